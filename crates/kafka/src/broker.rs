//! [`KafkaBroker`]: one Kafka connection's settings, from which every part
//! of a route is derived ([`Broker`]).

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use intake_core::backend::{Broker, RouteAddress, RouteOptions, RouteParts};
use intake_core::group_control::ControlLog;
use intake_core::publish::PublishError;
use intake_core::redact;

use crate::error::Error;
use crate::parking::{DEFAULT_RETURN_TEMPLATE, ParkedCounter, ParkingError};
use crate::{
    GroupProtocol, KafkaAcker, KafkaControlChannel, KafkaDeadLetterSink, KafkaDeadLetterStore,
    KafkaDeadLetters, KafkaLagProbe, KafkaParking, KafkaPublisher, KafkaSettings, KafkaSource,
};

#[cfg(doc)]
use intake_core::lag::LagProbe;

/// A Kafka cluster's connection, given once ([`KafkaSettings`]: brokers,
/// TLS, SASL, any librdkafka setting), and every part of a route derived
/// from it with [`Broker`]'s methods:
///
/// | part | derived as |
/// |---|---|
/// | source | [`KafkaSource::builder`] for the address's topic and group, reading the parking's return topic when the route parks ([`KafkaSourceBuilder::parking`](crate::KafkaSourceBuilder::parking)) |
/// | acker | [`KafkaSource::acker`] |
/// | dead-letter sink | [`KafkaSource::dead_letter_sink`]: `{topic}.{group}.dlq`, a returned copy named after its first delivery |
/// | parking | [`KafkaParking::builder`] for the group and topic, the options' tiers (else [`DEFAULT_TIERS`](crate::parking::DEFAULT_TIERS)), built **before** the source, which reads its return topic `{topic}.{group}.returned` |
/// | publisher | one [`KafkaPublisher`], shared by every call |
/// | dead-letter store | [`KafkaDeadLetters::builder`]`.dead_letters_of(topic, group)`, replaying through the publisher: [to the group](intake_core::dead_letter::store::Replay::to_group) into its return topic |
/// | lag probe | [`KafkaLagProbe`] of the group on the topic and its return topic (when it exists); [`parked`](LagProbe::parked) counts the group's retry topics |
/// | group control channel | [`control_channel`](Self::control_channel): the group's commands or status log, a topic of one partition ([`KafkaControlChannel`]) |
///
/// The parts use the default names of each explicit builder, so a part
/// derived here and one built by hand with the defaults (or by the `intake`
/// command line) agree.
///
/// Clones share the parkings the broker derived and its publisher;
/// [`Broker::shutdown`] stops the parkings' movers and closes the
/// publisher. `Debug` shows the settings with their secrets hidden.
///
/// ```no_run
/// use intake_core::backend::{Broker, RouteAddress, RouteOptions};
/// use intake_kafka::KafkaBroker;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let broker = KafkaBroker::from_url("kafka://127.0.0.1:9092")?;
/// let address = RouteAddress::new("payments", "billing");
/// let parts = broker.route(&address, &RouteOptions::new().parking()).await?;
/// assert!(parts.parking.is_some());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct KafkaBroker {
    settings: KafkaSettings,
    /// Every parking a route was derived with, for the shutdown.
    parkings: Arc<Mutex<Vec<KafkaParking>>>,
    /// The publisher, made on the first call that needs it.
    publisher: Arc<Mutex<Option<KafkaPublisher>>>,
}

impl fmt::Debug for KafkaBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parkings = self
            .parkings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        f.debug_struct("KafkaBroker")
            .field("settings", &self.settings)
            .field("parkings", &parkings)
            .finish_non_exhaustive()
    }
}

impl KafkaBroker {
    /// The broker of `settings`: each part is built with them (the
    /// consumer's, producer's and admin settings alike).
    pub fn new(settings: KafkaSettings) -> Self {
        Self {
            settings,
            parkings: Arc::default(),
            publisher: Arc::default(),
        }
    }

