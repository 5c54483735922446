//! [`MemoryPublisher`]: publishing to the memory broker's topics.

use std::future::{Ready, ready};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use super::broker::MemoryBroker;
use super::error::MemoryError;
use super::record::Record;
use crate::message::Position;
use crate::publish::{Confirmation, Output, PublishError, PublishErrorKind, Publisher};

/// Publishes to the memory broker's topics, confirmed at once: an output is
/// stored (and readable with [`MemoryBroker::messages`], or by any consumer
/// of the topic) when its receipt resolves. Keys pick the partition as
/// [`MemoryBroker::send`] does.
///
/// An output to a topic never created is
/// [rejected](PublishErrorKind::Rejected); [`fail_next`](Self::fail_next)
/// makes sends fail as an unreachable broker would, for tests of what a
/// failed output does to its input. Clones share the broker and the faults.
#[derive(Clone, Debug)]
pub struct MemoryPublisher {
    broker: MemoryBroker,
    failing_sends: Arc<AtomicU32>,
}

impl MemoryPublisher {
    pub(super) fn new(broker: MemoryBroker) -> Self {
        Self {
            broker,
            failing_sends: Arc::new(AtomicU32::new(0)),
        }
    }

    /// Makes the next `count` sends fail with
    /// [`PublishErrorKind::Unavailable`], nothing stored.
    pub fn fail_next(&self, count: u32) {
        self.failing_sends.store(count, Ordering::Relaxed);
    }

    fn take_failure(&self) -> bool {
        self.failing_sends
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(1)
            })
            .is_ok()
    }

    fn store(&self, output: Output) -> Result<Confirmation, PublishError> {
        let partition = output.partition();
        let (destination, payload, key, headers) = output.into_parts();
        if self.take_failure() {
            return Err(PublishError::new(
                PublishErrorKind::Unavailable,
                &*destination,
                "injected failure (MemoryPublisher::fail_next); publish again",
            ));
        }
        let mut record = Record::new(payload)
            .with_optional_key(key)
            .with_headers(headers);
        if let Some(partition) = partition {
            record = record.to_partition(partition);
        }
        match self.broker.send(&destination, record) {
            Ok(produced) => Ok(Confirmation::at(
                Some(produced.partition),
                Some(Position::Offset(produced.offset)),
            )),
            Err(error @ MemoryError::UnknownTopic { .. }) => Err(PublishError::new(
                PublishErrorKind::Rejected,
                &*destination,
                "no such topic; create it before publishing to it",
            )
            .with_source(error)),
            Err(error) => Err(PublishError::new(
                PublishErrorKind::Rejected,
                &*destination,
                "the memory broker refused the output",
            )
            .with_source(error)),
        }
    }
}

impl Publisher for MemoryPublisher {
    type Receipt = Ready<Result<Confirmation, PublishError>>;

    async fn send(&self, output: Output) -> Result<Self::Receipt, PublishError> {
        Ok(ready(self.store(output)))
    }
}
