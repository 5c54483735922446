//! [`NatsBroker`]: the connection to a NATS server given once, and every
//! part of a route derived from it
//! ([`Broker`](intake_core::backend::Broker)).

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use intake_core::backend::{Broker, RouteAddress, RouteOptions, RouteParts};
use intake_core::group_control::ControlLog;

use crate::connection::{self, Connection};
use crate::error::Error;
use crate::publisher::PublisherHandle;
use crate::settings::default_reconnect_backoff;
use crate::url::ServerUrls;
use crate::{
    NatsAcker, NatsControlChannel, NatsDeadLetterSink, NatsDeadLetterStore, NatsDeadLetters,
    NatsLagProbe, NatsParking, NatsPublisher, NatsSettings, NatsSource,
};

/// A NATS JetStream server (or cluster) and how to connect to it, from
/// which every part of a route is derived: source, acker, dead-letter sink
/// and parking together ([`route`](Broker::route)), a
/// [`publisher`](Broker::publisher), a route's
/// [`dead_letter_store`](Broker::dead_letter_store) and
/// [`lag_probe`](Broker::lag_probe), and a consumer group's
/// [`control_channel`](Self::control_channel).
///
/// How to connect is one [`NatsSettings`] (URL, credentials, TLS, connect
/// timeout, connection name, reconnect backoff), which the broker passes
/// to every part. Clones share what the broker keeps for
/// [`shutdown`](Broker::shutdown) (the publishers it made) and the one
/// connection its lag probes share. Each source and publisher has a
/// connection of its own, made with these settings. The explicit builders
/// ([`NatsSource::builder`], [`NatsPublisher::builder`],
/// [`NatsDeadLetters::builder`]) take the same settings and stay
/// available for what this shape does not cover (a broadcast source, a
/// filter subject, `ack_wait`, a dead-letter subject of one's own).
///
/// # A route's parts
///
/// | [`RouteAddress`] | JetStream |
/// |---|---|
/// | [`source`](RouteAddress::source) | the stream (it must exist) |
/// | [`group`](RouteAddress::group) | the durable pull consumer, created if missing |
///
/// The dead-letter sink writes to `<stream>.<consumer>.dlq` on the stream
/// `<stream>_dlq` (created if missing), which
/// [`dead_letter_store`](Broker::dead_letter_store) reads. With
/// [`RouteOptions::parking`], the parking is the source's own
/// ([`NatsSource::parking`]): a parked message waits in this process and
/// the same source gives it back once due, so it cannot be stranded. The
/// delays are exact; [`ParkingOptions::tiers`](intake_core::backend::ParkingOptions::tiers)
/// are ignored.
///
/// # Secrets
///
/// Credentials in the URL (`nats://user:password@host`,
/// `nats://token@host`) or given to a [`NatsSettings`] setter never appear
/// in `Debug`, logs or errors: the endpoint is shown with `***` in their
/// place.
///
/// ```no_run
/// use intake_core::backend::{Broker, RouteAddress, RouteOptions};
/// use intake_nats::NatsBroker;
///
/// # async fn run() -> Result<(), intake_nats::Error> {
/// let broker = NatsBroker::from_url("nats://127.0.0.1:4222")?;
/// let address = RouteAddress::new("ORDERS", "billing");
/// let parts = broker.route(&address, &RouteOptions::new().parking()).await?;
/// // `parts.source` and `parts.acker` to the consumer runtime, the sink to
/// // the dead-letter layer, the parking to the parking layer.
/// # drop(parts);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct NatsBroker {
    settings: NatsSettings,
    ack_timeout: Duration,
    shared: Arc<Shared>,
}

/// What the broker's clones share.
#[derive(Default)]
struct Shared {
    /// The publishers the broker made, closed by `shutdown`. Weak, so that
    /// a publisher its users dropped closes its connection as before.
    publishers: Mutex<Vec<Weak<PublisherHandle>>>,
    /// The connection every lag probe of this broker asks on, made at the
    /// first probe.
    probes: tokio::sync::OnceCell<Connection>,
}

impl fmt::Debug for NatsBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsBroker")
            .field("settings", &self.settings)
            .field("ack_timeout", &self.ack_timeout)
            .finish_non_exhaustive()
    }
}

impl NatsBroker {
    /// Default of [`NatsSettings::connect_timeout`].
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = NatsSettings::DEFAULT_CONNECT_TIMEOUT;
    /// Default of [`ack_timeout`](Self::ack_timeout), as the builders'.
    pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(10);

    /// The server(s) `settings` reach ([`NatsSettings`]), or the server(s)
    /// at a URL: `nats://[user:password@|token@]host[:port]`, `tls://…`
    /// for TLS, several separated by commas. The URL is checked when the
    /// first part is derived; [`from_url`](Self::from_url) checks it at
    /// once.
    pub fn new(settings: impl Into<NatsSettings>) -> Self {
        Self {
            settings: settings.into(),
            ack_timeout: Self::DEFAULT_ACK_TIMEOUT,
            shared: Arc::default(),
        }
    }

