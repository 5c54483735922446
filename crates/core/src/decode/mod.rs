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

mod error;
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

impl<T: Decode> FromMessage for Decoded<T> {
    fn from_message(message: Message) -> Result<Self, HandlerError> {
        Ok(Decoded(T::decode(message.payload())?))
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
