//! [`KeyOrder`]: each key's entries reach the runtime in stream order across
//! the consumers of a group, across a crash and across a restart.
//!
//! Redis hands a group's new entries to whichever consumer reads first, and
//! another consumer takes over a dead consumer's pending entries only once
//! they have been idle `claim_min_idle`. Without a check a consumer runs a
//! key's newer entries while an older entry of the same key is pending
//! elsewhere:
//!
//! - with a live member of the group, which runs it at the same time;
//! - with a member that crashed (or stopped with unfinished entries): its
//!   entries come back by claim after newer ones ran. A `ledger relay`
//!   SIGKILLed six times had 64 of 64 keys out of order this way;
//! - with this consumer itself, when the runtime gave the entry back for a
//!   later claim (a retryable failure).
//!
//! So an entry with a key waits in the source while an older entry of its
//! key is pending in the group and in no handler's hands here: pending
//! with another consumer, or given back by this one. The entry is held
//! (the keep-alive keeps it from being claimed) and handed out once the
//! older one is acknowledged, dead-lettered or parked, or claimed by this
//! consumer (and handed out before it). An entry this consumer handed out
//! already needs no check: the runtime runs a key's deliveries one at a
//! time, in the order they were handed out. The oldest pending entry of a
//! key never waits, so waiting cannot go in a circle.
//!
//! # Cost
//!
//! Each read of new entries brings one `XPENDING` summary per stream in the
//! same round trip. When no other consumer has entries pending and this one
//! gave none back (a single consumer's steady state), that is all. Otherwise
//! a script looks at the group's pending entries up to the newest waiting
//! one: `XPENDING` of the range and, for each entry of another consumer (or
//! given back), an `XRANGE` for its key; one round trip. Waiting entries
//! are looked at again from 2 ms after a look that freed none, doubling to
//! 200 ms, and whenever new entries arrive.
//!
//! Entries wait outside the runtime's budget: at most as many as
//! `max_in_flight` wait at once; while that many wait, no new entries are
//! read (claims go on).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;
use foldhash::fast::RandomState;
use intake_core::Message;
use redis::{Script, Value};
use tokio::time::Instant;

use super::convert::{bytes_of, integer_of};
use crate::stream_id::StreamId;

/// How soon waiting entries are looked at again after a look that freed
/// none, doubling up to [`LONGEST_RECHECK`].
const FIRST_RECHECK: Duration = Duration::from_millis(2);
const LONGEST_RECHECK: Duration = Duration::from_millis(200);

/// Most pending entries one look goes through. Past it the entries newer
/// than the last one looked at wait for the next look.
const MOST_PENDING_LOOKED_AT: usize = 20_000;

/// Most ids given back for a claim that one look passes to the script
/// (Lua's `unpack` stops near 8,000 values). With more, nothing is freed
/// until claims have taken enough of them back.
const MOST_GIVEN_BACK: usize = 2_000;

/// Entries that wait at once, all streams together, before `set_cap`.
const DEFAULT_CAP: usize = 1_000;

/// `KEYS[1]` the stream; `ARGV[1]` group, `ARGV[2]` this consumer, `ARGV[3]`
/// the key field, `ARGV[4]` the newest id to look at, `ARGV[5]` most pending
/// entries to look at, then the ids this consumer gave back for a claim.
///
/// Returns `{complete (1) or cut short (0), last id looked at, {id, mine
/// (1/0), key or nil, …}}` for each pending entry up to `ARGV[4]` of another
/// consumer or given back by this one. The key is the first value of the key
/// field, nil for an entry that no longer exists or has none.
static LOOK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local given = {}
for i = 6, #ARGV do given[ARGV[i]] = true end
local out = {}
local start = '-'
local last = ''
local seen = 0
local budget = tonumber(ARGV[5])
while seen < budget do
  local page = math.min(1000, budget - seen)
  local rows = redis.call('XPENDING', KEYS[1], ARGV[1], start, ARGV[4], page)
  for _, row in ipairs(rows) do
    local id = row[1]
    local mine = row[2] == ARGV[2]
    if not mine or given[id] then
      local key = false
      local entry = redis.call('XRANGE', KEYS[1], id, id)[1]
      if entry then
        local fields = entry[2]
        for j = 1, #fields - 1, 2 do
          if fields[j] == ARGV[3] then
            key = fields[j + 1]
            break
          end
        end
      end
      out[#out + 1] = id
      out[#out + 1] = mine and 1 or 0
      out[#out + 1] = key
    end
    last = id
  end
  seen = seen + #rows
  if #rows < page then
    return {1, last, out}
  end
  start = '(' .. last
end
return {0, last, out}
",
    )
});

