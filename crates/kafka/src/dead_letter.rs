//! [`KafkaDeadLetterSink`]: poison messages to a dead-letter topic.

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

/// How the sink makes sure a dead-letter topic exists before writing to it.
struct TopicCheck {
    /// Topics known to exist: checked once each.
    known: Mutex<HashSet<String>>,
    /// Partitions and replication factor of a topic the sink creates; `None`
    /// when it creates none.
    create: Option<(i32, i32)>,
    /// The admin client, made on the first creation.
    admin: LazyAdmin,
    timeout: Duration,
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

/// Builds a [`KafkaDeadLetterSink`]: from its source with
/// [`KafkaSource::dead_letter_sink`](crate::KafkaSource::dead_letter_sink)
/// (brokers, TLS and SASL settings, group and consumed topics filled in), or
/// on its own with [`KafkaDeadLetterSink::builder`].
#[derive(Debug, Clone)]
pub struct KafkaDeadLetterSinkBuilder {
    settings: KafkaSettings,
    group: String,
    /// Topics the consumer reads, which no dead letter may go to.
    consumed: Vec<String>,
    /// Return topics the consumer reads, with their origins.
    returns: Vec<(String, String)>,
    template: String,
    delivery_timeout: Duration,
    create_missing: bool,
    partitions: i32,
    replication: i32,
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

    /// Makes sure `topic` exists (creating it if allowed), once per topic.
    async fn ensure_topic(&self, topic: &str) -> Result<(), Error> {
        let check = &self.topics;
        if check.is_known(topic) {
            return Ok(());
        }
        let exists = {
            let producer = self.producer.clone();
            let name = topic.to_owned();
            let timeout = check.timeout;
            tokio::task::spawn_blocking(move || topic_exists(&producer, &name, timeout))
                .await
                // The lookup task did not finish: the runtime is shutting down.
                .unwrap_or(Err(KafkaError::Canceled))
                .map_err(|source| Error::DeadLetterTopicLookup {
                    topic: topic.to_owned(),
                    brokers: self.brokers.to_string(),
                    source: Box::new(source),
                })?
        };
        if !exists {
            let Some((partitions, replication)) = check.create else {
                return Err(Error::DeadLetterTopicMissing {
                    topic: topic.to_owned(),
                    brokers: self.brokers.to_string(),
                });
            };
            let failed = |source: KafkaError| Error::DeadLetterTopicNotCreated {
                topic: topic.to_owned(),
                brokers: self.brokers.to_string(),
                source: Box::new(source),
            };
            let admin = check.admin.client().map_err(failed)?;
            let options = AdminOptions::new().operation_timeout(Some(check.timeout));
            let new_topic = NewTopic::new(topic, partitions, TopicReplication::Fixed(replication));
            create_topic(&admin, &new_topic, &options)
                .await
                .map_err(failed)?;
            tracing::info!(dead_letter_topic = %topic, partitions, replication, "created the dead-letter topic");
        }
        check.remember(topic);
        Ok(())
    }
}

impl TopicCheck {
    fn is_known(&self, topic: &str) -> bool {
        self.known
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .contains(topic)
    }

