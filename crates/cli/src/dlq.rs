//! `intake dlq`: count, list, show, replay and purge the dead letters of a
//! group, through any backend's [`DeadLetterStore`].
//!
//! Each command is a function of a store and its arguments that returns
//! the text to print, so the same code runs against a broker's store and,
//! in the unit tests, against the memory broker's.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use intake_core::dead_letter::store::{
    DeadLetterStore, Filter, LetterId, Redrive, RedriveReport, Selection, StoreError, StoredLetter,
    Summary,
};
use intake_core::publish::PublishErrorKind;
use intake_core::redact::Capped;
use serde::Serialize;

use crate::failure::Failure;
use crate::output::{
    Table, escaped, escaped_block, escaped_bytes, human_duration, json, json_text,
};
use crate::stores::Letters;

/// Error text shown per letter in a listing; `show` prints it whole.
const LISTED_ERROR_CHARS: usize = 60;

/// Payload bytes `show` prints: a dead letter's payload may be megabytes,
/// and a terminal is not the place for them (`--json` has them whole).
const SHOWN_PAYLOAD_BYTES: usize = 4096;

/// A store's failure as the command reports it: a replay the broker
/// refused (no such destination, too large, not allowed) exits 3, since
/// trying again as it is fails the same way; one it did not confirm, 1.
pub fn store_failure(what: &str, error: StoreError) -> Failure {
    match error {
        StoreError::InvalidId { .. } => Failure::Usage(format!("{what}: {error}")),
        StoreError::NotFound { .. } => Failure::NotFound(format!("{what}: {error}")),
        StoreError::NoWayBackToGroup { ref origin } => Failure::NotPossible(format!(
            "{what}: these letters cannot go back to their consumer group alone: the store knows \
             no way back into `{origin}` that only this group reads (a return topic or stream \
             its parking reads), and nothing of `{origin}` was replayed. Replay with \
             --to-origin if every consumer group of `{origin}` should handle them again, or \
             with --to DESTINATION to send them elsewhere"
        )),
        StoreError::Broker { ref source, .. }
            if matches!(
                source.downcast_ref::<intake_amqp::Error>(),
                Some(intake_amqp::Error::PassLimit { .. })
            ) =>
        {
            Failure::PassLimit {
                what: what.to_owned(),
                source: Box::new(error),
            }
        }
        StoreError::Redrive { ref source, .. } if source.kind() == PublishErrorKind::Rejected => {
            Failure::Refused {
                what: what.to_owned(),
                source: Box::new(error),
            }
        }
        error => Failure::Unavailable {
            what: what.to_owned(),
            source: Box::new(error),
        },
    }
}

fn epoch_millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    })
}

fn age(time: SystemTime, now: SystemTime) -> String {
    format!(
        "{} ago",
        human_duration(now.duration_since(time).unwrap_or(Duration::ZERO))
    )
}

/// Bytes a producer wrote (a key, a header's value) for one line of a
/// terminal: see [`escaped_bytes`].
fn printable(bytes: &[u8]) -> String {
    escaped_bytes(bytes).into_owned()
}

/// Text for one cell of a table: escaped (see [`escaped`]), at most
/// `chars` characters.
fn one_line(text: &str, chars: usize) -> String {
    let line = escaped(text);
    match line.char_indices().nth(chars) {
        Some((end, _)) => format!("{}…", &line[..end]),
        None => line.into_owned(),
    }
}

/// The label column of `show`, and the indent of a payload's further lines.
const LABEL: &str = "          ";

/// `intake dlq count --json`.
#[derive(Debug, Serialize)]
struct CountReport<'a> {
    destination: &'a str,
    total: u64,
    by_class: &'a BTreeMap<&'static str, u64>,
    unreadable: u64,
    oldest_failed_at_ms: Option<u64>,
    oldest_age_ms: Option<u64>,
}

