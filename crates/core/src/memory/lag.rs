//! [`MemoryLagProbe`]: the memory broker's answer to "how far behind is this
//! group", per partition.

use std::time::{Duration, SystemTime};

use super::{MemoryBroker, MemoryError};
use crate::lag::{LagError, LagProbe, PartitionLag};
use crate::message::PartitionKey;

/// Reports a group's lag on one topic of a [`MemoryBroker`]: log end minus
/// committed offset per partition (from offset 0 where the group never
/// committed), and the age of the first uncommitted message from its
/// timestamp. Made by [`MemoryBroker::topic_lag_probe`] or the
/// [`Broker`](crate::backend::Broker) trait's `lag_probe`; see
/// [`lag`](crate::lag) for an example.
#[derive(Clone)]
pub struct MemoryLagProbe {
    broker: MemoryBroker,
    topic: String,
    group: String,
}

impl std::fmt::Debug for MemoryLagProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryLagProbe")
            .field("topic", &self.topic)
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl MemoryBroker {
    /// A probe of `group`'s lag on `topic`, made at once. The topic need not
    /// exist yet: until it does, the probe answers [`LagError::Refused`].
    /// The [`Broker`](crate::backend::Broker) trait's `lag_probe(&address)`,
    /// which every backend has, gives the same probe asynchronously.
    pub fn topic_lag_probe(&self, topic: &str, group: &str) -> MemoryLagProbe {
        MemoryLagProbe {
            broker: self.clone(),
            topic: topic.to_owned(),
            group: group.to_owned(),
        }
    }
}

impl MemoryLagProbe {
    fn query(&self) -> Result<Vec<PartitionLag>, MemoryError> {
        let snapshot = self.broker.group(&self.topic, &self.group)?;
        let topic = self.broker.topic(&self.topic)?;
        let now = SystemTime::now();
        let state = topic.lock();
        let group = state.group(&self.group);
        Ok(snapshot
            .partitions
            .iter()
            .map(|partition| {
                let key = PartitionKey::new(topic.name.clone(), partition.partition);
                let first_uncommitted = partition.committed.unwrap_or(0);
                let oldest = usize::try_from(first_uncommitted).ok().and_then(|offset| {
                    let log = state.logs.get(partition.partition as usize)?;
                    // Passing over copies other groups parked.
                    let offset = match group {
                        Some(index) => {
                            state.groups[index].visible_from(partition.partition, offset, log.len())
                        }
                        None => {
                            let private = state.private.get(partition.partition as usize)?;
                            (offset..log.len())
                                .find(|offset| !private.contains(offset))
                                .unwrap_or(log.len())
                        }
                    };
                    log.get(offset)?.metadata().timestamp()
                });
                // A clock that went backwards since the message was stamped
                // makes it zero seconds old rather than an error.
                let age = oldest.map_or(Duration::ZERO, |stamped| {
                    now.duration_since(stamped).unwrap_or_default()
                });
                PartitionLag::new(key, Some(partition.lag)).with_oldest_age(age)
            })
            .collect())
    }
}

impl LagProbe for MemoryLagProbe {
    fn group(&self) -> &str {
        &self.group
    }

    async fn lag(&self) -> Result<Vec<PartitionLag>, LagError> {
        self.query()
            .map_err(|error| LagError::Refused(Box::new(error)))
    }

    /// What the group's parkings of the topic hold.
    async fn parked(&self) -> Result<Option<u64>, LagError> {
        let waiting = self.broker.parked_waiting(&self.topic, &self.group);
        Ok(Some(
            waiting.load(std::sync::atomic::Ordering::Relaxed) as u64
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{AckBatch, Acker, PartitionAck, Source, SourceEvent};
    use crate::memory::Record;

    #[tokio::test]
    async fn reports_log_end_minus_committed_per_partition() {
        let broker = MemoryBroker::new();
        broker.create_topic("orders", 2).unwrap();
        for n in 0..10u32 {
            broker
                .send("orders", Record::new(n.to_string()).to_partition(n % 2))
                .unwrap();
        }
        let (mut source, mut acker) = broker.consumer("orders", "billing").unwrap();
        let mut deliveries = Vec::new();
        let event = source.next(&mut deliveries, 100).await.unwrap();
        assert!(matches!(event, SourceEvent::Assigned(_)));
        // Commit the first three messages of partition 0 only.
        let mut done = PartitionAck::new(PartitionKey::new("orders", 0));
        done.watermark = Some(crate::Position::Offset(2));
        acker
            .ack(&AckBatch {
                partitions: vec![done],
                sync: true,
            })
            .await
            .unwrap();

        let lag = broker
            .topic_lag_probe("orders", "billing")
            .lag()
            .await
            .unwrap();
        let messages: Vec<_> = lag.iter().map(|partition| partition.messages).collect();
        assert_eq!(messages, [Some(2), Some(5)]);
        assert_eq!(lag[0].partition, PartitionKey::new("orders", 0));
        assert_eq!(lag[1].partition, PartitionKey::new("orders", 1));
        source.close().await.unwrap();
    }

    #[tokio::test]
    async fn a_fully_committed_partition_has_no_age() {
        let broker = MemoryBroker::new();
        broker.create_topic("orders", 1).unwrap();
        let lag = broker
            .topic_lag_probe("orders", "billing")
            .lag()
            .await
            .unwrap();
        assert_eq!(lag[0].messages, Some(0));
        assert_eq!(lag[0].oldest_age, Some(Duration::ZERO));
    }

    #[tokio::test]
    async fn the_age_is_that_of_the_first_uncommitted_message() {
        let broker = MemoryBroker::new();
        broker.create_topic("orders", 1).unwrap();
        let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
        broker
            .send("orders", Record::new("old").with_timestamp(an_hour_ago))
            .unwrap();
        broker.send("orders", Record::new("new")).unwrap();
        let lag = broker
            .topic_lag_probe("orders", "billing")
            .lag()
            .await
            .unwrap();
        assert!(lag[0].oldest_age.unwrap() >= Duration::from_secs(3600));
    }

    #[tokio::test]
    async fn an_unknown_topic_is_refused() {
        let broker = MemoryBroker::new();
        let error = broker
            .topic_lag_probe("nowhere", "billing")
            .lag()
            .await
            .unwrap_err();
        assert!(matches!(error, LagError::Refused(_)));
        assert!(!error.is_transient());
    }
}
