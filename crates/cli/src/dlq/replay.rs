//! `intake dlq replay`.

use intake_core::dead_letter::store::{DeadLetterStore, Replay, ReplayReport, Selection};
use serde::Serialize;
use std::collections::BTreeMap;

use super::store_failure::store_failure;
use crate::failure::Failure;
use crate::output::{Table, escaped, json};

/// `intake dlq replay --json` and `purge --json`.
#[derive(Debug, Serialize)]
struct ReplayJson<'a> {
    destination: &'a str,
    dry_run: bool,
    replayed: u64,
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
    replay: &Replay,
    as_json: bool,
) -> Result<String, Failure> {
    let report = store
        .replay(selection, replay)
        .await
        .map_err(|error| store_failure("dlq replay", error))?;
    Ok(render_replay(store.destination(), &report, as_json))
}

fn render_replay(destination: &str, report: &ReplayReport, as_json: bool) -> String {
    if as_json {
        return json(&ReplayJson {
            destination,
            dry_run: report.dry_run,
            replayed: report.replayed,
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
    let mut text = format!("{verb} {} from {}\n", report.replayed, escaped(destination));
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
