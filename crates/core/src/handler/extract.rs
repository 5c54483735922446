//! Extractors: what a handler fn's arguments are made from.
//!
//! Two traits, as in axum: [`FromMessageParts`] reads metadata from a borrowed
//! [`Message`] and may appear in any argument position; [`FromMessage`]
//! consumes the message (its payload) and may only be the last argument.
//! Extraction is synchronous: everything an extractor needs is already in the
//! message, so no future (and no box) is built for it.

use bytes::Bytes;

use crate::error::HandlerError;
use crate::message::{Headers, Message, Metadata};

/// An extractor that reads a borrowed message: metadata, key, headers.
///
/// Any number of these may precede the last argument of a handler fn, and
/// one may also be the last argument.
///
/// # Example
///
/// ```
/// use intake_core::{FromMessageParts, HandlerError, Message};
///
/// /// The `tenant` header, required.
/// struct Tenant(String);
///
/// impl FromMessageParts for Tenant {
///     fn from_message_parts(message: &Message) -> Result<Self, HandlerError> {
///         match message.headers().get_str("tenant") {
///             Some(tenant) => Ok(Tenant(tenant.to_owned())),
///             None => Err(HandlerError::permanent("the `tenant` header is missing")),
///         }
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "handler argument `{Self}` cannot be extracted from a message's metadata",
    label = "`{Self}` is not a `FromMessageParts` extractor",
    note = "every argument but the last implements `FromMessageParts` (`Meta`, `Key`, `Headers`) \
            or is a `State<T>`",
    note = "`Json<T>`, `Decoded<T>`, `Payload` and `Message` consume the message: only the last \
            argument may be one of them, so move it last",
    note = "for a type of your own, implement `FromMessageParts` (reads a borrowed message) or, \
            for the last argument only, `FromMessage` (consumes it)"
)]
pub trait FromMessageParts: Sized {
    /// Extracts `Self`, or fails with the error the message gets instead of
    /// running the handler.
    fn from_message_parts(message: &Message) -> Result<Self, HandlerError>;
}

/// An extractor that consumes the message: its payload, or the message itself.
///
/// Only the last argument of a handler fn may be one. Every
/// [`FromMessageParts`] extractor is also a `FromMessage` one (with the marker
/// `M` telling the two apart, so the compiler never has to choose); implement
/// this trait without naming `M`.
#[diagnostic::on_unimplemented(
    message = "handler argument `{Self}` cannot be extracted from a message",
    label = "`{Self}` is not a `FromMessage` extractor",
    note = "the last argument of a handler fn implements `FromMessage` (`Json<T>`, `Decoded<T>`, \
            `Payload`, `Message`) or `FromMessageParts` (`Meta`, `Key`, `Headers`), or is a \
            `State<T>`",
    note = "`Json<T>` needs `T: serde::Deserialize`; `Decoded<T>` needs `T: Decode`"
)]
pub trait FromMessage<M = private::ViaMessage>: Sized {
    /// Extracts `Self`, or fails with the error the message gets instead of
    /// running the handler.
    fn from_message(message: Message) -> Result<Self, HandlerError>;
}

pub(crate) mod private {
    /// Marks a [`FromMessage`](super::FromMessage) implemented directly.
    #[derive(Debug)]
    pub enum ViaMessage {}

    /// Marks a [`FromMessage`](super::FromMessage) derived from
    /// [`FromMessageParts`](super::FromMessageParts).
    #[derive(Debug)]
    pub enum ViaParts {}
}

impl<T: FromMessageParts> FromMessage<private::ViaParts> for T {
    fn from_message(message: Message) -> Result<Self, HandlerError> {
        T::from_message_parts(&message)
    }
}

/// The whole message, for handlers that want everything (or decode by hand).
impl FromMessage for Message {
    fn from_message(message: Message) -> Result<Self, HandlerError> {
        Ok(message)
    }
}

/// The raw payload bytes. Consumes the message, so it is the last argument.
///
/// ```
/// use intake_core::{handler_fn, Payload};
///
/// let handler = handler_fn(async |Payload(bytes): Payload| {
///     assert!(!bytes.is_empty());
/// });
/// # drop(handler);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Payload(pub Bytes);

impl FromMessage for Payload {
    fn from_message(message: Message) -> Result<Self, HandlerError> {
        Ok(Payload(message.into_payload()))
    }
}

/// The message's [`Metadata`]: source, partition, position, timestamp,
/// attempt. Cloning it bumps a reference count; it never allocates.
#[derive(Clone, Debug)]
pub struct Meta(pub Metadata);

impl FromMessageParts for Meta {
    fn from_message_parts(message: &Message) -> Result<Self, HandlerError> {
        Ok(Meta(message.metadata().clone()))
    }
}

/// The message key, if the broker carries one (Kafka key, AMQP routing key, a
/// configured Redis field).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key(pub Option<Bytes>);

impl FromMessageParts for Key {
    fn from_message_parts(message: &Message) -> Result<Self, HandlerError> {
        Ok(Key(message.key().cloned()))
    }
}

/// The message headers (a reference-counted list: no copy of the entries).
impl FromMessageParts for Headers {
    fn from_message_parts(message: &Message) -> Result<Self, HandlerError> {
        Ok(message.headers().clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Metadata, Position};

    fn message() -> Message {
        let headers: Headers = [("trace", "abc")].into_iter().collect();
        Message::new(
            Bytes::from_static(b"body"),
            Metadata::new("orders".into(), 3, Position::Offset(42)),
        )
        .with_key(Bytes::from_static(b"customer-7"))
        .with_headers(headers)
    }

    #[test]
    fn metadata_extractors_read_without_consuming_the_message() {
        let message = message();
        let Meta(meta) = Meta::from_message_parts(&message).unwrap();
        let Key(key) = Key::from_message_parts(&message).unwrap();
        let headers = Headers::from_message_parts(&message).unwrap();
        assert_eq!(meta.position(), Position::Offset(42));
        assert_eq!(meta.partition(), 3);
        assert_eq!(key.as_deref(), Some(&b"customer-7"[..]));
        assert_eq!(headers.get_str("trace"), Some("abc"));
        assert_eq!(message.payload().as_ref(), b"body");
    }

    #[test]
    fn a_missing_key_is_none_not_an_error() {
        let message = Message::new(
            Bytes::new(),
            Metadata::new("orders".into(), 0, Position::Offset(0)),
        );
        assert_eq!(Key::from_message_parts(&message).unwrap(), Key(None));
    }

    #[test]
    fn payload_takes_the_bytes_out_of_the_message() {
        let Payload(bytes) = Payload::from_message(message()).unwrap();
        assert_eq!(bytes.as_ref(), b"body");
    }

    #[test]
    fn a_metadata_extractor_can_also_be_the_last_argument() {
        let Meta(meta) = <Meta as FromMessage<_>>::from_message(message()).unwrap();
        assert_eq!(&**meta.source(), "orders");
    }
}
