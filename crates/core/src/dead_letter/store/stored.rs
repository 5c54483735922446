//! [`StoredLetter`]: one entry of a dead-letter destination, read back.

use bytes::Bytes;

use super::LetterId;
use crate::dead_letter::{DeadLetter, EnvelopeError};
use crate::message::{Headers, Message};

/// One entry of a dead-letter destination: its id, its payload's size, and
/// the letter read back from it, or why it cannot be (something other than
/// an intake sink wrote it, or a newer intake did).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct StoredLetter {
    /// Its id in the store.
    pub id: LetterId,
    /// The size of the original payload in bytes (also when
    /// [`list`](super::DeadLetterStore::list) leaves the payload out).
    pub payload_bytes: usize,
    /// The letter: the original message (payload, key, producer headers,
    /// origin), error, class, attempts, times, replays. In a
    /// [`list`](super::DeadLetterStore::list)ing its message has an empty payload;
    /// [`read`](super::DeadLetterStore::read) has the payload.
    pub letter: Result<DeadLetter, EnvelopeError>,
}

impl StoredLetter {
    /// The entry `id` as its carrier holds it: the record's key slot (`None`
    /// on a carrier without one), the payload, and the headers or fields
    /// besides the payload. See [`DeadLetter::read`].
    pub fn read(id: LetterId, key_slot: Option<Bytes>, payload: Bytes, headers: &Headers) -> Self {
        Self {
            id,
            payload_bytes: payload.len(),
            letter: DeadLetter::read(key_slot, payload, headers),
        }
    }

    /// An entry read back by other means than [`read`](Self::read): its
    /// id, its payload's size and the letter, or why it is none.
    pub fn new(
        id: LetterId,
        payload_bytes: usize,
        letter: Result<DeadLetter, EnvelopeError>,
    ) -> Self {
        Self {
            id,
            payload_bytes,
            letter,
        }
    }

    /// The same entry with its payload left out, as a listing holds it.
    pub fn without_payload(mut self) -> Self {
        if let Ok(letter) = &mut self.letter {
            let message = &letter.message;
            let mut bare = Message::new(Bytes::new(), message.metadata().clone())
                .with_headers(message.headers().clone());
            if let Some(key) = message.key() {
                bare = bare.with_key(key.clone());
            }
            letter.message = bare;
        }
        self
    }
}
