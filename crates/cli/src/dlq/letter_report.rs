//! One letter as `list --json` and `show --json` print it.

use intake_core::dead_letter::store::StoredLetter;
use serde::Serialize;
use std::collections::BTreeMap;

use super::text::epoch_millis;
use crate::output::json_text;

/// One letter in `list --json` and `show --json`.
#[derive(Debug, Serialize)]
pub(super) struct LetterReport {
    id: String,
    payload_bytes: usize,
    readable: bool,
    /// Why the entry cannot be read as a letter.
    #[serde(skip_serializing_if = "Option::is_none")]
    unreadable: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    letter: Option<LetterFields>,
}

#[derive(Debug, Serialize)]
struct LetterFields {
    source: String,
    partition: u32,
    position: String,
    key: Option<String>,
    class: &'static str,
    error: String,
    attempts: u32,
    replays: u32,
    first_failed_at_ms: u64,
    failed_at_ms: u64,
    group: Option<String>,
    reference: bool,
    headers: BTreeMap<String, String>,
    /// The payload as text where it is UTF-8 (`show` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<String>,
}

pub(super) fn letter_report(stored: &StoredLetter, with_payload: bool) -> LetterReport {
    let letter = stored.letter.as_ref().ok().map(|letter| {
        let metadata = letter.message.metadata();
        LetterFields {
            source: metadata.source().to_string(),
            partition: metadata.partition(),
            position: metadata.position().to_string(),
            key: letter.message.key().map(|key| json_text(key)),
            class: letter.class.as_str(),
            error: letter.error.clone(),
            attempts: letter.attempts,
            replays: letter.replays,
            first_failed_at_ms: epoch_millis(letter.first_failed_at),
            failed_at_ms: epoch_millis(letter.failed_at),
            group: letter
                .origin
                .as_ref()
                .and_then(|origin| origin.group.as_deref().map(str::to_owned)),
            reference: letter.reference.is_some(),
            headers: letter
                .message
                .headers()
                .iter()
                .map(|header| (header.name.to_string(), json_text(&header.value)))
                .collect(),
            payload: with_payload.then(|| json_text(letter.message.payload())),
        }
    });
    LetterReport {
        id: stored.id.as_str().to_owned(),
        payload_bytes: stored.payload_bytes,
        readable: letter.is_some(),
        unreadable: stored.letter.as_ref().err().map(ToString::to_string),
        letter,
    }
}
