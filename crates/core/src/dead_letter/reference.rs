//! [`PayloadReference`]: what a dead letter carries when the message itself
//! could not be written.

use bytes::Bytes;

use crate::message::{Headers, Message};

/// The sizes of a message whose dead letter could not be written (too large
/// for the destination, or a destination that kept failing). The letter
/// written instead has the message's metadata (its origin: source,
/// partition, position), the error and the attempts, no payload, no key, and
/// these sizes as headers, so the message can be found at its origin while
/// the source still keeps it.
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
    /// The header of a reference letter that holds the payload's length.
    pub const PAYLOAD_BYTES_HEADER: &'static str = "intake.reference.payload_bytes";
    /// The header that holds the key's length.
    pub const KEY_BYTES_HEADER: &'static str = "intake.reference.key_bytes";
    /// The header that holds the number of headers.
    pub const HEADERS_HEADER: &'static str = "intake.reference.headers";
    /// The header that holds the headers' size in bytes.
    pub const HEADER_BYTES_HEADER: &'static str = "intake.reference.header_bytes";

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

    /// The message a reference letter carries for `original`: its metadata,
    /// nothing of its content, these sizes as headers.
    pub(super) fn message_for(&self, original: &Message) -> Message {
        let headers: Headers = [
            (Self::PAYLOAD_BYTES_HEADER, self.payload_bytes),
            (Self::KEY_BYTES_HEADER, self.key_bytes),
            (Self::HEADERS_HEADER, self.headers),
            (Self::HEADER_BYTES_HEADER, self.header_bytes),
        ]
        .into_iter()
        .map(|(name, size)| (name, Bytes::from(size.to_string())))
        .collect();
        Message::new(Bytes::new(), original.metadata().clone()).with_headers(headers)
    }
}
