//! [`RedisParking`]: retry later without blocking, on Redis. A message is
//! parked in a stream of its consumer group's own, indexed by its due time,
//! and moved by a mover once due into the group's return stream, which the
//! same source reads beside the stream the message came from.
//!
//! How it parks, what it costs and its limits are on [`RedisParking`],
//! where the crate's documentation shows them.

use std::fmt;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use intake_core::parking::{DUE, ORIGIN, ParkError, Parked, Parking};
use intake_core::{BackoffPolicy, ConfigError, Exponential, Message};
use redis::{RedisError, Script, Value};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::connection::{
    Connector, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, SecretUrl, SharedConnection,
};
use crate::dead_letter::MAX_DEAD_LETTER_VALUES;
use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::publisher::entry_fields;
use crate::settings::{DEFAULT_PAYLOAD_FIELD, Settings};

/// Most parked entries one round indexes per stream; a round that reads
/// this many runs again at once.
const INDEX_PER_ROUND: usize = 1_000;

/// The longest wait between failed rounds, should the policy give up
/// (the crate's never does): the mover itself never gives up.
const LONGEST_BACKOFF: Duration = Duration::from_secs(10);

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
static ROUND: LazyLock<Script> = LazyLock::new(|| {
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

/// Parks messages of Redis streams for a while and, once due, moves them
/// into a return stream that only the consumer group that parked them
/// reads: the [`Parking`] of the Redis backend, for
/// [`ParkingLayer`](intake_core::parking::ParkingLayer).
///
/// Derive one with a route of a [`RedisBroker`](crate::RedisBroker)
/// ([`RouteOptions::parking`](intake_core::backend::RouteOptions::parking):
/// its source then reads the return stream), or build one with
/// [`RedisStreamsSource::parking`](crate::RedisStreamsSource::parking)
/// (prefilled from the source) or [`RedisParking::builder`], and hand a
/// clone to the layer. Clones share the mover, which stops once every clone
/// is dropped or at [`shutdown`](Self::shutdown).
///
/// # Where a parked message comes back
///
/// A parked message of stream `orders`, parked by group `billing`, comes
/// back to the return stream `orders:billing:returned`
/// ([`RedisParking::return_stream`]; another name can be set with
/// [`return_stream`](RedisParkingBuilder::return_stream)), not to `orders`:
/// every consumer group of `orders` and every broadcast reader would
/// receive a copy moved there, and handle again what it had handled
/// already. The source reads the return stream as one more stream, which is
/// the one line to add to the source's builder:
///
/// ```text
/// .stream(RedisParking::return_stream("orders", "billing"))
/// ```
///
/// The copy keeps its fields, the park headers among them:
/// [`ORIGIN`] names `orders`, so the parking layer keeps the order of the
/// copy's key among the messages of `orders`. The source's
/// [`parking`](crate::RedisStreamsSource::parking) refuses to build while
/// the source does not read a return stream, so a forgotten line fails at
/// start rather than leaving copies unread.
///
/// # How it parks
///
/// A park is one `XADD` of the message to the parking stream
/// `<stream>:<group>:parked` (one per stream and group, so that each
/// group's mover moves only its own group's copies), confirmed by the entry
/// id Redis answers: the same fields the source reads (the payload field,
/// then every header in order; the key is among them, since the source
/// keeps its key field as a header), the park headers included ([`DUE`]
/// among them; [`ORIGIN`] is added when the caller did not set it).
/// [`park`](Parking::park) returns [`Parked::Moved`] only after that
/// confirmation, so the original is acknowledged only once its copy is
/// stored. A copy that came back through the return stream and is parked
/// again goes to the parking stream of its origin.
///
/// A park is a single command, hence atomic by itself: there is no moment
/// at which the copy exists and its due time is unknown, since the due time
/// travels in the entry. The due index, the sorted set
/// `<stream>:<group>:parked:due` of parked entry ids scored by due time
/// (milliseconds since the Unix epoch), is kept by the mover.
///
/// # How it comes back
///
/// A mover task runs while the parking lives (one per [`RedisParking`] and
/// its clones; each instance of an application runs its own, and they share
/// the work safely). Each round is one Lua script per stream, atomic on the
/// server, which
///
/// 1. indexes the entries parked since the last round: it reads them
///    through the consumer group [`RedisParking::MOVER_GROUP`] of the parking
///    stream, `ZADD`s each id with its [`DUE`] header as score, and only
///    then acknowledges them; a round that failed midway (`OOM`) leaves
///    them pending, and the next round reads them again first. The group is
///    the cursor, so each entry is indexed once however many movers run,
///    and it lives and dies with the parking stream;
/// 2. moves up to [`batch`](RedisParkingBuilder::batch) entries whose due
///    time has come: `XADD` of the entry's fields, as they are, to the
///    return stream (with `MAXLEN ~` when
///    [`max_len`](RedisParkingBuilder::max_len) is set), then `XDEL` from
///    the parking stream and `ZREM` from the index. Before the first, it
///    creates the consumer group on the return stream at `0` if it is
///    missing (`MKSTREAM`), so no copy lands where the group would start
///    after it. A script is never interleaved with another, so two movers
///    never move the same entry, and it stops at the first failing call:
///    an entry is moved whole or not at all;
/// 3. trims the return stream (`XTRIM MINID`) up to the oldest copy a group
///    on it still needs: the oldest it has pending, or else the first it
///    has not read (all of it once everything was read and acknowledged;
///    a return stream without a group is left alone);
/// 4. answers the earliest due time left.
///
/// Between rounds the mover sleeps until that due time, at most
/// [`poll_interval`](RedisParkingBuilder::poll_interval) (1 s): that bounds
/// how late an entry parked by another instance is seen. A park of its own
/// wakes it at once.
///
/// The due time is compared with the **mover's clock** (passed to the
/// script), not the server's `TIME`: the [`DUE`] header was computed from
/// the parking process's clock, so the same clock decides, and a message
/// never comes back before the due time it carries as its own instance saw
/// it. Instances whose clocks disagree move early or late by the skew.
///
/// Nothing parked is lost, and nothing comes back twice but for one case
/// (at-least-once): a park whose reply was lost (the connection dropped,
/// the command timed out) fails, so the parking layer retries the original
/// the ordinary way, although its copy may have been stored and comes back
/// too.
///
/// When a round fails (server unreachable, `READONLY` after a failover, a
/// key of the wrong type) the mover logs it once, waits as the crate's
/// reconnect policy does (100 ms doubling to 10 s, forever), and tries
/// again; every command is bounded by
/// [`command_timeout`](RedisParkingBuilder::command_timeout). An entry that
/// does not stall the mover but cannot be moved as it should is logged:
///
/// - one without a valid due time (written to the parking stream by hand)
///   is moved at once;
/// - an indexed id whose entry is gone (deleted or trimmed by an operator,
///   or not an entry id at all) is dropped from the index;
/// - one with more fields than a script call can pass (see
///   [`MAX_DEAD_LETTER_VALUES`](crate::MAX_DEAD_LETTER_VALUES); `park` refuses
///   such a message, so only an entry written by hand) is dropped from the
///   index and left in the parking stream, to be moved by hand.
///
/// # What it costs
///
/// Per parked message: one `XADD`, and on the server the entry in the
/// parking stream plus a member of the index until it is moved; moving it
/// is an `XRANGE`, `XADD`, `XDEL` and `ZREM` within a round's script, plus
/// one `XGROUP CREATE` per round that moves any. An idle mover runs one
/// short script per stream per poll interval (the trim looks at the return
/// stream's groups: `XINFO GROUPS`, and an `XPENDING` summary and at most
/// one `XRANGE` per group). Each [`RedisParking`] holds
/// one connection (parks and mover share it). The source reads one more
/// stream: its reads split their `COUNT` between the streams.
///
/// # Limits
///
/// - A moved message is a **new entry** of the return stream: it has a new
///   entry id (position) and its attempt counts from 1 again (the
///   [`ATTEMPTS`] header carries the attempts before). Its partition is the
///   return stream, so what a source does per stream (lag, the delivery
///   count against `max_deliveries`) is done under the return stream's
///   name. Its dead letter goes to its origin's dead-letter stream and names
///   the entry it was first delivered as
///   ([`RedisDeadLetterSink`](crate::RedisDeadLetterSink)).
/// - The return stream holds the copies its group has not acknowledged
///   and those after the oldest of them: each round trims what comes
///   before (a copy stuck pending keeps every later one in the stream until
///   it is claimed and acknowledged). [`max_len`](RedisParkingBuilder::max_len)
///   is not needed for that, and it can trim a copy the group has not read
///   yet, if it lags that far.
/// - A broadcast reader has no group, hence no return stream of its own:
///   it cannot park.
/// - A message the source did not decode (its key carried by no field) or
///   with more than about 3,500 fields is refused: the parking layer then
///   retries it the ordinary way.
/// - The parking stream must not be trimmed (`MAXLEN`): what is trimmed is
///   lost. The keys are not hash-tagged; like the rest of this crate,
///   parking is for a single Redis server (or a replicated one), not Redis
///   Cluster.
///
/// ```no_run
/// use std::time::Duration;
/// use intake_core::parking::ParkingLayer;
/// use intake_core::{Consumer, HandlerError, Message};
/// use intake_redis_streams::{RedisParking, RedisStreamsSource};
/// use tokio_util::sync::CancellationToken;
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let source = RedisStreamsSource::builder("redis://127.0.0.1:6379")
///     .stream("orders")
///     // Where the parked messages of `orders` come back, for this group only.
///     .stream(RedisParking::return_stream("orders", "billing"))
///     .group("billing")
///     .key_field("customer")
///     .build()
///     .await?;
/// let acker = source.acker();
/// let parking = source.parking().build().await?;
/// let handler = tower::ServiceBuilder::new()
///     .layer(ParkingLayer::new(parking.clone()))
///     .service(tower::service_fn(|message: Message| async move {
///         if message.payload().is_empty() {
///             return Err(HandlerError::retry_later("the ledger is down", Duration::from_secs(30)));
///         }
///         Ok::<(), HandlerError>(())
///     }));
/// let report = Consumer::builder()
///     .build(source, acker, handler)?
///     .run(CancellationToken::new())
///     .await?;
/// println!("{} parked", report.parked);
/// parking.shutdown().await;
/// # Ok(())
/// # }
/// ```
///
/// [`ATTEMPTS`]: intake_core::parking::ATTEMPTS
#[derive(Clone)]
pub struct RedisParking {
    inner: Arc<Inner>,
}

/// What the clones of a parking share.
struct Inner {
    /// The keys of each stream whose messages this parks.
    keys: Vec<StreamKeys>,
    group: String,
    payload_field: String,
    /// The connection of parks and of the mover, also for
    /// [`RedisParking::waiting`].
    connection: SharedConnection,
    /// Wakes the mover after a park of this process.
    wake: Arc<Notify>,
    /// Turns true to stop the mover (and refuse parks).
    stop: watch::Sender<bool>,
    mover: Mutex<Option<JoinHandle<()>>>,
    command_timeout: Duration,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The mover holds no clone of the parking, so the last clone gone
        // is the moment to stop it. What is parked stays parked.
        self.stop.send_replace(true);
    }
}

impl fmt::Debug for RedisParking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let streams: Vec<&str> = self.inner.keys.iter().map(|keys| &*keys.stream).collect();
        let returns: Vec<&str> = self.inner.keys.iter().map(|keys| &*keys.returned).collect();
        f.debug_struct("RedisParking")
            .field("endpoint", self.endpoint())
            .field("group", &self.inner.group)
            .field("streams", &streams)
            .field("return_streams", &returns)
            .finish_non_exhaustive()
    }
}

