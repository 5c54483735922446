//! [`KafkaDeadLetterSinkBuilder`]: the sink's topics and settings, checked
//! when it is built.

use super::*;

/// Builds a [`KafkaDeadLetterSink`]: from its source with
/// [`KafkaSource::dead_letter_sink`](crate::KafkaSource::dead_letter_sink)
/// (brokers, TLS and SASL settings, group and consumed topics filled in), or
/// on its own with [`KafkaDeadLetterSink::builder`].
#[derive(Debug, Clone)]
pub struct KafkaDeadLetterSinkBuilder {
    pub(super) settings: KafkaSettings,
    pub(super) group: String,
    /// Topics the consumer reads, which no dead letter may go to.
    pub(super) consumed: Vec<String>,
    /// Return topics the consumer reads, with their origins.
    pub(super) returns: Vec<(String, String)>,
    pub(super) template: String,
    pub(super) delivery_timeout: Duration,
    pub(super) create_missing: bool,
    pub(super) partitions: i32,
    pub(super) replication: i32,
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
    async fn a_template_without_placeholders_is_one_topic() {
        let sink = KafkaDeadLetterSink::builder(KafkaSettings::new("127.0.0.1:9"), "billing")
            .topic_template("all-dead-letters")
            .build()
            .await
            .expect("valid");
        assert_eq!(sink.topic_for("orders"), "all-dead-letters");
    }
}
