//! [`RedisStreamsSourceBuilder`]: what to read, as whom, and how to
//! recover; [`build`](RedisStreamsSourceBuilder::build) connects and
//! returns the [`RedisStreamsSource`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use intake_core::{BackoffPolicy, ConfigError, Exponential, SourceName};

use crate::connection::{SharedConnection, check_server_version};
use crate::dead_letter::RedisDeadLetterSinkBuilder;
use crate::error::Error;
use crate::held::HeldEntries;
use crate::settings::RedisSettings;
use crate::source::settings::{
    DEFAULT_PAYLOAD_FIELD, DeadLetterStream, Settings, StartFrom, default_consumer_name,
};

use super::RedisStreamsSource;

impl RedisStreamsSource {
    /// A builder of a source reading from the server of `settings`: a
    /// [`RedisSettings`] (URL, TLS root certificate, timeouts), or just the
    /// URL, `redis://[user[:password]@]host[:port][/db]` or `rediss://…`
    /// for TLS (feature `tls`, on by default). The password never appears
    /// in `Debug` output, logs or errors.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), intake_redis_streams::Error> {
    /// use std::time::Duration;
    /// use intake_redis_streams::RedisStreamsSource;
    ///
    /// let source = RedisStreamsSource::builder("redis://127.0.0.1:6379")
    ///     .stream("orders")
    ///     .group("billing")
    ///     .consumer("billing-1")
    ///     .claim_min_idle(Duration::from_secs(60))
    ///     .max_deliveries(5)
    ///     .build()
    ///     .await?;
    /// let acker = source.acker();
    /// let dead_letters = source.dead_letter_sink();
    /// # let _ = (acker, dead_letters);
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder(settings: impl Into<RedisSettings>) -> RedisStreamsSourceBuilder {
        RedisStreamsSourceBuilder::new(settings.into())
    }
}

/// Builds a [`RedisStreamsSource`]: a member of a consumer group over one
/// or more streams, or a broadcast reader. See
/// [`RedisStreamsSource::builder`].
///
/// # Delivery
///
/// A group consumer first re-reads the entries its own name still has
/// pending (from an earlier run), then new entries. Every
/// [`claim_interval`](Self::claim_interval) it claims entries that have been
/// pending longer than [`claim_min_idle`](Self::claim_min_idle) with any
/// consumer: the work of consumers that died, and entries whose handler
/// asked for a retry.
///
/// With a [`key_field`](Self::key_field), an entry waits in the source while
/// an older entry of its key is pending with another consumer or was given
/// back for a retry ([`keep_key_order`](Self::keep_key_order), on by
/// default): each key's entries reach the runtime in stream order across the
/// group, a crash and a restart under any name.
///
/// Redis cannot tell a slow consumer from a dead one: it measures how long
/// an entry has been idle since its last delivery. So while a consumer
/// holds entries (queued in the runtime behind a slow handler, or running),
/// it resets their idle time every third of `claim_min_idle`, without
/// counting a delivery, and it never claims an entry it holds itself. An
/// entry is claimed from a consumer only once that consumer stopped
/// refreshing it: it crashed, or stalled for longer than about two thirds
/// of `claim_min_idle`. **`claim_min_idle` must be longer than the longest
/// stall of a live process** (a pause of the runtime, a lost connection to
/// Redis); queueing and handling time no longer count. A handler that
/// never returns keeps its entry for as long as the consumer runs, as on
/// every other backend: bound it with a timeout layer.
///
/// # Retry later
///
/// A message whose handler failed with a retryable error after the
/// in-process retries is left pending: it is claimed again after
/// `claim_min_idle`, by this consumer or another, with its delivery count
/// (kept by Redis, so it survives restarts) one higher. Once the count
/// passes [`max_deliveries`](Self::max_deliveries) the source writes the
/// entry to the dead-letter stream instead of dispatching it.
#[derive(Clone)]
#[must_use = "a builder does nothing until `.build().await`"]
pub struct RedisStreamsSourceBuilder {
    connection: RedisSettings,
    streams: Vec<String>,
    group: Option<String>,
    consumer: Option<String>,
    broadcast: bool,
    payload_field: String,
    key_field: Option<String>,
    keep_key_order: bool,
    start: Option<StartFrom>,
    block: Duration,
    claim_min_idle: Duration,
    claim_interval: Option<Duration>,
    max_deliveries: Option<u32>,
    dead_letter_stream: DeadLetterStream,
    delete_acked: bool,
    reconnect: Arc<dyn BackoffPolicy>,
}

