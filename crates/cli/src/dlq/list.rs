//! `intake dlq list`.

use intake_core::dead_letter::store::{DeadLetterStore, Filter, LetterId};
use serde::Serialize;
use std::time::SystemTime;

use super::letter_report::{LetterReport, letter_report};
use super::store_failure::store_failure;
use super::text::{age, one_line};
use crate::failure::Failure;
use crate::output::{Table, escaped, json, json_text};

/// Error text shown per letter in a listing; `show` prints it whole.
const LISTED_ERROR_CHARS: usize = 60;

/// `intake dlq list --json`.
#[derive(Debug, Serialize)]
struct ListReport<'a> {
    destination: &'a str,
    letters: Vec<LetterReport>,
    /// Pass as `--after` for the next page; `null` at the end.
    next: Option<String>,
}

/// `intake dlq list`: up to `limit` letters after `after`, oldest first.
pub async fn list(
    store: &dyn DeadLetterStore,
    filter: &Filter,
    limit: usize,
    after: Option<&LetterId>,
    as_json: bool,
    now: SystemTime,
) -> Result<String, Failure> {
    let page = store
        .list(filter, limit, after)
        .await
        .map_err(|error| store_failure("dlq list", error))?;
    let next = page.next.as_ref().map(|id| id.as_str().to_owned());
    if as_json {
        return Ok(json(&ListReport {
            destination: store.destination(),
            letters: page
                .letters
                .iter()
                .map(|stored| letter_report(stored, false))
                .collect(),
            next,
        }));
    }
    let mut table = Table::new(&[
        "ID", "FAILED", "CLASS", "ATTEMPTS", "REPLAYS", "KEY", "BYTES", "ERROR",
    ])
    .right_aligned(3)
    .right_aligned(4)
    .right_aligned(6);
    for stored in &page.letters {
        let id = escaped(stored.id.as_str()).into_owned();
        let bytes = stored.payload_bytes.to_string();
        match &stored.letter {
            Ok(letter) => table.row(vec![
                id,
                age(letter.failed_at, now),
                letter.class.as_str().to_owned(),
                letter.attempts.to_string(),
                letter.replays.to_string(),
                letter
                    .message
                    .key()
                    .map_or_else(|| "-".to_owned(), |key| one_line(&json_text(key), 24)),
                bytes,
                one_line(&letter.error, LISTED_ERROR_CHARS),
            ]),
            Err(error) => table.row(vec![
                id,
                "?".to_owned(),
                "unreadable".to_owned(),
                String::new(),
                String::new(),
                String::new(),
                bytes,
                one_line(&error.to_string(), LISTED_ERROR_CHARS),
            ]),
        }
    }
    let mut text = table.render();
    if let Some(next) = next {
        text.push_str(&format!("more: --after {}\n", escaped(&next)));
    }
    Ok(text)
}
