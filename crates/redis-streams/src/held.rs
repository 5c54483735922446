//! [`HeldEntries`]: the group entries this consumer holds, from the moment
//! the source decodes them until the runtime gives them back (acknowledged,
//! or left pending for a later claim), and the keep-alive that resets their
//! idle time on the server.
//!
//! Redis measures an entry's idle time from its last delivery and cannot
//! tell an entry waiting in a live consumer's queue from one of a dead
//! consumer. Without this, an entry queued longer than `claim_min_idle`
//! (behind a slow handler under partition ordering: 256 queued entries at
//! 60 s pass it once handlers average 235 ms) was claimed again by its own
//! consumer, or by another, and ran twice; after `max_deliveries` such
//! copies it was dead-lettered although it never failed. So:
//!
//! - the source's claim never takes an entry it holds;
//! - a task resets the idle time of held entries (`XCLAIM … JUSTID` to the
//!   same consumer, which does not count a delivery) every third of
//!   `claim_min_idle`, so other consumers see them idle only once this
//!   consumer stopped (crashed, or stalled that long).
//!
//! Bookkeeping costs one lock per batch read and per acknowledgement, and
//! set operations without allocation once the sets have grown to the
//! in-flight budget.

use std::collections::HashSet;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use foldhash::fast::RandomState;
use intake_core::SourceName;
use redis::Script;

use crate::connection::SharedConnection;
use crate::source::settings::Settings;
use crate::stream_id::StreamId;

/// Ids held per stream, in the order of `Settings::streams`.
#[derive(Debug)]
pub(crate) struct HeldEntries {
    streams: Vec<SourceName>,
    held: Mutex<Vec<Ids>>,
}

/// The ids of one stream.
#[derive(Debug, Default)]
struct Ids {
    held: HashSet<StreamId, RandomState>,
    /// Given back by the runtime for a later claim (a retry): still pending
    /// with this consumer but in nobody's hands, so an older entry of its
    /// key that later entries must wait for (see `source/key_order.rs`).
    /// Forgotten once held again, acknowledged, or found no longer pending
    /// with this consumer.
    given_back: HashSet<StreamId, RandomState>,
}

impl HeldEntries {
    pub(crate) fn new(streams: &[SourceName]) -> Self {
        Self {
            streams: streams.to_vec(),
            held: Mutex::new(streams.iter().map(|_| Ids::default()).collect()),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Vec<Ids>) -> R) -> R {
        f(&mut self.held.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn index_of(&self, stream: &str) -> Option<usize> {
        self.streams.iter().position(|name| &**name == stream)
    }

    /// Records `ids` of stream `index` as held.
    pub(crate) fn hold(&self, index: usize, ids: &[StreamId]) {
        if ids.is_empty() {
            return;
        }
        self.with(|held| {
            if let Some(set) = held.get_mut(index) {
                set.held.extend(ids.iter().copied());
                if !set.given_back.is_empty() {
                    for id in ids {
                        set.given_back.remove(id);
                    }
                }
            }
        });
    }

    /// Forgets `ids` of `stream`: acknowledged.
    pub(crate) fn release(&self, stream: &str, ids: impl Iterator<Item = StreamId>) {
        let Some(index) = self.index_of(stream) else {
            return;
        };
        self.with(|held| {
            if let Some(set) = held.get_mut(index) {
                for id in ids {
                    set.held.remove(&id);
                    set.given_back.remove(&id);
                }
            }
        });
    }

    /// Forgets `ids` of `stream` as held, and records them as given back
    /// for a later claim: they stay pending with this consumer.
    pub(crate) fn give_back(&self, stream: &str, ids: impl Iterator<Item = StreamId>) {
        let Some(index) = self.index_of(stream) else {
            return;
        };
        self.with(|held| {
            if let Some(set) = held.get_mut(index) {
                for id in ids {
                    if set.held.remove(&id) {
                        set.given_back.insert(id);
                    }
                }
            }
        });
    }

    /// How many entries of stream `index` are held.
    pub(crate) fn count(&self, index: usize) -> usize {
        self.with(|held| held.get(index).map_or(0, |set| set.held.len()))
    }

    /// Whether stream `index` has ids given back for a claim.
    pub(crate) fn has_given_back(&self, index: usize) -> bool {
        self.with(|held| {
            held.get(index)
                .is_some_and(|set| !set.given_back.is_empty())
        })
    }

    /// The ids of stream `index` given back for a claim, into `out`.
    pub(crate) fn given_back(&self, index: usize, out: &mut Vec<StreamId>) {
        out.clear();
        self.with(|held| {
            if let Some(set) = held.get(index) {
                out.extend(set.given_back.iter().copied());
            }
        });
    }

    /// Forgets the given-back ids of stream `index` that `pending` (sorted)
    /// no longer lists among this consumer's pending entries, up to
    /// `through`: acknowledged or claimed by another consumer meanwhile.
    pub(crate) fn forget_given_back(&self, index: usize, through: StreamId, pending: &[StreamId]) {
        self.with(|held| {
            if let Some(set) = held.get_mut(index) {
                set.given_back
                    .retain(|id| *id > through || pending.binary_search(id).is_ok());
            }
        });
    }

    /// Keeps only the items whose id is not held in stream `index`.
    pub(crate) fn retain_unheld<T>(
        &self,
        index: usize,
        items: &mut Vec<T>,
        id: impl Fn(&T) -> StreamId,
    ) {
        self.with(|held| {
            if let Some(set) = held.get(index) {
                items.retain(|item| !set.held.contains(&id(item)));
            }
        });
    }

    /// The held ids of stream `index`, into `out`.
    fn snapshot(&self, index: usize, out: &mut Vec<StreamId>) {
        out.clear();
        self.with(|held| {
            if let Some(set) = held.get(index) {
                out.extend(set.held.iter().copied());
            }
        });
    }
}

/// `KEYS[1]` stream; `ARGV[1]` group, `ARGV[2]` consumer, then ids. Resets
/// the idle time of the ids still pending for this consumer, without
/// counting a delivery; an id another consumer claimed meanwhile is left to
/// it. Returns how many were reset.
static REFRESH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local claim = {KEYS[1], ARGV[1], ARGV[2], 0}
for i = 3, #ARGV do
  local row = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1, ARGV[2])
  if #row == 1 then claim[#claim + 1] = ARGV[i] end
end
if #claim == 4 then return 0 end
claim[#claim + 1] = 'JUSTID'
return #redis.call('XCLAIM', unpack(claim))
",
    )
});