impl fmt::Debug for RedisStreamsSourceBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStreamsSourceBuilder")
            .field("connection", &self.connection)
            .field("streams", &self.streams)
            .field("group", &self.group)
            .field("consumer", &self.consumer)
            .field("broadcast", &self.broadcast)
            .field("payload_field", &self.payload_field)
            .field("key_field", &self.key_field)
            .field("keep_key_order", &self.keep_key_order)
            .field("start", &self.start)
            .field("block", &self.block)
            .field("claim_min_idle", &self.claim_min_idle)
            .field("claim_interval", &self.claim_interval)
            .field("max_deliveries", &self.max_deliveries)
            .field("dead_letter_stream", &self.dead_letter_stream)
            .field("delete_acked", &self.delete_acked)
            .finish_non_exhaustive()
    }
}

impl RedisStreamsSourceBuilder {
    /// Default of [`claim_min_idle`](Self::claim_min_idle).
    pub const DEFAULT_CLAIM_MIN_IDLE: Duration = Duration::from_secs(60);
    /// Default of [`max_deliveries`](Self::max_deliveries).
    pub const DEFAULT_MAX_DELIVERIES: u32 = 5;
    /// Default of [`payload_field`](Self::payload_field).
    pub const DEFAULT_PAYLOAD_FIELD: &'static str = DEFAULT_PAYLOAD_FIELD;

    pub(crate) fn new(connection: RedisSettings) -> Self {
        Self {
            connection,
            streams: Vec::new(),
            group: None,
            consumer: None,
            broadcast: false,
            payload_field: Self::DEFAULT_PAYLOAD_FIELD.to_owned(),
            key_field: None,
            keep_key_order: true,
            start: None,
            block: Duration::from_secs(2),
            claim_min_idle: Self::DEFAULT_CLAIM_MIN_IDLE,
            claim_interval: None,
            max_deliveries: Some(Self::DEFAULT_MAX_DELIVERIES),
            dead_letter_stream: DeadLetterStream::default(),
            delete_acked: false,
            reconnect: Arc::new(
                Exponential::new(Duration::from_millis(100), Duration::from_secs(10))
                    .retry_forever(),
            ),
        }
    }

    /// Adds a stream to read.
    pub fn stream(mut self, stream: impl Into<String>) -> Self {
        self.streams.push(stream.into());
        self
    }

    /// Adds streams to read.
    pub fn streams<S: Into<String>>(mut self, streams: impl IntoIterator<Item = S>) -> Self {
        self.streams.extend(streams.into_iter().map(Into::into));
        self
    }

    /// Reads as a member of consumer group `group`, created (with the
    /// stream, if missing) on connect.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// This consumer's name within the group. Give every instance a name of
    /// its own that stays the same across restarts (a pod name): a restarted
    /// consumer then takes up its own pending entries at once, before any
    /// new entry, instead of waiting for `claim_min_idle` until a claim
    /// takes them over (meanwhile, under
    /// [`keep_key_order`](Self::keep_key_order), the keys of those entries
    /// wait too). Two live processes must never share a name: each would
    /// take the other's entries for its own. Defaults to
    /// `<hostname>-<pid>-<n>`, new in every process.
    pub fn consumer(mut self, consumer: impl Into<String>) -> Self {
        self.consumer = Some(consumer.into());
        self
    }

    /// Reads every entry without a consumer group (`XREAD`), so that every
    /// instance sees every entry. Nothing is acknowledged, claimed or
    /// retried by Redis; starts at new entries unless
    /// [`start_from`](Self::start_from) says otherwise.
    pub fn broadcast(mut self) -> Self {
        self.broadcast = true;
        self
    }

    /// The entry field that holds the payload (default `payload`). Every
    /// other field is a header. An entry without it is dead-lettered.
    pub fn payload_field(mut self, field: impl Into<String>) -> Self {
        self.payload_field = field.into();
        self
    }

    /// The entry field whose value is the message key (none by default).
    /// The field stays readable as a header.
    pub fn key_field(mut self, field: impl Into<String>) -> Self {
        self.key_field = Some(field.into());
        self
    }