    fn remember(&self, topic: &str) {
        self.known
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .insert(topic.to_owned());
    }
}

/// The dead-letter topic `template` names for messages of `topic` in
/// `group`.
fn resolve(template: &str, topic: &str, group: &str) -> String {
    template.replace("{topic}", topic).replace("{group}", group)
}

/// The dead-letter producer's settings: `settings` with the delivery
/// timeout (unless they set `message.timeout.ms`), `acks=all` and an
/// idempotent producer. A letter is the only copy left of a message whose
/// original is committed next: it must survive the leader's loss (every
/// in-sync replica has it), and a write librdkafka retries (a response lost
/// to a timeout or a broken connection) must not be written twice. Settings
/// that say otherwise explicitly are kept, with a warning.
pub(crate) fn producer_settings(
    settings: KafkaSettings,
    delivery_timeout: Duration,
) -> KafkaSettings {
    let mut settings = settings;
    if settings.get("message.timeout.ms").is_none() {
        settings = settings.set(
            "message.timeout.ms",
            delivery_timeout.as_millis().to_string(),
        );
    }
    let is_all = |acks: &str| {
        let acks = acks.trim();
        acks.eq_ignore_ascii_case("all") || acks == "-1"
    };
    let acks = settings
        .get("acks")
        .or_else(|| settings.get("request.required.acks"))
        .map(str::to_owned);
    match &acks {
        None => settings = settings.set("acks", "all"),
        Some(acks) if is_all(acks) => {}
        Some(acks) => tracing::warn!(
            acks = %acks,
            "the kafka dead-letter producer writes with the acks its settings give: a letter the leader confirmed alone is lost if the leader fails before a follower has it, and the original is committed by then; and without acks=all the producer cannot be idempotent, so a retried write may be written twice. Remove the setting for acks=all"
        ),
    }
    match settings.is_true("enable.idempotence") {
        None if acks.as_deref().is_none_or(is_all) => {
            settings = settings.set("enable.idempotence", "true");
        }
        // Refused by librdkafka with acks other than all; warned above.
        None => {}
        Some(false) => tracing::warn!(
            "the kafka dead-letter producer is not idempotent, as its settings say (enable.idempotence=false): a write librdkafka retries after a lost response may be written twice. Remove the setting"
        ),
        Some(true) => {}
    }
    settings
}

/// Whether the brokers know `topic`. Blocks for a metadata round trip.
fn topic_exists(
    producer: &FutureProducer,
    topic: &str,
    timeout: Duration,
) -> Result<bool, KafkaError> {
    let metadata = producer.client().fetch_metadata(Some(topic), timeout)?;
    Ok(metadata.topics().iter().any(|found| {
        found.name() == topic && found.error().is_none() && !found.partitions().is_empty()
    }))
}

impl KafkaDeadLetterSinkBuilder {
    /// A lag probe on the same brokers, settings and topics as the source
    /// this builder came from, for `group`.
    pub(crate) fn lag_probe(&self, group: &str) -> Result<crate::KafkaLagProbe, Error> {
        crate::KafkaLagProbe::new(&self.settings, group, self.consumed.iter().cloned())
    }

    /// The dead-letter topic's name, with `{topic}` and `{group}` replaced by
    /// the source topic and the group (default
    /// [`DEFAULT_TOPIC_TEMPLATE`]). A name without placeholders sends every
    /// dead letter to one topic.
    pub fn topic_template(mut self, template: impl Into<String>) -> Self {
        self.template = template.into();
        self
    }

    /// The return topics of `parking` for the [consumed
    /// topics](Self::consumed_topics) it serves: a copy read from one that
    /// fails for good is a dead letter of its first delivery (see
    /// [`KafkaDeadLetterSink`]). Filled in by
    /// [`KafkaSource::dead_letter_sink`](crate::KafkaSource::dead_letter_sink)
    /// for a source built with its
    /// [parking](crate::KafkaSourceBuilder::parking).
    pub fn parking(mut self, parking: &crate::KafkaParking) -> Self {
        self.returns.extend(
            parking
                .return_topics()
                .iter()
                .map(|(back_to, origin)| (back_to.clone(), origin.clone())),
        );
        self.returns.extend(
            parking
                .topics_returning_to_themselves()
                .iter()
                .map(|origin| (origin.clone(), origin.clone())),
        );
        self
    }

    /// Return topics the consumer reads, each with its origin.
    pub(crate) fn copies_returning_to(mut self, returns: Vec<(String, String)>) -> Self {
        self.returns.extend(returns);
        self
    }

    /// Adds topics the consumer reads: [`build`](Self::build) refuses a
    /// [template](Self::topic_template) that sends the dead letters of one
    /// of them to one of them (they would be consumed again, in a loop).
    /// Filled in by
    /// [`KafkaSource::dead_letter_sink`](crate::KafkaSource::dead_letter_sink).
    pub fn consumed_topics<I: IntoIterator<Item = S>, S: Into<String>>(
        mut self,
        topics: I,
    ) -> Self {
        self.consumed.extend(topics.into_iter().map(Into::into));
        self
    }

    /// How long a write may wait for the broker's acknowledgement, queueing
    /// and retries included (default 30 s; librdkafka's
    /// `message.timeout.ms`, unless the settings set it).
    pub fn delivery_timeout(mut self, timeout: Duration) -> Self {
        self.delivery_timeout = timeout;
        self
    }

    /// Whether a missing dead-letter topic is created on first use (default
    /// true). When false, a write to a missing topic fails with
    /// [`Error::DeadLetterTopicMissing`].
    pub fn create_missing_topics(mut self, create: bool) -> Self {
        self.create_missing = create;
        self
    }