    /// The broker at `url`:
    /// `kafka://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...][?SETTING=VALUE&...]`,
    /// or `kafkas://` for TLS (`security.protocol=SSL`).
    ///
    /// A user and password (percent-encoded) log in with SASL
    /// (`SASL_PLAINTEXT`, or `SASL_SSL` under `kafkas://`), mechanism
    /// `PLAIN` unless the query names one (`?sasl.mechanism=SCRAM-SHA-512`).
    /// Every query parameter is a librdkafka setting, percent-decoded
    /// (`ssl.ca.location`, `client.id`, ...), but `group_protocol` (or
    /// `group.protocol`): the [`GroupProtocol`] of the consumers,
    /// `classic` (the default) or `consumer` (KIP-848), as
    /// [`KafkaSettings::group_protocol`] sets it
    /// (`kafka://127.0.0.1:9092?group_protocol=consumer`). For settings that
    /// do not fit a URL, use [`new`](Self::new) with [`KafkaSettings`].
    ///
    /// # Errors
    ///
    /// [`Error::Config`] (setting `url`) for another scheme, no host, an
    /// ambiguous user info (a password with an unescaped `/`, `?`, `#` or
    /// `@`), or a query parameter without a value; [`Error::Config`]
    /// (setting `group.protocol`) for a group protocol other than `classic`
    /// and `consumer`. The error shows the URL
    /// with its password hidden, never a secret.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let url = url.trim();
        let invalid = |problem: String| Error::config("url", problem);
        let (rest, tls) = if let Some(rest) = url.strip_prefix("kafka://") {
            (rest, false)
        } else if let Some(rest) = url.strip_prefix("kafkas://") {
            (rest, true)
        } else {
            return Err(invalid(format!(
                "`{}` must start with kafka:// (or kafkas:// for TLS)",
                redact::url(url)
            )));
        };
        if redact::check_user_info(url).is_err() {
            return Err(invalid(format!(
                "`{}`: percent-encode `/`, `?`, `#` and `@` in the user and password",
                redact::url(url)
            )));
        }
        let (authority, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (user_info, hosts) = match authority.rsplit_once('@') {
            Some((user_info, hosts)) => (Some(user_info), hosts),
            None => (None, authority),
        };
        let hosts = hosts.trim_end_matches('/');
        if hosts.is_empty() || hosts.split(',').any(|host| host.trim().is_empty()) {
            return Err(invalid(format!(
                "`{}` names no broker: kafka://HOST:PORT[,HOST:PORT...]",
                redact::url(url)
            )));
        }
        let mut settings = KafkaSettings::new(hosts);
        let protocol = match (user_info.is_some(), tls) {
            (false, false) => None,
            (false, true) => Some("SSL"),
            (true, false) => Some("SASL_PLAINTEXT"),
            (true, true) => Some("SASL_SSL"),
        };
        if let Some(protocol) = protocol {
            settings = settings.set("security.protocol", protocol);
        }
        if let Some(user_info) = user_info {
            let (user, password) = user_info.split_once(':').unwrap_or((user_info, ""));
            settings = settings
                .set("sasl.mechanism", "PLAIN")
                .set("sasl.username", percent_decoded(user))
                .set("sasl.password", percent_decoded(password));
        }
        for parameter in query.split('&').filter(|parameter| !parameter.is_empty()) {
            let Some((key, value)) = parameter.split_once('=') else {
                // Not quoted: a name without a value may be a stray secret.
                return Err(invalid(format!(
                    "`{}`: a query parameter has no value; write SETTING=VALUE",
                    redact::url(url)
                )));
            };
            // librdkafka's alias: the last one given wins, not both.
            let key = match percent_decoded(key) {
                key if key == "sasl.mechanisms" => "sasl.mechanism".to_owned(),
                key => key,
            };
            if key == "group_protocol" || key == "group.protocol" {
                // Checked here, not first when a consumer is built.
                let protocol: GroupProtocol = percent_decoded(value).parse()?;
                settings = settings.group_protocol(protocol);
                continue;
            }
            settings = settings.set(key, percent_decoded(value));
        }
        Ok(Self::new(settings))
    }

    /// The settings every part is built with.
    pub fn settings(&self) -> &KafkaSettings {
        &self.settings
    }

    /// Consumer group `group`'s `log` (see
    /// [`group_control`](intake_core::group_control)): the topic
    /// `{group}.intake-control` or `{group}.intake-status`, one partition,
    /// created on first use ([`KafkaControlChannel`] has the names and
    /// settings). Its clients are its own, built with the broker's
    /// settings; they connect on first use, so a broker that is down fails
    /// the channel's calls, not this one. Give it to
    /// [`GroupControl::new`](intake_core::group_control::GroupControl::new)
    /// for the commands log.
    ///
    /// # Errors
    ///
    /// [`KafkaBrokerError::Part`] (part `control channel`) for settings
    /// librdkafka refuses (a secret's value never shown).
    pub async fn control_channel(
        &self,
        group: &str,
        log: ControlLog,
    ) -> Result<KafkaControlChannel, KafkaBrokerError> {
        KafkaControlChannel::new(&self.settings, group, log).map_err(|source| {
            KafkaBrokerError::Part {
                part: "control channel",
                address: format!("group `{group}`'s {} log", log.as_str()),
                source,
            }
        })
    }

