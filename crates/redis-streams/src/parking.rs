//! [`RedisParking`]: retry later without blocking, on Redis. A message is
//! parked in a stream of its own, indexed by its due time, and moved back
//! into the stream it came from by a mover once due.
//!
//! How it parks, what it costs and its limits are on [`RedisParking`],
//! where the crate's documentation shows them.

use std::fmt;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use intake_core::parking::{DUE, ParkError, Parked, Parking};
use intake_core::publish::{Output, Publisher};
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
use crate::publisher::{RedisStreamsPublisher, RedisStreamsPublisherBuilder};
use crate::settings::DEFAULT_PAYLOAD_FIELD;

/// Most parked entries one round indexes per stream; a round that reads
/// this many runs again at once.
const INDEX_PER_ROUND: usize = 1_000;

/// The longest wait between failed rounds, should the policy give up
/// (the crate's never does): the mover itself never gives up.
const LONGEST_BACKOFF: Duration = Duration::from_secs(10);

/// One round of the mover on one stream; see [`RedisParking`].
///
/// `KEYS[1]` the stream, `KEYS[2]` its parking stream, `KEYS[3]` its due
/// index; `ARGV[1]` now (ms since the epoch, the mover's clock), `ARGV[2]`
/// most entries moved, `ARGV[3]` most entries indexed per read, `ARGV[4]`
/// the due header's name, `ARGV[5]` the parking stream's group, `ARGV[6]`
/// most values an entry may have to be moved, `ARGV[7]` `MAXLEN` of the
/// stream (empty: none).
///
/// Returns `{indexed, undated, moved, vanished, more, next due or -1,
/// {ids left in the parking stream}}`.
///
/// The types are checked first and the calls that can fail on an entry's
/// content (`XRANGE` of an id from the index) are `pcall`ed: a script is
/// not rolled back, so an error after the `XREADGROUP` would otherwise
/// stall on the same entry every round. The entries read are acknowledged
/// only after they are indexed, so a round that fails in between (`OOM`)
/// leaves them pending for the next, which reads its pending ones (`0`)
/// before new ones (`>`).
static ROUND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
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
return {indexed, undated, moved, vanished, more, next_due, left}
",
    )
});