    /// Partitions and replication factor of a dead-letter topic the sink
    /// creates (default 1 partition and the broker's
    /// `default.replication.factor`, written `-1`). For letters that must
    /// survive a broker's loss: a replication factor of 3, with
    /// `min.insync.replicas=2` on the brokers (see
    /// [`KafkaDeadLetterSink`]'s durability).
    pub fn new_topic(mut self, partitions: i32, replication: i32) -> Self {
        self.partitions = partitions;
        self.replication = replication;
        self
    }

    /// Creates the producer: `acks=all`, idempotent, unless the settings
    /// explicitly say otherwise (see [`KafkaDeadLetterSink`]). It connects
    /// on its first write.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for settings librdkafka refuses (such as
    /// `enable.idempotence=true` with `acks` other than `all`), an empty topic
    /// template, a template that names a consumed topic (`{topic}` alone,
    /// or any template that resolves to one of the
    /// [consumed topics](Self::consumed_topics)), or a new-topic layout that
    /// cannot exist.
    pub async fn build(self) -> Result<KafkaDeadLetterSink, Error> {
        if self.template.trim().is_empty() {
            return Err(Error::config("topic_template", "must not be empty"));
        }
        if self.template.trim() == "{topic}" {
            return Err(Error::config(
                "topic_template",
                "`{topic}` alone names the source topic itself: dead letters would be consumed again, in a loop; use a name of their own, such as the default `{topic}.{group}.dlq`",
            ));
        }
        for consumed in &self.consumed {
            let topic = resolve(&self.template, consumed, &self.group);
            if self.consumed.contains(&topic) {
                return Err(Error::config(
                    "topic_template",
                    format!(
                        "`{}` sends the dead letters of `{consumed}` to `{topic}`, a topic this consumer reads: they would be consumed again, in a loop; use a name of their own, such as the default `{DEFAULT_TOPIC_TEMPLATE}`",
                        self.template
                    ),
                ));
            }
        }
        if self.partitions < 1 || (self.replication < 1 && self.replication != -1) {
            return Err(Error::config(
                "new_topic",
                format!(
                    "{} partitions with replication factor {}: use at least 1 partition and a replication factor of at least 1 (or -1 for the broker's default)",
                    self.partitions, self.replication
                ),
            ));
        }
        let brokers: Arc<str> = self.settings.endpoint().into();
        let producer: FutureProducer =
            producer_settings(self.settings.clone(), self.delivery_timeout)
                .client_config()
                .create()
                .map_err(|error| Error::from_kafka(error, &brokers, Duration::ZERO))?;
        let topics = TopicCheck {
            known: Mutex::new(HashSet::new()),
            create: self
                .create_missing
                .then_some((self.partitions, self.replication)),
            // The settings as given: an admin client of idempotent settings
            // would ask the brokers for a producer id it never uses.
            admin: LazyAdmin::new(self.settings),
            timeout: self.delivery_timeout,
        };
        let consumed: HashSet<String> = self.consumed.into_iter().collect();
        let mut returns: HashMap<String, String> = self
            .returns
            .into_iter()
            .filter(|(back_to, _)| consumed.contains(back_to))
            .collect();
        // Return topics named among the consumed ones by the parking's
        // default template.
        for origin in &consumed {
            let back_to = crate::parking::DEFAULT_RETURN_TEMPLATE
                .replace("{topic}", origin)
                .replace("{group}", &self.group);
            if consumed.contains(&back_to) {
                returns.entry(back_to).or_insert_with(|| origin.clone());
            }
        }
        let group: Arc<str> = self.group.into();
        Ok(KafkaDeadLetterSink {
            producer,
            topics: Arc::new(topics),
            carrier: Arc::new(Carrier::keyed(Broker::Kafka).with_group(group.clone())),
            group,
            consumed: Arc::new(consumed),
            returns: Arc::new(returns),
            template: self.template.into(),
            queue_timeout: self.delivery_timeout,
            brokers,
        })
    }
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
    async fn the_default_topic_is_per_source_and_group() {
        let sink = KafkaDeadLetterSink::builder(KafkaSettings::new("127.0.0.1:9"), "billing")
            .build()
            .await
            .expect("a producer needs no broker to be built");
        assert_eq!(sink.topic_for("orders"), "orders.billing.dlq");
    }