/// `intake dlq count`: how many letters the filter selects, per class, and
/// how old the oldest is.
pub async fn count(
    store: &dyn DeadLetterStore,
    filter: &Filter,
    as_json: bool,
    now: SystemTime,
) -> Result<String, Failure> {
    let summary = store
        .summary(filter)
        .await
        .map_err(|error| store_failure("dlq count", error))?;
    Ok(render_count(store.destination(), &summary, as_json, now))
}

fn render_count(destination: &str, summary: &Summary, as_json: bool, now: SystemTime) -> String {
    let oldest_age = summary.oldest_age(now);
    if as_json {
        return json(&CountReport {
            destination,
            total: summary.total,
            by_class: &summary.by_class,
            unreadable: summary.unreadable,
            oldest_failed_at_ms: summary.oldest_failed_at.map(epoch_millis),
            oldest_age_ms: oldest_age.map(|age| u64::try_from(age.as_millis()).unwrap_or(u64::MAX)),
        });
    }
    let mut table = Table::new(&["CLASS", "LETTERS"]).right_aligned(1);
    for (class, letters) in &summary.by_class {
        table.row(vec![(*class).to_owned(), letters.to_string()]);
    }
    if summary.unreadable > 0 {
        table.row(vec![
            "unreadable".to_owned(),
            summary.unreadable.to_string(),
        ]);
    }
    table.row(vec!["total".to_owned(), summary.total.to_string()]);
    let mut text = format!("{}\n{}", escaped(destination), table.render());
    if let Some(age) = oldest_age {
        text.push_str(&format!("oldest: failed {} ago\n", human_duration(age)));
    }
    text
}

/// One letter in `list --json` and `show --json`.
#[derive(Debug, Serialize)]
struct LetterReport {
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

fn letter_report(stored: &StoredLetter, with_payload: bool) -> LetterReport {
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

/// `intake dlq replay --json` and `purge --json`.
#[derive(Debug, Serialize)]
struct RedriveJson<'a> {
    destination: &'a str,
    dry_run: bool,
    redriven: u64,
    by_class: &'a BTreeMap<&'static str, u64>,
    skipped: Vec<SkippedJson>,
}

#[derive(Debug, Serialize)]
struct SkippedJson {
    id: String,
    reason: String,
}

/// `intake dlq replay`: each selected letter's message published again,
/// the letter removed once the publish is confirmed (or, in a dry run,
/// what would be).
pub async fn replay(
    store: &dyn DeadLetterStore,
    selection: &Selection,
    redrive: &Redrive,
    as_json: bool,
) -> Result<String, Failure> {
    let report = store
        .redrive(selection, redrive)
        .await
        .map_err(|error| store_failure("dlq replay", error))?;
    Ok(render_redrive(store.destination(), &report, as_json))
}

fn render_redrive(destination: &str, report: &RedriveReport, as_json: bool) -> String {
    if as_json {
        return json(&RedriveJson {
            destination,
            dry_run: report.dry_run,
            redriven: report.redriven,
            by_class: &report.by_class,
            skipped: report
                .skipped
                .iter()
                .map(|skipped| SkippedJson {
                    id: skipped.id.as_str().to_owned(),
                    reason: skipped.reason.to_string(),
                })
                .collect(),
        });
    }
    let verb = if report.dry_run {
        "would replay"
    } else {
        "replayed"
    };
    let mut text = format!("{verb} {} from {}\n", report.redriven, escaped(destination));
    let mut table = Table::new(&["CLASS", "LETTERS"]).right_aligned(1);
    for (class, letters) in &report.by_class {
        table.row(vec![(*class).to_owned(), letters.to_string()]);
    }
    if !report.by_class.is_empty() {
        text.push_str(&table.render());
    }
    if !report.skipped.is_empty() {
        text.push_str(&format!("skipped {}:\n", report.skipped.len()));
        for skipped in &report.skipped {
            text.push_str(&format!(
                "  {}  {}\n",
                escaped(skipped.id.as_str()),
                escaped(&skipped.reason.to_string())
            ));
        }
    }
    text
}

/// `intake dlq purge --json`.
#[derive(Debug, Serialize)]
struct PurgeJson<'a> {
    destination: &'a str,
    dry_run: bool,
    purged: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    by_class: Option<&'a BTreeMap<&'static str, u64>>,
}

