//! The JSON shapes of the dead-letter explorer: a letter in a listing
//! ([`LetterRow`]), one letter in full ([`LetterFull`]), and the filter a
//! query or a request body gives ([`LetterQuery`]).
//!
//! Every text here comes from a letter, so from outside: bytes are shown
//! escaped and cut at a bound with their size said, secret-named headers
//! are never shown, and serde escapes what JSON must.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::redaction::{
    FULL_PREVIEW, HEADER_PREVIEW, LIST_PREVIEW, PayloadView, Redaction, escaped, is_secret_header,
};
use crate::dead_letter::store::{Filter, StoredLetter, Summary};
use crate::error::ErrorClass;
use crate::redact::REDACTED;

/// The most bytes of error text a listing shows of a letter.
const LIST_ERROR: usize = 512;

/// The most bytes of a key shown.
const KEY_PREVIEW: usize = 256;

/// The most bytes of a header's name shown.
const HEADER_NAME: usize = 256;

/// The most headers one letter shows (the rest are counted).
const MAX_HEADERS: usize = 64;

/// The most bytes of a text search.
pub(super) const MAX_Q: usize = 256;

/// Which letters: the store's filter and a text search, as a query
/// (`class=&key=&from=&until=&q=`) or a request body's `filter` gives it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LetterQuery {
    /// `retryable`, `permanent`, `ignore` or `interrupted`.
    #[serde(default)]
    pub(super) class: Option<String>,
    /// The original message's key, as UTF-8 text.
    #[serde(default)]
    pub(super) key: Option<String>,
    /// Failed at or after, Unix milliseconds.
    #[serde(default)]
    pub(super) from: Option<u64>,
    /// Failed before, Unix milliseconds.
    #[serde(default)]
    pub(super) until: Option<u64>,
    /// Case-insensitive text in the error, the key, or (when the policy
    /// shows payloads) the payload's preview.
    #[serde(default)]
    pub(super) q: Option<String>,
}

impl LetterQuery {
    /// The store's filter, or why the query does not make one.
    pub(super) fn filter(&self) -> Result<Filter, &'static str> {
        let mut filter = Filter::all();
        if let Some(class) = &self.class {
            filter = filter.with_class(match class.as_str() {
                "retryable" => ErrorClass::Retryable,
                "permanent" => ErrorClass::Permanent,
                "ignore" => ErrorClass::Ignore,
                "interrupted" => ErrorClass::Interrupted,
                _ => return Err("class is retryable, permanent, ignore or interrupted"),
            });
        }
        if let Some(key) = &self.key {
            filter = filter.with_key(key.clone().into_bytes());
        }
        if self.from.is_some() || self.until.is_some() {
            let at = |ms: u64| UNIX_EPOCH.checked_add(Duration::from_millis(ms));
            let from = self.from.map(at);
            let until = self.until.map(at);
            if from.is_some_and(|at| at.is_none()) || until.is_some_and(|at| at.is_none()) {
                return Err("a time is out of range");
            }
            filter = filter.failed_between(from.flatten(), until.flatten());
        }
        if self.q.as_ref().is_some_and(|q| q.len() > MAX_Q) {
            return Err("q is longer than 256 bytes");
        }
        Ok(filter)
    }

    /// The text search, lowercased; `None` when there is none.
    pub(super) fn needle(&self) -> Option<String> {
        self.q
            .as_deref()
            .filter(|q| !q.is_empty())
            .map(str::to_lowercase)
    }
}

/// Whether `stored` holds `needle` (lowercase) in its error or key, or in
/// `payload`, the text its policy shows of the payload.
pub(super) fn holds(stored: &StoredLetter, needle: &str, payload: Option<&str>) -> bool {
    let Ok(letter) = &stored.letter else {
        return false;
    };
    let found = |text: &str| text.to_lowercase().contains(needle);
    found(&letter.error)
        || letter
            .message
            .key()
            .is_some_and(|key| found(&String::from_utf8_lossy(key)))
        || payload.is_some_and(found)
}

