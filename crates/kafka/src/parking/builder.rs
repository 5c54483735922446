//! [`KafkaParkingBuilder`]: the checks of a parking's settings, its
//! producer, its return topics and its mover, started.

use super::*;

/// Builds a [`KafkaParking`]: [`KafkaParking::builder`], then
/// [`build`](Self::build).
#[derive(Debug, Clone)]
pub struct KafkaParkingBuilder {
    pub(super) settings: KafkaSettings,
    pub(super) group: String,
    pub(super) topics: Vec<String>,
    pub(super) tiers: Vec<Duration>,
    pub(super) template: String,
    /// Templates of earlier runs whose retry topics the mover drains too.
    pub(super) drained_templates: Vec<String>,
    pub(super) return_template: String,
    pub(super) delivery_timeout: Duration,
    pub(super) replication: i32,
    pub(super) discovery_interval: Duration,
}

impl KafkaParkingBuilder {
    /// Adds topics whose messages this parking parks (the source's topics).
    /// The mover looks for their retry topics, so a message parked before a
    /// restart still comes back.
    pub fn topics<I: IntoIterator<Item = S>, S: Into<String>>(mut self, topics: I) -> Self {
        self.topics.extend(topics.into_iter().map(Into::into));
        self
    }

    /// The delay tiers (default [`DEFAULT_TIERS`]): one retry topic per
    /// origin topic and tier. Each a whole number of milliseconds, none
    /// zero.
    pub fn tiers<I: IntoIterator<Item = Duration>>(mut self, tiers: I) -> Self {
        self.tiers = tiers.into_iter().collect();
        self
    }

    /// The retry topic's name, with `{topic}`, `{group}` and `{tier}`
    /// replaced by the origin topic, the group and the tier (`1s`, `10m`,
    /// `1500ms`); default [`DEFAULT_TOPIC_TEMPLATE`]. Must name `{topic}`
    /// and `{tier}`: the mover tells by the retry topic where a record goes
    /// back to and how long it may wait.
    pub fn topic_template(mut self, template: impl Into<String>) -> Self {
        self.template = template.into();
        self
    }

    /// A [topic template](Self::topic_template) of an earlier run whose
    /// retry topics the mover drains too: after a change of template, the
    /// records parked under the old one still come back (nothing is parked
    /// there any more). Keep it until those topics are empty. Retry topics
    /// of tiers no longer configured need nothing: the mover finds every
    /// tier of a template it drains.
    pub fn drain_topic_template(mut self, template: impl Into<String>) -> Self {
        self.drained_templates.push(template.into());
        self
    }

    /// The topic parked messages come back to, with `{topic}` and `{group}`
    /// replaced by the origin topic and the group; default
    /// [`DEFAULT_RETURN_TEMPLATE`], a topic of the group's own, which the
    /// source reads besides the origin
    /// ([`KafkaParking::return_topic`] names it). `{topic}` alone sends
    /// them back to the origin topic itself, where **every** consumer group
    /// of the origin sees them again.
    pub fn return_topic_template(mut self, template: impl Into<String>) -> Self {
        self.return_template = template.into();
        self
    }

    /// How long a park may wait for the broker's acknowledgement, retries
    /// included, and each metadata lookup or topic creation (default 30 s;
    /// librdkafka's `message.timeout.ms`, unless the settings set it). The
    /// mover waits as long for the reports of the records it moves back.
    pub fn delivery_timeout(mut self, timeout: Duration) -> Self {
        self.delivery_timeout = timeout;
        self
    }

    /// Replication factor of a retry topic the parking creates (default
    /// `-1`, the broker's `default.replication.factor`).
    pub fn replication(mut self, replication: i32) -> Self {
        self.replication = replication;
        self
    }

    /// How often the mover asks the brokers for retry topics it does not
    /// know yet, created by another process or an earlier run (default
    /// 30 s; at start too). Those created by this process are followed at
    /// once.
    pub fn discovery_interval(mut self, interval: Duration) -> Self {
        self.discovery_interval = interval;
        self
    }