impl RedisParking {
    /// What a stream's parking stream is named after the stream and group:
    /// `orders:billing:parked`.
    pub const PARKED_SUFFIX: &'static str = ":parked";
    /// What a stream's due index is named after the stream and group:
    /// `orders:billing:parked:due`.
    pub const DUE_SUFFIX: &'static str = ":parked:due";
    /// What a stream's return stream is named after the stream and group,
    /// unless set: `orders:billing:returned`.
    pub const RETURNED_SUFFIX: &'static str = ":returned";
    /// The consumer group of every parking stream through which the movers
    /// index new parked entries.
    pub const MOVER_GROUP: &'static str = "intake-parking";

    /// A builder of a parking on a connection of its own to the server at
    /// `url` (`redis://[user[:password]@]host[:port][/db]`, or `rediss://`
    /// for TLS). Name the consumer group with
    /// [`group`](RedisParkingBuilder::group) and the streams whose messages
    /// it parks with
    /// [`consumed_stream`](RedisParkingBuilder::consumed_stream);
    /// [`RedisStreamsSource::parking`](crate::RedisStreamsSource::parking)
    /// does both from the source.
    pub fn builder(url: impl Into<String>) -> RedisParkingBuilder {
        RedisParkingBuilder::new(url)
    }

    /// The return stream of `stream` for consumer group `group` unless set
    /// otherwise: `<stream>:<group>:returned`, where the group's parked
    /// messages of `stream` come back. The group's source reads it beside
    /// `stream`.
    pub fn return_stream(stream: &str, group: &str) -> String {
        format!("{stream}:{group}{}", Self::RETURNED_SUFFIX)
    }

