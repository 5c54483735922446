//! `intake dlq count`.

use intake_core::dead_letter::store::{DeadLetterStore, Filter, Summary};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::SystemTime;

use super::store_failure::store_failure;
use super::text::epoch_millis;
use crate::failure::Failure;
use crate::output::{Table, escaped, human_duration, json};

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
