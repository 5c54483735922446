//! `intake dlq show`.

use intake_core::dead_letter::store::{DeadLetterStore, LetterId};
use intake_core::redact::Capped;
use std::time::SystemTime;

use super::letter_report::letter_report;
use super::store_failure::store_failure;
use super::text::{age, printable};
use crate::failure::Failure;
use crate::output::{escaped, escaped_block, json};

/// Payload bytes `show` prints: a dead letter's payload may be megabytes,
/// and a terminal is not the place for them (`--json` has them whole).
const SHOWN_PAYLOAD_BYTES: usize = 4096;

/// The label column of `show`, and the indent of a payload's further lines.
const LABEL: &str = "          ";

/// `intake dlq show ID`: one letter, payload included.
pub async fn show(
    store: &dyn DeadLetterStore,
    id: &LetterId,
    as_json: bool,
    now: SystemTime,
) -> Result<String, Failure> {
    let stored = store
        .read(id)
        .await
        .map_err(|error| store_failure("dlq show", error))?;
    if as_json {
        return Ok(json(&letter_report(&stored, true)));
    }
    let mut text = format!("id:        {}\n", escaped(stored.id.as_str()));
    let letter = match &stored.letter {
        Ok(letter) => letter,
        Err(error) => {
            text.push_str(&format!(
                "unreadable: {}\nbytes:     {}\n",
                escaped(&error.to_string()),
                stored.payload_bytes
            ));
            return Ok(text);
        }
    };
    let metadata = letter.message.metadata();
    let mut line = |name: &str, value: String| text.push_str(&format!("{name:<10} {value}\n"));
    line(
        "origin:",
        format!(
            "{}/{} at {}",
            escaped(metadata.source()),
            metadata.partition(),
            metadata.position()
        ),
    );
    if let Some(group) = letter.origin.as_ref().and_then(|o| o.group.as_deref()) {
        line("group:", escaped(group).into_owned());
    }
    line(
        "key:",
        letter
            .message
            .key()
            .map_or_else(|| "-".to_owned(), |key| printable(key)),
    );
    line("class:", letter.class.as_str().to_owned());
    line("attempts:", letter.attempts.to_string());
    line("replays:", letter.replays.to_string());
    line("failed:", age(letter.failed_at, now));
    line("first:", age(letter.first_failed_at, now));
    line("error:", escaped(&letter.error).into_owned());
    for header in letter.message.headers() {
        line(
            "header:",
            format!("{}={}", escaped(&header.name), printable(&header.value)),
        );
    }
    if letter.reference.is_some() {
        line(
            "payload:",
            "not in the letter (a reference: the original stays at its origin while the origin keeps it; the error text says where)".to_owned(),
        );
    } else {
        line("bytes:", stored.payload_bytes.to_string());
        let payload = escaped_block(letter.message.payload(), LABEL);
        line(
            "payload:",
            Capped::new(payload, SHOWN_PAYLOAD_BYTES).to_string(),
        );
    }
    Ok(text)
}