    /// The parking stream of `stream` for consumer group `group`.
    pub fn parked_stream(stream: &str, group: &str) -> String {
        format!("{stream}:{group}{}", Self::PARKED_SUFFIX)
    }

    /// The due index of `stream` for consumer group `group`.
    pub fn due_index(stream: &str, group: &str) -> String {
        format!("{stream}:{group}{}", Self::DUE_SUFFIX)
    }

    /// The server it parks on, without password.
    pub fn endpoint(&self) -> &Endpoint {
        self.inner.connection.connector().endpoint()
    }

    /// The consumer group whose messages this parks.
    pub fn group(&self) -> &str {
        &self.inner.group
    }

    /// Where the parked messages of `stream` come back, or `None` for a
    /// stream this parking was not built for.
    pub fn return_stream_of(&self, stream: &str) -> Option<&str> {
        self.inner
            .keys
            .iter()
            .find(|keys| *keys.stream == *stream)
            .map(|keys| &*keys.returned)
    }

    /// How many messages of `stream` this parking's group has parked and
    /// not moved back yet, by any instance (`XLEN` of its parking stream).
    pub async fn waiting(&self, stream: &str) -> Result<u64, Error> {
        let parked = Self::parked_stream(stream, &self.inner.group);
        let mut connection = self.inner.connection.get();
        let length = tokio::time::timeout(
            self.inner.command_timeout,
            redis::cmd("XLEN")
                .arg(&parked)
                .query_async::<u64>(&mut connection),
        )
        .await
        .unwrap_or_else(|_| Err(timed_out()));
        length.map_err(|error| {
            self.inner
                .connection
                .connector()
                .key_error(error, "XLEN", &parked)
        })
    }

    /// Tells the mover to stop (and later parks to fail) without waiting
    /// for it: a broker stopping several parkings tells each first, then
    /// waits for them within one bound.
    pub(crate) fn stop_soon(&self) {
        self.inner.stop.send_replace(true);
    }

    /// Stops the mover (a round in flight is dropped: its script ran whole
    /// on the server or not at all); later parks fail, and the parking
    /// layer retries those messages the ordinary way. A park under way
    /// finishes within its bound. What is parked stays parked, for the next
    /// instance's mover. Every clone is shut down.
    pub async fn shutdown(&self) {
        self.inner.stop.send_replace(true);
        let mover = self
            .inner
            .mover
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(mover) = mover {
            // The mover watches the stop at every await, so it ends at its
            // next poll; the bound is for a runtime too busy to poll it.
            let _ = tokio::time::timeout(self.inner.command_timeout, mover).await;
        }
    }

    /// The keys of the stream `message` was parked from: the stream it was
    /// consumed from, or the one whose return stream it came back through.
    fn keys_of(&self, message: &Message) -> Option<&StreamKeys> {
        let source: &str = message.metadata().source();
        self.inner
            .keys
            .iter()
            .find(|keys| *keys.stream == *source || keys.returned == source)
    }
}