/// Where the message was consumed.
#[derive(Clone, Debug, Serialize)]
pub(super) struct OriginView {
    source: String,
    partition: u32,
    position: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    broker: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    group: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    consumer: Option<String>,
}

/// A letter in a listing.
#[derive(Clone, Debug, Serialize)]
pub(super) struct LetterRow {
    pub(super) id: String,
    /// Why it cannot be read as a dead letter; the fields below are then
    /// absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    unreadable: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    failed_at_unix_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    class: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    origin: Option<OriginView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    attempts: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    replays: Option<u32>,
    payload: PayloadView,
}

impl LetterRow {
    /// The payload text shown (none under [`Redaction::Hash`]), for the
    /// text search.
    pub(super) fn payload_text(&self) -> Option<&str> {
        self.payload.preview.as_deref()
    }
}

/// One header as shown.
#[derive(Clone, Debug, Serialize)]
struct HeaderView {
    name: String,
    /// Escaped and cut at 1 KiB; `***` for a secret-named header.
    value: String,
    bytes: usize,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    redacted: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    truncated: bool,
}

/// One letter in full.
#[derive(Clone, Debug, Serialize)]
pub(super) struct LetterFull {
    #[serde(flatten)]
    row: LetterRow,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_failed_at_unix_ms: Option<u64>,
    /// A letter standing in for one that could not be written.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    reference: bool,
    headers: Vec<HeaderView>,
    /// How many headers the message has (more than shown past 64).
    headers_total: usize,
    /// Headers the destination holds no copy of.
    headers_omitted: u32,
}

/// The summary of the letters a filter selects.
#[derive(Clone, Debug, Serialize)]
pub(super) struct SummaryView {
    total: u64,
    by_class: std::collections::BTreeMap<&'static str, u64>,
    unreadable: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    oldest_failed_at_unix_ms: Option<u64>,
}