    /// The server(s) at `url`, as [`new`](Self::new), the URL checked now.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] (credentials replaced by `***`) for a URL that
    /// is not a NATS address list.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        ServerUrls::parse(url)?;
        Ok(Self::new(url))
    }

    /// How long the server may take to confirm what a part asks: a batch
    /// of acknowledgements, a dead letter, a publish, a JetStream API
    /// request (default 10 s).
    pub fn ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = timeout;
        // What clones made with the old value (the probes' connection,
        // publishers to shut down) is theirs.
        self.shared = Arc::default();
        self
    }

    /// How the broker's parts connect.
    pub fn settings(&self) -> &NatsSettings {
        &self.settings
    }

    /// The server(s), as logs and errors show them (no credentials).
    pub fn endpoint(&self) -> String {
        self.settings.endpoint()
    }

    /// Group `group`'s control `log` (see
    /// [`group_control`](intake_core::group_control)): the stream
    /// `INTAKE_CONTROL_{group}` (commands, kept until deleted) or
    /// `INTAKE_STATUS_{group}` (status, an hour's `max_age`), created when
    /// missing, on a connection of the channel's own made with the broker's
    /// settings. Appends wait for the stream's publish ack, within the
    /// [`ack_timeout`](Self::ack_timeout); so do the stream's creation and
    /// a feed's opening. How a group becomes a name, and how a feed ends
    /// when the server goes away, is on [`NatsControlChannel`].
    ///
    /// ```no_run
    /// use intake_core::group_control::{ControlLog, GroupControl};
    /// use intake_nats::NatsBroker;
    ///
    /// # async fn run() -> Result<(), intake_nats::Error> {
    /// let broker = NatsBroker::from_url("nats://127.0.0.1:4222")?;
    /// let commands = broker.control_channel("billing", ControlLog::Commands).await?;
    /// let status = broker.control_channel("billing", ControlLog::Status).await?;
    /// let group = GroupControl::new(commands, "instance-a").with_status(status);
    /// // `App::new()…group_control(group)`.
    /// # drop(group);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an empty group; as
    /// [`NatsPublisherBuilder::build`](crate::NatsPublisherBuilder::build)
    /// when connecting fails ([`Error::Unreachable`], transient);
    /// [`Error::JetStream`] when the stream cannot be created (transient
    /// when the server cannot now), [`Error::Unconfirmed`] when it did not
    /// answer in time.
    pub async fn control_channel(
        &self,
        group: &str,
        log: ControlLog,
    ) -> Result<NatsControlChannel, Error> {
        // A publisher of its own, not registered for `shutdown`: the
        // group's log outlives the routes' publishers while the app stops,
        // and the channel's connection closes when it and its feeds are
        // dropped.
        let publisher = NatsPublisher::builder(&self.settings)
            .ack_timeout(self.ack_timeout)
            .send_timeout(self.ack_timeout)
            .build()
            .await?;
        NatsControlChannel::open(publisher, group, log, self.ack_timeout).await
    }

    /// The source of the route at `address`, with the broker's settings.
    async fn source(&self, address: &RouteAddress) -> Result<NatsSource, Error> {
        NatsSource::builder(&self.settings)
            .stream(address.source())
            .consumer(address.group())
            .ack_timeout(self.ack_timeout)
            .build()
            .await
    }

    /// The connection the lag probes share, made once.
    async fn probe_connection(&self) -> Result<&Connection, Error> {
        self.shared
            .probes
            .get_or_try_init(|| async {
                let settings = self
                    .settings
                    .connect_settings(self.ack_timeout, default_reconnect_backoff)?;
                connection::connect(&settings).await
            })
            .await
    }

    fn publishers(&self) -> std::sync::MutexGuard<'_, Vec<Weak<PublisherHandle>>> {
        // A push or a drain leaves the list whole whatever panics.
        self.shared
            .publishers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The parts of a JetStream route (see [`NatsBroker`]): the stream must
/// exist; the durable consumer and the dead-letter stream are created when
/// missing.
impl Broker for NatsBroker {
    type Source = NatsSource;
    type Acker = NatsAcker;
    type DeadLetterSink = NatsDeadLetterSink;
    type Parking = NatsParking;
    type Publisher = NatsPublisher;
    type DeadLetterStore = NatsDeadLetterStore;
    type LagProbe = NatsLagProbe;
    type ControlChannel = NatsControlChannel;
    type Error = Error;