    /// The shared publisher, made on the first call.
    fn shared_publisher(&self) -> Result<KafkaPublisher, Error> {
        let mut publisher = self
            .publisher
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(publisher) = &*publisher {
            return Ok(publisher.clone());
        }
        let made = KafkaPublisher::builder(self.settings.clone()).build()?;
        *publisher = Some(made.clone());
        Ok(made)
    }

    /// The parking of the route at `address`, with `tiers` or the
    /// parking's defaults.
    async fn parking(
        &self,
        address: &RouteAddress,
        tiers: Option<&[Duration]>,
    ) -> Result<KafkaParking, Error> {
        let mut parking = KafkaParking::builder(self.settings.clone(), address.group())
            .topics([address.source()]);
        if let Some(tiers) = tiers {
            parking = parking.tiers(tiers.iter().copied());
        }
        parking.build().await
    }
}

/// Why a [`KafkaBroker`] could not derive a part, or stop what its parts
/// run. The client's own error is the [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaBrokerError {
    /// A part of the route at `address` could not be built.
    #[error("cannot derive the {part} of {address} from the Kafka broker")]
    Part {
        /// Which part: `parking`, `source`, `dead-letter sink`, ...
        part: &'static str,
        /// The route's address (`topic as group`).
        address: String,
        /// What the part's builder said.
        source: Error,
    },
    /// The broker's publisher could not be built.
    #[error("cannot derive the Kafka broker's publisher")]
    Publisher(#[source] Error),
    /// A parking's mover did not stop within the shutdown's timeout.
    #[error("the parking of group `{group}` did not stop in time")]
    ParkingShutdown {
        /// The parking's consumer group.
        group: String,
        /// The parking's error.
        source: ParkingError,
    },
    /// The publisher still had outputs unconfirmed at the end of the
    /// shutdown's timeout.
    #[error("the Kafka broker's publisher closed with outputs unconfirmed")]
    PublisherShutdown(#[source] PublishError),
}

impl KafkaBrokerError {
    /// Whether trying again later, unchanged, may succeed (see
    /// [`Error::is_transient`]); a shutdown that timed out is.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Part { source, .. } | Self::Publisher(source) => source.is_transient(),
            Self::ParkingShutdown { .. } | Self::PublisherShutdown(_) => true,
        }
    }
}

impl Broker for KafkaBroker {
    type Source = KafkaSource;
    type Acker = KafkaAcker;
    type DeadLetterSink = KafkaDeadLetterSink;
    type Parking = KafkaParking;
    type Publisher = KafkaPublisher;
    type DeadLetterStore = KafkaDeadLetterStore;
    type LagProbe = KafkaLagProbe;
    type ControlChannel = KafkaControlChannel;
    type Error = KafkaBrokerError;

