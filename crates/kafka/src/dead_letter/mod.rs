//! [`KafkaDeadLetterSink`]: poison messages to a dead-letter topic.

mod builder;
mod producer;
mod topics;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::borrow::Cow;

use intake_core::dead_letter::envelope::{Broker, Carrier, Envelope};
use intake_core::{
    DeadLetter, FirstDelivery,
    backend::{DeadLetterError, DeadLetterSink},
    parking::{ORIGIN, first_delivery_of},
};
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;

use crate::error::Error;
use crate::settings::KafkaSettings;
use crate::topic_admin::{LazyAdmin, create_topic};

pub use self::builder::KafkaDeadLetterSinkBuilder;
pub(crate) use self::producer::producer_settings;
use self::topics::TopicCheck;

/// The default dead-letter topic: one per source topic and group, so groups
/// never receive each other's dead letters.
pub const DEFAULT_TOPIC_TEMPLATE: &str = "{topic}.{group}.dlq";

/// Writes dead letters to a Kafka topic and resolves once the broker
/// acknowledged the write (the producer's delivery report, `acks=all`:
/// every in-sync replica has it).
///
/// **Durability and duplicates.** The letter is the only copy of a message
/// whose original is committed next, so the producer writes with
/// `acks=all` and is **idempotent** (`enable.idempotence=true`): a write
/// librdkafka retries (a response lost to a timeout or a broken connection)
/// carries the same producer id and sequence number, and the broker keeps
/// one copy. Settings that explicitly set `acks` to another value or
/// `enable.idempotence=false` are kept, with a warning at build time (an
/// idempotent producer needs `acks=all`: other acks turn it off). Letters
/// carry no id of their own; duplicates remain where one write becomes
/// two: a write whose delivery report did not come within the
/// [delivery timeout](KafkaDeadLetterSinkBuilder::delivery_timeout) (it may
/// have been written; the dead-letter layer writes it again, or the
/// original is delivered again), and a crash or a rebalance between the
/// letter's write and the original's commit (the original is delivered
/// again and fails again). Two letters of one message name the same origin
/// (`intake.origin.source`, `.partition`, `.position`, `.group`): a reader
/// that must see each message once keeps one letter per origin.
/// `acks=all` is as strong as the topic: a topic the sink creates has one
/// partition and the broker's `default.replication.factor` (often 1 on a
/// development broker) unless [`new_topic`](KafkaDeadLetterSinkBuilder::new_topic)
/// says otherwise; in production use a replication factor of 3 and set the
/// broker's (or the topic's) `min.insync.replicas` to 2, so that a write
/// confirmed with `acks=all` is on two brokers at least. One partition
/// keeps the letters of a topic in the order they failed; more partitions
/// spread the load of many letters, without that order.
///
/// The record is the original payload and key (the record key is the
/// original key, not repeated in a header) with the dead-letter
/// [envelope](intake_core::dead_letter::envelope) as headers: the
/// producer's headers (a name in the `intake.` namespace as
/// `intake.producer.<name>`, so none passes for the origin), then origin
/// (topic, partition, offset, group), error class and text, attempts and
/// times. `docs/DEAD-LETTERS.md` has the table;
/// [`DeadLetter::read`] reads a record of the topic back.
///
/// A letter larger than the producer's `message.max.bytes` or the topic's
/// `max.message.bytes` can never be written: the write fails with
/// [`DeadLetterError::rejected`], and the dead-letter layer writes the
/// letter's [reference](intake_core::dead_letter::PayloadReference) (origin
/// and sizes, no payload) at once instead of retrying.
///
/// Before its first write to a dead-letter topic the sink checks that the
/// topic exists and, unless [told not to](KafkaDeadLetterSinkBuilder::create_missing_topics),
/// creates it (one partition, the broker's default replication factor;
/// both [configurable](KafkaDeadLetterSinkBuilder::new_topic)). A topic that
/// is missing and cannot be created fails the write with an [`Error`] that
/// says what to do ([`DeadLetterTopicMissing`](Error::DeadLetterTopicMissing),
/// [`DeadLetterTopicNotCreated`](Error::DeadLetterTopicNotCreated)), and the
/// original message stays unacknowledged.
///
/// A parked copy that came back through its group's return topic
/// (`{topic}.{group}.returned`, see [`KafkaParking`](crate::KafkaParking))
/// is a dead letter of its **first delivery**: it goes to the dead-letter
/// topic of the topic it was first consumed from, and its origin names that
/// topic, partition and offset (the park headers
/// [`ORIGIN`],
/// [`ORIGIN_PARTITION`](intake_core::parking::ORIGIN_PARTITION),
/// [`ORIGIN_POSITION`](intake_core::parking::ORIGIN_POSITION), or the
/// [`parked_from`](intake_core::Metadata::parked_from) a parking layer
/// inside set): the letter points at the original record, where a replay's
/// exactly-once marker knows it. The headers are believed only on a record
/// read from a return topic of the topic they name (the source's
/// [parking](crate::KafkaSourceBuilder::parking), or a consumed topic named
/// `{topic}.{group}.returned` for another consumed topic): a producer
/// cannot direct letters anywhere else, nor make a letter name another
/// record. A copy parked by an earlier version, without the partition and
/// offset headers, goes to the origin's dead-letter topic naming where it
/// is: its return topic, partition and offset.
#[derive(Clone)]
pub struct KafkaDeadLetterSink {
    producer: FutureProducer,
    topics: Arc<TopicCheck>,
    carrier: Arc<Carrier>,
    group: Arc<str>,
    /// The topics the consumer reads, which no letter may go to.
    consumed: Arc<HashSet<String>>,
    /// The return topics the consumer reads, with the origin whose copies
    /// come back there: the only records whose park headers are believed.
    returns: Arc<HashMap<String, String>>,
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

impl KafkaDeadLetterSink {
    /// A sink on the brokers of `settings` for the consumer group `group`.
    /// [`KafkaSource::dead_letter_sink`](crate::KafkaSource::dead_letter_sink)
    /// starts one from a source, with its settings, group and topics.
    pub fn builder(
        settings: KafkaSettings,
        group: impl Into<String>,
    ) -> KafkaDeadLetterSinkBuilder {
        KafkaDeadLetterSinkBuilder {
            settings,
            group: group.into(),
            consumed: Vec::new(),
            returns: Vec::new(),
            template: DEFAULT_TOPIC_TEMPLATE.into(),
            delivery_timeout: Duration::from_secs(30),
            create_missing: true,
            partitions: 1,
            replication: -1,
        }
    }