/// `intake dlq purge`: removes the selected letters for good, after
/// `confirm` says yes (it is asked with the count; `None`: `--yes`, nobody
/// is asked); a dry run only counts them by class.
pub async fn purge(
    store: &dyn Letters,
    selection: &Selection,
    dry_run: bool,
    as_json: bool,
    confirm: Option<impl FnOnce(&str) -> Result<(), Failure>>,
) -> Result<String, Failure> {
    let destination = store.destination();
    let Some(confirm) = confirm.filter(|_| !dry_run) else {
        return purge_unasked(store, selection, dry_run, as_json).await;
    };
    match selection {
        Selection::Matching(filter) => {
            // The question counts these letters, and the purge takes these
            // and no other: letters given up while a person reads it are
            // left for the next purge, and `purged` never exceeds the
            // count they said yes to.
            let (summary, ids) = listed(store, filter).await?;
            if summary.total == 0 {
                return Ok(render_purge(destination, 0, false, None, as_json));
            }
            confirm(&format!(
                "Delete {} dead letters from {} for good?",
                summary.total,
                escaped(destination)
            ))?;
            let purged = store
                .purge_listed(&ids)
                .await
                .map_err(|error| store_failure("dlq purge", error))?;
            return Ok(render_purge(destination, purged, false, None, as_json));
        }
        Selection::Ids(ids) => {
            confirm(&format!(
                "Delete {} dead letters from {} for good?",
                ids.len(),
                escaped(destination)
            ))?;
        }
    }
    let purged = store
        .purge(selection)
        .await
        .map_err(|error| store_failure("dlq purge", error))?;
    Ok(render_purge(destination, purged, false, None, as_json))
}

/// A purge nobody is asked about (`--yes`), or a dry run: by the
/// selection itself, the store bounding a filter's by the letters it holds
/// when it starts (no count was shown to bound it by, and a RabbitMQ pass
/// that removes as it goes is not held back by `max_letters`).
async fn purge_unasked(
    store: &dyn Letters,
    selection: &Selection,
    dry_run: bool,
    as_json: bool,
) -> Result<String, Failure> {
    let destination = store.destination();
    if dry_run {
        return Ok(match selection {
            Selection::Matching(filter) => {
                let summary = store
                    .summary(filter)
                    .await
                    .map_err(|error| store_failure("dlq purge", error))?;
                render_purge(destination, summary.total, true, Some(&summary), as_json)
            }
            Selection::Ids(ids) => render_purge(destination, ids.len() as u64, true, None, as_json),
        });
    }
    let purged = store
        .purge(selection)
        .await
        .map_err(|error| store_failure("dlq purge", error))?;
    Ok(render_purge(destination, purged, false, None, as_json))
}

/// Letters a listing page holds while the ids of a purge are gathered:
/// their envelopes without payloads, a few MB at most. On RabbitMQ one
/// page is one pass, which takes at most its `max_letters` anyway.
const LISTED_PER_PAGE: usize = 10_000;

/// The letters `filter` selects as the store holds them now: their summary
/// and their ids, oldest first.
async fn listed(
    store: &dyn DeadLetterStore,
    filter: &Filter,
) -> Result<(Summary, Vec<LetterId>), Failure> {
    let mut summary = Summary::default();
    let mut ids = Vec::new();
    let mut after: Option<LetterId> = None;
    loop {
        let page = store
            .list(filter, LISTED_PER_PAGE, after.as_ref())
            .await
            .map_err(|error| store_failure("dlq purge", error))?;
        for stored in &page.letters {
            summary.add(stored);
            ids.push(stored.id.clone());
        }
        // A cursor that does not move would list the same page for ever.
        match page.next {
            Some(next) if after.as_ref() != Some(&next) => after = Some(next),
            _ => return Ok((summary, ids)),
        }
    }
}