/// Parks messages of Redis streams for a while and moves them back into
/// their stream once due: the [`Parking`] of the Redis backend, for
/// [`ParkingLayer`](intake_core::parking::ParkingLayer).
///
/// Build one with [`RedisParking::builder`], naming the streams whose
/// messages it parks, and hand a clone to the layer. Clones share the
/// mover, which stops once every clone is dropped or at
/// [`shutdown`](Self::shutdown).
///
/// # How it parks
///
/// A park is one `XADD` of the message to the parking stream
/// `<stream>:parked`, written by a [`RedisStreamsPublisher`] and confirmed by
/// the entry id Redis answers: the same fields the source reads (the payload
/// field, then every header in order; the key is among them, since the
/// source keeps its key field as a header), the park headers included
/// ([`DUE`] among them). [`park`](Parking::park) returns
/// [`Parked::Moved`] only after that confirmation, so the original is
/// acknowledged only once its copy is stored.
///
/// A park is a single command, hence atomic by itself: there is no moment
/// at which the copy exists and its due time is unknown, since the due time
/// travels in the entry. The due index, the sorted set
/// `<stream>:parked:due` of parked entry ids scored by due time
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
///    stream (with `MAXLEN ~` when [`max_len`](RedisParkingBuilder::max_len)
///    is set), then `XDEL` from the parking stream and `ZREM` from the
///    index. A script is never interleaved with another, so two movers
///    never move the same entry, and it stops at the first failing call:
///    an entry is moved whole or not at all;
/// 3. answers the earliest due time left.
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
/// Per parked message: one pipelined `XADD`, and on the server the entry in
/// the parking stream plus a member of the index until it is moved; moving
/// it back is an `XRANGE`, `XADD`, `XDEL` and `ZREM` within a round's
/// script. An idle mover runs one short script per stream per poll
/// interval. Each [`RedisParking`] holds two connections: the publisher's
/// and the mover's.
///
/// # Limits
///
/// - A moved message is a **new entry** of its stream: it has a new entry id
///   (position), its attempt counts from 1 again (the [`ATTEMPTS`] header
///   carries the attempts before), and **every consumer group reading the
///   stream receives it**, not only the group that parked it, as does any
///   broadcast reader. Park where one group reads the stream.
/// - A message the source did not decode (its key carried by no field) or
///   with more than about 3,500 fields is refused: the parking layer then
///   retries it the ordinary way.
/// - The parking stream must not be trimmed (`MAXLEN`): what is trimmed is
///   lost. The three keys of a stream are not hash-tagged; like the rest of
///   this crate, parking is for a single Redis server (or a replicated one),
///   not Redis Cluster.
///
/// ```no_run
/// use std::time::Duration;
/// use intake_core::parking::ParkingLayer;
/// use intake_core::{Consumer, HandlerError, Message};
/// use intake_redis_streams::{RedisParking, RedisStreamsSource};
/// use tokio_util::sync::CancellationToken;
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let url = "redis://127.0.0.1:6379";
/// let source = RedisStreamsSource::builder(url)
///     .stream("orders")
///     .group("billing")
///     .key_field("customer")
///     .build()
///     .await?;
/// let acker = source.acker();
/// let parking = RedisParking::builder(url).consumed_stream("orders").build().await?;
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
    publisher: RedisStreamsPublisher,
    /// The streams whose messages this parks (and whose parked entries its
    /// mover moves back).
    streams: Vec<Arc<str>>,
    /// The mover's connection, also for [`RedisParking::waiting`].
    connection: SharedConnection,
    /// Wakes the mover after a park of this process.
    wake: Arc<Notify>,
    /// Turns true to stop the mover.
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
        f.debug_struct("RedisParking")
            .field("endpoint", self.endpoint())
            .field("streams", &self.inner.streams)
            .finish_non_exhaustive()
    }
}

impl RedisParking {
    /// What a stream's parking stream is named after it: `orders:parked`.
    pub const PARKED_SUFFIX: &'static str = ":parked";
    /// What a stream's due index is named after it: `orders:parked:due`.
    pub const DUE_SUFFIX: &'static str = ":parked:due";
    /// The consumer group of every parking stream through which the movers
    /// index new parked entries.
    pub const MOVER_GROUP: &'static str = "intake-parking";

    /// A builder of a parking on connections of its own to the server at
    /// `url` (`redis://[user[:password]@]host[:port][/db]`, or `rediss://`
    /// for TLS). Name the streams whose messages it parks with
    /// [`consumed_stream`](RedisParkingBuilder::consumed_stream).
    pub fn builder(url: impl Into<String>) -> RedisParkingBuilder {
        RedisParkingBuilder::new(url)
    }

    /// The parking stream of `stream`.
    pub fn parked_stream(stream: &str) -> String {
        format!("{stream}{}", Self::PARKED_SUFFIX)
    }

    /// The due index of `stream`.
    pub fn due_index(stream: &str) -> String {
        format!("{stream}{}", Self::DUE_SUFFIX)
    }

    /// The server it parks on, without password.
    pub fn endpoint(&self) -> &Endpoint {
        self.inner.connection.connector().endpoint()
    }

    /// How many messages of `stream` are parked and not moved back yet, by
    /// any instance (`XLEN` of its parking stream).
    pub async fn waiting(&self, stream: &str) -> Result<u64, Error> {
        let parked = Self::parked_stream(stream);
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

    /// Stops the mover (a round in flight is dropped: its script ran whole
    /// on the server or not at all) and closes the publisher once the parks
    /// under way are answered; later parks fail, and the parking layer
    /// retries those messages the ordinary way. What is parked stays
    /// parked, for the next instance's mover. Every clone is shut down.
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
        self.inner.publisher.close().await;
    }
}

