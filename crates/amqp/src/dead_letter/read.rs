//! Reading a delivery of a dead-letter queue back as a letter.

use intake_core::dead_letter::EnvelopeError;
use intake_core::{DeadLetter, SourceName};
use lapin::message::Delivery;

use crate::headers;
use crate::source::convert::DeliveryReader;

/// Reads a delivery of a dead-letter queue back as the letter an
/// [`AmqpDeadLetterSink`](super::AmqpDeadLetterSink) wrote: its properties and headers as the
/// [`AmqpSource`](crate::AmqpSource) shows them, through
/// [`DeadLetter::read`] with no key slot (the delivery's routing key is the
/// letter's, not the original's).
///
/// A message the broker dead-lettered itself
/// ([`BrokerDeadLetterSink`](crate::BrokerDeadLetterSink)) carries
/// RabbitMQ's `x-death`, not the envelope, and is refused with
/// [`EnvelopeError::Missing`].
///
/// # Errors
///
/// [`EnvelopeError`] naming the envelope field that is missing, malformed
/// or repeated.
pub fn read_dead_letter(delivery: Delivery) -> Result<DeadLetter, EnvelopeError> {
    read_stored(delivery).0
}

/// The letter in `delivery`, and the id its sink gave it
/// ([`headers::LETTER_ID`], left out of the letter's headers), if any.
pub(crate) fn read_stored(
    delivery: Delivery,
) -> (Result<DeadLetter, EnvelopeError>, Option<String>) {
    let message = DeliveryReader::new(SourceName::from("")).read(delivery, 0);
    let token = message
        .headers()
        .get_str(headers::LETTER_ID)
        .map(str::to_owned);
    let letter = match token {
        None => DeadLetter::read(None, message.payload().clone(), message.headers()),
        Some(_) => {
            let others: intake_core::Headers = message
                .headers()
                .iter()
                .filter(|header| &*header.name != headers::LETTER_ID)
                .map(|header| (header.name.clone(), header.value.clone()))
                .collect();
            DeadLetter::read(None, message.payload().clone(), &others)
        }
    };
    (letter, token)
}