fn render_purge(
    destination: &str,
    purged: u64,
    dry_run: bool,
    summary: Option<&Summary>,
    as_json: bool,
) -> String {
    if as_json {
        return json(&PurgeJson {
            destination,
            dry_run,
            purged,
            by_class: summary.map(|summary| &summary.by_class),
        });
    }
    let verb = if dry_run { "would purge" } else { "purged" };
    let mut text = format!("{verb} {purged} from {}\n", escaped(destination));
    if let Some(summary) = summary.filter(|summary| !summary.by_class.is_empty()) {
        let mut table = Table::new(&["CLASS", "LETTERS"]).right_aligned(1);
        for (class, letters) in &summary.by_class {
            table.row(vec![(*class).to_owned(), letters.to_string()]);
        }
        if summary.unreadable > 0 {
            table.row(vec![
                "unreadable".to_owned(),
                summary.unreadable.to_string(),
            ]);
        }
        text.push_str(&table.render());
    }
    text
}

#[cfg(test)]
mod tests {
    use intake_core::backend::DeadLetterSink;
    use intake_core::memory::{MemoryBroker, MemoryDeadLetterStore};
    use intake_core::{DeadLetter, ErrorClass, Message, Metadata, Position};

    use super::*;

    /// A memory broker whose `orders`/`billing` dead letters hold two
    /// permanent failures (keys `a`, `b`) and one retryable one (key `a`).
    async fn store_with_three() -> (MemoryBroker, MemoryDeadLetterStore) {
        let broker = MemoryBroker::new();
        broker.create_topic("orders", 1).unwrap();
        let sink = broker.dead_letter_sink("orders", "billing").unwrap();
        for (offset, key, class) in [
            (0, "a", ErrorClass::Permanent),
            (1, "b", ErrorClass::Permanent),
            (2, "a", ErrorClass::Retryable),
        ] {
            let message = Message::new(
                format!("payload {offset}"),
                Metadata::new("orders".into(), 0, Position::Offset(offset)),
            )
            .with_key(key);
            sink.write(&DeadLetter::new(message, "expected value", 3).with_class(class))
                .await
                .unwrap();
        }
        let store = broker.dead_letter_store("orders", "billing").unwrap();
        (broker, store)
    }

    #[tokio::test]
    async fn count_shows_letters_per_class() {
        let (_broker, store) = store_with_three().await;
        let text = count(&store, &Filter::all(), false, SystemTime::now())
            .await
            .unwrap();
        assert!(
            text.starts_with(
                "orders.billing.dlq\nCLASS      LETTERS\npermanent        2\n\
                 retryable        1\ntotal            3\noldest: failed "
            ),
            "{text}"
        );
        let value: serde_json::Value = serde_json::from_str(
            &count(
                &store,
                &Filter::all().with_class(ErrorClass::Permanent),
                true,
                SystemTime::now(),
            )
            .await
            .unwrap(),
        )
        .unwrap();
        assert_eq!(value["total"], 2);
        assert_eq!(value["by_class"]["permanent"], 2);
    }

