//! Making sure a dead-letter topic exists before the first letter is
//! written to it, creating it when allowed.

use super::*;

/// How the sink makes sure a dead-letter topic exists before writing to it.
pub(super) struct TopicCheck {
    /// Topics known to exist: checked once each.
    pub(super) known: Mutex<HashSet<String>>,
    /// Partitions and replication factor of a topic the sink creates; `None`
    /// when it creates none.
    pub(super) create: Option<(i32, i32)>,
    /// The admin client, made on the first creation.
    pub(super) admin: LazyAdmin,
    pub(super) timeout: Duration,
}

impl KafkaDeadLetterSink {
    /// Makes sure `topic` exists (creating it if allowed), once per topic.
    pub(super) async fn ensure_topic(&self, topic: &str) -> Result<(), Error> {
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
    pub(super) fn is_known(&self, topic: &str) -> bool {
        self.known
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .contains(topic)
    }

    pub(super) fn remember(&self, topic: &str) {
        self.known
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .insert(topic.to_owned());
    }
}

/// Whether the brokers know `topic`. Blocks for a metadata round trip.
pub(super) fn topic_exists(
    producer: &FutureProducer,
    topic: &str,
    timeout: Duration,
) -> Result<bool, KafkaError> {
    let metadata = producer.client().fetch_metadata(Some(topic), timeout)?;
    Ok(metadata.topics().iter().any(|found| {
        found.name() == topic && found.error().is_none() && !found.partitions().is_empty()
    }))
}
