//! [`KafkaPublisherBuilder`]: the producer's settings, intake's defaults
//! among them, and the producer made.

use super::*;

/// Builds a [`KafkaPublisher`] on the brokers of a [`KafkaSettings`]: every
/// librdkafka producer setting passes through it (TLS, SASL, `compression.type`,
/// `batch.size`, ...).
///
/// Defaults intake applies unless the settings say otherwise:
/// `linger.ms=5`, `partitioner=murmur2_random` (Java's partitioner for keyed
/// records), `queue.buffering.max.messages=100000`,
/// `queue.buffering.max.kbytes=65536` (64 MiB, not librdkafka's 1 GiB),
/// `message.timeout.ms` from [`delivery_timeout`](Self::delivery_timeout).
/// Always applied: `enable.idempotence=true`.
///
/// The producer is made in this one place ([`build`](Self::build)), so a
/// transactional variant can start from the same settings.
#[derive(Debug, Clone)]
pub struct KafkaPublisherBuilder {
    pub(super) settings: KafkaSettings,
    pub(super) linger: Duration,
    pub(super) max_buffered: u32,
    pub(super) max_buffered_kbytes: u32,
    pub(super) send_timeout: Duration,
    pub(super) delivery_timeout: Duration,
}

impl KafkaPublisherBuilder {
    /// How long librdkafka gathers outputs into a batch before sending it
    /// (`linger.ms`, default 5 ms, unless the settings set it): longer makes
    /// fewer, larger requests at the cost of latency.
    pub fn linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// The most outputs sent but not yet confirmed
    /// (`queue.buffering.max.messages`, default 100,000, unless the settings
    /// set it): a send beyond it waits for room.
    pub fn max_buffered(mut self, outputs: u32) -> Self {
        self.max_buffered = outputs;
        self
    }

    /// The most KiB of outputs sent but not yet confirmed
    /// (`queue.buffering.max.kbytes`, default 65,536 = 64 MiB, unless the
    /// settings set it).
    pub fn max_buffered_kbytes(mut self, kbytes: u32) -> Self {
        self.max_buffered_kbytes = kbytes;
        self
    }

    /// How long a send waits for room in a full buffer before it fails with
    /// [`Unavailable`](PublishErrorKind::Unavailable) (default 10 s).
    pub fn send_timeout(mut self, timeout: Duration) -> Self {
        self.send_timeout = timeout;
        self
    }

    /// How long an output may wait for its delivery report, queueing and
    /// retries included, before its receipt fails with
    /// [`Unavailable`](PublishErrorKind::Unavailable) (default 30 s;
    /// librdkafka's `message.timeout.ms`, unless the settings set it).
    pub fn delivery_timeout(mut self, timeout: Duration) -> Self {
        self.delivery_timeout = timeout;
        self
    }

    /// The producer's librdkafka settings: the given ones, intake's defaults
    /// where they say nothing, and idempotence.
    fn producer_settings(&self) -> Result<KafkaSettings, Error> {
        if self.settings.is_true("enable.idempotence") == Some(false) {
            return Err(Error::config(
                "enable.idempotence",
                "must be true: without it a retried batch can be stored twice or after a later one, and outputs lose their order; remove the setting",
            ));
        }
        if self.max_buffered == 0 || self.max_buffered_kbytes == 0 {
            return Err(Error::config(
                "max_buffered",
                "the buffer needs room for at least one output and 1 KiB",
            ));
        }
        let mut settings = self.settings.clone();
        let delivery_timeout = self.delivery_timeout.as_millis().to_string();
        let defaults = [
            ("linger.ms", self.linger.as_millis().to_string()),
            ("partitioner", "murmur2_random".to_owned()),
            (
                "queue.buffering.max.messages",
                self.max_buffered.to_string(),
            ),
            (
                "queue.buffering.max.kbytes",
                self.max_buffered_kbytes.to_string(),
            ),
            ("message.timeout.ms", delivery_timeout),
        ];
        let config = settings.client_config_mut();
        for (key, value) in defaults {
            if config.get(key).is_none() {
                config.set(key, value);
            }
        }
        config.set("enable.idempotence", "true");
        Ok(settings)
    }

    /// Creates the producer and its polling thread. It connects on the first
    /// send.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for settings librdkafka refuses (a secret's value
    /// never shown), `enable.idempotence=false`, or an empty buffer.
    pub fn build(self) -> Result<KafkaPublisher, Error> {
        let settings = self.producer_settings()?;
        let brokers: Arc<str> = settings.endpoint().into();
        let delivery_timeout = settings
            .get("message.timeout.ms")
            .and_then(|ms| ms.parse().ok())
            .map_or(self.delivery_timeout, Duration::from_millis);
        let shared = Arc::new(Shared {
            awaiting: AtomicIsize::new(0),
            waiting: AtomicUsize::new(0),
            room: Notify::new(),
            closed: AtomicBool::new(false),
            brokers: Arc::clone(&brokers),
            delivery_timeout,
        });
        let context = PublisherContext {
            shared: Arc::clone(&shared),
            alone: Some(Alone::new(&settings)),
        };
        let producer: ThreadedProducer<PublisherContext> = settings
            .client_config()
            .create_with_context(context)
            .map_err(|error| Error::from_kafka(error, &brokers, Duration::ZERO))?;
        tracing::debug!(%brokers, ?delivery_timeout, send_timeout = ?self.send_timeout, "kafka publisher created");
        Ok(KafkaPublisher {
            inner: Arc::new(Inner {
                producer,
                shared,
                line: tokio::sync::Mutex::new(()),
                send_timeout: self.send_timeout,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotence_cannot_be_turned_off() {
        let built = KafkaPublisher::builder(
            KafkaSettings::new("127.0.0.1:9").set("enable.idempotence", "false"),
        )
        .build();
        assert!(
            matches!(built, Err(Error::Config { ref setting, .. }) if setting == "enable.idempotence"),
            "{built:?}"
        );
    }

    #[test]
    fn the_settings_win_over_intakes_defaults() {
        let builder = KafkaPublisher::builder(
            KafkaSettings::new("127.0.0.1:9")
                .set("linger.ms", "50")
                .set("partitioner", "consistent_random"),
        )
        .max_buffered(8);
        let settings = builder.producer_settings().expect("valid");
        assert_eq!(settings.get("linger.ms"), Some("50"));
        assert_eq!(settings.get("partitioner"), Some("consistent_random"));
        assert_eq!(settings.get("queue.buffering.max.messages"), Some("8"));
        assert_eq!(settings.get("message.timeout.ms"), Some("30000"));
        assert_eq!(settings.get("enable.idempotence"), Some("true"));
    }
}
