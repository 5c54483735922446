//! `intake dlq purge`: asked first, and only the letters asked about.

use intake_core::dead_letter::store::{DeadLetterStore, Filter, LetterId, Selection, Summary};
use serde::Serialize;
use std::collections::BTreeMap;

use super::store_failure::store_failure;
use crate::failure::Failure;
use crate::output::{Table, escaped, json};
use crate::stores::Letters;

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
