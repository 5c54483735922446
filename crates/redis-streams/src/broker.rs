//! [`RedisBroker`]: one Redis server's connection settings, given once,
//! from which every part of a route is derived
//! ([`intake_core::backend::Broker`]).

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use intake_core::backend::{Broker, RouteAddress, RouteOptions, RouteParts};
use intake_core::group_control::ControlLog;

use crate::error::Error;
use crate::settings::RedisSettings;
use crate::source::settings::{DEFAULT_PAYLOAD_FIELD, DeadLetterStream, default_consumer_name};
use crate::{
    RedisControlChannel, RedisDeadLetterSink, RedisDeadLetterStore, RedisDeadLetters,
    RedisLagProbe, RedisParking, RedisStreamsAcker, RedisStreamsPublisher,
    RedisStreamsPublisherBuilder, RedisStreamsSource,
};

/// A Redis server, and every part of a route derived from it: the
/// [`Broker`] of the Redis Streams backend.
///
/// The connection is given once, as [`RedisSettings`]: the URL
/// (`redis://[user[:password]@]host[:port][/db]`, or `rediss://…` for TLS),
/// the TLS root certificate and the connect and command timeouts. Every
/// part derived from the broker connects with them (a parking bounds each
/// park and mover round by the command timeout); the password never
/// appears in `Debug` output, logs or errors.
///
/// | part | derived as |
/// |---|---|
/// | [`route`](Broker::route) | a [`RedisStreamsSource`] of the stream as a member of the group, its [`acker`](RedisStreamsSource::acker), its [`dead_letter_sink`](RedisStreamsSource::dead_letter_sink) and, with [`RouteOptions::parking`], its [`parking`](RedisStreamsSource::parking) |
/// | [`publisher`](Broker::publisher) | a [`RedisStreamsPublisher`] writing the fields a route reads |
/// | [`dead_letter_store`](Broker::dead_letter_store) | the [`RedisDeadLetterStore`] of the stream's dead-letter stream, scoped to the group (its letters alone; a replay to the group goes to its return stream) |
/// | [`lag_probe`](Broker::lag_probe) | a [`RedisLagProbe`] of the group on the stream and, once it exists, on its return stream; its [`parked`](intake_core::lag::LagProbe::parked) counts the group's parked messages |
/// | [`control_channel`](Self::control_channel) | a [`RedisControlChannel`] of one of the group's control logs: stream `{group}:intake-control` or `{group}:intake-status` |
///
/// # A route's parts agree
///
/// A route derived with parking reads the parking's return stream
/// ([`RedisParking::return_stream`], `<stream>:<group>:returned`) beside
/// the stream, so a parked message always comes back to a source that
/// reads it. The source, its acker and dead-letter sink share one
/// connection; the parking has one of its own. The payload and key fields
/// ([`payload_field`](Self::payload_field), [`key_field`](Self::key_field))
/// and the dead-letter stream ([`dead_letter_stream`](Self::dead_letter_stream))
/// are the broker's, so what its publisher writes a route reads with its
/// key, and its dead-letter store reads what a route's sink wrote.
///
/// # Consumer names
///
/// Each route's source joins its group as `<group>-<hostname>-<pid>-<n>`
/// (`HOSTNAME`, else `intake`; `n` counts the routes of the process), a
/// name no other live process uses, new in every process. A consumer
/// restarted under a new name leaves its pending entries to be claimed
/// after `claim_min_idle` (60 s). To take them up at once after a restart,
/// give the broker a name that stays the same across restarts (a pod name)
/// with [`consumer_name`](Self::consumer_name); every route then joins its
/// group under that name, so derive each stream and group once per process
/// with it, and never give two live processes the same name. Settings of
/// a source the broker does not cover (claim times, `max_deliveries`,
/// `delete_acked`, broadcast) are on the explicit
/// [`RedisStreamsSource::builder`].
///
/// # Shutdown
///
/// The broker keeps every parking it derived (clones share their mover,
/// so a parking stays alive while the broker holds it, even once the
/// route's own clone is dropped). [`shutdown`](Broker::shutdown) stops
/// their movers, each within the command timeout and all within the time
/// it is given; call it once every route has stopped. What is parked stays
/// parked, for the next instance's mover.
///
/// ```no_run
/// use std::time::Duration;
/// use intake_core::backend::{Broker, RouteAddress, RouteOptions};
/// use intake_redis_streams::{RedisBroker, RedisSettings};
///
/// # async fn demo() -> Result<(), intake_redis_streams::Error> {
/// let settings = RedisSettings::new("redis://127.0.0.1:6379")
///     .command_timeout(Duration::from_secs(3));
/// let broker = RedisBroker::new(settings).consumer_name("billing-pod-0");
/// broker.endpoint()?; // the URL checked now
/// let address = RouteAddress::new("payments", "billing");
/// let parts = broker.route(&address, &RouteOptions::new().parking()).await?;
/// // parts.source reads `payments` and `payments:billing:returned`.
/// # let _ = parts;
/// broker.shutdown(Duration::from_secs(5)).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisBroker {
    settings: RedisSettings,
    consumer_name: Option<String>,
    payload_field: String,
    key_field: String,
    dead_letter_stream: DeadLetterStream,
    /// Every parking derived, to stop at shutdown; shared by the clones.
    parkings: Arc<Mutex<Vec<RedisParking>>>,
}