#[async_trait::async_trait]
impl Parking for RedisParking {
    async fn park(&self, message: &Message, delay: Duration) -> Result<Parked, ParkError> {
        let stream: &str = message.metadata().source();
        if !self.inner.streams.iter().any(|known| **known == *stream) {
            return Err(ParkError::new(Error::from(ConfigError::new(
                "consumed_stream",
                format!(
                    "does not name `{stream}`: its parked messages would never be moved back; \
                     name it when building the parking"
                ),
            ))));
        }
        let mut headers = message.headers().clone();
        if let Some(key) = message.key()
            && !headers.iter().any(|header| header.value == *key)
        {
            return Err(ParkError::new(refused(
                "its key is carried by none of its fields, so a parked copy would come back \
                 without it (a message the source decoded keeps its key field)",
            )));
        }
        let values = 2 * (1 + headers.len());
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
        // No key on the output: the key is one of the headers already, and
        // the copy must hold exactly the fields the original had.
        let output = Output::new(Self::parked_stream(stream), message.payload().clone())
            .with_headers(headers);
        let receipt = self
            .inner
            .publisher
            .send(output)
            .await
            .map_err(ParkError::new)?;
        receipt.await.map_err(ParkError::new)?;
        self.inner.wake.notify_one();
        Ok(Parked::Moved)
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
struct StreamKeys {
    stream: Arc<str>,
    parked: String,
    due: String,
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
}

impl Round {
    fn parse(reply: Value) -> Option<Self> {
        let Value::Array(items) = reply else {
            return None;
        };
        let [indexed, undated, moved, vanished, more, next_due, left] =
            <[Value; 7]>::try_from(items).ok()?;
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
        })
    }
}

/// Moves due entries back; see [`RedisParking`].
struct Mover {
    connection: SharedConnection,
    keys: Vec<StreamKeys>,
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
            .key(&*keys.stream)
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
                let keys = format!("{}, {}, {}", keys.stream, keys.parked, keys.due);
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
    if round.moved > 0 || round.indexed > 0 {
        tracing::debug!(
            stream = %keys.stream,
            indexed = round.indexed,
            moved = round.moved,
            "parked messages indexed and moved back"
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

/// Builds a [`RedisParking`]; see [`RedisParking::builder`].
#[derive(Clone)]
#[must_use = "a builder does nothing until `.build().await`"]
pub struct RedisParkingBuilder {
    url: SecretUrl,
    /// Holds the URL as given, for the publisher that writes the parks.
    publisher: RedisStreamsPublisherBuilder,
    tls_root_certificate: Option<Vec<u8>>,
    connect_timeout: Duration,
    command_timeout: Duration,
    consumed: Vec<String>,
    payload_field: String,
    max_len: Option<u64>,
    batch: usize,
    poll_interval: Duration,
}

impl fmt::Debug for RedisParkingBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisParkingBuilder")
            .field("url", &self.url)
            .field("consumed", &self.consumed)
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
        let url = url.into();
        Self {
            url: SecretUrl::new(url.clone()),
            publisher: RedisStreamsPublisher::builder(url),
            tls_root_certificate: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            consumed: Vec::new(),
            payload_field: DEFAULT_PAYLOAD_FIELD.to_owned(),
            max_len: None,
            batch: Self::DEFAULT_BATCH,
            poll_interval: Self::DEFAULT_POLL_INTERVAL,
        }
    }

    /// Names a stream whose messages this parks, and whose parked messages
    /// its mover moves back. Call it once per stream the consumer reads.
    pub fn consumed_stream(mut self, stream: impl Into<String>) -> Self {
        self.consumed.push(stream.into());
        self
    }

    /// The field that carries each entry's payload (default `payload`): the
    /// source's [`payload_field`](crate::RedisStreamsSourceBuilder::payload_field).
    pub fn payload_field(mut self, field: impl Into<String>) -> Self {
        self.payload_field = field.into();
        self
    }

    /// Trims each stream a parked message moves back into to about
    /// `max_len` entries (`XADD … MAXLEN ~ max_len`), as a publisher with
    /// the same [setting](crate::RedisStreamsPublisherBuilder::max_len)
    /// would. Default: no trimming. The parking streams are never trimmed.
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

    /// How long to wait for a connection (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long to wait for the reply to a round, reconnecting included
    /// (default 5 s). A park waits at most three times as long: for room in
    /// the publisher's buffer, in its queue, and for the reply.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// Trusts the CA certificate `pem` (PEM text) instead of the platform's
    /// root certificates, for a `rediss://` server whose certificate a
    /// private CA signed.
    #[cfg(feature = "tls")]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        let pem = pem.into();
        self.publisher = self.publisher.tls_root_certificate(pem.clone());
        self.tls_root_certificate = Some(pem);
        self
    }