/// An entry that waits, and whether it was counted as one that waited.
struct Waiting {
    message: Message,
    id: StreamId,
    counted: bool,
}

/// The entries of each stream that wait for an older entry of their key.
pub(super) struct KeyOrder {
    /// Per stream (in the order of the settings), oldest first.
    waiting: Vec<VecDeque<Waiting>>,
    total: usize,
    cap: usize,
    next_check: Instant,
    check_after: Duration,
    // Scratch space reused across looks.
    kept: VecDeque<Waiting>,
    oldest: HashMap<Bytes, StreamId, RandomState>,
    blocked: HashSet<Bytes, RandomState>,
    mine: Vec<StreamId>,
}

/// What one look at a stream's pending entries found.
pub(super) struct Look {
    /// The newest id the look was asked to cover.
    asked: StreamId,
    /// Whether every pending entry up to `asked` was looked at.
    complete: bool,
    /// The last pending id looked at.
    last: Option<StreamId>,
    /// Pending entries of another consumer or given back: id, whether this
    /// consumer's, key.
    rows: Vec<(StreamId, bool, Option<Bytes>)>,
}

impl Look {
    /// Up to which id every pending entry was looked at.
    pub(super) fn covered(&self) -> StreamId {
        match (self.complete, self.last) {
            (true, _) => self.asked,
            (false, Some(last)) => last,
            (false, None) => StreamId::ZERO,
        }
    }
}

impl KeyOrder {
    pub(super) fn new(streams: usize) -> Self {
        Self {
            waiting: (0..streams).map(|_| VecDeque::new()).collect(),
            total: 0,
            cap: DEFAULT_CAP,
            next_check: Instant::now(),
            check_after: FIRST_RECHECK,
            kept: VecDeque::new(),
            oldest: HashMap::default(),
            blocked: HashSet::default(),
            mine: Vec::new(),
        }
    }

    /// At most `cap` entries wait at once (the runtime's `max_in_flight`).
    pub(super) fn set_cap(&mut self, cap: usize) {
        self.cap = cap.max(1);
    }

    /// Whether stream `index` has entries waiting.
    pub(super) fn is_waiting(&self, index: usize) -> bool {
        self.waiting
            .get(index)
            .is_some_and(|queue| !queue.is_empty())
    }

    /// Whether any entry waits.
    pub(super) fn any_waiting(&self) -> bool {
        self.total > 0
    }

    /// Whether so many wait that no more entries should be read.
    pub(super) fn is_full(&self) -> bool {
        self.total >= self.cap
    }

    /// Whether the waiting entries are due for another look.
    pub(super) fn check_due(&self) -> bool {
        self.total > 0 && Instant::now() >= self.next_check
    }

    /// How long until the next look, for a read that should not block past
    /// it.
    pub(super) fn until_check(&self) -> Duration {
        self.next_check.saturating_duration_since(Instant::now())
    }

    /// The newest waiting id of stream `index`.
    pub(super) fn newest(&self, index: usize) -> Option<StreamId> {
        self.waiting
            .get(index)
            .and_then(VecDeque::back)
            .map(|waiting| waiting.id)
    }

    /// Adds `messages` (entries of stream `index` with a key, oldest first)
    /// to those that wait.
    pub(super) fn add(&mut self, index: usize, messages: impl Iterator<Item = Message>) {
        let Some(queue) = self.waiting.get_mut(index) else {
            return;
        };
        for message in messages {
            let id =
                StreamId::from_position(message.metadata().position()).unwrap_or(StreamId::ZERO);
            let waiting = Waiting {
                message,
                id,
                counted: false,
            };
            // Claimed entries may be older than entries already waiting.
            if queue.back().is_none_or(|last| last.id < id) {
                queue.push_back(waiting);
            } else {
                let at = queue.partition_point(|other| other.id < id);
                queue.insert(at, waiting);
            }
            self.total += 1;
        }
        // New entries are looked at at once.
        self.next_check = Instant::now();
    }