#[async_trait::async_trait]
impl Parking for RedisParking {
    async fn park(&self, message: &Message, delay: Duration) -> Result<Parked, ParkError> {
        if *self.inner.stop.borrow() {
            return Err(ParkError::new(refused("the parking was shut down")));
        }
        let Some(keys) = self.keys_of(message) else {
            let stream: &str = message.metadata().source();
            return Err(ParkError::new(Error::from(ConfigError::new(
                "consumed_stream",
                format!(
                    "does not name `{stream}` (nor a stream whose return stream it is): its \
                     parked messages would never come back; name it when building the parking"
                ),
            ))));
        };
        let mut headers = message.headers().clone();
        if let Some(key) = message.key()
            && !headers.iter().any(|header| header.value == *key)
        {
            return Err(ParkError::new(refused(
                "its key is carried by none of its fields, so a parked copy would come back \
                 without it (a message the source decoded keeps its key field)",
            )));
        }
        // The origin is added below when missing: counted here already.
        let added = usize::from(headers.get(ORIGIN).is_none());
        let values = 2 * (1 + headers.len() + added);
        if values > MAX_DEAD_LETTER_VALUES {
            return Err(ParkError::new(refused(format!(
                "it has {} fields; a parked entry is moved back by a script, which takes at \
                 most {MAX_DEAD_LETTER_VALUES} names and values",
                headers.len() + 1
            ))));
        }
        let due = headers.get_str(DUE).and_then(|due| due.parse::<u64>().ok());
        if due.is_none() {
            // The parking layer sets it; a caller without the layer gets the
            // delay it asked for.
            headers.set(DUE, unix_millis(SystemTime::now() + delay).to_string());
        }
        if added > 0 {
            headers.set(ORIGIN, keys.stream.to_string());
        }
        // The payload field first, then the headers in order, as a
        // publisher writes them: the copy holds exactly the fields the
        // original had (its key field among the headers) and the park
        // headers.
        let mut command = redis::cmd("XADD");
        command.arg(&keys.parked).arg("*");
        entry_fields(
            &mut command,
            &self.inner.payload_field,
            message.payload(),
            None,
            &headers,
        );
        let mut connection = self.inner.connection.get();
        // The connection's own response timeout does not cover waiting for
        // a reconnect; this bounds both.
        let reply = tokio::time::timeout(
            self.inner.command_timeout,
            command.query_async::<Value>(&mut connection),
        )
        .await
        .unwrap_or_else(|_| Err(timed_out()));
        match reply {
            Ok(Value::BulkString(_) | Value::SimpleString(_)) => {}
            Ok(_) => {
                return Err(ParkError::new(Error::UnexpectedReply {
                    command: "XADD",
                    detail: format!("no entry id for the park in `{}`", keys.parked),
                }));
            }
            Err(error) => {
                self.inner.connection.replace_if_replica(&error).await;
                return Err(ParkError::new(self.inner.connection.connector().key_error(
                    error,
                    "XADD",
                    &keys.parked,
                )));
            }
        }
        self.inner.wake.notify_one();
        Ok(Parked::Moved)
    }

    /// An entry of one of the return streams, where only the mover writes.
    fn is_returned_copy(&self, message: &Message) -> bool {
        let source: &str = message.metadata().source();
        self.inner.keys.iter().any(|keys| keys.returned == source)
    }
}

/// Why `park` refused a message: its copy could not come back as the
/// message it is.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Unparkable(String);

fn refused(why: impl Into<String>) -> Unparkable {
    Unparkable(why.into())
}

fn unix_millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    })
}

fn timed_out() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no reply within the command timeout",
    ))
}

/// The keys of one stream's parking.
#[derive(Clone, Debug)]
struct StreamKeys {
    /// The stream whose messages are parked.
    stream: Arc<str>,
    /// Where they come back.
    returned: String,
    parked: String,
    due: String,
}

impl StreamKeys {
    fn new(stream: &str, group: &str, returned: Option<&str>) -> Self {
        Self {
            stream: Arc::from(stream),
            returned: returned
                .map_or_else(|| RedisParking::return_stream(stream, group), str::to_owned),
            parked: RedisParking::parked_stream(stream, group),
            due: RedisParking::due_index(stream, group),
        }
    }
}

/// What one round on one stream did.
#[derive(Debug, Default, PartialEq, Eq)]
struct Round {
    indexed: u64,
    undated: u64,
    moved: u64,
    vanished: u64,
    /// A limit was reached: more may be waiting now.
    more: bool,
    /// The earliest due time left in the index (ms since the epoch).
    next_due: Option<u64>,
    /// Ids too large to move, dropped from the index.
    left: Vec<String>,
    /// Entries trimmed from the return stream: every group on it had read
    /// and acknowledged them.
    trimmed: u64,
}

impl Round {
    fn parse(reply: Value) -> Option<Self> {
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

/// Moves due entries back; see [`RedisParking`].
struct Mover {
    connection: SharedConnection,
    keys: Vec<StreamKeys>,
    /// The consumer group that reads the return streams.
    group: String,
    batch: usize,
    max_len: Option<u64>,
    poll_interval: Duration,
    command_timeout: Duration,
    reconnect: Exponential,
    wake: Arc<Notify>,
    /// Rounds failed in a row.
    failures: u32,
}

impl Mover {
    /// Runs after a first round (in `build`) that asked for `wait`, until
    /// told to stop or the parking is gone.
    async fn run(mut self, mut wait: Duration, mut stop: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                biased;
                _ = stop.wait_for(|stopped| *stopped) => break,
                () = self.wake.notified() => {}
                () = tokio::time::sleep(wait) => {}
            }
            wait = tokio::select! {
                biased;
                _ = stop.wait_for(|stopped| *stopped) => break,
                wait = self.rounds() => wait,
            };
        }
        tracing::debug!(
            endpoint = %self.connection.connector().endpoint(),
            "Redis parking mover stopped"
        );
    }