/// Ids per script call: Lua's `unpack` stops near 8,000 values.
const REFRESH_CHUNK: usize = 1_000;

/// How often held entries get their idle time reset: a third of
/// `claim_min_idle`, so that one late or failed round still leaves them
/// short of it.
pub(crate) fn refresh_interval(claim_min_idle: Duration) -> Duration {
    (claim_min_idle / 3).max(Duration::from_millis(1))
}

/// Resets the idle time of held entries every [`refresh_interval`] until
/// dropped (the source aborts it).
pub(crate) async fn keep_alive(
    held: Arc<HeldEntries>,
    connection: SharedConnection,
    settings: Arc<Settings>,
) {
    let Some(group) = settings.group.clone() else {
        return;
    };
    let mut ticks = tokio::time::interval(refresh_interval(settings.claim_min_idle));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ids = Vec::new();
    loop {
        ticks.tick().await;
        for (index, stream) in settings.streams.iter().enumerate() {
            held.snapshot(index, &mut ids);
            for chunk in ids.chunks(REFRESH_CHUNK) {
                let mut invocation = REFRESH.key(&**stream);
                invocation.arg(&*group).arg(&*settings.consumer);
                for id in chunk {
                    invocation.arg(*id);
                }
                let mut redis = connection.get();
                let refreshed: Result<usize, _> = invocation.invoke_async(&mut redis).await;
                match refreshed {
                    Ok(count) => settings.counters.add_refreshed(count),
                    Err(error) => {
                        // The next round tries again; meanwhile the entries
                        // age, and past claim_min_idle another consumer may
                        // take them (a copy, never a loss).
                        let error =
                            connection
                                .connector()
                                .key_error(error, "XCLAIM JUSTID", stream);
                        tracing::warn!(%error, "could not keep held entries from being claimed");
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_ids_are_released_by_stream_and_filtered_from_claims() {
        let held = HeldEntries::new(&["a".into(), "b".into()]);
        let id = |seq| StreamId { ms: 1, seq };
        held.hold(0, &[id(1), id(2), id(3)]);
        held.hold(1, &[id(1)]);
        held.release("a", [id(2)].into_iter());
        held.release("unknown", [id(1)].into_iter());
        assert_eq!((held.count(0), held.count(1)), (2, 1));
        let mut candidates = vec![id(1), id(2), id(4)];
        held.retain_unheld(0, &mut candidates, |id| *id);
        assert_eq!(candidates, vec![id(2), id(4)]);
    }

    #[test]
    fn given_back_ids_are_kept_until_held_again_acknowledged_or_no_longer_pending() {
        let held = HeldEntries::new(&["a".into()]);
        let id = |seq| StreamId { ms: 1, seq };
        let given_back = |held: &HeldEntries| {
            let mut out = Vec::new();
            held.given_back(0, &mut out);
            out.sort_unstable();
            out
        };
        held.hold(0, &[id(1), id(2), id(3), id(4), id(5)]);
        // Only held ids can be given back.
        held.give_back("a", [id(1), id(2), id(3), id(4), id(9)].into_iter());
        assert_eq!(given_back(&held), vec![id(1), id(2), id(3), id(4)]);
        assert_eq!(held.count(0), 1);
        held.hold(0, &[id(1)]);
        held.release("a", [id(2)].into_iter());
        assert_eq!(given_back(&held), vec![id(3), id(4)]);
        // 3 is no longer pending with this consumer; 4 is beyond the look.
        held.forget_given_back(0, id(3), &[id(1)]);
        assert_eq!(given_back(&held), vec![id(4)]);
    }

    #[test]
    fn the_refresh_comes_well_within_the_claim_time() {
        assert_eq!(
            refresh_interval(Duration::from_secs(60)),
            Duration::from_secs(20)
        );
        assert!(refresh_interval(Duration::from_millis(1)) > Duration::ZERO);
    }
}
