//! The mover's round: the Lua script that indexes, moves and trims on one
//! stream, and what it answers.

use std::sync::LazyLock;

use redis::{Script, Value};

/// One round of the mover on one stream; see [`RedisParking`].
///
/// `KEYS[1]` the return stream, `KEYS[2]` the parking stream, `KEYS[3]`
/// its due index; `ARGV[1]` now (ms since the epoch, the mover's clock),
/// `ARGV[2]` most entries moved, `ARGV[3]` most entries indexed per read,
/// `ARGV[4]` the due header's name, `ARGV[5]` the parking stream's group,
/// `ARGV[6]` most values an entry may have to be moved, `ARGV[7]` `MAXLEN`
/// of the return stream (empty: none), `ARGV[8]` the consumer group that
/// reads the return stream.
///
/// Returns `{indexed, undated, moved, vanished, more, next due or -1,
/// {ids left in the parking stream}, trimmed}`.
///
/// The types are checked first and the calls that can fail on an entry's
/// content (`XRANGE` of an id from the index) are `pcall`ed: a script is
/// not rolled back, so an error after the `XREADGROUP` would otherwise
/// stall on the same entry every round. The entries read are acknowledged
/// only after they are indexed, so a round that fails in between (`OOM`)
/// leaves them pending for the next, which reads its pending ones (`0`)
/// before new ones (`>`).
///
/// Before the first entry of a round is moved, the consumer group is
/// created on the return stream at `0` where it is missing: a copy must
/// never land in a return stream whose group the source would create
/// later at `$` (`StartFrom::NewEntries`), past the copy.
///
/// Last, the return stream is trimmed (`XTRIM MINID`) up to the oldest entry
/// some group on it still needs: its oldest pending entry, or else the
/// first it has not read; the whole stream when every group read and
/// acknowledged everything. A stream with no group is left alone.
pub(super) static ROUND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
-- Entry ids compared exactly (a sequence may pass what a Lua number holds).
local function id_less(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if not am or not bm then return false end
  local function less(x, y)
    if #x ~= #y then return #x < #y end
    return x < y
  end
  if am ~= bm then return less(am, bm) end
  return less(as, bs)
end
local kinds = {}
for i, wanted in ipairs({'stream', 'stream', 'zset'}) do
  local found = redis.call('TYPE', KEYS[i])['ok']
  if found ~= 'none' and found ~= wanted then
    return redis.error_reply('WRONGTYPE key ' .. KEYS[i] .. ' holds a ' .. found ..
      '; parking needs a ' .. wanted .. ' there')
  end
  kinds[i] = found
end
local indexed, undated = 0, 0
local full = false
if kinds[2] == 'stream' then
  for _, from in ipairs({'0', '>'}) do
    local function read()
      return redis.pcall('XREADGROUP', 'GROUP', ARGV[5], 'mover', 'COUNT', ARGV[3],
        'STREAMS', KEYS[2], from)
    end
    local reply = read()
    if type(reply) == 'table' and reply.err then
      if string.sub(reply.err, 1, 7) ~= 'NOGROUP' then
        return reply
      end
      redis.call('XGROUP', 'CREATE', KEYS[2], ARGV[5], '0')
      reply = read()
      if type(reply) == 'table' and reply.err then
        return reply
      end
    end
    if reply then
      local entries = reply[1][2]
      local read_ids = {}
      for _, entry in ipairs(entries) do
        local fields = entry[2]
        if fields then
          local due
          for i = 1, #fields - 1, 2 do
            if fields[i] == ARGV[4] then
              due = tonumber(fields[i + 1])
              break
            end
          end
          if not (due and due >= 0 and due <= 1e15) then
            due = 0
            undated = undated + 1
          end
          redis.call('ZADD', KEYS[3], due, entry[1])
          indexed = indexed + 1
        end
        read_ids[#read_ids + 1] = entry[1]
      end
      if #read_ids > 0 then
        redis.call('XACK', KEYS[2], ARGV[5], unpack(read_ids))
      end
      if #entries >= tonumber(ARGV[3]) then
        full = true
      end
    end
  end
end
local moved, vanished, left = 0, 0, {}
local grouped = false
local due_ids = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, id in ipairs(due_ids) do
  local found = redis.pcall('XRANGE', KEYS[2], id, id)
  local entry = nil
  if type(found) == 'table' and not found.err then
    entry = found[1]
  end
  if not entry then
    vanished = vanished + 1
  elseif #entry[2] > tonumber(ARGV[6]) then
    left[#left + 1] = id
  else
    if not grouped then
      local created = redis.pcall('XGROUP', 'CREATE', KEYS[1], ARGV[8], '0', 'MKSTREAM')
      if type(created) == 'table' and created.err and string.sub(created.err, 1, 9) ~= 'BUSYGROUP' then
        return created
      end
      grouped = true
    end
    if ARGV[7] == '' then
      redis.call('XADD', KEYS[1], '*', unpack(entry[2]))
    else
      redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[7], '*', unpack(entry[2]))
    end
    redis.call('XDEL', KEYS[2], id)
    moved = moved + 1
  end
  redis.call('ZREM', KEYS[3], id)
end
if #due_ids >= tonumber(ARGV[2]) then
  full = true
end
local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
local next_due = -1
if first[2] then
  next_due = tonumber(first[2])
end
local more = 0
if full then
  more = 1
end
local trimmed = 0
if redis.call('TYPE', KEYS[1])['ok'] == 'stream' then
  local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
  -- Keep every id from `keep` on; nil: nothing is needed any more.
  local keep, needed = nil, false
  for _, info in ipairs(groups) do
    local name, last
    for i = 1, #info - 1, 2 do
      if info[i] == 'name' then
        name = info[i + 1]
      elseif info[i] == 'last-delivered-id' then
        last = info[i + 1]
      end
    end
    local oldest = nil
    local summary = redis.call('XPENDING', KEYS[1], name)
    if tonumber(summary[1]) > 0 and summary[2] then
      oldest = summary[2]
    else
      local unread = redis.call('XRANGE', KEYS[1], '(' .. last, '+', 'COUNT', 1)[1]
      if unread then
        oldest = unread[1]
      end
    end
    if oldest then
      if not keep or id_less(oldest, keep) then
        keep = oldest
      end
    end
    needed = true
  end
  if needed then
    if keep then
      trimmed = redis.call('XTRIM', KEYS[1], 'MINID', keep)
    else
      trimmed = redis.call('XTRIM', KEYS[1], 'MAXLEN', 0)
    end
  end
end
return {indexed, undated, moved, vanished, more, next_due, left, trimmed}
",
    )
});

