//! The dead-letter envelope: one set of field names, the same on every
//! carrier, that records next to the original message where it came from,
//! why it failed, how often, and when. `docs/DEAD-LETTERS.md` has the table.
//!
//! A sink describes itself once as a [`Carrier`] (its broker, whether its
//! records have a key slot, the group it writes for), builds an [`Envelope`]
//! for each letter, and maps the envelope's `(name, value)` pairs onto its
//! carrier: Kafka headers, Redis stream fields, AMQP headers, memory-broker
//! headers. No sink spells a field name itself. [`read`] (also
//! [`DeadLetter::read`](crate::dead_letter::DeadLetter::read)) turns what
//! any sink wrote back into a [`DeadLetter`](crate::dead_letter::DeadLetter).
//!
//! Every name of the envelope starts with `intake.`. A producer's own header
//! in that namespace is carried as `intake.producer.<name>` and restored on
//! read: no producer header can pass for an envelope field (an origin
//! cannot be spoofed), and nothing of the producer's is lost.
//!
//! ```
//! use bytes::Bytes;
//! use intake_core::dead_letter::envelope::{self, Broker, Carrier, Envelope};
//! use intake_core::{DeadLetter, Headers, Message, Metadata, Position};
//!
//! let message = Message::new("{not json", Metadata::new("orders".into(), 2, Position::Offset(41)))
//!     .with_key("customer-7");
//! let letter = DeadLetter::new(message, "expected value at line 1 column 2", 3);
//!
//! // A sink of a carrier with a key slot (a Kafka topic, say).
//! let carrier = Carrier::keyed(Broker::Kafka).with_group("billing");
//! let envelope = Envelope::new(&letter, &carrier);
//! let headers: Headers = envelope
//!     .pairs()
//!     .map(|(name, value)| (name.into_owned(), Bytes::copy_from_slice(value)))
//!     .collect();
//! assert_eq!(headers.get_str(envelope::ORIGIN_SOURCE), Some("orders"));
//! assert_eq!(headers.get_str(envelope::ORIGIN_POSITION), Some("41"));
//!
//! // Read back from what the carrier holds: key slot, payload, headers.
//! let read = DeadLetter::read(envelope.key().cloned(), envelope.payload().clone(), &headers)?;
//! assert_eq!(read.message.metadata().position(), Position::Offset(41));
//! assert_eq!(read.message.key().map(|key| &key[..]), Some(&b"customer-7"[..]));
//! assert_eq!(read.attempts, 3);
//! # Ok::<(), intake_core::dead_letter::EnvelopeError>(())
//! ```

mod broker;
mod carrier;
mod error;
mod fields;
mod origin;
mod read;
mod write;

pub use self::broker::Broker;
pub use self::carrier::Carrier;
pub use self::error::EnvelopeError;
pub use self::fields::{
    ATTEMPTS, CURRENT_VERSION, ERROR_CLASS, ERROR_MESSAGE, FAILED_FIRST, FAILED_LAST,
    HEADERS_OMITTED, MAX_FIELDS, ORIGIN_BROKER, ORIGIN_CONSUMER, ORIGIN_GROUP, ORIGIN_KEY,
    ORIGIN_PARTITION, ORIGIN_POSITION, ORIGIN_SOURCE, PRODUCER_PREFIX, REFERENCE_HEADER_BYTES,
    REFERENCE_HEADERS, REFERENCE_KEY_BYTES, REFERENCE_PAYLOAD_BYTES, REPLAYS, RESERVED_PREFIX,
    VERSION,
};
pub use self::origin::Origin;
pub(super) use self::read::earlier_failure;
pub use self::read::read;
pub use self::write::Envelope;
pub(crate) use self::write::capped_error;

#[cfg(test)]
mod tests;
