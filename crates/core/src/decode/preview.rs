//! [`PayloadPreview`]: how much of an undecodable payload errors show.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, RwLock};

use crate::message::payload_preview;
use crate::redact::Capped;

/// How much of an undecodable payload an error shows by default.
pub const PREVIEW_LIMIT: usize = 256;

/// The most bytes of a [`PayloadPreview::with`] function's text an error
/// shows.
const CUSTOM_LIMIT: usize = 4 * PREVIEW_LIMIT;

/// A text function of the application's (see [`PayloadPreview::with`]).
type PreviewFn = Arc<dyn Fn(&[u8]) -> String + Send + Sync>;

/// How a [`DecodeError`](super::DecodeError) shows the payload it could not
/// decode.
///
/// The error's text goes wherever the failure is reported: the runtime's
/// log line for a message dropped without a dead-letter layer, the
/// `error` field of the message's span ([`TraceLayer`](crate::trace::TraceLayer)),
/// and the error text of its dead letter, which is stored and shown by
/// `intake dlq show`. A payload can be personal data; choose what these
/// show once, at start-up, with [`set_global`](Self::set_global):
///
/// | setting | the payload in the error | the codec's message |
/// |---|---|---|
/// | [`escaped`](Self::escaped) (default, 256 bytes) | its first bytes, escaped | as the codec wrote it |
/// | [`off`](Self::off) | its length only | withheld |
/// | [`hash`](Self::hash) | its length and [fingerprint](Self::fingerprint) | withheld |
/// | [`with`](Self::with) | its length and your function's text | withheld |
///
/// The codec's message is withheld whenever the preview is not the escaped
/// payload, because codecs quote what they could not take (serde:
/// ``invalid type: string "alice@example.com", expected u64``). What is
/// kept is what cannot quote the payload: for JSON the kind of error and
/// where (`invalid data at line 1 column 25`), for UTF-8 where the bad
/// byte is; other codecs' messages are replaced by a note. The whole cause
/// stays available to code as [`DecodeError::cause`](super::DecodeError::cause).
///
/// The dead letter itself still holds the whole message, payload included,
/// as it must to be replayed: who may read a dead-letter destination is a
/// matter of its broker's permissions.
///
/// ```
/// use intake_core::decode::{DecodeError, PayloadPreview};
///
/// PayloadPreview::off().set_global();
/// let error = DecodeError::new::<u64>("decimal text", b"alice", "not a number: alice");
/// assert!(error.to_string().ends_with("payload (5 bytes, not shown)"));
/// # PayloadPreview::default().set_global();
/// ```
#[derive(Clone)]
pub struct PayloadPreview(Kind);

#[derive(Clone)]
enum Kind {
    Escaped(usize),
    Off,
    Hash,
    With(PreviewFn),
}

/// The setting of the process; `None`: the default.
static GLOBAL: RwLock<Option<PayloadPreview>> = RwLock::new(None);

impl PayloadPreview {
    /// The first `limit` bytes of the payload, with bytes that are not
    /// printable ASCII escaped (`\xff`, `\n`) and a note of how many were
    /// cut. The default, with a limit of [`PREVIEW_LIMIT`] (256 bytes).
    pub fn escaped(limit: usize) -> Self {
        Self(Kind::Escaped(limit))
    }

    /// Nothing of the payload: its length only.
    pub fn off() -> Self {
        Self(Kind::Off)
    }

    /// The payload's [fingerprint](Self::fingerprint): equal payloads have
    /// equal ones, so failures of one payload can be told apart from others
    /// and matched with a payload at hand, without showing it.
    ///
    /// It is not a secret: anyone who can guess a payload (an email address,
    /// a card number) can check the guess against it, as with any hash that
    /// has no key. Where that matters, use [`off`](Self::off), or
    /// [`with`](Self::with) and a keyed hash of your own.
    pub fn hash() -> Self {
        Self(Kind::Hash)
    }

    /// The text `preview` makes of the payload: a redaction of your own
    /// (mask the digits, keep a field that is not personal, a keyed hash).
    ///
    /// Its text is shown escaped (control characters such as a newline
    /// become `\n`, so it cannot forge log lines) and cut at 1,024 bytes. A
    /// panic in it is caught, and the payload is then not shown. It runs
    /// only when a payload fails to decode.
    pub fn with(preview: impl Fn(&[u8]) -> String + Send + Sync + 'static) -> Self {
        Self(Kind::With(Arc::new(preview)))
    }

    /// Makes this the setting of the process: every [`DecodeError`](super::DecodeError)
    /// built from now on, in any consumer, follows it. Call it at start-up,
    /// before the consumers run.
    pub fn set_global(self) {
        let mut global = GLOBAL.write().unwrap_or_else(|poison| poison.into_inner());
        *global = Some(self);
    }

    /// The setting of the process (see [`set_global`](Self::set_global)).
    pub fn global() -> Self {
        GLOBAL
            .read()
            .unwrap_or_else(|poison| poison.into_inner())
            .clone()
            .unwrap_or_default()
    }