/// What one round on one stream did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Round {
    pub(super) indexed: u64,
    pub(super) undated: u64,
    pub(super) moved: u64,
    pub(super) vanished: u64,
    /// A limit was reached: more may be waiting now.
    pub(super) more: bool,
    /// The earliest due time left in the index (ms since the epoch).
    pub(super) next_due: Option<u64>,
    /// Ids too large to move, dropped from the index.
    pub(super) left: Vec<String>,
    /// Entries trimmed from the return stream: every group on it had read
    /// and acknowledged them.
    pub(super) trimmed: u64,
}

impl Round {
    pub(super) fn parse(reply: Value) -> Option<Self> {
        let Value::Array(items) = reply else {
            return None;
        };
        let [
            indexed,
            undated,
            moved,
            vanished,
            more,
            next_due,
            left,
            trimmed,
        ] = <[Value; 8]>::try_from(items).ok()?;
        let count = |value: Value| match value {
            Value::Int(number) => u64::try_from(number).ok(),
            _ => None,
        };
        let next_due = match next_due {
            Value::Int(number) => u64::try_from(number).ok(),
            _ => return None,
        };
        let left = match left {
            Value::Array(ids) => ids
                .into_iter()
                .map(|id| match id {
                    Value::BulkString(id) => Some(String::from_utf8_lossy(&id).into_owned()),
                    Value::SimpleString(id) => Some(id),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?,
            Value::Nil => Vec::new(),
            _ => return None,
        };
        Some(Self {
            indexed: count(indexed)?,
            undated: count(undated)?,
            moved: count(moved)?,
            vanished: count(vanished)?,
            more: count(more)? > 0,
            next_due,
            left,
            trimmed: count(trimmed)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_reply_of_another_shape_is_refused_not_a_panic() {
        let good = || {
            vec![
                Value::Int(2),
                Value::Int(0),
                Value::Int(1),
                Value::Int(0),
                Value::Int(0),
                Value::Int(1_700_000_000_000),
                Value::Array(vec![Value::BulkString(b"1-1".to_vec())]),
                Value::Int(4),
            ]
        };
        let parsed = Round::parse(Value::Array(good()));
        assert_eq!(
            parsed,
            Some(Round {
                indexed: 2,
                moved: 1,
                next_due: Some(1_700_000_000_000),
                left: vec!["1-1".to_owned()],
                trimmed: 4,
                ..Round::default()
            })
        );
        let mut no_due = good();
        no_due[5] = Value::Int(-1);
        assert_eq!(
            Round::parse(Value::Array(no_due)).map(|round| round.next_due),
            Some(None)
        );
        let mut short = good();
        short.pop();
        assert_eq!(Round::parse(Value::Array(short)), None);
        let mut negative = good();
        negative[2] = Value::Int(-3);
        assert_eq!(Round::parse(Value::Array(negative)), None);
        assert_eq!(Round::parse(Value::Int(1)), None);
        assert_eq!(Round::parse(Value::Nil), None);
    }
}
