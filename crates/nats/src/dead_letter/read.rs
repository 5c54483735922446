//! Reading a message of a dead-letter stream back as a letter.

use std::sync::Arc;

use intake_core::dead_letter::envelope::EnvelopeError;
use intake_core::{DeadLetter, Headers, Message};

use super::NATS_HEADER_PREFIX;

/// Reads back a dead letter consumed from a dead-letter stream (with a
/// [`NatsSource`](crate::NatsSource), or any client whose message you turn
/// into an intake [`Message`]): the original payload, key, headers and
/// origin, the error, class, attempts and times.
///
/// Headers named `Nats-…` come back under their own names (the letter
/// carries them as `intake.nats.…`, since JetStream acts on them in a
/// publish).
///
/// # Errors
///
/// [`EnvelopeError`] naming the field that is missing, malformed or
/// repeated.
pub fn read_dead_letter(message: &Message) -> Result<DeadLetter, EnvelopeError> {
    let headers: Headers = message
        .headers()
        .iter()
        .map(|header| {
            let name: Arc<str> = match header.name.strip_prefix(NATS_HEADER_PREFIX) {
                Some(original) => original.into(),
                None => header.name.clone(),
            };
            (name, header.value.clone())
        })
        .collect();
    DeadLetter::read(None, message.payload().clone(), &headers)
}
