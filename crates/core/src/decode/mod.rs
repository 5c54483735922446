//! Typed payloads: [`Json<T>`] for JSON, and [`Decode`] with [`Decoded<T>`]
//! for any other codec.
//!
//! Both are handler arguments (the last one: they consume the payload). A
//! payload that does not decode never reaches the handler: the message fails
//! with a [permanent](crate::HandlerError::permanent) error, a
//! [`DecodeError`] that names the codec, the target type and the codec's
//! complaint, and shows the start of the payload (escaped), so the dead-letter
//! record or log line says what arrived. Where payloads hold personal data,
//! [`PayloadPreview`] shows nothing of them, a fingerprint, or a text of
//! the application's instead (a process-wide setting, made at start-up):
//!
//! ```
//! use intake_core::decode::PayloadPreview;
//!
//! PayloadPreview::hash().set_global();
//! ```
//!
//! A codec of your own implements [`Decode`]:
//!
//! ```
//! use bytes::Bytes;
//! use intake_core::{handler_fn, Decode, DecodeError, Decoded};
//!
//! /// A payload that is one decimal number, as text.
//! struct Count(u64);
//!
//! impl Decode for Count {
//!     fn decode(payload: &Bytes) -> Result<Self, DecodeError> {
//!         std::str::from_utf8(payload)
//!             .map_err(|error| DecodeError::new::<Self>("decimal text", payload, error))?
//!             .parse()
//!             .map(Count)
//!             .map_err(|error| DecodeError::new::<Self>("decimal text", payload, error))
//!     }
//! }
//!
//! let handler = handler_fn(async |Decoded(Count(count)): Decoded<Count>| {
//!     tracing::info!(count, "counted");
//! });
//! # drop(handler);
//! ```
//!
//! The codec gets the payload as `&Bytes`, so one that keeps parts of it
//! (prost with `bytes` fields) can share the buffer instead of copying.
//!
//! A Kafka record whose value is null (a compacted topic's tombstone: "this
//! key is deleted") arrives as a message with
//! [`is_tombstone`](Message::is_tombstone) set and an empty payload. It
//! never reaches a codec: `Json<T>` and `Decoded<T>` fail it with a
//! permanent `DecodeError` that says it is a tombstone, and
//! `Option<Json<T>>` and `Option<Decoded<T>>` take it as `None`. An empty
//! value, which is not a tombstone, is decoded like any other.

mod error;
mod fast_json;
mod json;
mod preview;

use bytes::Bytes;

pub use error::DecodeError;
pub use json::Json;
pub use preview::{PREVIEW_LIMIT, PayloadPreview};

use crate::error::HandlerError;
use crate::handler::FromMessage;
use crate::message::Message;

/// A type a payload decodes into. Used through the [`Decoded<T>`] extractor.
pub trait Decode: Sized {
    /// Decodes `payload`; a failure is a [`DecodeError`] built with
    /// [`DecodeError::new`].
    fn decode(payload: &Bytes) -> Result<Self, DecodeError>;
}

/// A UTF-8 text payload.
impl Decode for String {
    fn decode(payload: &Bytes) -> Result<Self, DecodeError> {
        match std::str::from_utf8(payload) {
            Ok(text) => Ok(text.to_owned()),
            Err(error) => Err(DecodeError::new::<Self>("UTF-8 text", payload, error)),
        }
    }
}

/// The payload decoded into `T` with `T`'s [`Decode`] impl.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Decoded<T>(pub T);

/// A [tombstone](Message::is_tombstone) fails: see `Option<Decoded<T>>`.
impl<T: Decode> FromMessage for Decoded<T> {
    fn from_message(message: Message) -> Result<Self, HandlerError> {
        if message.is_tombstone() {
            return Err(DecodeError::tombstone::<T>("its codec", "Option<Decoded<T>>").into());
        }
        Ok(Decoded(T::decode(message.payload())?))
    }
}

