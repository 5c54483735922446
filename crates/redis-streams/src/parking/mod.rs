//! [`RedisParking`]: retry later without blocking, on Redis. A message is
//! parked in a stream of its consumer group's own, indexed by its due time,
//! and moved by a mover once due into the group's return stream, which the
//! same source reads beside the stream the message came from.
//!
//! How it parks, what it costs and its limits are on [`RedisParking`],
//! where the crate's documentation shows them.

mod builder;
mod mover;
mod round;

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use intake_core::ConfigError;
use intake_core::Message;
use intake_core::parking::{DUE, ORIGIN, ParkError, Parked, Parking};
use redis::{RedisError, Value};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

pub use self::builder::RedisParkingBuilder;
use crate::connection::SharedConnection;
use crate::dead_letter::MAX_DEAD_LETTER_VALUES;
use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::publisher::entry_fields;

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
/// [`command_timeout`](crate::RedisSettings::command_timeout). An entry that
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
    pub(super) inner: Arc<Inner>,
}

/// What the clones of a parking share.
pub(super) struct Inner {
    /// The keys of each stream whose messages this parks.
    pub(super) keys: Vec<StreamKeys>,
    pub(super) group: String,
    pub(super) payload_field: String,
    /// The connection of parks and of the mover, also for
    /// [`RedisParking::waiting`].
    pub(super) connection: SharedConnection,
    /// Wakes the mover after a park of this process.
    pub(super) wake: Arc<Notify>,
    /// Turns true to stop the mover (and refuse parks).
    pub(super) stop: watch::Sender<bool>,
    pub(super) mover: Mutex<Option<JoinHandle<()>>>,
    pub(super) command_timeout: Duration,
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

    /// A builder of a parking on a connection of its own to the server of
    /// `settings`: a [`RedisSettings`](crate::RedisSettings), or just the
    /// URL (`redis://[user[:password]@]host[:port][/db]`, or `rediss://`
    /// for TLS). Each park and mover round is bounded by the settings'
    /// [`command_timeout`](crate::RedisSettings::command_timeout),
    /// reconnecting included. Name the consumer group with
    /// [`group`](RedisParkingBuilder::group) and the streams whose messages
    /// it parks with
    /// [`consumed_stream`](RedisParkingBuilder::consumed_stream);
    /// [`RedisStreamsSource::parking`](crate::RedisStreamsSource::parking)
    /// does both from the source.
    pub fn builder(settings: impl Into<crate::RedisSettings>) -> RedisParkingBuilder {
        RedisParkingBuilder::new(settings.into())
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

pub(super) fn unix_millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    })
}

pub(super) fn timed_out() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no reply within the command timeout",
    ))
}

/// The keys of one stream's parking.
#[derive(Clone, Debug)]
pub(super) struct StreamKeys {
    /// The stream whose messages are parked.
    pub(super) stream: Arc<str>,
    /// Where they come back.
    pub(super) returned: String,
    pub(super) parked: String,
    pub(super) due: String,
}

impl StreamKeys {
    pub(super) fn new(stream: &str, group: &str, returned: Option<&str>) -> Self {
        Self {
            stream: Arc::from(stream),
            returned: returned
                .map_or_else(|| RedisParking::return_stream(stream, group), str::to_owned),
            parked: RedisParking::parked_stream(stream, group),
            due: RedisParking::due_index(stream, group),
        }
    }
}
