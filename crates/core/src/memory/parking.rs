//! [`MemoryParking`]: the memory broker parks a message on a timer and
//! appends it to its topic again once due, for the parking group alone.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::MemoryBroker;
use super::record::Record;
use crate::message::{Message, Position};
use crate::parking::{ParkError, Parked, Parking};

/// Parks messages one group consumed from one topic of the memory broker:
/// each is appended to the topic again (same key, so the same partition)
/// once its delay is over, for that group alone: the topic's other groups
/// pass over the copy, as they would not read a Kafka return topic or Redis
/// return stream of the group. Get one from
/// [`MemoryBroker::parking`](super::MemoryBroker::parking).
///
/// The park lives in this process, like everything the memory broker holds.
#[derive(Clone)]
pub struct MemoryParking {
    broker: MemoryBroker,
    topic: Arc<str>,
    group: Arc<str>,
    waiting: Arc<AtomicUsize>,
}

impl MemoryParking {
    pub(super) fn new(
        broker: MemoryBroker,
        topic: &str,
        group: &str,
        waiting: Arc<AtomicUsize>,
    ) -> Self {
        Self {
            broker,
            topic: topic.into(),
            group: group.into(),
            waiting,
        }
    }

    /// Messages parked and not yet back in the topic (by every parking of
    /// this topic and group).
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }
}

impl fmt::Debug for MemoryParking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryParking")
            .field("topic", &self.topic)
            .field("group", &self.group)
            .field("waiting", &self.waiting())
            .finish()
    }
}

#[async_trait::async_trait]
impl Parking for MemoryParking {
    async fn park(&self, message: &Message, delay: Duration) -> Result<Parked, ParkError> {
        // Refused now rather than lost later: the topic must exist.
        self.broker
            .partitions(&self.topic)
            .map_err(ParkError::new)?;
        let record = Record::new(message.payload().clone())
            .with_optional_key(message.key().cloned())
            .with_headers(message.headers().clone());
        let broker = self.broker.clone();
        let topic = Arc::clone(&self.topic);
        let group = Arc::clone(&self.group);
        let waiting = Arc::clone(&self.waiting);
        waiting.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if let Err(error) = broker.send_parked_copy(&topic, &group, record) {
                tracing::error!(%topic, %group, %error,
                    "a parked message could not go back to its topic");
            }
            waiting.fetch_sub(1, Ordering::Relaxed);
        });
        Ok(Parked::Moved)
    }

    /// By the broker's own record of the copies it gave back.
    fn is_returned_copy(&self, message: &Message) -> bool {
        let metadata = message.metadata();
        match metadata.position() {
            Position::Offset(offset) => {
                self.broker
                    .is_parked_copy(metadata.source(), metadata.partition(), offset)
            }
            Position::StreamId { .. } | Position::Tag(_) => false,
        }
    }
}