    /// The fingerprint [`hash`](Self::hash) shows: `fnv1a64:` and the
    /// 64-bit FNV-1a hash of the whole payload in 16 hexadecimal digits.
    /// FNV-1a is simple to compute anywhere (offset basis
    /// `0xcbf29ce484222325`, prime `0x100000001b3`), and stable across
    /// versions of intake; it is not a cryptographic hash.
    ///
    /// ```
    /// use intake_core::decode::PayloadPreview;
    ///
    /// assert_eq!(PayloadPreview::fingerprint(b""), "fnv1a64:cbf29ce484222325");
    /// assert_eq!(PayloadPreview::fingerprint(b"a"), "fnv1a64:af63dc4c8601ec8c");
    /// ```
    pub fn fingerprint(payload: &[u8]) -> String {
        let hash = payload
            .iter()
            .fold(0xcbf2_9ce4_8422_2325_u64, |hash, &byte| {
                (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
            });
        format!("fnv1a64:{hash:016x}")
    }

    /// What an error shows of `payload`.
    pub(crate) fn show(&self, payload: &[u8]) -> Shown {
        match &self.0 {
            Kind::Escaped(limit) => Shown::Escaped(payload_preview(payload, *limit)),
            Kind::Off => Shown::Withheld(None),
            Kind::Hash => Shown::Withheld(Some(Self::fingerprint(payload))),
            Kind::With(preview) => match catch_unwind(AssertUnwindSafe(|| preview(payload))) {
                Ok(text) => Shown::Custom(printable(&text, CUSTOM_LIMIT)),
                Err(_) => {
                    Shown::Withheld(Some("not shown: the preview function panicked".to_owned()))
                }
            },
        }
    }
}

impl Default for PayloadPreview {
    /// [`escaped`](Self::escaped) at [`PREVIEW_LIMIT`] bytes.
    fn default() -> Self {
        Self::escaped(PREVIEW_LIMIT)
    }
}

impl fmt::Debug for PayloadPreview {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Kind::Escaped(limit) => f.debug_tuple("Escaped").field(limit).finish(),
            Kind::Off => f.write_str("Off"),
            Kind::Hash => f.write_str("Hash"),
            Kind::With(_) => f.write_str("With(fn)"),
        }
    }
}

/// What an error shows of a payload.
#[derive(Clone, Debug)]
pub(crate) enum Shown {
    /// Its first bytes, escaped; the codec's message may be shown too.
    Escaped(String),
    /// The application's text.
    Custom(String),
    /// Nothing of its bytes; a note (its fingerprint) if any.
    Withheld(Option<String>),
    /// There is none: a tombstone.
    Absent,
}

impl Shown {
    /// The text that stands for the payload ("" when nothing does).
    pub(crate) fn text(&self) -> &str {
        match self {
            Shown::Escaped(text) | Shown::Custom(text) | Shown::Withheld(Some(text)) => text,
            Shown::Withheld(None) | Shown::Absent => "",
        }
    }

    /// Whether the payload's own bytes are shown, and with them the codec's
    /// message.
    pub(crate) fn is_escaped(&self) -> bool {
        matches!(self, Shown::Escaped(_))
    }

    /// Writes the payload's part of an error's text, `len` its length.
    pub(crate) fn write(&self, f: &mut fmt::Formatter<'_>, len: usize) -> fmt::Result {
        match self {
            Shown::Escaped(text) | Shown::Custom(text) => {
                write!(f, "payload ({len} bytes): {text}")
            }
            Shown::Withheld(None) => write!(f, "payload ({len} bytes, not shown)"),
            Shown::Withheld(Some(note)) => write!(f, "payload ({len} bytes, {note})"),
            Shown::Absent => f.write_str("no payload"),
        }
    }
}

/// `text` with control characters escaped, cut at `limit` bytes.
fn printable(text: &str, limit: usize) -> String {
    let mut shown = String::with_capacity(text.len().min(limit));
    for character in text.chars() {
        if character.is_control() {
            shown.extend(character.escape_default());
        } else {
            shown.push(character);
        }
    }
    Capped::new(&shown, limit).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_custom_text_is_escaped_and_bounded() {
        assert_eq!(printable("a\nb\u{1b}[31m", 100), "a\\nb\\u{1b}[31m");
        let long = "x".repeat(2 * CUSTOM_LIMIT);
        let shown = printable(&long, CUSTOM_LIMIT);
        assert!(shown.starts_with(&"x".repeat(CUSTOM_LIMIT)));
        assert!(shown.ends_with(&format!("… ({CUSTOM_LIMIT} more bytes)")));
    }

    #[test]
    fn the_fingerprint_is_fnv1a_64() {
        // Test vectors of the FNV reference.
        assert_eq!(
            PayloadPreview::fingerprint(b"foobar"),
            "fnv1a64:85944171f73967e8"
        );
        assert_eq!(
            PayloadPreview::fingerprint(b"a"),
            "fnv1a64:af63dc4c8601ec8c"
        );
    }
}
