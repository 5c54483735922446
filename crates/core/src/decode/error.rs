//! [`DecodeError`]: a payload that does not decode.

use std::fmt;

use super::preview::{PayloadPreview, Shown};
use crate::error::{BoxError, HandlerError};
use crate::message::capped_text;

/// A payload that the codec rejected: which codec, into which type, why, and
/// the start of the payload (escaped), so a log line or a dead letter says
/// what arrived without a trip to the broker.
///
/// How much of the payload it shows is the process's
/// [`PayloadPreview`] setting: the first 256 bytes, escaped, by default;
/// nothing, a fingerprint or a text of the application's where payloads
/// hold personal data (the codec's message, which may quote the payload, is
/// then withheld too).
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
pub struct DecodeError {
    format: &'static str,
    target: &'static str,
    payload_len: usize,
    shown: Shown,
    cause_text: String,
    cause: BoxError,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot decode the payload as {} into `{}`: {}; ",
            self.format, self.target, self.cause_text
        )?;
        self.shown.write(f, self.payload_len)
    }
}

impl DecodeError {
    /// The most bytes of the codec's error text a `DecodeError` shows.
    pub const CAUSE_LIMIT: usize = 512;

    /// A failure to decode `payload` as `format` (`"JSON"`, `"protobuf"`)
    /// into `T`, because of `cause` (the codec's error). Shows the payload
    /// as the process's [`PayloadPreview`] says.
    pub fn new<T: ?Sized>(
        format: &'static str,
        payload: &[u8],
        cause: impl Into<BoxError>,
    ) -> Self {
        let cause = cause.into();
        let shown = PayloadPreview::global().show(payload);
        let cause_text = if shown.is_escaped() {
            capped_text(cause.to_string(), Self::CAUSE_LIMIT)
        } else {
            withheld_cause_text(&cause)
        };
        Self {
            format,
            target: std::any::type_name::<T>(),
            payload_len: payload.len(),
            shown,
            cause_text,
            cause,
        }
    }

    /// A [tombstone](crate::Message::is_tombstone) handed to an extractor
    /// that decodes `format` into `T`: there is no payload to decode, and
    /// `optional` (`Option<Json<T>>`) is the extractor that takes one.
    #[cold]
    #[inline(never)]
    pub(crate) fn tombstone<T: ?Sized>(format: &'static str, optional: &'static str) -> Self {
        let cause = Tombstone { optional };
        Self {
            format,
            target: std::any::type_name::<T>(),
            payload_len: 0,
            shown: Shown::Absent,
            cause_text: cause.to_string(),
            cause: Box::new(cause),
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

    /// What the error shows of the payload (see [`PayloadPreview`]): by
    /// default its first [`PREVIEW_LIMIT`](super::PREVIEW_LIMIT) bytes,
    /// non-printable bytes escaped, with a note of how much was cut; its
    /// fingerprint, or the application's text; empty when previews are off.
    pub fn preview(&self) -> &str {
        self.shown.text()
    }

    /// The payload's length in bytes.
    pub fn payload_len(&self) -> usize {
        self.payload_len
    }

    /// The codec's error, whole, whatever the [`PayloadPreview`] setting:
    /// it may quote the payload.
    pub fn cause(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.cause
    }
}

/// Why a tombstone does not decode.
#[derive(Debug, thiserror::Error)]
#[error(
    "the message is a tombstone (a record with no value: on a compacted topic, its key was \
     deleted); take {optional} to receive tombstones as None"
)]
struct Tombstone {
    optional: &'static str,
}

/// What is shown of the codec's message when the payload is not: what
/// cannot quote it.
fn withheld_cause_text(cause: &BoxError) -> String {
    if let Some(json) = cause.downcast_ref::<serde_json::Error>() {
        let kind = match json.classify() {
            serde_json::error::Category::Io => "I/O error",
            serde_json::error::Category::Syntax => "syntax error",
            serde_json::error::Category::Data => "invalid data",
            serde_json::error::Category::Eof => "unexpected end of input",
        };
        return format!("{kind} at line {} column {}", json.line(), json.column());
    }
    // Their text names byte positions only.
    if cause.is::<std::str::Utf8Error>() || cause.is::<std::string::FromUtf8Error>() {
        return cause.to_string();
    }
    "the codec's message is not shown (it may quote the payload)".to_owned()
}

impl From<DecodeError> for HandlerError {
    fn from(error: DecodeError) -> Self {
        HandlerError::permanent(error)
    }
}