impl fmt::Debug for RedisBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parkings = self
            .parkings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        f.debug_struct("RedisBroker")
            .field("settings", &self.settings)
            .field("consumer_name", &self.consumer_name)
            .field("payload_field", &self.payload_field)
            .field("key_field", &self.key_field)
            .field("dead_letter_stream", &self.dead_letter_stream)
            .field("parkings", &parkings)
            .finish()
    }
}

impl RedisBroker {
    /// Default of [`key_field`](Self::key_field): the publisher's.
    pub const DEFAULT_KEY_FIELD: &'static str = RedisStreamsPublisherBuilder::DEFAULT_KEY_FIELD;
    /// Default of [`payload_field`](Self::payload_field).
    pub const DEFAULT_PAYLOAD_FIELD: &'static str = DEFAULT_PAYLOAD_FIELD;

    /// The server of `settings`: a [`RedisSettings`] (URL, TLS root
    /// certificate, timeouts), or just the URL
    /// (`redis://[user[:password]@]host[:port][/db]`, or `rediss://…` for
    /// TLS, feature `tls`). Nothing is checked or connected until a part is
    /// derived; [`from_url`](Self::from_url) checks the URL at once.
    pub fn new(settings: impl Into<RedisSettings>) -> Self {
        Self {
            settings: settings.into(),
            consumer_name: None,
            payload_field: Self::DEFAULT_PAYLOAD_FIELD.to_owned(),
            key_field: Self::DEFAULT_KEY_FIELD.to_owned(),
            dead_letter_stream: DeadLetterStream::default(),
            parkings: Arc::default(),
        }
    }