    fn kind(&self) -> &'static str {
        "nats"
    }

    /// The source, its acker, its dead-letter sink and (asked for) its own
    /// parking: a parked message waits in this process and the source
    /// gives it back.
    ///
    /// # Errors
    ///
    /// As [`NatsSourceBuilder::build`](crate::NatsSourceBuilder::build)
    /// ([`Error::StreamNotFound`] for a stream that does not exist) and
    /// [`NatsDeadLetterSinkBuilder::build`](crate::NatsDeadLetterSinkBuilder::build).
    async fn route(
        &self,
        address: &RouteAddress,
        options: &RouteOptions,
    ) -> Result<RouteParts<Self>, Error> {
        let source = self.source(address).await?;
        let acker = source.acker();
        let dead_letter_sink = source.dead_letter_sink().build().await?;
        let parking = options.parking.as_ref().map(|_| source.parking());
        Ok(RouteParts::new(source, acker, dead_letter_sink, parking))
    }

    /// A publisher on a connection of its own, closed by
    /// [`shutdown`](Broker::shutdown).
    ///
    /// # Errors
    ///
    /// As [`NatsPublisherBuilder::build`](crate::NatsPublisherBuilder::build).
    async fn publisher(&self) -> Result<NatsPublisher, Error> {
        let publisher = NatsPublisher::builder(&self.settings)
            .ack_timeout(self.ack_timeout)
            .build()
            .await?;
        let mut publishers = self.publishers();
        publishers.retain(|publisher| publisher.strong_count() > 0);
        publishers.push(publisher.handle());
        Ok(publisher)
    }

    /// The letters the route's dead-letter sink writes
    /// (`<stream>.<consumer>.dlq` on `<stream>_dlq`), replayed through a
    /// [`publisher`](Broker::publisher) of this broker.
    ///
    /// # Errors
    ///
    /// As [`NatsDeadLettersBuilder::build`](crate::NatsDeadLettersBuilder::build)
    /// and [`NatsPublisherBuilder::build`](crate::NatsPublisherBuilder::build).
    async fn dead_letter_store(
        &self,
        address: &RouteAddress,
    ) -> Result<NatsDeadLetterStore, Error> {
        let letters = NatsDeadLetters::builder(&self.settings)
            .dead_letters_of(address.source(), address.group())
            .request_timeout(self.ack_timeout)
            .build()
            .await?;
        let publisher = Broker::publisher(self).await?;
        Ok(letters.store(publisher))
    }

    /// The lag of the route's durable consumer, on a connection every
    /// probe of this broker shares. Its
    /// [`parked`](intake_core::lag::LagProbe::parked) is `None`: see
    /// [`NatsLagProbe`].
    ///
    /// # Errors
    ///
    /// When connecting fails (the first probe makes the connection); the
    /// consumer is not looked up until the probe asks.
    async fn lag_probe(&self, address: &RouteAddress) -> Result<NatsLagProbe, Error> {
        let connection = self.probe_connection().await?;
        Ok(NatsLagProbe::of_source(
            connection.client.clone(),
            connection.endpoint.clone(),
            address.source(),
            address.group(),
        ))
    }

    async fn control_channel(
        &self,
        group: &str,
        log: ControlLog,
    ) -> Result<NatsControlChannel, Error> {
        NatsBroker::control_channel(self, group, log).await
    }

    /// Closes the publishers this broker made: each stops taking outputs,
    /// waits for the acks of those sent, and closes its connection, all
    /// within `timeout`. Nothing else runs in the background: a parked
    /// message waits in its source, which hands it back to the server when
    /// the consumer closes it.
    ///
    /// # Errors
    ///
    /// [`Error::Unconfirmed`] when the publishers did not close within
    /// `timeout` (their outputs stored or not).
    async fn shutdown(&self, timeout: Duration) -> Result<(), Error> {
        let publishers: Vec<NatsPublisher> = self
            .publishers()
            .drain(..)
            .filter_map(|handle| handle.upgrade())
            .map(NatsPublisher::from_handle)
            .collect();
        if publishers.is_empty() {
            return Ok(());
        }
        let count = publishers.len();
        let closing = futures_util::future::join_all(publishers.iter().map(NatsPublisher::close));
        match tokio::time::timeout(timeout, closing).await {
            Ok(_) => {
                tracing::debug!(publishers = count, "shut the NATS broker's publishers down");
                Ok(())
            }
            Err(_) => Err(Error::Unconfirmed {
                endpoint: self.endpoint(),
                what: format!("the close of {count} publishers"),
                waited: timeout,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_errors_never_show_a_secret() {
        let broker = NatsBroker::new(
            NatsSettings::new("nats://app:s3cret@127.0.0.1:4222")
                .token("t0ken")
                .nkey("SUseed"),
        );
        let shown = format!("{broker:?} {}", broker.endpoint());
        for secret in ["s3cret", "t0ken", "SUseed"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        let broker = NatsBroker::new(
            NatsSettings::new("nats://tok3n@127.0.0.1").user_password("app", "passw0rd"),
        );
        let shown = format!("{broker:?}");
        assert!(
            !shown.contains("tok3n") && !shown.contains("passw0rd"),
            "{shown}"
        );
        let error = NatsBroker::from_url("nats://app:s3cret@host/path").expect_err("a path");
        let shown = format!("{error} {error:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn its_kind_is_nats() {
        assert_eq!(NatsBroker::new("nats://127.0.0.1").kind(), "nats");
    }

    #[tokio::test]
    async fn a_shutdown_without_parts_has_nothing_to_wait_for() {
        let broker = NatsBroker::new("nats://127.0.0.1:1");
        broker
            .shutdown(Duration::from_millis(1))
            .await
            .expect("nothing to close");
    }
}