    fn kind(&self) -> &'static str {
        "kafka"
    }

    /// The route's parts: with parking, the parking first (it makes the
    /// return topic), then a source that reads it
    /// ([`KafkaSourceBuilder::parking`](crate::KafkaSourceBuilder::parking)),
    /// whose dead-letter sink names a returned copy after its first
    /// delivery. The parking is kept for [`shutdown`](Broker::shutdown).
    async fn route(
        &self,
        address: &RouteAddress,
        options: &RouteOptions,
    ) -> Result<RouteParts<Self>, KafkaBrokerError> {
        let failed = |part: &'static str| {
            move |source: Error| KafkaBrokerError::Part {
                part,
                address: address.to_string(),
                source,
            }
        };
        let parking = match &options.parking {
            Some(parking) => Some(
                self.parking(address, parking.tiers.as_deref())
                    .await
                    .map_err(failed("parking"))?,
            ),
            None => None,
        };
        let mut source = KafkaSource::builder(self.settings.clone())
            .group(address.group())
            .topic(address.source());
        if let Some(parking) = &parking {
            source = source.parking(parking);
        }
        // On an error the parking is dropped here, and its mover stops.
        let source = source.build().await.map_err(failed("source"))?;
        let acker = source.acker();
        let dead_letter_sink = source
            .dead_letter_sink()
            .build()
            .await
            .map_err(failed("dead-letter sink"))?;
        if let Some(parking) = &parking {
            self.parkings
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(parking.clone());
        }
        Ok(RouteParts::new(source, acker, dead_letter_sink, parking))
    }

    /// The broker's one publisher (a clone of it on every call); made on
    /// the first call. It connects on its first send.
    async fn publisher(&self) -> Result<KafkaPublisher, KafkaBrokerError> {
        self.shared_publisher().map_err(KafkaBrokerError::Publisher)
    }

    /// The route's dead-letter topic `{topic}.{group}.dlq`, as its derived
    /// sink writes it, replaying through the broker's publisher: to the
    /// group's return topic `{topic}.{group}.returned`
    /// ([`Replay::to_group`](intake_core::dead_letter::store::Replay::to_group)),
    /// or to the origin. The clients connect on first use.
    async fn dead_letter_store(
        &self,
        address: &RouteAddress,
    ) -> Result<KafkaDeadLetterStore, KafkaBrokerError> {
        let failed = |source| KafkaBrokerError::Part {
            part: "dead-letter store",
            address: address.to_string(),
            source,
        };
        let log = KafkaDeadLetters::builder(self.settings.clone())
            .dead_letters_of(address.source(), address.group())
            .build()
            .map_err(failed)?;
        Ok(log.store(self.shared_publisher().map_err(failed)?))
    }

    /// The group's lag on the topic and on its return topic (where it
    /// exists: copies moved back and not handled yet), and as
    /// [`parked`](LagProbe::parked) the records in the group's retry
    /// topics `{topic}.{group}.retry.{tier}` (every tier) that its movers
    /// have not moved back: the parked backlog, `Some(0)` for a route that
    /// never parked. Counted on the brokers, so any process (the `intake`
    /// command line too) sees what the route's processes parked.
    async fn lag_probe(&self, address: &RouteAddress) -> Result<KafkaLagProbe, KafkaBrokerError> {
        let failed = |source| KafkaBrokerError::Part {
            part: "lag probe",
            address: address.to_string(),
            source,
        };
        let (topic, group) = (address.source(), address.group());
        let return_topic = DEFAULT_RETURN_TEMPLATE
            .replace("{topic}", topic)
            .replace("{group}", group);
        let counter = ParkedCounter::new(&self.settings, topic, group).map_err(|error| {
            failed(Error::from_kafka(
                error,
                &self.settings.endpoint(),
                Duration::ZERO,
            ))
        })?;
        Ok(KafkaLagProbe::new(&self.settings, group, [topic])
            .map_err(failed)?
            .optional_topics([return_topic])
            .counting_parked(counter))
    }

    async fn control_channel(
        &self,
        group: &str,
        log: ControlLog,
    ) -> Result<KafkaControlChannel, KafkaBrokerError> {
        KafkaBroker::control_channel(self, group, log).await
    }

    /// Stops the movers of every parking a route was derived with (all
    /// told at once, then each waited for with what is left of `timeout`),
    /// then closes the publisher, waiting for its outputs' delivery reports
    /// with what is left. A second call has nothing left to stop; a later
    /// [`publisher`](Broker::publisher) makes a new one.
    ///
    /// # Errors
    ///
    /// The first part that did not stop in time (the others are still
    /// stopped, and logged); a mover stops on its own afterwards.
    async fn shutdown(&self, timeout: Duration) -> Result<(), KafkaBrokerError> {
        let deadline = Instant::now() + timeout;
        let parkings =
            std::mem::take(&mut *self.parkings.lock().unwrap_or_else(PoisonError::into_inner));
        let publisher = self
            .publisher
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        for parking in &parkings {
            parking.request_stop();
        }
        let mut first = None;
        for parking in parkings {
            let left = deadline.saturating_duration_since(Instant::now());
            if let Err(source) = parking.shutdown(left).await {
                tracing::warn!(group = parking.group(), error = %source, "kafka broker: a parking's mover did not stop in time");
                first.get_or_insert(KafkaBrokerError::ParkingShutdown {
                    group: parking.group().to_owned(),
                    source,
                });
            }
        }
        if let Some(publisher) = publisher {
            let left = deadline.saturating_duration_since(Instant::now());
            if let Err(error) = publisher.close(left).await {
                first.get_or_insert(KafkaBrokerError::PublisherShutdown(error));
            }
        }
        match first {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}

/// `text` with its `%XX` escapes decoded (bytes that are not UTF-8 become
/// U+FFFD); a `%` not followed by two hex digits stays as it is.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while let Some(&byte) = bytes.get(index) {
        let escaped = bytes
            .get(index + 1..index + 3)
            .filter(|_| byte == b'%')
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(escaped) => {
                decoded.push(escaped);
                index += 3;
            }
            None => {
                decoded.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_url_names_the_brokers() {
        let broker = KafkaBroker::from_url("kafka://a:9092,b:9093/").unwrap();
        assert_eq!(broker.settings().bootstrap_servers(), "a:9092,b:9093");
        assert_eq!(broker.settings().get("security.protocol"), None);
        assert_eq!(broker.kind(), "kafka");
    }

    #[test]
    fn the_url_chooses_the_group_protocol_typed() {
        for url in [
            "kafka://a:9092?group_protocol=consumer",
            "kafka://a:9092?group.protocol=Consumer",
            "kafka://a:9092?client.id=c&group_protocol=consumer",
        ] {
            let broker = KafkaBroker::from_url(url).unwrap();
            assert_eq!(broker.settings().get("group.protocol"), Some("consumer"));
            assert_eq!(
                broker.settings().chosen_group_protocol().ok(),
                Some(GroupProtocol::Consumer),
                "{url}"
            );
        }
        let classic = KafkaBroker::from_url("kafka://a:9092").unwrap();
        assert_eq!(
            classic.settings().chosen_group_protocol().ok(),
            Some(GroupProtocol::Classic)
        );
        let refused = KafkaBroker::from_url("kafka://a:9092?group_protocol=kip-848");
        assert!(
            matches!(refused, Err(Error::Config { ref setting, .. }) if setting == "group.protocol"),
            "{refused:?}"
        );
    }

    #[test]
    fn credentials_in_the_url_log_in_with_sasl_and_never_show() {
        let broker = KafkaBroker::from_url(
            "kafkas://billing:s3cr%2Ft%40x@a:9092?sasl.mechanism=SCRAM-SHA-512&client.id=b%20c",
        )
        .unwrap();
        let settings = broker.settings();
        assert_eq!(settings.bootstrap_servers(), "a:9092");
        assert_eq!(settings.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(settings.get("sasl.mechanism"), Some("SCRAM-SHA-512"));
        assert_eq!(settings.get("sasl.username"), Some("billing"));
        assert_eq!(settings.get("sasl.password"), Some("s3cr/t@x"));
        assert_eq!(settings.get("client.id"), Some("b c"));
        let shown = format!("{broker:?}");
        assert!(!shown.contains("s3cr"), "{shown}");
        assert!(!shown.contains("billing"), "{shown}");

        let plain = KafkaBroker::from_url("kafka://u:p4ss@a:9092").unwrap();
        assert_eq!(
            plain.settings().get("security.protocol"),
            Some("SASL_PLAINTEXT")
        );
        assert_eq!(plain.settings().get("sasl.mechanism"), Some("PLAIN"));
        let tls = KafkaBroker::from_url("kafkas://a:9093").unwrap();
        assert_eq!(tls.settings().get("security.protocol"), Some("SSL"));
    }

    #[test]
    fn a_bad_url_is_a_config_error_without_its_password() {
        for url in [
            "redis://u:hunter2@a:6379",
            "kafka://",
            "kafka://u:hunter2@",
            "kafka://u:hunter2@a:9092,",
            "kafka://u:hun/ter2@a:9092",
            "kafka://u:hunter2@a:9092?client.id",
        ] {
            let error = KafkaBroker::from_url(url).expect_err(url);
            let shown = format!("{error} {error:?}");
            assert!(matches!(error, Error::Config { .. }), "{url}: {shown}");
            assert!(!shown.contains("hunter2"), "{url}: {shown}");
            assert!(!shown.contains("ter2"), "{url}: {shown}");
        }
    }

    #[test]
    fn percent_decoding_keeps_what_is_no_escape() {
        assert_eq!(percent_decoded("a%2Fb%zz%4"), "a/b%zz%4");
        assert_eq!(percent_decoded("%E2%82%AC+"), "€+");
    }
}