    /// Creates the producer, makes sure each served topic's
    /// [return topic](KafkaParking::return_topic) exists (creating it with
    /// as many partitions as the served topic; at most the delivery timeout
    /// per lookup and creation), and starts the mover. Retry topics are
    /// created on their first park.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for settings librdkafka refuses (an idempotent
    /// producer needs `acks=all`), no topics, an empty group, tiers that
    /// are empty, zero or finer than a millisecond, a template without
    /// `{topic}` or `{tier}` or one that names a served topic, a
    /// replication factor below 1 other than -1, a return template that
    /// names no topic of its own per served topic;
    /// [`Error::UnknownTopic`] when a served topic does not exist,
    /// [`Error::Unreachable`] (and the other client errors) when its return
    /// topic cannot be looked up or created; [`Error::Spawn`] when the
    /// mover's thread cannot start.
    pub async fn build(self) -> Result<KafkaParking, Error> {
        if self.group.trim().is_empty() {
            return Err(Error::config(
                "group",
                "name the consumer group whose messages are parked",
            ));
        }
        if self.topics.is_empty() || self.topics.iter().any(|topic| topic.trim().is_empty()) {
            return Err(Error::config(
                "topics",
                "name the topics whose messages are parked, none empty (`.topics([\"orders\"])`)",
            ));
        }
        let Some(tiers) = Tiers::new(self.tiers.clone()) else {
            return Err(Error::config(
                "tiers",
                "give at least one tier, each above zero and a whole number of milliseconds",
            ));
        };
        for (setting, template) in std::iter::once(("topic_template", &self.template)).chain(
            self.drained_templates
                .iter()
                .map(|template| ("drain_topic_template", template)),
        ) {
            if !template.contains("{topic}") || template.matches("{tier}").count() != 1 {
                return Err(Error::config(
                    setting,
                    format!(
                        "`{template}` must name `{{topic}}`, and `{{tier}}` once: the mover tells by the retry topic where a record goes back to and how long it may wait; the default is `{DEFAULT_TOPIC_TEMPLATE}`"
                    ),
                ));
            }
        }
        if self.replication < 1 && self.replication != -1 {
            return Err(Error::config(
                "replication",
                format!(
                    "{}: use a replication factor of at least 1, or -1 for the broker's default",
                    self.replication
                ),
            ));
        }
        if self.return_template.trim().is_empty() {
            return Err(Error::config(
                "return_topic_template",
                format!("must not be empty; the default is `{DEFAULT_RETURN_TEMPLATE}`"),
            ));
        }
        let mut origin_of: HashMap<String, String> = HashMap::new();
        let mut returns_to_itself = Vec::new();
        for topic in &self.topics {
            let back_to = resolve(&self.return_template, topic, &self.group, "");
            if back_to == *topic {
                returns_to_itself.push(topic.clone());
                continue;
            }
            let shared = origin_of.insert(back_to.clone(), topic.clone());
            if self.topics.contains(&back_to) || shared.is_some() {
                return Err(Error::config(
                    "return_topic_template",
                    format!(
                        "`{}` returns the messages of `{topic}` to `{back_to}`, which is another served topic or the return topic of one; name `{{topic}}` in it, such as the default `{DEFAULT_RETURN_TEMPLATE}`",
                        self.return_template
                    ),
                ));
            }
        }
        let mut routes = HashMap::new();
        for topic in &self.topics {
            let back_to = resolve(&self.return_template, topic, &self.group, "");
            for tier in 0..tiers.len() {
                let retry = resolve(&self.template, topic, &self.group, &tiers.label(tier));
                if self.topics.contains(&retry) || origin_of.contains_key(&retry) {
                    return Err(Error::config(
                        "topic_template",
                        format!(
                            "`{}` parks messages of `{topic}` in `{retry}`, a topic this parking serves or returns to: they would be parked and moved in a loop",
                            self.template
                        ),
                    ));
                }
                routes.insert(
                    retry,
                    Route {
                        back_to: back_to.as_str().into(),
                        tier,
                    },
                );
            }
        }

        let mut patterns = Vec::new();
        for topic in &self.topics {
            let back_to: Arc<str> = resolve(&self.return_template, topic, &self.group, "").into();
            for template in std::iter::once(&self.template).chain(&self.drained_templates) {
                let (before, after) = template.split_once("{tier}").unwrap_or((template, ""));
                patterns.push(RetryPattern {
                    prefix: resolve(before, topic, &self.group, ""),
                    suffix: resolve(after, topic, &self.group, ""),
                    back_to: Arc::clone(&back_to),
                });
            }
        }
        // A served topic or a return topic that reads as a retry topic of
        // some tier would be drained by the mover, in a loop.
        for topic in self.topics.iter().chain(origin_of.keys()) {
            if patterns
                .iter()
                .any(|pattern| pattern.tier_of(topic).is_some())
            {
                return Err(Error::config(
                    "topic_template",
                    format!(
                        "`{topic}` is a topic this parking serves or returns to, and reads as a retry topic of the template `{}`: the mover would move its messages in a loop",
                        self.template
                    ),
                ));
            }
        }
        warn_unless_co_located(&self.settings, &self.group);

        let brokers: Arc<str> = self.settings.endpoint().into();
        let mut producer_settings = self.settings.clone();
        {
            let config = producer_settings.client_config_mut();
            config.set("enable.idempotence", "true");
            // A lookup of a missing retry topic must not create it with the
            // broker's default layout: the parking creates it, sized.
            config.set("allow.auto.create.topics", "false");
            if config.get("message.timeout.ms").is_none() {
                config.set(
                    "message.timeout.ms",
                    self.delivery_timeout.as_millis().to_string(),
                );
            }
            // Records without a usable origin partition go back where a
            // Java producer puts their key.
            if config.get("partitioner").is_none() {
                config.set("partitioner", "murmur2_random");
            }
        }
        let producer: FutureProducer = producer_settings
            .client_config()
            .create()
            .map_err(|error| Error::from_kafka(error, &brokers, Duration::ZERO))?;
        let read = self.topics.iter().map(|_| AtomicBool::new(false)).collect();
        let parking = KafkaParking {
            inner: Arc::new(Inner {
                producer,
                brokers: Arc::clone(&brokers),
                group: self.group,
                topics: self.topics,
                return_template: self.return_template,
                origin_of,
                returns_to_itself,
                read,
                tiers,
                template: self.template,
                registry: Arc::new(Registry::default()),
                admin: TopicAdmin {
                    replication: self.replication,
                    client: LazyAdmin::new(producer_settings),
                    creating: tokio::sync::Mutex::new(()),
                },
                delivery_timeout: self.delivery_timeout,
                mover: Arc::new(MoverShared::default()),
                stopped: Mutex::new(None),
                settings: self.settings.clone(),
                patterns: patterns.clone(),
                backlog: Mutex::new(None),
            }),
        };
        let inner = &*parking.inner;
        // Before the source is built: it refuses a topic that does not exist.
        let mut returns: Vec<(&String, &String)> = inner.origin_of.iter().collect();
        returns.sort();
        for (back_to, origin) in returns {
            let partitions = parking
                .ensure_topic(back_to, origin)
                .await
                .map_err(|error| {
                    tracing::warn!(return_topic = %back_to, %origin, error = %intake_core::ErrorChain::new(&error), "the return topic could not be made sure of");
                    build_error(error)
                })?;
            // Partitions added to the origin after its return topic was
            // made: copies of those go back by their key.
            if let Ok(Some(of_origin)) = parking.lookup(origin).await
                && of_origin > partitions
            {
                tracing::warn!(return_topic = %back_to, %origin, partitions, origin_partitions = of_origin, "the return topic has fewer partitions than its origin: copies of the partitions it lacks come back by their key, to another partition than their origin's; add partitions to the return topic");
            }
        }
        let stopped = mover::spawn(MoverConfig {
            settings: self.settings,
            group: mover_group(&inner.group),
            producer: inner.producer.clone(),
            routes,
            patterns,
            tiers: inner.tiers.clone(),
            registry: Arc::clone(&inner.registry),
            shared: Arc::clone(&inner.mover),
            delivery_timeout: self.delivery_timeout,
            discovery_interval: self.discovery_interval,
            brokers,
        })?;
        *inner
            .stopped
            .lock()
            .unwrap_or_else(|poison| poison.into_inner()) = Some(stopped);
        parking.register();
        tracing::debug!(group = %inner.group, topics = ?inner.topics, brokers = %inner.brokers, "kafka parking started");
        Ok(parking)
    }
}

/// A return topic that could not be made sure of at build time, as the
/// build's error.
fn build_error(error: ParkingError) -> Error {
    match error {
        ParkingError::OriginMissing { topic, brokers } => Error::UnknownTopic { topic, brokers },
        ParkingError::Lookup {
            brokers, source, ..
        }
        | ParkingError::TopicNotCreated {
            brokers, source, ..
        }
        | ParkingError::Write {
            brokers, source, ..
        } => Error::from_kafka(*source, &brokers, Duration::ZERO),
        ParkingError::TimedOut {
            brokers, waited, ..
        } => Error::from_kafka(
            KafkaError::MetadataFetch(RDKafkaErrorCode::OperationTimedOut),
            &brokers,
            waited,
        ),
        other => Error::config("return_topic_template", other.to_string()),
    }
}