    /// Whether an entry with a key waits in the source while an older entry
    /// of its key is pending in the group and in no handler's hands here
    /// (default on; it applies with a [`key_field`](Self::key_field)):
    ///
    /// - pending with another consumer: running there (Redis hands each new
    ///   entry to whichever consumer reads first, so a key's entries are
    ///   spread over the group), or left by one that died or stopped, until
    ///   a claim takes it over after `claim_min_idle`;
    /// - given back by this consumer for a retry (claimed again after
    ///   `claim_min_idle`).
    ///
    /// With the runtime's `DeliveryOrder::Key` (or `Partition`), each key's
    /// entries then run one at a time in stream order across the whole
    /// group, across crashes and restarts under any consumer name. The
    /// price: a key whose older entry is held by a consumer that died
    /// waits up to `claim_min_idle` (plus a claim interval) for it, other
    /// keys flow; at most `max_in_flight` entries wait at once, and while
    /// that many wait no new entries are read. A single consumer costs one
    /// `XPENDING` summary per stream in the round trip of each read; with
    /// several, each read is followed by one script over the group's
    /// pending entries (see [`RedisCounters::key_order_waits`]).
    ///
    /// Turn it off when the handler needs no order per key (`Unordered`):
    /// entries are then handed out as they are read.
    ///
    /// [`RedisCounters::key_order_waits`]: crate::RedisCounters::key_order_waits
    pub fn keep_key_order(mut self, keep: bool) -> Self {
        self.keep_key_order = keep;
        self
    }

    /// Where a newly created group (or a broadcast reader) starts. A group
    /// that vanishes while the source runs (`XGROUP DESTROY`, the stream
    /// deleted) is created again after the newest entry the source had read
    /// of each stream, not here (from the beginning, everything handled
    /// before would be handled again); see
    /// [`RedisCounters::groups_created_again`](crate::RedisCounters::groups_created_again).
    pub fn start_from(mut self, start: StartFrom) -> Self {
        self.start = Some(start);
        self
    }

    /// How long one blocking read waits for entries (default 2 s). Claims
    /// run between reads, so this also bounds how late a claim can be.
    pub fn block(mut self, block: Duration) -> Self {
        self.block = block;
        self
    }

    /// How long an entry must have been idle (pending without being
    /// refreshed by a live consumer) before another delivery may claim it
    /// (default 60 s). See [the type docs](Self).
    pub fn claim_min_idle(mut self, idle: Duration) -> Self {
        self.claim_min_idle = idle;
        self
    }

    /// How often to look for entries to claim (default a quarter of
    /// `claim_min_idle`, at most 10 s).
    pub fn claim_interval(mut self, interval: Duration) -> Self {
        self.claim_interval = Some(interval);
        self
    }

    /// Dead-letters an entry instead of delivering it once Redis counts
    /// more than `deliveries` deliveries of it (default 5).
    pub fn max_deliveries(mut self, deliveries: u32) -> Self {
        self.max_deliveries = Some(deliveries);
        self
    }

    /// Never dead-letters an entry for its delivery count. A message that
    /// always fails is then retried every `claim_min_idle`, forever.
    pub fn unlimited_deliveries(mut self) -> Self {
        self.max_deliveries = None;
        self
    }

    /// Where dead letters go (default: the source stream's name plus
    /// `:dlq`).
    pub fn dead_letter_stream(mut self, stream: DeadLetterStream) -> Self {
        self.dead_letter_stream = stream;
        self
    }

    /// Deletes entries (`XDEL`) once they are acknowledged, in the same round
    /// trip as the `XACK`. Off by default: it costs about a third of the
    /// throughput, and trimming by length on the producer side (`XADD
    /// MAXLEN ~`) is usually the better tool.
    ///
    /// Only for a stream this group alone reads: an entry deleted is gone
    /// for every group. [`build`](Self::build) refuses it when another
    /// consumer group exists on one of the streams, and a group that
    /// appears while the source runs stops the deleting (each deletion
    /// checks, in the same script, that the stream has one group; logged
    /// once at error level): acknowledged entries then stay.
    pub fn delete_acked(mut self, delete: bool) -> Self {
        self.delete_acked = delete;
        self
    }