/// `None` for a [tombstone](Message::is_tombstone), the decoded payload
/// otherwise (see `Option<Json<T>>`).
impl<T: Decode> FromMessage for Option<Decoded<T>> {
    fn from_message(message: Message) -> Result<Self, HandlerError> {
        if message.is_tombstone() {
            return Ok(None);
        }
        Ok(Some(Decoded(T::decode(message.payload())?)))
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use tower::ServiceExt;

    use super::*;
    use crate::error::ErrorClass;
    use crate::handler::handler_fn;
    use crate::message::{Metadata, Position};

    #[derive(Debug, Deserialize, PartialEq)]
    struct Order {
        id: u64,
        quantity: u32,
    }

    fn message(payload: impl Into<Bytes>) -> Message {
        Message::new(
            payload,
            Metadata::new("orders".into(), 0, Position::Offset(0)),
        )
    }

    fn decode_error(error: &HandlerError) -> &DecodeError {
        error
            .cause()
            .downcast_ref::<DecodeError>()
            .expect("the cause is a DecodeError")
    }

    #[test]
    fn json_decodes_the_payload() {
        let Json(order) =
            Json::<Order>::from_message(message(&br#"{"id":1000000,"quantity":37}"#[..])).unwrap();
        assert_eq!(
            order,
            Order {
                id: 1_000_000,
                quantity: 37
            }
        );
    }

    #[test]
    fn a_json_failure_is_permanent_and_names_type_cause_and_payload() {
        let error = Json::<Order>::from_message(message(&br#"{"id":7}"#[..])).unwrap_err();
        assert_eq!(error.class(), ErrorClass::Permanent);
        let decode = decode_error(&error);
        assert_eq!(decode.format(), "JSON");
        assert!(decode.target().ends_with("Order"), "{}", decode.target());
        let text = error.to_string();
        assert!(text.starts_with("permanent error: cannot decode the payload as JSON into `"));
        assert!(text.contains("missing field `quantity`"), "{text}");
        assert!(text.ends_with(r#"payload (8 bytes): {\"id\":7}"#), "{text}");
    }

    #[test]
    fn the_preview_escapes_binary_bytes_and_stops_at_the_limit() {
        let mut payload = vec![0xff, 0x00, b'\n'];
        payload.resize(PREVIEW_LIMIT + 10, b'a');
        let error = Json::<Order>::from_message(message(payload)).unwrap_err();
        let decode = decode_error(&error);
        assert!(decode.preview().starts_with(r"\xff\x00\naaa"));
        assert!(decode.preview().ends_with("… (10 more bytes)"));
        assert_eq!(decode.payload_len(), PREVIEW_LIMIT + 10);
        assert_eq!(
            decode.preview().matches('a').count(),
            PREVIEW_LIMIT - 3,
            "only the first {PREVIEW_LIMIT} bytes are shown"
        );
    }

    #[test]
    fn the_codec_error_is_reachable_as_the_cause() {
        let error = Json::<Order>::decode(&Bytes::from_static(b"not json")).unwrap_err();
        assert!(error.cause().downcast_ref::<serde_json::Error>().is_some());
        assert!(std::error::Error::source(&error).is_none());
    }

    #[test]
    fn decoded_uses_the_type_s_codec() {
        let Decoded(text) = Decoded::<String>::from_message(message("héllo")).unwrap();
        assert_eq!(text, "héllo");
        let error = Decoded::<String>::from_message(message(&b"\xc3\x28"[..])).unwrap_err();
        assert!(error.is_permanent());
        assert!(error.to_string().contains(r"payload (2 bytes): \xc3("));
    }

    /// A Kafka record with a null value (a compacted topic's delete
    /// marker), as the source hands it over.
    fn tombstone() -> Message {
        Message::tombstone(Metadata::new("orders".into(), 0, Position::Offset(9)))
            .with_key(Bytes::from_static(b"order-7"))
    }

    #[test]
    fn a_tombstone_has_an_empty_payload_and_says_it_is_one() {
        let deleted = tombstone();
        assert!(deleted.is_tombstone());
        assert!(deleted.payload().is_empty());
        assert_eq!(deleted.key().map(|key| &key[..]), Some(&b"order-7"[..]));
        // An empty value is a value, not a tombstone.
        assert!(!message(Bytes::new()).is_tombstone());
        // Changed copies stay tombstones.
        let mut copy = tombstone();
        copy.headers_mut().insert("h", "v");
        assert!(copy.is_tombstone());
    }

    #[test]
    fn json_and_decoded_refuse_a_tombstone_naming_it_and_the_extractor_that_takes_it() {
        let error = Json::<Order>::from_message(tombstone()).unwrap_err();
        assert_eq!(error.class(), ErrorClass::Permanent);
        let text = error.to_string();
        assert!(
            text.contains("the message is a tombstone (a record with no value"),
            "{text}"
        );
        assert!(text.ends_with("; no payload"), "{text}");
        assert!(text.contains("Option<Json<T>>"), "{text}");
        assert!(!text.contains("EOF while parsing"), "{text}");
        let error = Decoded::<String>::from_message(tombstone()).unwrap_err();
        assert!(error.to_string().contains("tombstone"), "{error}");
        // An empty value is not a tombstone: it fails as any payload that
        // is not JSON does (as a tombstone did too, before it could be told
        // apart).
        let error = Json::<Order>::from_message(message(Bytes::new())).unwrap_err();
        assert!(
            error
                .to_string()
                .ends_with("EOF while parsing a value at line 1 column 0; payload (0 bytes): "),
            "{error}"
        );
        // An empty value still decodes as what it is.
        let Decoded(text) = Decoded::<String>::from_message(message(Bytes::new())).unwrap();
        assert_eq!(text, "");
    }

    #[test]
    fn an_optional_json_or_decoded_is_none_for_a_tombstone_and_decodes_anything_else() {
        assert!(matches!(
            Option::<Json<Order>>::from_message(tombstone()),
            Ok(None)
        ));
        assert!(matches!(
            Option::<Decoded<String>>::from_message(tombstone()),
            Ok(None)
        ));
        let some =
            Option::<Json<Order>>::from_message(message(&br#"{"id":1,"quantity":2}"#[..])).unwrap();
        assert_eq!(some.map(|Json(order)| order.quantity), Some(2));
        // A payload that does not decode is still a failure, not a None.
        let error = Option::<Json<Order>>::from_message(message(&b"{}"[..])).unwrap_err();
        assert!(error.is_permanent());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_handler_taking_an_optional_json_sees_a_tombstone_as_none() {
        let handler = handler_fn(async |Json(_): Json<Order>| Ok::<(), HandlerError>(()));
        let error = handler.oneshot(tombstone()).await.unwrap_err();
        assert!(error.to_string().contains("tombstone"), "{error}");
        let deleted = handler_fn(async |order: Option<Json<Order>>| match order {
            None => Ok::<(), HandlerError>(()),
            Some(_) => Err(HandlerError::permanent("expected a delete")),
        });
        assert!(deleted.oneshot(tombstone()).await.is_ok());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_handler_never_runs_on_an_undecodable_payload() {
        let handler = handler_fn(
            async |Json(_order): Json<Order>| -> Result<(), HandlerError> {
                Err(HandlerError::retryable("the handler ran"))
            },
        );
        let error = handler.oneshot(message("{")).await.unwrap_err();
        assert_eq!(error.class(), ErrorClass::Permanent);
        assert!(error.to_string().contains("EOF while parsing"), "{error}");
    }
}
