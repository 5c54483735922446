//! Reference letters (origin and sizes, no payload) refused where the
//! entry they would name goes away with the acknowledgement that follows.

use intake_core::DeadLetter;

use super::RedisDeadLetterSink;
use crate::error::Error;

impl RedisDeadLetterSink {
    /// Refuses the reference letter `letter` (its envelope as it would be
    /// written) when the entry it names does not outlive the acknowledgement
    /// that follows: a stream whose acknowledged entries this consumer
    /// deletes, or a copy in a return stream that names no first delivery,
    /// which the parking's mover trims once acknowledged. (A reference
    /// carries no fields, so a copy is known by the stream it was read
    /// from; its first delivery only from the parking layer, a dead-letter
    /// layer inside it.)
    pub(super) fn check_reference(&self, letter: &DeadLetter) -> Result<(), Error> {
        let metadata = letter.message.metadata();
        let (named, position) = match metadata.parked_from() {
            Some(first) => (&*first.source, first.position),
            None => (&**metadata.source(), metadata.position()),
        };
        let physical: &str = metadata.source();
        let copy = self
            .destination
            .consumed
            .iter()
            .any(|origin| origin != physical && self.is_return_stream_of(physical, origin));
        let why = if copy && metadata.parked_from().is_none() {
            "it is a parked copy in a return stream, which is trimmed once acknowledged"
        } else if self.destination.deletes_acked && self.destination.consumed.contains(named) {
            "the consumer deletes acknowledged entries (delete_acked)"
        } else {
            return Ok(());
        };
        let refused = Error::ReferenceNotWritten {
            endpoint: self.connection.connector().endpoint().clone(),
            stream: named.to_owned(),
            position: position.to_string(),
            why,
        };
        tracing::error!(
            stream = named,
            %position,
            payload_bytes = letter.reference.map_or(0, |sizes| sizes.payload_bytes),
            error = %refused,
            "the dead letter could not be written; the entry stays pending"
        );
        Err(refused)
    }
}