    fn check(&self) -> Result<(), ConfigError> {
        if self.consumed.is_empty() {
            return Err(ConfigError::new(
                "consumed_stream",
                "names no stream: name each stream whose messages are parked",
            ));
        }
        for stream in &self.consumed {
            if stream.is_empty() {
                return Err(ConfigError::new("consumed_stream", "is empty"));
            }
            for own in [
                RedisParking::parked_stream(stream),
                RedisParking::due_index(stream),
            ] {
                if self.consumed.contains(&own) {
                    return Err(ConfigError::new(
                        "consumed_stream",
                        format!(
                            "`{own}` is where the messages of `{stream}` wait while parked; \
                             it cannot be consumed too"
                        ),
                    ));
                }
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
            ("connect_timeout", self.connect_timeout),
            ("command_timeout", self.command_timeout),
        ] {
            if timeout.is_zero() {
                return Err(ConfigError::new(name, "is zero"));
            }
        }
        Ok(())
    }

    /// Checks the settings, connects, runs a first round of the mover (so
    /// that a key of the wrong type or a missing permission fails here, and
    /// messages already due move at once) and starts the mover task on the
    /// current Tokio runtime.
    ///
    /// Fails with [`Error::Config`] for a setting that cannot work, before
    /// connecting, and with a typed error for a bad URL, an unreachable
    /// server, refused credentials or a key of the wrong type (none of
    /// them shows the password).
    pub async fn build(self) -> Result<RedisParking, Error> {
        self.check()?;
        let connector = Connector::new(
            &self.url,
            self.tls_root_certificate.as_deref(),
            self.connect_timeout,
            self.command_timeout,
        )?;
        let connection = SharedConnection::new(connector.shared().await?, connector);
        // Outputs carry no key (it travels among the headers), so the
        // publisher never writes its key field; it is set apart from the
        // payload field only because the publisher refuses the two equal.
        let publisher = self
            .publisher
            .payload_field(&self.payload_field)
            .key_field(format!("{}.key", self.payload_field))
            .connect_timeout(self.connect_timeout)
            .command_timeout(self.command_timeout)
            // A park holds its message's place in the consumer's budget
            // while it waits: bounded by the command timeout at each step
            // rather than the publisher's defaults (10 s and 25 s).
            .send_timeout(self.command_timeout)
            .queue_timeout(self.command_timeout)
            .build()
            .await?;
        let streams: Vec<Arc<str>> = self.consumed.iter().map(|s| Arc::from(&**s)).collect();
        let wake = Arc::new(Notify::new());
        let mover = Mover {
            connection: connection.clone(),
            keys: streams
                .iter()
                .map(|stream| StreamKeys {
                    stream: Arc::clone(stream),
                    parked: RedisParking::parked_stream(stream),
                    due: RedisParking::due_index(stream),
                })
                .collect(),
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
            streams = ?streams,
            "Redis parking started"
        );
        Ok(RedisParking {
            inner: Arc::new(Inner {
                publisher,
                streams,
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
        let builder = || RedisParking::builder("redis://127.0.0.1").consumed_stream("orders");
        let refused = [
            (
                RedisParking::builder("redis://127.0.0.1"),
                "consumed_stream",
            ),
            (builder().consumed_stream(""), "consumed_stream"),
            (
                builder().consumed_stream("orders:parked"),
                "consumed_stream",
            ),
            (builder().payload_field(""), "payload_field"),
            (builder().max_len(0), "max_len"),
            (builder().batch(0), "batch"),
            (builder().batch(RedisParkingBuilder::MAX_BATCH + 1), "batch"),
            (builder().poll_interval(Duration::ZERO), "poll_interval"),
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
