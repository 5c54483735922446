//! [`DecodeError`]: a payload that does not decode.

use crate::error::{BoxError, HandlerError};
use crate::message::{capped_text, payload_preview};

/// How much of an undecodable payload an error shows.
pub const PREVIEW_LIMIT: usize = 256;

/// A payload that the codec rejected: which codec, into which type, why, and
/// the start of the payload (escaped), so a log line or a dead letter says
/// what arrived without a trip to the broker.
///
/// It becomes a [permanent](HandlerError::permanent) [`HandlerError`]: no
/// retry turns bad bytes into good ones.
///
/// The codec's error is part of the message, cut at
/// [`CAUSE_LIMIT`](Self::CAUSE_LIMIT) bytes (serde quotes a wrongly typed
/// value whole, so the codec's own text can be as large as the payload),
/// and available whole as [`cause`](Self::cause); it is not also returned
/// by [`source`](std::error::Error::source), so that error reports that
/// print the chain do not print it twice.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot decode the payload as {format} into `{target}`: {cause_text}; payload ({payload_len} bytes): {preview}"
)]
pub struct DecodeError {
    format: &'static str,
    target: &'static str,
    payload_len: usize,
    preview: String,
    cause_text: String,
    cause: BoxError,
}

impl DecodeError {
    /// The most bytes of the codec's error text a `DecodeError` shows.
    pub const CAUSE_LIMIT: usize = 512;

    /// A failure to decode `payload` as `format` (`"JSON"`, `"protobuf"`)
    /// into `T`, because of `cause` (the codec's error).
    pub fn new<T: ?Sized>(
        format: &'static str,
        payload: &[u8],
        cause: impl Into<BoxError>,
    ) -> Self {
        let cause = cause.into();
        Self {
            format,
            target: std::any::type_name::<T>(),
            payload_len: payload.len(),
            preview: payload_preview(payload, PREVIEW_LIMIT),
            cause_text: capped_text(cause.to_string(), Self::CAUSE_LIMIT),
            cause,
        }
    }

    /// The payload format the codec expected.
    pub fn format(&self) -> &'static str {
        self.format
    }

    /// The type the payload was to be decoded into.
    pub fn target(&self) -> &'static str {
        self.target
    }

    /// The first [`PREVIEW_LIMIT`] bytes of the payload, non-printable bytes
    /// escaped, with a note of how much was cut.
    pub fn preview(&self) -> &str {
        &self.preview
    }

    /// The payload's length in bytes.
    pub fn payload_len(&self) -> usize {
        self.payload_len
    }

    /// The codec's error.
    pub fn cause(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.cause
    }
}

impl From<DecodeError> for HandlerError {
    fn from(error: DecodeError) -> Self {
        HandlerError::permanent(error)
    }
}