    /// The dead-letter topic for messages of `topic`.
    pub fn topic_for(&self, topic: &str) -> String {
        resolve(&self.template, topic, &self.group)
    }

    /// Where `letter`'s message was first delivered, when it is a parked
    /// copy that came back and that first delivery is believed: the
    /// [`parked_from`](intake_core::Metadata::parked_from) a parking layer
    /// set, or the park headers of a record read from a return topic of the
    /// origin they name. `Err(origin)` for such a copy parked by an
    /// earlier version, which names its origin topic only.
    fn first_delivery(&self, letter: &DeadLetter) -> Option<Result<FirstDelivery, String>> {
        let message = &letter.message;
        let metadata = message.metadata();
        if let Some(first) = metadata.parked_from() {
            return Some(Ok(first.clone()));
        }
        let consumed: &str = metadata.source();
        let origin_of_copies = self.returns.get(consumed)?;
        let origin = message.headers().get(ORIGIN)?;
        // The header comes from whoever wrote the record: it is followed
        // only from a return topic, and only to that topic's own origin.
        if origin.as_ref() != origin_of_copies.as_bytes() {
            tracing::debug!(
                topic = consumed,
                origin_bytes = origin.len(),
                "a record of a return topic names another origin; dead-lettering it as a message of the topic it was consumed from"
            );
            return None;
        }
        Some(match first_delivery_of(message) {
            Some(first) if *first.source == **origin_of_copies => Ok(first),
            _ => Err(origin_of_copies.clone()),
        })
    }
}

/// The dead-letter topic `template` names for messages of `topic` in
/// `group`.
fn resolve(template: &str, topic: &str, group: &str) -> String {
    template.replace("{topic}", topic).replace("{group}", group)
}

#[async_trait::async_trait]
impl DeadLetterSink for KafkaDeadLetterSink {
    async fn write(&self, letter: &DeadLetter) -> Result<(), DeadLetterError> {
        let consumed = letter.message.metadata().source().clone();
        let (letter, origin) = match self.first_delivery(letter) {
            Some(Ok(first)) => {
                // The envelope names the first delivery; the message keeps
                // where it was consumed.
                let origin = first.source.to_string();
                let mut of_origin = letter.clone();
                of_origin
                    .message
                    .metadata_mut()
                    .set_parked_from(Some(first));
                (Cow::Owned(of_origin), origin)
            }
            // Where it is, in its origin's dead letters.
            Some(Err(origin)) => (Cow::Borrowed(letter), origin),
            None => (Cow::Borrowed(letter), consumed.to_string()),
        };
        let topic = self.topic_for(&origin);
        if topic == origin || topic == *consumed || self.consumed.contains(&topic) {
            // A template without placeholders that names a consumed topic.
            return Err(Error::DeadLetterTopicIsSource { topic }.into());
        }
        self.ensure_topic(&topic).await?;
        let envelope = Envelope::new(&letter, &self.carrier);
        let mut headers =
            OwnedHeaders::new_with_capacity(envelope.header_count() + envelope.field_count());
        for (name, value) in envelope.pairs() {
            headers = headers.insert(Header {
                key: &name,
                value: Some(value),
            });
        }
        let mut record = FutureRecord::<[u8], [u8]>::to(&topic)
            .payload(envelope.payload().as_ref())
            .headers(headers);
        if let Some(key) = envelope.key() {
            record = record.key(key.as_ref());
        }
        let written = self
            .producer
            .send(record, Timeout::After(self.queue_timeout))
            .await;
        match written {
            Ok(_delivery) => Ok(()),
            // librdkafka refuses a record over the producer's
            // `message.max.bytes` before sending it, and the broker one over
            // the topic's `max.message.bytes`: the same letter is refused
            // every time, so it is rejected, not retried.
            Err((
                source @ KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge),
                _,
            )) => Err(Error::DeadLetterTooLarge {
                topic,
                brokers: self.brokers.to_string(),
                source: Box::new(source),
            }
            .into()),
            // The dead-letter layer logs the failure, with this error.
            Err((source, _unsent)) => Err(Error::DeadLetterWrite {
                topic,
                brokers: self.brokers.to_string(),
                source: Box::new(source),
            }
            .into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_dead_letter_is_never_written_to_the_topic_it_came_from() {
        let sink = KafkaDeadLetterSink::builder(KafkaSettings::new("127.0.0.1:9"), "billing")
            .topic_template("orders")
            .build()
            .await
            .expect("valid");
        let message = intake_core::Message::new(
            "poison",
            intake_core::Metadata::new("orders".into(), 0, intake_core::Position::Offset(7)),
        );
        let refused = sink
            .write(&DeadLetter::new(message, "bad", 1))
            .await
            .expect_err("refused without a broker round trip");
        assert!(
            matches!(
                refused.0.downcast_ref::<Error>(),
                Some(Error::DeadLetterTopicIsSource { topic }) if topic == "orders"
            ),
            "{refused:?}"
        );
    }

    /// A parked copy's park headers are believed only on a record of a
    /// return topic, and only when they name that topic's own origin: a
    /// producer that writes them cannot direct letters to a topic of its
    /// choosing, nor make a letter name another record.
    #[tokio::test]
    async fn a_copys_first_delivery_is_believed_only_from_a_return_topic_of_its_origin() {
        use intake_core::parking::{ORIGIN_PARTITION, ORIGIN_POSITION};
        use intake_core::{Metadata, Position};

        let sink = KafkaDeadLetterSink::builder(KafkaSettings::new("127.0.0.1:9"), "billing")
            .consumed_topics(["orders", "payments", "orders.billing.returned"])
            .build()
            .await
            .expect("valid");
        let letter = |source: &str, origin: &[u8], partition: &str, position: &str| {
            let mut headers = intake_core::Headers::default();
            headers.set(ORIGIN, bytes::Bytes::copy_from_slice(origin));
            headers.set(ORIGIN_PARTITION, partition.to_owned());
            headers.set(ORIGIN_POSITION, position.to_owned());
            let message = intake_core::Message::new(
                "poison",
                Metadata::new(source.into(), 0, Position::Offset(7)),
            )
            .with_headers(headers);
            DeadLetter::new(message, "bad", 1)
        };
        let returned = "orders.billing.returned";
        let long = "o".repeat(100_000);
        for hostile in [
            &b"payments"[..],
            b"orders.billing.dlq",
            b"",
            b"\xff\xfe",
            long.as_bytes(),
            returned.as_bytes(),
        ] {
            assert_eq!(
                sink.first_delivery(&letter(returned, hostile, "3", "41")),
                None,
                "{hostile:?}"
            );
        }
        assert_eq!(
            sink.first_delivery(&letter(returned, b"orders", "3", "41")),
            Some(Ok(FirstDelivery {
                source: "orders".into(),
                partition: 3,
                position: Position::Offset(41),
            }))
        );
        assert_eq!(
            sink.first_delivery(&letter(returned, b"orders", "3", "x")),
            Some(Err("orders".to_owned())),
            "a copy without a usable first delivery names where it is, in its origin's letters"
        );
        // On a topic that is no return topic, the headers are a producer's.
        for source in ["orders", "payments"] {
            assert_eq!(
                sink.first_delivery(&letter(source, b"orders", "3", "41")),
                None
            );
            assert_eq!(
                sink.first_delivery(&letter(source, b"payments", "3", "41")),
                None
            );
        }
        let standalone = KafkaDeadLetterSink::builder(KafkaSettings::new("127.0.0.1:9"), "billing")
            .build()
            .await
            .expect("valid");
        assert_eq!(
            standalone.first_delivery(&letter(returned, b"orders", "3", "41")),
            None,
            "a sink told of no consumed topics follows no origin"
        );
        // Set by a parking layer inside: believed as it is.
        let mut inside = letter("orders", b"", "", "");
        let first = FirstDelivery {
            source: "payments".into(),
            partition: 1,
            position: Position::Offset(2),
        };
        inside
            .message
            .metadata_mut()
            .set_parked_from(Some(first.clone()));
        assert_eq!(sink.first_delivery(&inside), Some(Ok(first)));
    }
}
