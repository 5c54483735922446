//! [`MemoryDeadLetterSink`]: dead letters go to a topic of the broker.
//!
//! The dead-letter topic is an ordinary one-partition topic, by default
//! `<topic>.<group>.dlq` (one per topic and group, so groups never see each
//! other's failures). Each dead letter becomes a message with the original
//! payload, key and headers plus headers naming its origin, the error, the
//! attempts and the time; a dead-letter consumer reads it like any topic. The
//! broker also keeps each [`DeadLetter`] as written, for inspection.

use std::fmt;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use bytes::Bytes;

use super::faults::{FaultState, InjectedFault};
use super::record::Record;
use super::topic::Topic;
use crate::dead_letter::{DeadLetter, DeadLetterError, DeadLetterSink};

/// Header with the topic the message was consumed from.
pub const ORIGIN_TOPIC_HEADER: &str = "intake-origin-topic";
/// Header with the partition the message was consumed from.
pub const ORIGIN_PARTITION_HEADER: &str = "intake-origin-partition";
/// Header with the message's offset in its original partition.
pub const ORIGIN_OFFSET_HEADER: &str = "intake-origin-offset";
/// Header with the last error's text.
pub const ERROR_HEADER: &str = "intake-error";
/// Header with the number of attempts made.
pub const ATTEMPTS_HEADER: &str = "intake-attempts";
/// Header with when the message was given up, in milliseconds since the Unix
/// epoch.
pub const FAILED_AT_HEADER: &str = "intake-failed-at-ms";

/// The default dead-letter topic of `group` consuming `topic`.
pub fn dead_letter_topic(topic: &str, group: &str) -> String {
    format!("{topic}.{group}.dlq")
}

/// Writes dead letters to a dead-letter topic of the memory broker. Cheap to
/// clone. Get one from [`MemoryBroker::dead_letter_sink`](super::MemoryBroker::dead_letter_sink).
#[derive(Clone)]
pub struct MemoryDeadLetterSink {
    topic: Arc<Topic>,
    faults: Arc<FaultState>,
}

impl MemoryDeadLetterSink {
    pub(crate) fn new(topic: Arc<Topic>, faults: Arc<FaultState>) -> Self {
        Self { topic, faults }
    }

    /// The dead-letter topic this sink writes to.
    pub fn topic(&self) -> &str {
        &self.topic.name
    }
}

impl fmt::Debug for MemoryDeadLetterSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryDeadLetterSink")
            .field("topic", &self.topic.name)
            .finish()
    }
}

#[async_trait::async_trait]
impl DeadLetterSink for MemoryDeadLetterSink {
    async fn write(&self, letter: &DeadLetter) -> Result<(), DeadLetterError> {
        if self.faults.take_dead_letter_failure() {
            return Err(DeadLetterError(Box::new(InjectedFault::DeadLetterWrite)));
        }
        let record = record_of(letter);
        let mut state = self.topic.lock();
        self.topic
            .append(&mut state, record)
            .map_err(|error| DeadLetterError(Box::new(error)))?;
        state.dead_letters.push(letter.clone());
        Ok(())
    }
}

/// The message stored for `letter`: the original with origin headers.
fn record_of(letter: &DeadLetter) -> Record {
    let original = &letter.message;
    let metadata = original.metadata();
    let failed_at_ms = letter
        .failed_at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis());
    let mut headers = original.headers().clone();
    headers.insert(
        ORIGIN_TOPIC_HEADER,
        Bytes::copy_from_slice(metadata.source().as_bytes()),
    );
    headers.insert(ORIGIN_PARTITION_HEADER, metadata.partition().to_string());
    headers.insert(ORIGIN_OFFSET_HEADER, metadata.position().to_string());
    headers.insert(ERROR_HEADER, letter.error.clone());
    headers.insert(ATTEMPTS_HEADER, letter.attempts.to_string());
    headers.insert(FAILED_AT_HEADER, failed_at_ms.to_string());
    Record::new(original.payload().clone())
        .with_optional_key(original.key().cloned())
        .with_headers(headers)
        .with_timestamp(letter.failed_at)
        .to_partition(0)
}