impl From<Summary> for SummaryView {
    fn from(summary: Summary) -> Self {
        Self {
            total: summary.total,
            by_class: summary.by_class,
            unreadable: summary.unreadable,
            oldest_failed_at_unix_ms: summary.oldest_failed_at.map(unix_ms),
        }
    }
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map(|since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// `text` cut to `max` bytes at a character boundary, the cut said.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} more bytes)", &text[..end], text.len() - end)
}

/// `stored` (read with its payload) as a listing shows it, under
/// `redaction`.
pub(super) fn row(stored: &StoredLetter, redaction: &Redaction) -> LetterRow {
    row_within(stored, redaction, LIST_PREVIEW, LIST_ERROR)
}

fn row_within(
    stored: &StoredLetter,
    redaction: &Redaction,
    preview: usize,
    error: usize,
) -> LetterRow {
    let payload = redaction.show(stored, preview);
    let id = stored.id.to_string();
    match &stored.letter {
        Err(why) => LetterRow {
            id,
            unreadable: Some(cut(&why.to_string(), error)),
            failed_at_unix_ms: None,
            class: None,
            error: None,
            key: None,
            origin: None,
            attempts: None,
            replays: None,
            payload,
        },
        Ok(letter) => {
            let metadata = letter.message.metadata();
            let origin = letter.origin.as_ref();
            LetterRow {
                id,
                unreadable: None,
                failed_at_unix_ms: Some(unix_ms(letter.failed_at)),
                class: Some(letter.class.as_str()),
                error: Some(cut(&letter.error, error)),
                key: letter.message.key().map(|key| escaped(key, KEY_PREVIEW)),
                origin: Some(OriginView {
                    source: cut(metadata.source().as_ref(), KEY_PREVIEW),
                    partition: metadata.partition(),
                    position: metadata.position().to_string(),
                    broker: origin.map(|origin| origin.broker.as_str()),
                    group: origin
                        .and_then(|origin| origin.group.as_deref())
                        .map(|group| cut(group, KEY_PREVIEW)),
                    consumer: origin
                        .and_then(|origin| origin.consumer.as_deref())
                        .map(|consumer| cut(consumer, KEY_PREVIEW)),
                }),
                attempts: Some(letter.attempts),
                replays: Some(letter.replays),
                payload,
            }
        }
    }
}

/// `stored` (read with its payload) in full, under `redaction`.
pub(super) fn full(stored: &StoredLetter, redaction: &Redaction) -> LetterFull {
    let row = row_within(
        stored,
        redaction,
        FULL_PREVIEW,
        crate::dead_letter::DeadLetter::ERROR_LIMIT,
    );
    let Ok(letter) = &stored.letter else {
        return LetterFull {
            row,
            first_failed_at_unix_ms: None,
            reference: false,
            headers: Vec::new(),
            headers_total: 0,
            headers_omitted: 0,
        };
    };
    let all = letter.message.headers();
    let headers = all
        .iter()
        .take(MAX_HEADERS)
        .map(|header| {
            let redacted = is_secret_header(&header.name);
            HeaderView {
                name: escaped(header.name.as_bytes(), HEADER_NAME),
                value: if redacted {
                    REDACTED.to_owned()
                } else {
                    escaped(&header.value, HEADER_PREVIEW)
                },
                bytes: header.value.len(),
                redacted,
                truncated: !redacted && header.value.len() > HEADER_PREVIEW,
            }
        })
        .collect();
    LetterFull {
        row,
        first_failed_at_unix_ms: Some(unix_ms(letter.first_failed_at)),
        reference: letter.reference.is_some(),
        headers,
        headers_total: all.len(),
        headers_omitted: letter.headers_omitted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dead_letter::DeadLetter;
    use crate::dead_letter::store::LetterId;
    use crate::message::Headers;
    use crate::{Message, Metadata, Position};

    #[test]
    fn hostile_headers_are_cut_secrets_hidden_and_the_json_is_safe() {
        let mut headers = Headers::new();
        headers.insert("Authorization", "Bearer s3cret");
        headers.insert("x-\u{1b}[2J", vec![b'<'; 100_000]);
        for index in 0..100 {
            headers.insert(format!("h{index}"), "v");
        }
        let message = Message::new(
            &b"\xff\xfe<img src=x onerror=alert(1)>"[..],
            Metadata::new("t".into(), 0, Position::Offset(7)),
        )
        .with_key(&b"k\x00"[..])
        .with_headers(headers);
        let stored = StoredLetter::new(
            LetterId::from("7"),
            31,
            Ok(DeadLetter::new(message, "bad \u{1b}[31m<b>", 1)),
        );
        let full = full(&stored, &Redaction::Off);
        let json = serde_json::to_string(&full).unwrap();
        assert!(!json.contains("s3cret"), "{json}");
        assert!(!json.contains('\u{1b}'), "{json}");
        assert!(json.len() < 32 * 1024, "{}", json.len());
        assert_eq!(full.headers.len(), MAX_HEADERS);
        assert_eq!(full.headers_total, 102);
        assert!(full.headers[1].truncated && full.headers[1].bytes == 100_000);
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["key"], "k\\x00");
        assert_eq!(value["origin"]["position"], "7");
    }

    #[test]
    fn a_query_makes_a_filter_or_says_why_not() {
        let query = LetterQuery {
            class: Some("nonsense".into()),
            ..LetterQuery::default()
        };
        assert!(query.filter().is_err());
        let query = LetterQuery {
            class: Some("permanent".into()),
            from: Some(u64::MAX),
            q: Some("x".repeat(MAX_Q + 1)),
            ..LetterQuery::default()
        };
        assert!(query.filter().is_err());
        let query = LetterQuery {
            q: Some("TimeOut".into()),
            ..LetterQuery::default()
        };
        assert_eq!(query.needle().as_deref(), Some("timeout"));
        assert!(query.filter().is_ok_and(|filter| filter.is_all()));
    }
}