    #[tokio::test]
    async fn list_pages_through_the_letters() {
        let (_broker, store) = store_with_three().await;
        let text = list(&store, &Filter::all(), 2, None, false, SystemTime::now())
            .await
            .unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("ID"), "{text}");
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[3].starts_with("more: --after "), "{text}");
        let value: serde_json::Value = serde_json::from_str(
            &list(
                &store,
                &Filter::all().with_key("a"),
                10,
                None,
                true,
                SystemTime::now(),
            )
            .await
            .unwrap(),
        )
        .unwrap();
        let letters = value["letters"].as_array().unwrap();
        assert_eq!(letters.len(), 2);
        assert_eq!(letters[0]["letter"]["key"], "a");
        assert_eq!(letters[0]["letter"]["error"], "expected value");
        assert_eq!(value["next"], serde_json::Value::Null);
    }

    #[tokio::test]
    async fn show_prints_the_payload_and_an_unknown_id_exits_3() {
        let (_broker, store) = store_with_three().await;
        let page = store.list(&Filter::all(), 1, None).await.unwrap();
        let id = page.letters[0].id.clone();
        let text = show(&store, &id, false, SystemTime::now()).await.unwrap();
        assert!(text.contains("payload:   payload 0\n"), "{text}");
        assert!(text.contains("class:     permanent\n"), "{text}");
        let missing = show(&store, &LetterId::new("999"), false, SystemTime::now())
            .await
            .unwrap_err();
        assert_eq!(missing.exit_code(), 3, "{missing}");
        let invalid = show(&store, &LetterId::new("x"), false, SystemTime::now())
            .await
            .unwrap_err();
        assert_eq!(invalid.exit_code(), 2, "{invalid}");
    }

    #[tokio::test]
    async fn a_dry_run_replay_counts_by_class_and_moves_nothing() {
        let (broker, store) = store_with_three().await;
        let all = Selection::Matching(Filter::all());
        let text = replay(&store, &all, &Redrive::to_origin().dry_run(true), false)
            .await
            .unwrap();
        assert!(text.starts_with("would replay 3 from "), "{text}");
        assert!(text.contains("permanent        2\n"), "{text}");
        assert_eq!(store.count(&Filter::all()).await.unwrap(), 3);
        assert!(broker.messages("orders", 0, 0).unwrap().is_empty());

        let text = replay(&store, &all, &Redrive::to_origin(), true)
            .await
            .unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["redriven"], 3);
        assert_eq!(store.count(&Filter::all()).await.unwrap(), 0);
        assert_eq!(broker.messages("orders", 0, 0).unwrap().len(), 3);
    }

    #[tokio::test]
    async fn a_replay_to_the_group_without_a_way_back_exits_3_and_names_to_origin() {
        // The memory store knows no way back to one group alone.
        let (broker, store) = store_with_three().await;
        let all = Selection::Matching(Filter::all());
        let refused = replay(&store, &all, &Redrive::to_group(), false)
            .await
            .unwrap_err();
        assert_eq!(refused.exit_code(), 3, "{refused}");
        let report = refused.report(None);
        for words in ["orders", "--to-origin", "every consumer group"] {
            assert!(report.contains(words), "{report}");
        }
        assert_eq!(store.count(&Filter::all()).await.unwrap(), 3);
        assert!(broker.messages("orders", 0, 0).unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_replay_the_broker_refuses_exits_3() {
        let (_broker, store) = store_with_three().await;
        let all = Selection::Matching(Filter::all());
        // No such topic: the memory publisher rejects it.
        let refused = replay(&store, &all, &Redrive::to("nowhere"), false)
            .await
            .unwrap_err();
        assert_eq!(refused.exit_code(), 3, "{}", refused.report(None));
        assert_eq!(store.count(&Filter::all()).await.unwrap(), 3);
    }

    #[tokio::test]
    async fn purge_asks_first_and_deletes_nothing_when_declined() {
        let (_broker, store) = store_with_three().await;
        let permanent = Selection::Matching(Filter::all().with_class(ErrorClass::Permanent));
        let dry = purge(
            &store,
            &permanent,
            true,
            false,
            Some(|_: &str| panic!("a dry run asks nothing")),
        )
        .await
        .unwrap();
        assert!(dry.starts_with("would purge 2 from "), "{dry}");

        let mut asked = String::new();
        let declined = purge(
            &store,
            &permanent,
            false,
            false,
            Some(|question: &str| {
                asked = question.to_owned();
                Err(Failure::NotConfirmed)
            }),
        )
        .await
        .unwrap_err();
        assert_eq!(declined.exit_code(), 5);
        assert!(asked.starts_with("Delete 2 dead letters from "), "{asked}");
        assert_eq!(store.count(&Filter::all()).await.unwrap(), 3);

        let done = purge(&store, &permanent, false, false, Some(|_: &str| Ok(())))
            .await
            .unwrap();
        assert!(done.starts_with("purged 2 from "), "{done}");
        assert_eq!(store.count(&Filter::all()).await.unwrap(), 1);
    }

    #[tokio::test]
    async fn a_purge_deletes_only_the_letters_it_asked_about() {
        use intake_core::memory::{Record, dead_letter_topic};

        let (broker, store) = store_with_three().await;
        let topic = dead_letter_topic("orders", "billing");
        let originals = broker.messages(&topic, 0, 0).unwrap();
        let copy = |letter: &Message| {
            Record::new(letter.payload().clone())
                .with_optional_key(letter.key().cloned())
                .with_headers(letter.headers().clone())
        };
        for (selection, asked_for) in [
            (Selection::Matching(Filter::all()), 3),
            (
                Selection::Matching(Filter::all().with_class(ErrorClass::Permanent)),
                2,
            ),
        ] {
            store
                .purge(&Selection::Matching(Filter::all()))
                .await
                .unwrap();
            for letter in &originals {
                broker.send(&topic, copy(letter)).unwrap();
            }
            let mut asked = String::new();
            // Letters given up while the person reads the question: two
            // permanent failures, like the first letter.
            let done = purge(
                &store,
                &selection,
                false,
                true,
                Some(|question: &str| {
                    asked = question.to_owned();
                    for _ in 0..2 {
                        broker.send(&topic, copy(&originals[0])).unwrap();
                    }
                    Ok(())
                }),
            )
            .await
            .unwrap();
            assert!(
                asked.starts_with(&format!("Delete {asked_for} dead letters")),
                "{asked}"
            );
            let value: serde_json::Value = serde_json::from_str(&done).unwrap();
            assert_eq!(value["purged"], asked_for, "{done}");
            assert_eq!(
                store.count(&Filter::all()).await.unwrap(),
                3 - asked_for + 2,
                "the letters written meanwhile are left; {done}"
            );
        }
    }

    /// What a producer (or a handler's error quoting its input) can put in
    /// a letter to drive a terminal: OSC 0 (the window title), OSC 52 (the
    /// clipboard), CSI (erase, move up), a C1 CSI, DEL, CR, BS, a bidi
    /// override (Trojan Source), and a newline forging a field of its own.
    const HOSTILE: &str = "\x1b]0;owned\x07\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\x1b[1A\u{9b}31m\x7f\r\x08\u{202e}\nclass:     retryable";

    /// Whether `c` may reach a terminal: no control character but the
    /// newline between lines, no bidi control. Written out here, not taken
    /// from the code under test.
    fn inert(c: char) -> bool {
        c == '\n'
            || !(c.is_control()
                || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'))
    }

    fn assert_inert(text: &str) {
        if let Some(c) = text.chars().find(|&c| !inert(c)) {
            panic!("{c:?} reaches the terminal in {text:?}");
        }
    }

    /// A memory store whose one letter has the hostile text in every
    /// producer-controlled field: source, key, error, header name and
    /// value, payload; and a second entry that is no letter, whose
    /// unreadable field quotes the hostile text.
    async fn store_with_hostile_letter() -> (MemoryBroker, MemoryDeadLetterStore) {
        use intake_core::Headers;
        use intake_core::dead_letter::envelope::ATTEMPTS;
        use intake_core::memory::{Record, dead_letter_topic};

        let broker = MemoryBroker::new();
        broker.create_topic("orders", 1).unwrap();
        let sink = broker.dead_letter_sink("orders", "billing").unwrap();
        let mut headers = Headers::default();
        headers.insert(HOSTILE, HOSTILE.as_bytes().to_vec());
        let message = Message::new(
            HOSTILE,
            Metadata::new(HOSTILE.into(), 0, Position::Offset(7)),
        )
        .with_key(HOSTILE)
        .with_headers(headers);
        sink.write(&DeadLetter::new(message, HOSTILE, 1))
            .await
            .unwrap();
        let topic = dead_letter_topic("orders", "billing");
        let written = broker.messages(&topic, 0, 0).unwrap().remove(0);
        let mut forged = written.headers().clone();
        forged.set(ATTEMPTS, HOSTILE.as_bytes().to_vec());
        broker
            .send(&topic, Record::new("x").with_headers(forged))
            .unwrap();
        let store = broker.dead_letter_store("orders", "billing").unwrap();
        (broker, store)
    }

    #[tokio::test]
    async fn show_escapes_every_producer_controlled_field() {
        let (_broker, store) = store_with_hostile_letter().await;
        let text = show(&store, &LetterId::new("0"), false, SystemTime::now())
            .await
            .unwrap();
        assert_inert(&text);
        // One line per field, none forged: only the payload (the last
        // field) may span lines, and its further lines are indented, so no
        // line of it can pass for a field.
        let labels: Vec<&str> = text
            .lines()
            .filter(|line| !line.starts_with(' '))
            .map(|line| line.split_whitespace().next().unwrap_or_default())
            .collect();
        assert_eq!(
            labels,
            [
                "id:",
                "origin:",
                "group:",
                "key:",
                "class:",
                "attempts:",
                "replays:",
                "failed:",
                "first:",
                "error:",
                "header:",
                "bytes:",
                "payload:"
            ],
            "{text}"
        );
        assert!(text.contains("error:     \\x1b]0;owned\\x07"), "{text}");
        let unreadable = show(&store, &LetterId::new("1"), false, SystemTime::now())
            .await
            .unwrap();
        assert_inert(&unreadable);
        assert_eq!(unreadable.lines().count(), 3, "{unreadable}");
    }

    #[tokio::test]
    async fn list_and_count_escape_every_producer_controlled_field() {
        let (_broker, store) = store_with_hostile_letter().await;
        let text = list(&store, &Filter::all(), 10, None, false, SystemTime::now())
            .await
            .unwrap();
        assert_inert(&text);
        assert_eq!(text.lines().count(), 3, "{text}");
        let text = count(&store, &Filter::all(), false, SystemTime::now())
            .await
            .unwrap();
        assert_inert(&text);
    }

    #[tokio::test]
    async fn json_carries_the_exact_text_with_nothing_raw_for_a_terminal() {
        let (_broker, store) = store_with_hostile_letter().await;
        for text in [
            show(&store, &LetterId::new("0"), true, SystemTime::now())
                .await
                .unwrap(),
            list(&store, &Filter::all(), 10, None, true, SystemTime::now())
                .await
                .unwrap(),
        ] {
            // `jq .` and a terminal both read it: every such character is a
            // JSON escape, which parses back to the very text.
            assert_inert(&text);
            let value: serde_json::Value = serde_json::from_str(&text).unwrap();
            let letter = if value["letters"].is_array() {
                &value["letters"][0]["letter"]
            } else {
                &value["letter"]
            };
            assert_eq!(letter["error"], HOSTILE, "{text}");
            assert_eq!(letter["source"], HOSTILE, "{text}");
            assert!(letter["headers"].get(HOSTILE).is_some(), "{text}");
        }
    }

    #[test]
    fn keys_and_payloads_cannot_drive_the_terminal() {
        assert_eq!(printable(b"plain text"), "plain text");
        assert_eq!(printable(b"\x1b[2Jgone"), "\\x1b[2Jgone");
        assert_eq!(printable(&[0xff, 0x00]), "\\xff\\x00");
        assert_eq!(one_line("a\nb", 10), "a\\nb");
        assert_eq!(one_line("abcdef", 3), "abc…");
    }
}
