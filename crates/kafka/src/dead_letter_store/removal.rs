//! Removing letters: a mark in the compacted side topic, or a
//! `DeleteRecords` of a partition's prefix, and the side topic made sure of.

use super::*;

impl KafkaDeadLetters {
    /// Creates the side topic (compacted, one partition) unless it is known
    /// to exist. Never left to the broker's `auto.create.topics.enable`:
    /// that would make it with the delete policy, and its marks would
    /// expire with the retention, bringing removed letters back.
    pub(super) async fn ensure_side_topic(&self) -> Result<(), StoreError> {
        if *self
            .inner
            .side_topic_ready
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            return Ok(());
        }
        let topic = self.inner.removed_topic.as_str();
        let step = || format!("create the side topic `{topic}`");
        let new_topic =
            NewTopic::new(topic, 1, TopicReplication::Fixed(-1)).set("cleanup.policy", "compact");
        let options = AdminOptions::new()
            .request_timeout(Some(Timeout::After(self.inner.timeout)))
            .operation_timeout(Some(self.inner.timeout));
        let created = self
            .bounded(
                "remove letters from",
                step(),
                create_topic(&self.inner.admin, &new_topic, &options),
            )
            .await?
            .map_err(|source| {
                self.error(
                    "remove letters from",
                    Failure::Client {
                        step: step(),
                        source,
                    },
                )
            })?;
        if created {
            tracing::info!(topic, "created the side topic of removed dead letters");
        }
        *self
            .inner
            .side_topic_ready
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = true;
        Ok(())
    }

    /// Writes one record per id to the side topic: a mark (the time of the
    /// removal) or, `tombstone`, its deletion; returns once every one is
    /// confirmed.
    pub(super) async fn write_marks(
        &self,
        ids: &[Id],
        tombstone: bool,
    ) -> Result<(), KafkaErrorOrTimeout> {
        let topic = self.inner.removed_topic.as_str();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis())
            .to_string();
        let mut deliveries = Vec::with_capacity(ids.len());
        for id in ids {
            let key = id.to_string();
            let mut record = FutureRecord::<String, String>::to(topic)
                .key(&key)
                .partition(0);
            if !tombstone {
                record = record.payload(&now);
            }
            match self.inner.producer.send_result(record) {
                Ok(delivery) => deliveries.push(delivery),
                Err((error, _)) => return Err(KafkaErrorOrTimeout::Kafka(error)),
            }
        }
        let confirmed = tokio::time::timeout(self.inner.timeout, async {
            for delivery in deliveries {
                match delivery.await {
                    Ok(Ok(_)) => {}
                    Ok(Err((error, _))) => return Err(error),
                    Err(_) => return Err(KafkaError::Canceled),
                }
            }
            Ok(())
        })
        .await;
        match confirmed {
            Err(_) => Err(KafkaErrorOrTimeout::TimedOut),
            Ok(Err(error)) => Err(KafkaErrorOrTimeout::Kafka(error)),
            Ok(Ok(())) => Ok(()),
        }
    }

    /// Marks `ids` removed in the side topic (created first if need be).
    pub(super) async fn mark(&self, ids: &[Id]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        self.ensure_side_topic().await?;
        self.write_marks(ids, false).await.map_err(|failed| {
            let step = format!(
                "mark {} letters removed in `{}`",
                ids.len(),
                self.inner.removed_topic
            );
            let failure = match failed {
                KafkaErrorOrTimeout::Kafka(source) => Failure::Client { step, source },
                KafkaErrorOrTimeout::TimedOut => Failure::TimedOut {
                    step,
                    waited: self.inner.timeout,
                },
            };
            self.error("remove letters from", failure)
        })
    }

    /// Deletes `prefixes` (partition and new low watermark) with
    /// `DeleteRecords`; returns the new low watermark of each partition
    /// whose prefix was deleted. A partition missing from the answer was
    /// not deleted: the caller marks its letters instead.
    pub(super) async fn delete_prefixes(&self, prefixes: &[(i32, i64)]) -> Vec<(i32, i64)> {
        let mut list = TopicPartitionList::new();
        for &(partition, low) in prefixes {
            if list
                .add_partition_offset(&self.inner.topic, partition, Offset::Offset(low))
                .is_err()
            {
                return Vec::new();
            }
        }
        let options = AdminOptions::new()
            .request_timeout(Some(Timeout::After(self.inner.timeout)))
            .operation_timeout(Some(self.inner.timeout));
        let asked = tokio::time::timeout(
            self.inner.timeout,
            self.inner.admin.delete_records(&list, &options),
        )
        .await;
        let warn = |error: &dyn fmt::Display| {
            tracing::warn!(
                topic = %self.inner.topic,
                %error,
                "could not delete the removed dead letters' prefix; marking them removed instead"
            );
        };
        match asked {
            Ok(Ok(result)) => result
                .elements()
                .iter()
                .filter_map(|element| match (element.error(), element.offset()) {
                    (Ok(()), Offset::Offset(low)) => Some((element.partition(), low)),
                    (Ok(()), _) => None,
                    (Err(error), _) => {
                        warn(&error);
                        None
                    }
                })
                .collect(),
            Ok(Err(error)) => {
                warn(&error);
                Vec::new()
            }
            Err(_) => {
                warn(&format_args!("no answer within {:?}", self.inner.timeout));
                Vec::new()
            }
        }
    }
}
