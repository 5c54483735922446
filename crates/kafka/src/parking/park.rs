//! Parking a message: its copy produced to the retry topic of its tier,
//! the retry topic created on its first use.

use super::*;

/// Creates retry topics, one at a time.
pub(super) struct TopicAdmin {
    pub(super) replication: i32,
    /// Made on the first creation (most runs create none).
    pub(super) client: LazyAdmin,
    /// Parks that find a retry topic missing create it one after another:
    /// the second finds it made.
    pub(super) creating: tokio::sync::Mutex<()>,
}

impl KafkaParking {
    /// How many partitions the retry topic `topic` (for messages of
    /// `origin`) has, creating it when it is missing; the mover follows it
    /// from then on.
    async fn ensure_retry_topic(&self, topic: &str, origin: &str) -> Result<i32, ParkingError> {
        let inner = &*self.inner;
        if let Some(partitions) = inner.registry.partitions(topic) {
            return Ok(partitions);
        }
        let _turn = tokio::time::timeout(inner.delivery_timeout, inner.admin.creating.lock())
            .await
            .map_err(|_| ParkingError::TimedOut {
                topic: topic.to_owned(),
                brokers: inner.brokers.to_string(),
                waited: inner.delivery_timeout,
            })?;
        if let Some(partitions) = inner.registry.partitions(topic) {
            return Ok(partitions);
        }
        let partitions = self.ensure_topic(topic, origin).await?;
        inner.registry.insert(topic, partitions);
        Ok(partitions)
    }

    /// How many partitions `topic` has, creating it with as many as
    /// `origin` when it is missing.
    pub(super) async fn ensure_topic(
        &self,
        topic: &str,
        origin: &str,
    ) -> Result<i32, ParkingError> {
        let inner = &*self.inner;
        let admin = &inner.admin;
        let waited = inner.delivery_timeout;
        let timed_out = || ParkingError::TimedOut {
            topic: topic.to_owned(),
            brokers: inner.brokers.to_string(),
            waited,
        };
        let partitions = match self.lookup(topic).await? {
            Some(partitions) => partitions,
            None => {
                let partitions =
                    self.lookup(origin)
                        .await?
                        .ok_or_else(|| ParkingError::OriginMissing {
                            topic: origin.to_owned(),
                            brokers: inner.brokers.to_string(),
                        })?;
                let failed = |source: KafkaError| ParkingError::TopicNotCreated {
                    topic: topic.to_owned(),
                    brokers: inner.brokers.to_string(),
                    source: Box::new(source),
                };
                let client = admin.client.client().map_err(failed)?;
                let options = AdminOptions::new().operation_timeout(Some(waited));
                let new_topic = NewTopic::new(
                    topic,
                    partitions,
                    TopicReplication::Fixed(admin.replication),
                );
                tokio::time::timeout(waited, create_topic(&client, &new_topic, &options))
                    .await
                    .map_err(|_| timed_out())?
                    .map_err(failed)?;
                tracing::info!(%topic, %origin, partitions, replication = admin.replication, "created a parking topic");
                partitions
            }
        };
        Ok(partitions)
    }

    /// The partition count of `topic`, `None` when it does not exist.
    pub(super) async fn lookup(&self, topic: &str) -> Result<Option<i32>, ParkingError> {
        let inner = &*self.inner;
        let producer = inner.producer.clone();
        let name = topic.to_owned();
        let timeout = inner.delivery_timeout;
        tokio::task::spawn_blocking(move || partition_count(producer.client(), &name, timeout))
            .await
            // The lookup task did not finish: the runtime is shutting down.
            .unwrap_or(Err(KafkaError::Canceled))
            .map_err(|source| ParkingError::Lookup {
                topic: topic.to_owned(),
                brokers: inner.brokers.to_string(),
                source: Box::new(source),
            })
    }
}

#[async_trait::async_trait]
impl Parking for KafkaParking {
    async fn park(&self, message: &Message, delay: Duration) -> Result<Parked, ParkError> {
        let inner = &*self.inner;
        let metadata = message.metadata();
        let consumed: &str = metadata.source();
        // A copy that came back through the return topic is parked again
        // as a message of its origin: the same retry topics, partition
        // numbers and return topic.
        let origin: &str = match inner.origin_of.get(consumed) {
            Some(origin) => origin,
            None if inner.topics.iter().any(|served| served == consumed) => consumed,
            None => {
                return Err(ParkError::new(ParkingError::UnknownTopic {
                    topic: consumed.to_owned(),
                    configured: inner.topics.clone(),
                }));
            }
        };
        // Before anything is written: a copy that comes back where no
        // source of the group reads is never handled again.
        if !self.is_read(origin) {
            return Err(ParkError::new(ParkingError::ReturnTopicUnread {
                topic: origin.to_owned(),
                group: inner.group.clone(),
                return_topic: self.return_topic(origin),
            }));
        }
        let origin_partition = i32::try_from(metadata.partition()).map_err(|_| {
            ParkError::new(ParkingError::BadPartition {
                topic: origin.to_owned(),
                partition: metadata.partition(),
            })
        })?;
        let topic = self.topic_for(origin, delay);
        let partitions = self
            .ensure_retry_topic(&topic, origin)
            .await
            .map_err(ParkError::new)?;

        let parked = message.headers();
        let mut headers = OwnedHeaders::new_with_capacity(parked.len() + 2);
        for header in parked
            .iter()
            .filter(|header| &*header.name != LEGACY_ORIGIN_PARTITION)
        {
            headers = headers.insert(Header {
                key: &header.name,
                value: Some(header.value.as_ref()),
            });
        }
        // The parking layer sets the due time; a caller of its own may not.
        if parked.get(DUE).is_none() {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis();
            // Saturating: a delay beyond the clock is far in the future,
            // where the mover keeps it (writing it to the tail now and
            // then), not a due time it cannot read.
            let due = u64::try_from(now.saturating_add(delay.as_millis()))
                .unwrap_or(u64::MAX)
                .to_string();
            headers = headers.insert(Header {
                key: DUE,
                value: Some(due.as_bytes()),
            });
        }
        // The parking layer names the first delivery's partition, which the
        // mover sends the copy back to; a caller of its own may not.
        if parked.get(ORIGIN_PARTITION).is_none() {
            let origin_partition_text = origin_partition.to_string();
            headers = headers.insert(Header {
                key: ORIGIN_PARTITION,
                value: Some(origin_partition_text.as_bytes()),
            });
        }
        let mut record = FutureRecord::<[u8], [u8]>::to(&topic)
            .payload(message.payload().as_ref())
            .partition(origin_partition % partitions.max(1))
            .headers(headers);
        if let Some(key) = message.key() {
            record = record.key(key.as_ref());
        }
        match inner
            .producer
            .send(record, Timeout::After(inner.delivery_timeout))
            .await
        {
            Ok(_delivery) => Ok(Parked::Moved),
            Err((source, _unsent)) => Err(ParkError::new(ParkingError::Write {
                topic,
                brokers: inner.brokers.to_string(),
                source: Box::new(source),
            })),
        }
    }

    /// A record of one of the return topics, where only the mover writes
    /// (or of a served topic whose copies return to itself).
    fn is_returned_copy(&self, message: &Message) -> bool {
        let source: &str = message.metadata().source();
        self.inner.origin_of.contains_key(source)
            || self
                .inner
                .returns_to_itself
                .iter()
                .any(|topic| topic == source)
    }
}