    /// Hands the waiting entries of stream `index` that `look` frees to
    /// `ready`, in order; returns how many, and how many started to wait.
    /// The ids of this consumer that `look` lists are left in `self.mine`
    /// (sorted).
    pub(super) fn release(
        &mut self,
        index: usize,
        look: &Look,
        ready: &mut VecDeque<Message>,
    ) -> (usize, usize) {
        self.oldest.clear();
        self.blocked.clear();
        self.mine.clear();
        for (id, mine, key) in &look.rows {
            if *mine {
                self.mine.push(*id);
            }
            if let Some(key) = key {
                let oldest = self.oldest.entry(key.clone()).or_insert(*id);
                *oldest = (*oldest).min(*id);
            }
        }
        self.mine.sort_unstable();
        let Some(queue) = self.waiting.get_mut(index) else {
            return (0, 0);
        };
        let (mut released, mut started) = (0, 0);
        self.kept.clear();
        for mut waiting in queue.drain(..) {
            let key = waiting.message.key();
            let wait = waiting.id > look.covered()
                || key.is_some_and(|key| {
                    self.blocked.contains(key)
                        || self
                            .oldest
                            .get(key)
                            .is_some_and(|older| *older < waiting.id)
                });
            if wait {
                if let Some(key) = key {
                    self.blocked.insert(key.clone());
                }
                if !waiting.counted {
                    waiting.counted = true;
                    started += 1;
                }
                self.kept.push_back(waiting);
            } else {
                released += 1;
                ready.push_back(waiting.message);
            }
        }
        std::mem::swap(queue, &mut self.kept);
        self.total -= released;
        if released > 0 {
            self.check_after = FIRST_RECHECK;
            self.next_check = Instant::now();
        } else {
            self.next_check = Instant::now() + self.check_after;
            self.check_after = (self.check_after * 2).min(LONGEST_RECHECK);
        }
        (released, started)
    }

    /// The ids of this consumer the last [`release`](Self::release) saw
    /// pending (given back), sorted.
    pub(super) fn mine(&self) -> &[StreamId] {
        &self.mine
    }

    /// Puts off the next look, after one that could not be made (more ids
    /// given back than a look can take).
    pub(super) fn put_off(&mut self) {
        self.next_check = Instant::now() + self.check_after;
        self.check_after = (self.check_after * 2).min(LONGEST_RECHECK);
    }
}

/// Whether an `XPENDING` summary reply shows entries pending with any
/// consumer but `consumer`. An answer of another shape counts as yes: a
/// look then decides.
pub(super) fn others_pending(summary: &Value, consumer: &str) -> bool {
    let Value::Array(parts) = summary else {
        return true;
    };
    match parts.first().and_then(integer_of) {
        Some(0) => return false,
        Some(_) => {}
        None => return true,
    }
    let Some(Value::Array(consumers)) = parts.get(3) else {
        return true;
    };
    consumers.iter().any(|row| match row {
        Value::Array(pair) => pair
            .first()
            .and_then(bytes_of)
            .is_none_or(|name| name != consumer.as_bytes()),
        _ => true,
    })
}

/// Looks at the pending entries of `stream` up to `through` for group
/// `group`: those of other consumers, and those of `consumer` among
/// `given_back`.
pub(super) async fn look(
    connection: &mut redis::aio::MultiplexedConnection,
    stream: &str,
    group: &str,
    consumer: &str,
    key_field: &str,
    through: StreamId,
    given_back: &[StreamId],
) -> Result<Look, redis::RedisError> {
    let mut invocation = LOOK.prepare_invoke();
    invocation
        .key(stream)
        .arg(group)
        .arg(consumer)
        .arg(key_field)
        .arg(through)
        .arg(MOST_PENDING_LOOKED_AT);
    for id in given_back {
        invocation.arg(*id);
    }
    let reply: Value = invocation.invoke_async(connection).await?;
    parse_look(reply, through).ok_or_else(|| {
        redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "not the reply of the key-order script",
        ))
    })
}

/// Whether `given_back` is too long for one look.
pub(super) fn too_many_given_back(given_back: &[StreamId]) -> bool {
    given_back.len() > MOST_GIVEN_BACK
}

