//! [`Redaction`]: what the dead-letter explorer shows of a letter's
//! payload, and the headers it never shows (those named like secrets).
//!
//! Everything shown of a letter is outside input: bytes become escaped
//! text (`\xff`, `\x1b`, `\n`) cut to a bound with the size said, and JSON
//! escapes the rest, so neither HTML nor terminal escapes reach a page or
//! a terminal as markup.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use serde::Serialize;

use crate::dead_letter::store::StoredLetter;
use crate::decode::PayloadPreview;
use crate::message::payload_preview;

/// The most bytes of a payload a preview shows in a listing.
pub(super) const LIST_PREVIEW: usize = 256;

/// The most bytes of a payload a preview shows for one letter.
pub(super) const FULL_PREVIEW: usize = 4_096;

/// The most bytes of a header value shown.
pub(super) const HEADER_PREVIEW: usize = 1_024;

/// A redaction function's text, and so the text searched, is cut to this.
const CUSTOM_LIMIT: usize = 4_096;

/// A user's redaction: the text to show for a letter's payload.
pub type RedactionFn = Arc<dyn Fn(&StoredLetter) -> String + Send + Sync>;

/// What the console's dead-letter explorer shows of a letter's payload
/// (see [`ConsoleSettings::redaction`](super::ConsoleSettings::redaction)).
///
/// Headers named like secrets (`authorization`, `cookie`, a password, a
/// token, a secret, `sasl`, an API key ...) are redacted whatever the
/// policy.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum Redaction {
    /// The payload's first bytes as text, bytes that are not printable
    /// ASCII escaped (`\xff`), cut at 256 bytes in a listing and 4 KiB for
    /// one letter, with the size said. Text search (`q`) covers it.
    Off,
    /// Only the payload's size and its
    /// [fingerprint](PayloadPreview::fingerprint) (FNV-1a, not a secret
    /// against a payload that can be guessed). The default.
    #[default]
    Hash,
    /// The text your function makes of the letter (read with its payload):
    /// mask what is personal, keep what is not. Its text is escaped and cut
    /// at 4 KiB; a panic in it shows nothing. Text search covers it.
    With(RedactionFn),
}

impl Redaction {
    /// A policy showing the text `redact` makes of each letter.
    pub fn with(redact: impl Fn(&StoredLetter) -> String + Send + Sync + 'static) -> Self {
        Self::With(Arc::new(redact))
    }

    /// Its name in the API: `off`, `hash` or `custom`.
    pub fn name(&self) -> &'static str {
        match self {
            Redaction::Off => "off",
            Redaction::Hash => "hash",
            Redaction::With(_) => "custom",
        }
    }

    /// Whether it shows something of a payload's content (and text search
    /// may look at it).
    pub(super) fn shows_payload(&self) -> bool {
        !matches!(self, Redaction::Hash)
    }

    /// What to show of `stored`'s payload (read with its payload), at most
    /// `limit` bytes of it.
    pub(super) fn show(&self, stored: &StoredLetter, limit: usize) -> PayloadView {
        let payload: &[u8] = match &stored.letter {
            Ok(letter) => letter.message.payload(),
            Err(_) => &[],
        };
        let mut view = PayloadView {
            bytes: stored.payload_bytes,
            shown: self.name(),
            fingerprint: None,
            preview: None,
        };
        match self {
            Redaction::Off => view.preview = Some(payload_preview(payload, limit)),
            Redaction::Hash => view.fingerprint = Some(PayloadPreview::fingerprint(payload)),
            Redaction::With(redact) => {
                view.preview = Some(match catch_unwind(AssertUnwindSafe(|| redact(stored))) {
                    Ok(text) => payload_preview(text.as_bytes(), CUSTOM_LIMIT.min(limit)),
                    Err(_) => {
                        view.shown = "none";
                        "not shown: the redaction function panicked".to_owned()
                    }
                });
            }
        }
        view
    }
}

impl std::fmt::Debug for Redaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Redaction::Off => "Off",
            Redaction::Hash => "Hash",
            Redaction::With(_) => "With(fn)",
        })
    }
}

/// What is shown of a payload.
#[derive(Clone, Debug, Serialize)]
pub(super) struct PayloadView {
    /// Its size.
    pub(super) bytes: usize,
    /// The policy that made it: `off`, `hash`, `custom`, or `none`.
    pub(super) shown: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) fingerprint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) preview: Option<String>,
}

/// Whether a header called `name` may hold a secret: what
/// [`redact::is_secret_name`](crate::redact::is_secret_name) says, and the
/// names of HTTP and broker credentials it does not catch.
pub(super) fn is_secret_header(name: &str) -> bool {
    const MORE: [&str; 6] = [
        "authorization",
        "cookie",
        "sasl",
        "session",
        "bearer",
        "cert",
    ];
    let lower = name.to_ascii_lowercase();
    crate::redact::is_secret_name(name) || MORE.iter().any(|part| lower.contains(part))
}

/// `bytes` as escaped text cut at `limit` bytes (the cut said).
pub(super) fn escaped(bytes: &[u8], limit: usize) -> String {
    payload_preview(bytes, limit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dead_letter::DeadLetter;
    use crate::dead_letter::store::LetterId;
    use crate::{Message, Metadata, Position};

    fn letter(payload: &'static [u8]) -> StoredLetter {
        let message = Message::new(payload, Metadata::new("t".into(), 0, Position::Offset(0)));
        StoredLetter::new(
            LetterId::from("0"),
            payload.len(),
            Ok(DeadLetter::new(message, "e", 1)),
        )
    }

    #[test]
    fn each_policy_shows_what_it_says_and_nothing_hostile_raw() {
        let stored = letter(b"<script>\x1b[31m\xff");
        let hash = Redaction::Hash.show(&stored, 64);
        assert_eq!(hash.preview, None);
        assert_eq!(hash.bytes, 14);
        assert!(hash.fingerprint.is_some_and(|f| f.starts_with("fnv1a64:")));
        let off = Redaction::Off.show(&stored, 64).preview.unwrap();
        assert!(!off.contains('\x1b') && off.contains("\\xff"), "{off}");
        let cut = Redaction::Off.show(&stored, 3).preview.unwrap();
        assert!(
            cut.starts_with("<sc") && cut.contains("more bytes"),
            "{cut}"
        );
        let custom = Redaction::with(|_| "x\u{1b}".to_owned()).show(&stored, 64);
        assert_eq!(custom.shown, "custom");
        assert!(!custom.preview.unwrap().contains('\x1b'));
        let panics = Redaction::with(|_| panic!("no")).show(&stored, 64);
        assert_eq!(panics.shown, "none");
    }

    #[test]
    fn secret_headers_are_known_by_name() {
        for name in [
            "Authorization",
            "x-api-key",
            "password",
            "Cookie",
            "sasl.jaas",
            "auth-token",
        ] {
            assert!(is_secret_header(name), "{name}");
        }
        for name in ["content-type", "trace-id", "intake.replays"] {
            assert!(!is_secret_header(name), "{name}");
        }
    }
}