    /// One round on every stream; how long to wait before the next.
    async fn rounds(&mut self) -> Duration {
        let mut wait = self.poll_interval;
        let mut failed = 0;
        for keys in &self.keys {
            match self.round(keys).await {
                Ok(round) => {
                    report(keys, &round);
                    wait = pace(wait, &round);
                }
                Err(error) => {
                    failed += 1;
                    if self.failures == 0 {
                        tracing::warn!(
                            stream = %keys.stream,
                            %error,
                            "moving parked messages back failed; retrying with backoff (they \
                             stay parked meanwhile)"
                        );
                    } else {
                        tracing::debug!(stream = %keys.stream, %error, "moving parked messages back still fails");
                    }
                }
            }
        }
        if failed == 0 {
            if self.failures > 0 {
                tracing::info!(
                    endpoint = %self.connection.connector().endpoint(),
                    "moving parked messages back works again"
                );
                self.failures = 0;
            }
            return wait;
        }
        self.failures = self.failures.saturating_add(1);
        let backoff = self
            .reconnect
            .delay(self.failures)
            .unwrap_or(LONGEST_BACKOFF);
        if failed == self.keys.len() {
            backoff
        } else {
            // The streams that work keep their pace; the failing one is
            // tried with them.
            wait
        }
    }

    /// Runs the round script on one stream.
    async fn round(&self, keys: &StreamKeys) -> Result<Round, Error> {
        let mut invocation = ROUND.prepare_invoke();
        invocation
            .key(&keys.returned)
            .key(&keys.parked)
            .key(&keys.due)
            .arg(unix_millis(SystemTime::now()))
            .arg(self.batch)
            .arg(INDEX_PER_ROUND)
            .arg(DUE)
            .arg(RedisParking::MOVER_GROUP)
            .arg(MAX_DEAD_LETTER_VALUES);
        match self.max_len {
            Some(max_len) => invocation.arg(max_len),
            None => invocation.arg(""),
        };
        invocation.arg(&self.group);
        let mut connection = self.connection.get();
        // The connection's own response timeout does not cover waiting for
        // a reconnect; this bounds both.
        let reply = tokio::time::timeout(
            self.command_timeout,
            invocation.invoke_async::<Value>(&mut connection),
        )
        .await
        .unwrap_or_else(|_| Err(timed_out()));
        match reply {
            Ok(reply) => Round::parse(reply).ok_or_else(|| Error::UnexpectedReply {
                command: "EVALSHA",
                detail: "not the reply of the parking round script".to_owned(),
            }),
            Err(error) => {
                self.connection.replace_if_replica(&error).await;
                let keys = format!("{}, {}, {}", keys.returned, keys.parked, keys.due);
                Err(self
                    .connection
                    .connector()
                    .key_error(error, "EVALSHA", &keys))
            }
        }
    }
}

/// How long to wait after `round`, at most `wait`: not at all when it
/// reached a limit, otherwise until the earliest due time it left.
fn pace(wait: Duration, round: &Round) -> Duration {
    if round.more {
        return Duration::ZERO;
    }
    match round.next_due {
        Some(due) => {
            let until = due.saturating_sub(unix_millis(SystemTime::now()));
            wait.min(Duration::from_millis(until))
        }
        None => wait,
    }
}

/// Logs what a round did that someone may look for.
fn report(keys: &StreamKeys, round: &Round) {
    if round.moved > 0 || round.indexed > 0 || round.trimmed > 0 {
        tracing::debug!(
            stream = %keys.stream,
            return_stream = %keys.returned,
            indexed = round.indexed,
            moved = round.moved,
            trimmed = round.trimmed,
            "parked messages indexed and moved to the return stream; copies every group \
             acknowledged trimmed from it"
        );
    }
    if round.undated > 0 {
        tracing::warn!(
            stream = %keys.stream,
            parked_stream = %keys.parked,
            entries = round.undated,
            "parked entries without a valid due time (`{DUE}`) are moved back at once"
        );
    }
    if round.vanished > 0 {
        tracing::warn!(
            stream = %keys.stream,
            parked_stream = %keys.parked,
            entries = round.vanished,
            "due parked entries were no longer in the parking stream (deleted or trimmed); \
             dropped from the due index"
        );
    }
    if !round.left.is_empty() {
        tracing::error!(
            stream = %keys.stream,
            parked_stream = %keys.parked,
            ids = ?round.left,
            "parked entries have more fields than a script can move; left in the parking \
             stream and dropped from the due index: move them by hand"
        );
    }
}

/// Builds a [`RedisParking`]; see [`RedisParking::builder`] and
/// [`RedisStreamsSource::parking`](crate::RedisStreamsSource::parking).
#[derive(Clone)]
#[must_use = "a builder does nothing until `.build().await`"]
pub struct RedisParkingBuilder {
    server: Server,
    tls_root_certificate: Option<Vec<u8>>,
    /// `None`: the default, or the source's for a builder from a source.
    connect_timeout: Option<Duration>,
    command_timeout: Duration,
    consumed: Vec<String>,
    group: Option<String>,
    /// Return streams set by hand: (consumed stream, return stream).
    returns: Vec<(String, String)>,
    /// The streams the source reads, for a builder from a source: each
    /// return stream must be among them.
    read_by_source: Option<Vec<String>>,
    payload_field: String,
    max_len: Option<u64>,
    batch: usize,
    poll_interval: Duration,
}

/// Where a parking connects.
#[derive(Clone)]
enum Server {
    Url(SecretUrl),
    /// As the source it was made from does (server, TLS, timeouts).
    Source(Box<Connector>),
}