    #[tokio::test]
    async fn a_template_naming_the_source_topic_is_refused_at_build_time() {
        let built = KafkaDeadLetterSink::builder(KafkaSettings::new("127.0.0.1:9"), "billing")
            .topic_template(" {topic} ")
            .build()
            .await;
        assert!(matches!(
            built,
            Err(Error::Config { ref setting, .. }) if setting == "topic_template"
        ));
    }

    /// A template that resolves to a consumed topic, for one of them, is
    /// refused when the sink is built (it was found only by the first write
    /// before, and only for the topic the message came from).
    #[tokio::test]
    async fn a_template_that_resolves_to_a_consumed_topic_is_refused_at_build_time() {
        let sink = || {
            KafkaDeadLetterSink::builder(KafkaSettings::new("127.0.0.1:9"), "billing")
                .consumed_topics(["orders", "payments", "orders.billing.dlq.billing.dlq"])
        };
        for template in ["payments", "{topic}.{group}.dlq.{group}.dlq", "{group}s"] {
            let built = sink()
                .consumed_topics(["billings"])
                .topic_template(template)
                .build()
                .await;
            assert!(
                matches!(built, Err(Error::Config { ref setting, .. }) if setting == "topic_template"),
                "{template}: {built:?}"
            );
        }
        sink()
            .build()
            .await
            .expect("the default template names no consumed topic");
    }

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

    /// L4, L5: the dead-letter producer writes with `acks=all` and is
    /// idempotent unless its settings explicitly say otherwise (kept, with
    /// a warning); librdkafka refuses idempotence with other acks, so those
    /// settings turn it off.
    #[test]
    fn the_producer_is_idempotent_with_acks_all_unless_told_otherwise() {
        let timeout = Duration::from_secs(30);
        let of = |settings: KafkaSettings| {
            let chosen = producer_settings(settings, timeout);
            (
                chosen.get("acks").map(str::to_owned),
                chosen.get("enable.idempotence").map(str::to_owned),
                chosen.get("message.timeout.ms").map(str::to_owned),
            )
        };
        let base = KafkaSettings::new("127.0.0.1:9");
        assert_eq!(
            of(base.clone()),
            (
                Some("all".into()),
                Some("true".into()),
                Some("30000".into())
            )
        );
        for acks in ["all", "-1", " ALL "] {
            let (_, idempotence, _) = of(base.clone().set("acks", acks));
            assert_eq!(idempotence.as_deref(), Some("true"), "{acks}");
        }
        assert_eq!(
            of(base.clone().set("acks", "1")),
            (Some("1".into()), None, Some("30000".into())),
            "an explicit acks is kept, and idempotence left off (librdkafka refuses it with acks=1)"
        );
        assert_eq!(
            of(base.clone().set("request.required.acks", "0")).1,
            None,
            "acks under its other name counts too"
        );
        assert_eq!(
            of(base.clone().set("enable.idempotence", "false")),
            (
                Some("all".into()),
                Some("false".into()),
                Some("30000".into())
            )
        );
        assert_eq!(
            of(base.set("message.timeout.ms", "5000")).2.as_deref(),
            Some("5000")
        );
    }

    /// librdkafka builds a producer of these settings, and refuses the one
    /// combination that cannot work (idempotence with acks=1).
    #[tokio::test]
    async fn librdkafka_takes_the_forced_settings() {
        KafkaDeadLetterSink::builder(KafkaSettings::new("127.0.0.1:9"), "billing")
            .build()
            .await
            .expect("acks=all and idempotence are valid");
        KafkaDeadLetterSink::builder(
            KafkaSettings::new("127.0.0.1:9").set("acks", "1"),
            "billing",
        )
        .build()
        .await
        .expect("an explicit acks=1 builds, not idempotent");
        let refused = KafkaDeadLetterSink::builder(
            KafkaSettings::new("127.0.0.1:9")
                .set("acks", "1")
                .set("enable.idempotence", "true"),
            "billing",
        )
        .build()
        .await;
        assert!(matches!(refused, Err(Error::Config { .. })), "{refused:?}");
    }

    #[tokio::test]
    async fn a_template_without_placeholders_is_one_topic() {
        let sink = KafkaDeadLetterSink::builder(KafkaSettings::new("127.0.0.1:9"), "billing")
            .topic_template("all-dead-letters")
            .build()
            .await
            .expect("valid");
        assert_eq!(sink.topic_for("orders"), "all-dead-letters");
    }
}