    /// How to wait between attempts to reconnect the reading connection
    /// after it was lost, or after a transient refusal ([`TRANSIENT_CODES`]):
    /// any [`BackoffPolicy`], checked by [`build`](Self::build). Default:
    /// exponential from 100 ms doubling to 10 s, 10 % jitter, forever. When
    /// the policy gives up, [`Source::next`](intake_core::backend::Source::next)
    /// reports the server unreachable to the runtime (which backs off by its
    /// own policy and calls again); closing the source never waits on it.
    ///
    /// [`TRANSIENT_CODES`]: crate::TRANSIENT_CODES
    pub fn reconnect_backoff(mut self, policy: impl BackoffPolicy) -> Self {
        self.reconnect = Arc::new(policy);
        self
    }

    /// Checks the settings without connecting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.settings().map(|_| ())
    }

    fn settings(&self) -> Result<Settings, ConfigError> {
        if self.streams.is_empty() {
            return Err(ConfigError::new(
                "streams",
                "is empty: name at least one stream with `.stream(name)`",
            ));
        }
        for (index, stream) in self.streams.iter().enumerate() {
            if stream.is_empty() {
                return Err(ConfigError::new("streams", "contains an empty name"));
            }
            if self.streams[..index].contains(stream) {
                return Err(ConfigError::new(
                    "streams",
                    format!("names `{stream}` twice"),
                ));
            }
        }
        self.dead_letter_stream.check(&self.streams)?;
        let group = match (&self.group, self.broadcast) {
            (Some(_), true) => {
                return Err(ConfigError::new(
                    "broadcast",
                    "cannot be combined with `group`: a broadcast reader reads every entry \
                     without a group",
                ));
            }
            (None, false) => {
                return Err(ConfigError::new(
                    "group",
                    "is not set: name a consumer group with `.group(name)`, or read every \
                     entry with `.broadcast()`",
                ));
            }
            (Some(group), false) if group.is_empty() => {
                return Err(ConfigError::new("group", "is empty"));
            }
            (group, _) => group.as_deref().map(Arc::from),
        };
        if matches!(&self.consumer, Some(consumer) if consumer.is_empty()) {
            return Err(ConfigError::new("consumer", "is empty"));
        }
        if self.payload_field.is_empty() {
            return Err(ConfigError::new("payload_field", "is empty"));
        }
        if matches!(&self.key_field, Some(field) if field.is_empty()) {
            return Err(ConfigError::new("key_field", "is empty"));
        }
        if self.block < Duration::from_millis(1) {
            return Err(ConfigError::new(
                "block",
                "must be at least 1 ms (Redis reads BLOCK 0 as \"wait forever\")",
            ));
        }
        if self.claim_min_idle < Duration::from_millis(1) {
            return Err(ConfigError::new(
                "claim_min_idle",
                "must be at least 1 ms: with 0, every pending entry, including those being \
                 handled, would be claimed again at once",
            ));
        }
        let claim_interval = self
            .claim_interval
            .unwrap_or_else(|| (self.claim_min_idle / 4).min(Duration::from_secs(10)));
        if claim_interval < Duration::from_millis(1) {
            return Err(ConfigError::new("claim_interval", "must be at least 1 ms"));
        }
        if self.max_deliveries == Some(0) {
            return Err(ConfigError::new(
                "max_deliveries",
                "must be at least 1 (or use `unlimited_deliveries()`)",
            ));
        }
        self.reconnect.validate().map_err(|error| {
            ConfigError::new(
                "reconnect_backoff",
                format!("`{}` {}", error.setting, error.problem),
            )
        })?;
        let consumer = self.consumer.clone().unwrap_or_else(default_consumer_name);
        Ok(Settings {
            streams: self
                .streams
                .iter()
                .map(|s| SourceName::from(s.as_str()))
                .collect(),
            group,
            consumer: consumer.into(),
            payload_field: self.payload_field.as_str().into(),
            key_field: self.key_field.as_deref().map(Arc::from),
            key_order: self.keep_key_order,
            start: self.start.unwrap_or(if self.broadcast {
                StartFrom::NewEntries
            } else {
                StartFrom::Beginning
            }),
            block: self.block,
            claim_min_idle: self.claim_min_idle,
            claim_interval,
            max_deliveries: self.max_deliveries,
            dead_letter_stream: self.dead_letter_stream.clone(),
            delete_acked: self.delete_acked,
            reconnect: self.reconnect.clone(),
            counters: Arc::default(),
        })
    }

    /// Connects: checks the server, creates the consumer group (and the
    /// stream) where missing, and returns the source. Its acker is
    /// [`RedisStreamsSource::acker`].
    ///
    /// Fails with a typed error for a bad setting or URL, an unreachable
    /// server, refused credentials, or a key that is not a stream; with
    /// [`delete_acked`](Self::delete_acked), for a stream another consumer
    /// group reads too.
    pub async fn build(self) -> Result<RedisStreamsSource, Error> {
        let settings = Arc::new(self.settings()?);
        let connector = self.connection.connector()?;
        let mut reader = connector.blocking_reader(settings.block).await?;
        check_server_version(&mut reader, &connector).await?;
        let shared = SharedConnection::new(connector.shared().await?, connector.clone());
        let dead_letters = RedisDeadLetterSinkBuilder::from_source(shared.clone(), &settings);
        let held = Arc::new(HeldEntries::new(&settings.streams));
        RedisStreamsSource::start(connector, reader, settings, dead_letters, shared, held).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group_builder() -> RedisStreamsSourceBuilder {
        RedisStreamsSource::builder("redis://127.0.0.1")
            .stream("orders")
            .group("billing")
    }

    #[test]
    fn a_group_consumer_needs_a_stream_and_a_group() {
        let error = RedisStreamsSource::builder("redis://127.0.0.1")
            .group("g")
            .validate();
        assert_eq!(error.map_err(|e| e.setting), Err("streams"));
        let error = RedisStreamsSource::builder("redis://127.0.0.1")
            .stream("s")
            .validate();
        assert_eq!(error.map_err(|e| e.setting), Err("group"));
        assert!(group_builder().validate().is_ok());
    }

    #[test]
    fn broadcast_and_group_exclude_each_other() {
        let error = group_builder().broadcast().validate();
        assert_eq!(error.map_err(|e| e.setting), Err("broadcast"));
    }

    #[test]
    fn dead_letters_may_not_go_to_a_consumed_stream() {
        let error = group_builder().stream("orders:dlq").validate();
        assert_eq!(error.map_err(|e| e.setting), Err("dead_letter_stream"));
        let error = group_builder()
            .dead_letter_stream(DeadLetterStream::Fixed("orders".into()))
            .validate();
        assert_eq!(error.map_err(|e| e.setting), Err("dead_letter_stream"));
    }

    #[test]
    fn zero_durations_and_counts_are_refused() {
        let setting =
            |builder: RedisStreamsSourceBuilder| builder.validate().map_err(|e| e.setting);
        assert_eq!(setting(group_builder().block(Duration::ZERO)), Err("block"));
        assert_eq!(
            setting(group_builder().claim_min_idle(Duration::ZERO)),
            Err("claim_min_idle")
        );
        assert_eq!(
            setting(group_builder().max_deliveries(0)),
            Err("max_deliveries")
        );
        assert_eq!(
            setting(group_builder().stream("orders")),
            Err("streams"),
            "a stream named twice"
        );
    }

    #[test]
    fn the_claim_interval_follows_the_idle_time() {
        let settings = group_builder()
            .claim_min_idle(Duration::from_secs(2))
            .settings();
        assert_eq!(
            settings.map(|s| s.claim_interval).ok(),
            Some(Duration::from_millis(500))
        );
    }

    #[test]
    fn debug_output_hides_the_password() {
        let builder = RedisStreamsSource::builder("redis://user:topsecret@host:6379/0");
        let debug = format!("{builder:?}");
        assert!(!debug.contains("topsecret"), "{debug}");
        assert!(debug.contains("user:***@host"), "{debug}");
    }

    #[test]
    fn the_default_reconnect_policy_waits_100_ms_doubling_to_10_s_forever() {
        use intake_core::BackoffPolicy as _;

        let settings = group_builder().settings().expect("valid");
        let policy = &settings.reconnect;
        let first = policy.delay(1).expect("a first retry");
        assert!(
            first >= Duration::from_millis(90) && first <= Duration::from_millis(110),
            "{first:?}"
        );
        let late = policy.delay(30).expect("a 30th retry");
        assert!(
            late >= Duration::from_secs(9) && late <= Duration::from_secs(10),
            "{late:?}"
        );
        assert!(policy.delay(u32::MAX).is_some(), "it never gives up");
    }
}
