//! [`PayloadReference`]: what a dead letter carries when the message itself
//! could not be written.

use bytes::Bytes;

use crate::message::Message;

/// The sizes of a message whose dead letter could not be written (too large
/// for the destination, or a destination that kept failing). The letter
/// written instead has the message's metadata (its origin: source,
/// partition, position), the error and the attempts, no payload, no key, no
/// headers, and these sizes in the `intake.reference.*` fields of the
/// [envelope](super::envelope), so the message can be found at its origin
/// while the source still keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PayloadReference {
    /// The payload's length in bytes.
    pub payload_bytes: usize,
    /// The key's length in bytes (0 without a key).
    pub key_bytes: usize,
    /// How many headers the message had.
    pub headers: usize,
    /// The headers' names and values, in bytes.
    pub header_bytes: usize,
}

impl PayloadReference {
    /// The sizes of `message`.
    pub fn of(message: &Message) -> Self {
        let headers = message.headers();
        Self {
            payload_bytes: message.payload().len(),
            key_bytes: message.key().map_or(0, Bytes::len),
            headers: headers.len(),
            header_bytes: headers
                .iter()
                .map(|header| header.name.len() + header.value.len())
                .sum(),
        }
    }
}
