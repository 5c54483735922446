//! [`KafkaDeadLetterSink`]: poison messages to a dead-letter topic.

use std::sync::Arc;
use std::time::Duration;

use intake_core::{DeadLetter, DeadLetterError, DeadLetterSink};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

use crate::error::ConnectError;
use crate::settings::KafkaSettings;
use crate::source::epoch_millis;

/// Names of the headers a dead letter carries besides the original ones.
pub mod header {
    /// The topic the message was consumed from.
    pub const TOPIC: &str = "intake.origin.topic";
    /// Its partition, in decimal.
    pub const PARTITION: &str = "intake.origin.partition";
    /// Its offset, in decimal.
    pub const OFFSET: &str = "intake.origin.offset";
    /// Its key, as raw bytes (absent when it had none; the dead letter's own
    /// key is the original key too).
    pub const KEY: &str = "intake.origin.key";
    /// The consumer group that gave up on it.
    pub const GROUP: &str = "intake.origin.group";
    /// The last error, as text.
    pub const ERROR: &str = "intake.error";
    /// Attempts made, in decimal.
    pub const ATTEMPTS: &str = "intake.attempts";
    /// When it was given up, in milliseconds since the Unix epoch.
    pub const FAILED_AT: &str = "intake.failed_at";
}

/// The default dead-letter topic: one per source topic and group, so groups
/// never receive each other's dead letters.
pub const DEFAULT_TOPIC_TEMPLATE: &str = "{topic}.{group}.dlq";

/// Writes dead letters to a Kafka topic and resolves once the broker
/// acknowledged the write (the producer's delivery report; with
/// librdkafka's default `acks=all`, every in-sync replica has it).
///
/// The record keeps the original payload, key and headers, and adds the
/// [`header`] set: origin topic, partition, offset, key, group, the last
/// error, the attempt count and the time.
#[derive(Clone)]
pub struct KafkaDeadLetterSink {
    producer: FutureProducer,
    group: Arc<str>,
    template: Arc<str>,
    queue_timeout: Duration,
    brokers: Arc<str>,
}

impl std::fmt::Debug for KafkaDeadLetterSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaDeadLetterSink")
            .field("brokers", &self.brokers)
            .field("group", &self.group)
            .field("template", &self.template)
            .finish_non_exhaustive()
    }
}

/// Builds a [`KafkaDeadLetterSink`].
#[derive(Debug, Clone)]
pub struct KafkaDeadLetterSinkBuilder {
    settings: KafkaSettings,
    group: String,
    template: String,
    delivery_timeout: Duration,
}

impl KafkaDeadLetterSink {
    /// A sink on the brokers of `settings` for the consumer group `group`.
    pub fn builder(
        settings: KafkaSettings,
        group: impl Into<String>,
    ) -> KafkaDeadLetterSinkBuilder {
        KafkaDeadLetterSinkBuilder {
            settings,
            group: group.into(),
            template: DEFAULT_TOPIC_TEMPLATE.into(),
            delivery_timeout: Duration::from_secs(30),
        }
    }

    /// The dead-letter topic for messages of `topic`.
    pub fn topic_for(&self, topic: &str) -> String {
        self.template
            .replace("{topic}", topic)
            .replace("{group}", &self.group)
    }
}

impl KafkaDeadLetterSinkBuilder {
    /// The dead-letter topic's name, with `{topic}` and `{group}` replaced by
    /// the source topic and the group (default
    /// [`DEFAULT_TOPIC_TEMPLATE`]). A name without placeholders sends every
    /// dead letter to one topic.
    pub fn topic_template(mut self, template: impl Into<String>) -> Self {
        self.template = template.into();
        self
    }

    /// How long a write may wait for the broker's acknowledgement, queueing
    /// and retries included (default 30 s; librdkafka's
    /// `message.timeout.ms`, unless the settings set it).
    pub fn delivery_timeout(mut self, timeout: Duration) -> Self {
        self.delivery_timeout = timeout;
        self
    }

    /// Creates the producer.
    ///
    /// # Errors
    ///
    /// [`ConnectError::Config`] for settings librdkafka refuses or an empty
    /// topic template.
    pub fn build(self) -> Result<KafkaDeadLetterSink, ConnectError> {
        if self.template.trim().is_empty() {
            return Err(ConnectError::Config {
                setting: "topic_template".into(),
                problem: "must not be empty".into(),
            });
        }
        let brokers: Arc<str> = self.settings.bootstrap_servers().into();
        let mut settings = self.settings;
        if settings.get("message.timeout.ms").is_none() {
            settings = settings.set(
                "message.timeout.ms",
                self.delivery_timeout.as_millis().to_string(),
            );
        }
        let producer: FutureProducer = settings
            .client_config()
            .create()
            .map_err(|error| ConnectError::from_kafka(error, &brokers, Duration::ZERO))?;
        Ok(KafkaDeadLetterSink {
            producer,
            group: self.group.into(),
            template: self.template.into(),
            queue_timeout: self.delivery_timeout,
            brokers,
        })
    }
}

#[async_trait::async_trait]
impl DeadLetterSink for KafkaDeadLetterSink {
    async fn write(&self, letter: &DeadLetter) -> Result<(), DeadLetterError> {
        let message = &letter.message;
        let metadata = message.metadata();
        let topic = self.topic_for(metadata.source());
        let partition = metadata.partition().to_string();
        let offset = metadata.position().to_string();
        let attempts = letter.attempts.to_string();
        let failed_at = epoch_millis(letter.failed_at);

        let mut headers = OwnedHeaders::new_with_capacity(message.headers().len() + 8);
        for original in message.headers() {
            headers = headers.insert(Header {
                key: &original.name,
                value: Some(original.value.as_ref()),
            });
        }
        let origin: [(&str, &[u8]); 7] = [
            (header::TOPIC, metadata.source().as_bytes()),
            (header::PARTITION, partition.as_bytes()),
            (header::OFFSET, offset.as_bytes()),
            (header::GROUP, self.group.as_bytes()),
            (header::ERROR, letter.error.as_bytes()),
            (header::ATTEMPTS, attempts.as_bytes()),
            (header::FAILED_AT, failed_at.as_bytes()),
        ];
        for (key, value) in origin {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
        if let Some(key) = message.key() {
            headers = headers.insert(Header {
                key: header::KEY,
                value: Some(key.as_ref()),
            });
        }

        let mut record = FutureRecord::<[u8], [u8]>::to(&topic)
            .payload(message.payload().as_ref())
            .headers(headers);
        if let Some(key) = message.key() {
            record = record.key(key.as_ref());
        }
        match self
            .producer
            .send(record, Timeout::After(self.queue_timeout))
            .await
        {
            Ok(_delivery) => Ok(()),
            Err((error, _unsent)) => {
                tracing::warn!(%error, dead_letter_topic = %topic, "dead-letter write failed; the original stays unacknowledged");
                Err(DeadLetterError(
                    format!("producing to `{topic}` on {} failed: {error}", self.brokers).into(),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_topic_is_per_source_and_group() {
        let sink = KafkaDeadLetterSink::builder(KafkaSettings::new("127.0.0.1:9"), "billing")
            .build()
            .expect("a producer needs no broker to be built");
        assert_eq!(sink.topic_for("orders"), "orders.billing.dlq");
    }

    #[test]
    fn a_template_without_placeholders_is_one_topic() {
        let sink = KafkaDeadLetterSink::builder(KafkaSettings::new("127.0.0.1:9"), "billing")
            .topic_template("all-dead-letters")
            .build()
            .expect("valid");
        assert_eq!(sink.topic_for("orders"), "all-dead-letters");
    }
}