impl fmt::Debug for RedisParkingBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("RedisParkingBuilder");
        match &self.server {
            Server::Url(url) => debug.field("url", url),
            Server::Source(connector) => debug.field("source_endpoint", connector.endpoint()),
        };
        debug
            .field("group", &self.group)
            .field("consumed", &self.consumed)
            .field("return_streams", &self.returns)
            .field("read_by_source", &self.read_by_source)
            .field("payload_field", &self.payload_field)
            .field("max_len", &self.max_len)
            .field("batch", &self.batch)
            .field("poll_interval", &self.poll_interval)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("tls_root_certificate", &self.tls_root_certificate.is_some())
            .finish()
    }
}

impl RedisParkingBuilder {
    /// Default of [`batch`](Self::batch).
    pub const DEFAULT_BATCH: usize = 100;
    /// The largest [`batch`](Self::batch): a script holds the server while
    /// it runs.
    pub const MAX_BATCH: usize = 1_000;
    /// Default of [`poll_interval`](Self::poll_interval).
    pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);

    fn new(url: impl Into<String>) -> Self {
        Self::on(Server::Url(SecretUrl::new(url)))
    }

    fn on(server: Server) -> Self {
        Self {
            server,
            tls_root_certificate: None,
            connect_timeout: None,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            consumed: Vec::new(),
            group: None,
            returns: Vec::new(),
            read_by_source: None,
            payload_field: DEFAULT_PAYLOAD_FIELD.to_owned(),
            max_len: None,
            batch: Self::DEFAULT_BATCH,
            poll_interval: Self::DEFAULT_POLL_INTERVAL,
        }
    }

    /// A builder prefilled from a source: its server and TLS settings, its
    /// group, its payload field, and as consumed streams those of its
    /// streams that are not the default return stream of another.
    pub(crate) fn from_source(connector: Connector, settings: &Settings) -> Self {
        let streams: Vec<String> = settings.streams.iter().map(|s| s.to_string()).collect();
        let group = settings.group.as_deref().map(str::to_owned);
        let consumed = streams
            .iter()
            .filter(|stream| {
                group.as_deref().is_none_or(|group| {
                    !streams
                        .iter()
                        .any(|other| RedisParking::return_stream(other, group) == **stream)
                })
            })
            .cloned()
            .collect();
        Self {
            consumed,
            group,
            read_by_source: Some(streams),
            payload_field: settings.payload_field.to_string(),
            ..Self::on(Server::Source(Box::new(connector)))
        }
    }

    /// The consumer group whose messages this parks: the group that reads
    /// the return streams, and part of the name of every key of the
    /// parking. Required; a builder from a source has the source's.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Names a stream whose messages this parks, and whose parked messages
    /// its mover moves to the stream's return stream. Call it once per
    /// stream the consumer reads, its return streams aside; a builder from
    /// a source names the source's.
    pub fn consumed_stream(mut self, stream: impl Into<String>) -> Self {
        self.consumed.push(stream.into());
        self
    }

    /// Sets where the parked messages of consumed stream `stream` come
    /// back (default [`RedisParking::return_stream`]`(stream, group)`). The
    /// group's source must read it, and no other consumer: every reader of
    /// a return stream receives each copy. A builder from a source no
    /// longer takes `return_stream` for a stream of its own to park.
    pub fn return_stream(
        mut self,
        stream: impl Into<String>,
        return_stream: impl Into<String>,
    ) -> Self {
        let (stream, return_stream) = (stream.into(), return_stream.into());
        self.consumed.retain(|consumed| *consumed != return_stream);
        self.returns.retain(|(consumed, _)| *consumed != stream);
        self.returns.push((stream, return_stream));
        self
    }

    /// The field that carries each entry's payload (default `payload`): the
    /// source's [`payload_field`](crate::RedisStreamsSourceBuilder::payload_field).
    pub fn payload_field(mut self, field: impl Into<String>) -> Self {
        self.payload_field = field.into();
        self
    }

    /// Also trims each return stream a parked message moves into to about
    /// `max_len` entries (`XADD … MAXLEN ~ max_len`). Default: no such
    /// bound. Not needed to keep a return stream small: every round of the
    /// mover trims the copies its group acknowledged (see [`RedisParking`]).
    /// A hard bound on top, at the price that a copy the group has not read
    /// yet is trimmed too (lost) when the group lags that far behind. The
    /// parking streams are never trimmed.
    pub fn max_len(mut self, max_len: u64) -> Self {
        self.max_len = Some(max_len);
        self
    }

    /// Most due messages one round moves back per stream (default 100, at
    /// most [`MAX_BATCH`](Self::MAX_BATCH)); a round that moves this many
    /// is followed by another at once.
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch;
        self
    }

    /// The longest the mover sleeps between rounds (default 1 s): how late,
    /// at most, it notices a message another instance parked with a shorter
    /// delay than the ones it knows of.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// How long to wait for a connection (default 5 s). A builder from a
    /// source connects as the source does and refuses this setting.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// How long to wait for the reply to a park or a round, reconnecting
    /// included (default 5 s).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// Trusts the CA certificate `pem` (PEM text) instead of the platform's
    /// root certificates, for a `rediss://` server whose certificate a
    /// private CA signed. A builder from a source connects as the source
    /// does and refuses this setting.
    #[cfg(feature = "tls")]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_certificate = Some(pem.into());
        self
    }

    /// The keys of each consumed stream, once `check` passed.
    fn keys(&self, group: &str) -> Vec<StreamKeys> {
        self.consumed
            .iter()
            .map(|stream| {
                let returned = self
                    .returns
                    .iter()
                    .find(|(consumed, _)| consumed == stream)
                    .map(|(_, returned)| returned.as_str());
                StreamKeys::new(stream, group, returned)
            })
            .collect()
    }

    fn check(&self) -> Result<&str, ConfigError> {
        let group = match self.group.as_deref() {
            Some("") => return Err(ConfigError::new("group", "is empty")),
            Some(group) => group,
            None => {
                return Err(ConfigError::new(
                    "group",
                    "names no consumer group: parked messages come back to a stream only \
                     their group reads (a broadcast reader has none, so it cannot park)",
                ));
            }
        };
        if self.consumed.is_empty() {
            return Err(ConfigError::new(
                "consumed_stream",
                "names no stream: name each stream whose messages are parked",
            ));
        }
        if self.consumed.iter().any(String::is_empty) {
            return Err(ConfigError::new("consumed_stream", "is empty"));
        }
        for (stream, returned) in &self.returns {
            if returned.is_empty() {
                return Err(ConfigError::new("return_stream", "is empty"));
            }
            if !self.consumed.contains(stream) {
                return Err(ConfigError::new(
                    "return_stream",
                    format!("is set for `{stream}`, which is no consumed stream"),
                ));
            }
        }
        let keys = self.keys(group);
        for (n, own) in keys.iter().enumerate() {
            for (name, what) in [
                (&own.returned, "come back"),
                (&own.parked, "wait while parked"),
                (&own.due, "are indexed while parked"),
            ] {
                if self.consumed.contains(name) {
                    return Err(ConfigError::new(
                        "consumed_stream",
                        format!(
                            "`{name}` is where the parked messages of `{}` {what}; it cannot \
                             be a consumed stream too",
                            own.stream
                        ),
                    ));
                }
            }
            if let Some(other) = keys[..n]
                .iter()
                .find(|other| other.returned == own.returned)
            {
                return Err(ConfigError::new(
                    "return_stream",
                    format!(
                        "`{}` is the return stream of both `{}` and `{}`; give each stream \
                         its own",
                        own.returned, other.stream, own.stream
                    ),
                ));
            }
            if let Some(read) = &self.read_by_source
                && !read.contains(&own.returned)
            {
                return Err(ConfigError::new(
                    "return_stream",
                    format!(
                        "`{}`, where the parked messages of `{}` come back, is not read by the \
                         source: add `.stream(\"{}\")` to the source's builder",
                        own.returned, own.stream, own.returned
                    ),
                ));
            }
        }
        if matches!(self.server, Server::Source(_)) {
            if self.tls_root_certificate.is_some() {
                return Err(ConfigError::new(
                    "tls_root_certificate",
                    "is set on a parking built from a source, which connects as the source \
                     does: set it on the source",
                ));
            }
            if self.connect_timeout.is_some() {
                return Err(ConfigError::new(
                    "connect_timeout",
                    "is set on a parking built from a source, which connects as the source \
                     does: set it on the source",
                ));
            }
        }
        if self.payload_field.is_empty() {
            return Err(ConfigError::new("payload_field", "is empty"));
        }
        if self.max_len == Some(0) {
            return Err(ConfigError::new(
                "max_len",
                "is 0, which would trim every entry away",
            ));
        }
        if self.batch == 0 || self.batch > Self::MAX_BATCH {
            return Err(ConfigError::new(
                "batch",
                format!("must be 1 to {}", Self::MAX_BATCH),
            ));
        }
        for (name, timeout) in [
            ("poll_interval", self.poll_interval),
            (
                "connect_timeout",
                self.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
            ),
            ("command_timeout", self.command_timeout),
        ] {
            if timeout.is_zero() {
                return Err(ConfigError::new(name, "is zero"));
            }
        }
        Ok(group)
    }

    /// Checks the settings, connects, runs a first round of the mover (so
    /// that a key of the wrong type or a missing permission fails here, and
    /// messages already due move at once) and starts the mover task on the
    /// current Tokio runtime.
    ///
    /// Fails with [`Error::Config`] for a setting that cannot work (no
    /// group; from a source, a return stream the source does not read),
    /// before connecting, and with a typed error for a bad URL, an
    /// unreachable server, refused credentials or a key of the wrong type
    /// (none of them shows the password).
    pub async fn build(self) -> Result<RedisParking, Error> {
        let group = self.check()?.to_owned();
        let connector = match &self.server {
            Server::Url(url) => Connector::new(
                url,
                self.tls_root_certificate.as_deref(),
                self.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
                self.command_timeout,
            )?,
            Server::Source(connector) => (**connector).clone(),
        };
        let connection = SharedConnection::new(connector.shared().await?, connector);
        let keys = self.keys(&group);
        let wake = Arc::new(Notify::new());
        let mover = Mover {
            connection: connection.clone(),
            keys: keys.clone(),
            group: group.clone(),
            batch: self.batch,
            max_len: self.max_len,
            poll_interval: self.poll_interval,
            command_timeout: self.command_timeout,
            reconnect: Exponential::new(Duration::from_millis(100), LONGEST_BACKOFF)
                .retry_forever(),
            wake: Arc::clone(&wake),
            failures: 0,
        };
        let mut wait = mover.poll_interval;
        for keys in &mover.keys {
            let round = mover.round(keys).await?;
            report(keys, &round);
            wait = pace(wait, &round);
        }
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(mover.run(wait, stopped));
        tracing::debug!(
            endpoint = %connection.connector().endpoint(),
            group,
            keys = ?keys,
            "Redis parking started"
        );
        Ok(RedisParking {
            inner: Arc::new(Inner {
                keys,
                group,
                payload_field: self.payload_field,
                connection,
                wake,
                stop,
                mover: Mutex::new(Some(task)),
                command_timeout: self.command_timeout,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_that_cannot_work_are_refused_before_connecting() {
        let builder = || {
            RedisParking::builder("redis://127.0.0.1")
                .group("billing")
                .consumed_stream("orders")
        };
        let refused = [
            (
                RedisParking::builder("redis://127.0.0.1").consumed_stream("orders"),
                "group",
            ),
            (builder().group(""), "group"),
            (
                RedisParking::builder("redis://127.0.0.1").group("billing"),
                "consumed_stream",
            ),
            (builder().consumed_stream(""), "consumed_stream"),
            (
                builder().consumed_stream("orders:billing:parked"),
                "consumed_stream",
            ),
            (
                builder().consumed_stream("orders:billing:returned"),
                "consumed_stream",
            ),
            (builder().return_stream("orders", ""), "return_stream"),
            (builder().return_stream("payments", "back"), "return_stream"),
            (
                builder()
                    .consumed_stream("payments")
                    .return_stream("orders", "back")
                    .return_stream("payments", "back"),
                "return_stream",
            ),
            (builder().payload_field(""), "payload_field"),
            (builder().max_len(0), "max_len"),
            (builder().batch(0), "batch"),
            (builder().batch(RedisParkingBuilder::MAX_BATCH + 1), "batch"),
            (builder().poll_interval(Duration::ZERO), "poll_interval"),
            (builder().connect_timeout(Duration::ZERO), "connect_timeout"),
            (builder().command_timeout(Duration::ZERO), "command_timeout"),
        ];
        for (builder, setting) in refused {
            let error = builder.check().err().map(|error| error.to_string());
            assert!(
                error
                    .as_deref()
                    .is_some_and(|error| error.contains(setting)),
                "{setting}: {error:?}"
            );
        }
        assert!(builder().consumed_stream("payments").check().is_ok());
        let custom = builder().return_stream("orders", "orders:back");
        assert_eq!(custom.check().ok(), Some("billing"));
        assert_eq!(custom.keys("billing")[0].returned, "orders:back");
    }

    /// A builder as `RedisStreamsSource::parking` makes it for a source
    /// of `streams` in `group`.
    fn from_source(streams: &[&str], group: Option<&str>) -> RedisParkingBuilder {
        let connector = Connector::new(
            &SecretUrl::new("redis://127.0.0.1"),
            None,
            DEFAULT_CONNECT_TIMEOUT,
            DEFAULT_COMMAND_TIMEOUT,
        )
        .expect("a valid URL");
        let settings = Settings {
            streams: streams.iter().map(|s| (*s).into()).collect(),
            group: group.map(Arc::from),
            consumer: Arc::from("c1"),
            payload_field: Arc::from("body"),
            key_field: None,
            key_order: true,
            start: crate::StartFrom::Beginning,
            block: Duration::from_secs(1),
            claim_min_idle: Duration::from_secs(30),
            claim_interval: Duration::from_secs(5),
            max_deliveries: None,
            dead_letter_stream: crate::DeadLetterStream::default(),
            delete_acked: false,
            reconnect: Arc::new(Exponential::new(
                Duration::from_millis(100),
                LONGEST_BACKOFF,
            )),
            stats: Arc::default(),
        };
        RedisParkingBuilder::from_source(connector, &settings)
    }

    #[test]
    fn a_builder_from_a_source_parks_its_streams_and_needs_it_to_read_their_return_streams() {
        let both = from_source(&["orders", "orders:billing:returned"], Some("billing"));
        assert_eq!(
            both.consumed,
            ["orders"],
            "the return stream is no stream to park"
        );
        assert_eq!(both.payload_field, "body");
        assert_eq!(both.check().ok(), Some("billing"));

        let forgotten = from_source(&["orders"], Some("billing"))
            .check()
            .err()
            .map(|error| error.to_string());
        assert!(
            forgotten
                .as_deref()
                .is_some_and(|error| error.contains(".stream(\"orders:billing:returned\")")),
            "{forgotten:?}"
        );
        // A return stream of another group is a stream like any other: its
        // own return stream is missing.
        assert!(
            from_source(&["orders", "orders:shipping:returned"], Some("billing"))
                .check()
                .is_err()
        );
        // A return stream set by hand that the source reads.
        let custom = from_source(&["orders", "orders:back"], Some("billing"))
            .return_stream("orders", "orders:back");
        assert_eq!(custom.consumed, ["orders"]);
        assert!(custom.check().is_ok(), "{:?}", custom.check());

        let broadcast = from_source(&["orders"], None).check().err();
        assert!(
            broadcast.is_some_and(|error| error.to_string().contains("group")),
            "a broadcast reader has no group to park for"
        );
        let timeout = both.clone().connect_timeout(Duration::from_secs(1));
        assert!(
            timeout
                .check()
                .is_err_and(|error| error.to_string().contains("connect_timeout")),
            "connects as the source does"
        );
        #[cfg(feature = "tls")]
        {
            let tls = both.clone().tls_root_certificate("pem");
            assert!(
                tls.check()
                    .is_err_and(|error| error.to_string().contains("tls_root_certificate")),
                "connects as the source does"
            );
        }
    }

    #[test]
    fn the_builder_shows_no_password() {
        let builder = RedisParking::builder("redis://app:s3cr3t@cache:6379");
        let shown = format!("{builder:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("cache:6379"), "{shown}");
    }

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
