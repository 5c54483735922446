//! [`KafkaDeadLettersBuilder`]: the dead-letter topic's reader, its
//! clients and their settings.

use super::*;

/// Builds [`KafkaDeadLetters`]; see [`KafkaDeadLetters::builder`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `.build()`"]
pub struct KafkaDeadLettersBuilder {
    pub(super) settings: KafkaSettings,
    pub(super) topic: Option<String>,
    pub(super) group: Option<String>,
    pub(super) return_template: String,
    pub(super) timeout: Duration,
}

impl KafkaDeadLettersBuilder {
    /// The dead-letter topic to read, by its own name.
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }

    /// The dead letters the default sink of consumer group `group` writes
    /// for topic `topic`: `<topic>.<group>.dlq`
    /// ([`DEFAULT_TOPIC_TEMPLATE`]), letters of that [group](Self::group).
    pub fn dead_letters_of(self, topic: &str, group: &str) -> Self {
        let name = DEFAULT_TOPIC_TEMPLATE
            .replace("{topic}", topic)
            .replace("{group}", group);
        self.topic(name).group(group)
    }

    /// The consumer group whose letters the topic holds: a
    /// [replay to the group](intake_core::dead_letter::store::Replay::to_group)
    /// goes to its return topic (see
    /// [`KafkaDeadLetters::way_back_to_group`](DeadLetterLog::way_back_to_group)).
    /// Set by [`dead_letters_of`](Self::dead_letters_of).
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// The group's return topic, with `{topic}` and `{group}` replaced by
    /// the letter's origin and the [group](Self::group): the parking's
    /// [`return_topic_template`](crate::KafkaParkingBuilder::return_topic_template)
    /// (default [`DEFAULT_RETURN_TEMPLATE`]).
    pub fn return_topic_template(mut self, template: impl Into<String>) -> Self {
        self.return_template = template.into();
        self
    }

    /// The longest any one wait may take (default 10 s): each librdkafka
    /// call, each poll for the next record, each delivery of marks and
    /// each admin request.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Creates the consumer, producer and admin client. They connect on
    /// first use; a dead-letter topic that does not exist yet holds no
    /// letters.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for no topic, an empty one, a zero timeout, or
    /// settings librdkafka refuses (a secret's value never shown).
    pub fn build(self) -> Result<KafkaDeadLetters, Error> {
        let topic = match self.topic {
            Some(topic) if !topic.is_empty() => topic,
            Some(_) => return Err(Error::config("topic", "is empty")),
            None => {
                return Err(Error::config(
                    "topic",
                    "is not set; name the dead-letter topic (`topic`) or its source and group (`dead_letters_of`)",
                ));
            }
        };
        if self.timeout.is_zero() {
            return Err(Error::config("timeout", "must be more than zero"));
        }
        let brokers = self.settings.endpoint();
        let failed = |error| Error::from_kafka(error, &brokers, Duration::ZERO);
        let millis = self.timeout.as_millis().max(1).to_string();
        let mut consumer = self.settings.client_config().clone();
        // librdkafka refuses an assignment without a group id, though an
        // assign-only consumer never joins its group nor commits to it.
        consumer
            .set("group.id", "intake-dead-letter-store")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "true")
            // Letters deleted under a read: go on from the oldest left.
            .set("auto.offset.reset", "earliest")
            .set("allow.auto.create.topics", "false");
        // A fetch long-polls the partition's leader for up to this long
        // when it is at the end, and the metadata and watermark requests of
        // the next step queue behind it on the same connection: at
        // librdkafka's 500 ms every store step took 1.5-2.5 s. Reads go to
        // a known end, so a long poll buys nothing here.
        if consumer.get("fetch.wait.max.ms").is_none() {
            consumer.set("fetch.wait.max.ms", "10");
        }
        let consumer: BaseConsumer = consumer.create().map_err(failed)?;
        let mut producer = self.settings.client_config().clone();
        producer
            .set("acks", "all")
            .set("message.timeout.ms", &millis);
        let producer: FutureProducer = producer.create().map_err(failed)?;
        let admin: AdminClient<DefaultClientContext> =
            self.settings.client_config().create().map_err(failed)?;
        Ok(KafkaDeadLetters {
            inner: Arc::new(Inner {
                removed_topic: format!("{topic}{REMOVED_SUFFIX}"),
                topic,
                group: self.group.filter(|group| !group.is_empty()),
                return_template: self.return_template,
                brokers,
                timeout: self.timeout,
                reader: Mutex::new(Reader {
                    consumer,
                    marks: BTreeSet::new(),
                    marks_next: 0,
                }),
                producer,
                admin,
                side_topic_ready: Mutex::new(false),
            }),
        })
    }
}
