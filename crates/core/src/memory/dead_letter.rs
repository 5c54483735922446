//! [`MemoryDeadLetterSink`]: dead letters go to a topic of the broker.
//!
//! The dead-letter topic is an ordinary one-partition topic, by default
//! `<topic>.<group>.dlq` (one per topic and group, so groups never see each
//! other's failures). Each dead letter becomes a record with the original
//! payload and key (the record key is the original key) and, as headers,
//! the producer's headers and the fields of the
//! [envelope](crate::dead_letter::envelope); a dead-letter consumer reads it
//! like any topic, and [`DeadLetter::read`] turns it back into the letter
//! ([`MemoryBroker::dead_letters`](super::MemoryBroker::dead_letters) does).

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

use super::faults::{FaultState, InjectedFault};
use super::record::Record;
use super::topic::Topic;
use crate::dead_letter::envelope::{Broker, Carrier, Envelope};
use crate::dead_letter::{DeadLetter, DeadLetterError, DeadLetterSink};
use crate::message::Headers;

/// The default dead-letter topic of `group` consuming `topic`.
pub fn dead_letter_topic(topic: &str, group: &str) -> String {
    format!("{topic}.{group}.dlq")
}

/// Writes dead letters to a dead-letter topic of the memory broker. Cheap to
/// clone. Get one from [`MemoryBroker::dead_letter_sink`](super::MemoryBroker::dead_letter_sink).
#[derive(Clone)]
pub struct MemoryDeadLetterSink {
    topic: Arc<Topic>,
    carrier: Arc<Carrier>,
    faults: Arc<FaultState>,
}

impl MemoryDeadLetterSink {
    pub(crate) fn new(topic: Arc<Topic>, group: &str, faults: Arc<FaultState>) -> Self {
        Self {
            topic,
            carrier: Arc::new(Carrier::keyed(Broker::Memory).with_group(group)),
            faults,
        }
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
        let record = record_of(&Envelope::new(letter, &self.carrier));
        let mut state = self.topic.lock();
        self.topic
            .append(&mut state, record)
            .map_err(|error| DeadLetterError(Box::new(error)))?;
        Ok(())
    }
}

/// The record stored for a letter: its payload and key, and the envelope's
/// pairs as headers.
fn record_of(envelope: &Envelope<'_>) -> Record {
    let producers = envelope
        .headers()
        .map(|(name, value)| (name.into_owned(), value.clone()));
    let fields = envelope
        .fields()
        .map(|(name, value)| (name.to_owned(), Bytes::copy_from_slice(value)));
    let headers: Headers = producers.chain(fields).collect();
    Record::new(envelope.payload().clone())
        .with_optional_key(envelope.key().cloned())
        .with_headers(headers)
        .with_timestamp(envelope.letter().failed_at)
        .to_partition(0)
}