    /// The server at `url`, checked now: fails with
    /// [`Error::InvalidUrl`] (the password redacted) for a URL the client
    /// cannot use. Nothing is connected until a part is derived.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let broker = Self::new(url);
        broker.settings.connector()?;
        Ok(broker)
    }

    /// The connection every part derived connects with.
    pub fn settings(&self) -> &RedisSettings {
        &self.settings
    }

    /// The consumer name every route joins its group under, instead of
    /// `<group>-<hostname>-<pid>-<n>` (see [the type docs](Self#consumer-names)):
    /// a name that stays the same across restarts (a pod name), so that a
    /// restarted consumer takes up its own pending entries at once. Two
    /// live processes must never share it, and a process derives each
    /// stream and group once with it.
    pub fn consumer_name(mut self, name: impl Into<String>) -> Self {
        self.consumer_name = Some(name.into());
        self
    }

    /// The entry field that carries the payload (default `payload`), for
    /// routes, the publisher and the dead-letter store.
    pub fn payload_field(mut self, field: impl Into<String>) -> Self {
        self.payload_field = field.into();
        self
    }

    /// The entry field that carries the key (default `key`): routes read it
    /// as each message's key (and keep each key's order across the group,
    /// see [`keep_key_order`](crate::RedisStreamsSourceBuilder::keep_key_order)),
    /// the publisher writes each output's key there.
    pub fn key_field(mut self, field: impl Into<String>) -> Self {
        self.key_field = field.into();
        self
    }

    /// Where routes write dead letters and the dead-letter store reads
    /// them (default: the stream's name plus `:dlq`).
    pub fn dead_letter_stream(mut self, stream: DeadLetterStream) -> Self {
        self.dead_letter_stream = stream;
        self
    }

    /// The server, without password.
    ///
    /// Fails with [`Error::InvalidUrl`] for a URL the client cannot use.
    pub fn endpoint(&self) -> Result<crate::Endpoint, Error> {
        self.settings.endpoint()
    }

    /// Group `group`'s control log `log` ([`ControlLog`]), through which the
    /// group's instances share pauses and resumes (the commands log) and
    /// what each runs (the status log); see
    /// [`group_control`](intake_core::group_control). The commands log is
    /// stream `{group}:intake-control`, never trimmed; the status log is
    /// stream `{group}:intake-status`, trimmed to about 10,000 entries.
    ///
    /// The URL is checked now; the channel connects at its first append,
    /// and each feed on a connection of its own, all with the broker's
    /// settings (see [`RedisControlChannel`]).
    ///
    /// ```no_run
    /// use intake_core::group_control::{ControlLog, GroupControl};
    /// use intake_redis_streams::RedisBroker;
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let broker = RedisBroker::from_url("redis://127.0.0.1:6379")?;
    /// let commands = broker.control_channel("billing", ControlLog::Commands).await?;
    /// let control = GroupControl::new(commands, "billing-pod-0");
    /// control.pause_partition("orders", "orders", 0).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] (the password redacted) or [`Error::Config`]
    /// for settings the client cannot use.
    pub async fn control_channel(
        &self,
        group: &str,
        log: ControlLog,
    ) -> Result<RedisControlChannel, Error> {
        Ok(RedisControlChannel::new(
            self.settings.connector()?,
            group,
            log,
        ))
    }

    /// The consumer name of a route of `group`.
    fn consumer_of(&self, group: &str) -> String {
        match &self.consumer_name {
            Some(name) => name.clone(),
            None => format!("{group}-{}", default_consumer_name()),
        }
    }

    /// The parkings derived so far, shared by the clones.
    fn parkings(&self) -> std::sync::MutexGuard<'_, Vec<RedisParking>> {
        self.parkings.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Broker for RedisBroker {
    type Source = RedisStreamsSource;
    type Acker = RedisStreamsAcker;
    type DeadLetterSink = RedisDeadLetterSink;
    type Parking = RedisParking;
    type Publisher = RedisStreamsPublisher;
    type DeadLetterStore = RedisDeadLetterStore;
    type LagProbe = RedisLagProbe;
    type ControlChannel = RedisControlChannel;
    type Error = Error;

    fn kind(&self) -> &'static str {
        "redis"
    }

    /// The route's source joins the group (created with the stream where
    /// missing, from the stream's first entry) under the broker's consumer
    /// name; with parking, it also reads the return stream, and the
    /// parking ([`RedisStreamsSource::parking`]) is the one that moves
    /// parked messages there. Tiers in the options are ignored: Redis parks
    /// each message for the delay it asks for.
    async fn route(
        &self,
        address: &RouteAddress,
        options: &RouteOptions,
    ) -> Result<RouteParts<Self>, Error> {
        let (stream, group) = (address.source(), address.group());
        let mut builder = RedisStreamsSource::builder(&self.settings)
            .stream(stream)
            .group(group)
            .consumer(self.consumer_of(group))
            .payload_field(&self.payload_field)
            .key_field(&self.key_field)
            .dead_letter_stream(self.dead_letter_stream.clone());
        if options.parking.is_some() {
            builder = builder.stream(RedisParking::return_stream(stream, group));
        }
        let source = builder.build().await?;
        let acker = source.acker();
        let dead_letter_sink = source.dead_letter_sink().build().await?;
        let parking = match options.parking {
            Some(_) => {
                // On the source's connection settings: its command
                // timeout bounds each park and mover round.
                let parking = source.parking().build().await?;
                self.parkings().push(parking.clone());
                Some(parking)
            }
            None => None,
        };
        Ok(RouteParts::new(source, acker, dead_letter_sink, parking))
    }

    /// A publisher writing the broker's payload and key fields, on a
    /// connection of its own; close it
    /// ([`close`](RedisStreamsPublisher::close)) or drop every clone when
    /// done.
    async fn publisher(&self) -> Result<RedisStreamsPublisher, Error> {
        RedisStreamsPublisher::builder(&self.settings)
            .payload_field(&self.payload_field)
            .key_field(&self.key_field)
            .build()
            .await
    }

    /// The dead letters of the stream's dead-letter stream that the group
    /// wrote (every group of a stream shares it), as `intake dlq --group`
    /// opens them; a replay to the group goes to its return stream, and a
    /// replay to the origin through a publisher of this broker.
    async fn dead_letter_store(
        &self,
        address: &RouteAddress,
    ) -> Result<RedisDeadLetterStore, Error> {
        let letters = RedisDeadLetters::builder(&self.settings)
            .dead_letters_of_with(address.source(), &self.dead_letter_stream)
            .group(address.group())
            .payload_field(&self.payload_field)
            .build()
            .await?;
        Ok(letters.store(Broker::publisher(self).await?))
    }

    /// The group's lag on the stream and, once it exists, on the route's
    /// return stream; its parked backlog from the group's parking stream.
    /// It connects at its first query.
    async fn lag_probe(&self, address: &RouteAddress) -> Result<RedisLagProbe, Error> {
        let (stream, group) = (address.source(), address.group());
        Ok(RedisLagProbe::of_route(
            self.settings.connector()?,
            group,
            stream,
            &RedisParking::return_stream(stream, group),
        ))
    }

    async fn control_channel(
        &self,
        group: &str,
        log: ControlLog,
    ) -> Result<RedisControlChannel, Error> {
        RedisBroker::control_channel(self, group, log).await
    }

    /// Stops the mover of every parking this broker (or a clone) derived:
    /// each is told to stop at once, then waited for, all within
    /// `timeout`. Fails with [`Error::ShutdownTimedOut`] when some did not
    /// stop in time (they were told to; what is parked stays parked).
    async fn shutdown(&self, timeout: Duration) -> Result<(), Error> {
        let parkings = std::mem::take(&mut *self.parkings());
        for parking in &parkings {
            parking.stop_soon();
        }
        let mut stopped = 0;
        let waited = tokio::time::timeout(timeout, async {
            for parking in &parkings {
                parking.shutdown().await;
                stopped += 1;
            }
        })
        .await;
        match waited {
            Ok(()) => Ok(()),
            Err(_) => Err(Error::ShutdownTimedOut {
                timeout,
                running: parkings.len() - stopped,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_stays_out_of_debug_and_errors() {
        let broker = RedisBroker::new(
            RedisSettings::new("redis://app:s3cr3t@cache:6379/2")
                .connect_timeout(Duration::from_secs(1)),
        )
        .consumer_name("pod-0");
        let shown = format!("{broker:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("cache:6379"), "{shown}");
        assert_eq!(
            broker.endpoint().ok().map(|endpoint| endpoint.to_string()),
            Some("redis://app@cache:6379/2".to_owned())
        );
        let refused = RedisBroker::from_url("http://app:s3cr3t@cache").err();
        let shown = refused.map(|error| format!("{error} {error:?}"));
        assert!(
            shown.as_deref().is_some_and(
                |shown| shown.contains("invalid Redis URL") && !shown.contains("s3cr3t")
            ),
            "{shown:?}"
        );
    }

    #[test]
    fn each_route_joins_under_a_name_of_its_own_unless_one_is_given() {
        let broker = RedisBroker::new("redis://127.0.0.1");
        let first = broker.consumer_of("billing");
        let second = broker.consumer_of("billing");
        assert!(first.starts_with("billing-"), "{first}");
        assert_ne!(first, second);
        assert!(first.contains(&std::process::id().to_string()), "{first}");
        let named = broker.consumer_name("pod-0");
        assert_eq!(named.consumer_of("billing"), "pod-0");
    }

    #[tokio::test]
    async fn a_shutdown_with_nothing_derived_is_done_at_once() {
        let broker = RedisBroker::new("redis://127.0.0.1");
        assert_eq!(broker.kind(), "redis");
        let done = broker.shutdown(Duration::from_millis(10)).await;
        assert!(done.is_ok(), "{done:?}");
    }
}