fn parse_look(reply: Value, asked: StreamId) -> Option<Look> {
    let Value::Array(parts) = reply else {
        return None;
    };
    let [complete, last, rows] = <[Value; 3]>::try_from(parts).ok()?;
    let complete = integer_of(&complete)? == 1;
    let last = match bytes_of(&last)? {
        b"" => None,
        id => Some(StreamId::parse(id)?),
    };
    let rows = match rows {
        Value::Array(rows) => rows,
        Value::Nil => Vec::new(),
        _ => return None,
    };
    let mut parsed = Vec::with_capacity(rows.len() / 3);
    let mut rows = rows.into_iter();
    while let (Some(id), Some(mine), Some(key)) = (rows.next(), rows.next(), rows.next()) {
        let id = StreamId::parse(bytes_of(&id)?)?;
        let mine = integer_of(&mine)? == 1;
        let key = match key {
            Value::Nil => None,
            Value::BulkString(bytes) => Some(Bytes::from(bytes)),
            other => Some(Bytes::copy_from_slice(bytes_of(&other)?)),
        };
        parsed.push((id, mine, key));
    }
    Some(Look {
        asked,
        complete,
        last,
        rows: parsed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use intake_core::Metadata;

    fn message(seq: u64, key: &str) -> Message {
        let id = StreamId { ms: 1, seq };
        Message::new("x", Metadata::new("s".into(), 0, id.position())).with_key(key.to_owned())
    }

    fn id(seq: u64) -> StreamId {
        StreamId { ms: 1, seq }
    }

    fn ids(ready: &VecDeque<Message>) -> Vec<u64> {
        ready
            .iter()
            .filter_map(|m| StreamId::from_position(m.metadata().position()))
            .map(|id| id.seq)
            .collect()
    }

    #[test]
    fn an_entry_waits_for_an_older_pending_entry_of_its_key_and_keeps_its_place() {
        let mut order = KeyOrder::new(1);
        order.add(
            0,
            [
                message(5, "a"),
                message(6, "b"),
                message(7, "a"),
                message(8, "c"),
            ]
            .into_iter(),
        );
        let mut ready = VecDeque::new();
        // 3 (key a) is pending with another consumer; 4 had no key.
        let look = Look {
            asked: id(8),
            complete: true,
            last: Some(id(4)),
            rows: vec![(id(3), false, Some(Bytes::from("a"))), (id(4), false, None)],
        };
        assert_eq!(order.release(0, &look, &mut ready), (2, 2));
        assert_eq!(ids(&ready), vec![6, 8]);
        // A claimed older entry of key a goes before those waiting.
        order.add(0, [message(3, "a")].into_iter());
        ready.clear();
        let look = Look {
            asked: id(7),
            complete: true,
            last: None,
            rows: vec![],
        };
        assert_eq!(order.release(0, &look, &mut ready), (3, 0));
        assert_eq!(ids(&ready), vec![3, 5, 7]);
        assert!(!order.any_waiting());
    }

    #[test]
    fn an_entry_past_a_look_cut_short_waits_and_a_given_back_entry_holds_its_key() {
        let mut order = KeyOrder::new(1);
        order.add(0, [message(5, "a"), message(9, "b")].into_iter());
        let mut ready = VecDeque::new();
        let look = Look {
            asked: id(9),
            complete: false,
            last: Some(id(6)),
            rows: vec![(id(2), true, Some(Bytes::from("a")))],
        };
        assert_eq!(order.release(0, &look, &mut ready), (0, 2));
        assert_eq!(order.mine(), &[id(2)]);
        assert!(ready.is_empty());
        order.set_cap(2);
        assert!(order.is_full());
    }

    #[test]
    fn a_summary_tells_whether_another_consumer_has_entries_pending() {
        let bulk = |text: &str| Value::BulkString(text.as_bytes().to_vec());
        let none = Value::Array(vec![Value::Int(0), Value::Nil, Value::Nil, Value::Nil]);
        assert!(!others_pending(&none, "me"));
        let row = |name: &str| Value::Array(vec![bulk(name), bulk("3")]);
        let mine = Value::Array(vec![
            Value::Int(3),
            bulk("1-1"),
            bulk("1-3"),
            Value::Array(vec![row("me")]),
        ]);
        assert!(!others_pending(&mine, "me"));
        let shared = Value::Array(vec![
            Value::Int(6),
            bulk("1-1"),
            bulk("1-6"),
            Value::Array(vec![row("me"), row("other")]),
        ]);
        assert!(others_pending(&shared, "me"));
        assert!(
            others_pending(&Value::Okay, "me"),
            "an odd reply means look"
        );
    }

    #[test]
    fn a_look_reply_of_another_shape_is_refused_not_a_panic() {
        assert!(parse_look(Value::Nil, id(2)).is_none());
        assert!(parse_look(Value::Array(vec![Value::Int(1)]), id(2)).is_none());
        let good = Value::Array(vec![
            Value::Int(1),
            Value::BulkString(b"1-2".to_vec()),
            Value::Array(vec![
                Value::BulkString(b"1-1".to_vec()),
                Value::Int(0),
                Value::Nil,
            ]),
        ]);
        let look = parse_look(good, id(2)).expect("parsed");
        assert!(look.complete);
        assert_eq!(look.covered(), id(2));
        assert_eq!(look.rows, vec![(id(1), false, None)]);
    }
}
