//! Replay and purge of dead letters through the console: a dry run names
//! the set, the real run takes exactly that set.
//!
//! A dry run (`"dry_run": true`, the default) lists the letters its filter
//! selects, asks the store's own dry run what a replay would skip and why,
//! and keeps the ids it saw under a random `confirm` value (128 bits, for
//! 10 minutes, the last 32 dry runs). The real run (`"dry_run": false`)
//! names that value and nothing else: it replays or purges the letters of
//! those ids ([`Selection::Ids`]), so a letter written since the dry run is
//! not in the set and stays, and a letter gone since is reported not
//! found. A confirm value is used once. Replays go at most
//! [`replay_rate`](super::ConsoleSettings::replay_rate) letters a second,
//! in a task of their own, so a client that hangs up does not cut one
//! short; one expected to take longer than [`ANSWER_WITHIN`] (5 s) is
//! answered `202 Accepted` at once. The audit log has how each ended.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use serde::{Deserialize, Serialize};

use super::api::{self, Refusal};
use super::audit::AuditEntry;
use super::dead_letters::{Store, failed};
use super::letter_view::{self, LetterQuery};
use super::view::Now;
use super::{Console, guard, lock};
use crate::dead_letter::store::{
    LetterId, Replay, ReplayReport, Selection, SkipReason, StoreError,
};

/// The most letters one dry run takes into its set: a filter that selects
/// more says so (`truncated`), and a later run takes the rest.
pub const MAX_SET: usize = 100_000;

/// How long a dry run's confirm value holds.
const CONFIRM_FOR: Duration = Duration::from_secs(600);

/// How many dry runs wait for their confirmation at most (the oldest goes).
const MAX_PENDING: usize = 32;

/// A run expected to take longer (at the replay rate) is answered `202
/// Accepted` at once and goes on; the audit log has how it ended.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// The most skipped letters an answer lists (all are counted).
const MAX_SKIPPED_SHOWN: usize = 100;

/// How many letters a listing page asks the store for while collecting.
const COLLECT_PAGE: usize = 500;

/// What a dry run will let the real run do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    Replay,
    Purge,
}

impl Action {
    fn name(self) -> &'static str {
        match self {
            Action::Replay => "dead_letters.replay",
            Action::Purge => "dead_letters.purge",
        }
    }
}

/// A dry run waiting for its confirmation.
pub(super) struct Pending {
    confirm: String,
    route: String,
    action: Action,
    to_origin: bool,
    ids: Vec<LetterId>,
    at: Instant,
}

/// A replay or purge request's body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ActionBody {
    /// Which letters (the dry run's; the real run takes the confirmed set).
    #[serde(default)]
    filter: LetterQuery,
    /// Whether only to say what would be done (the default).
    #[serde(default = "yes")]
    dry_run: bool,
    /// The dry run's `confirm`, for the real run.
    #[serde(default)]
    confirm: Option<String>,
    /// Replay to `group` (its way back in alone; the default) or `origin`
    /// (every group of it).
    #[serde(default)]
    target: Option<String>,
}

fn yes() -> bool {
    true
}

/// What a dry run or a run answers.
#[derive(Debug, Serialize)]
struct ActionAnswer {
    route: String,
    action: &'static str,
    dry_run: bool,
    /// Letters in the set.
    letters: usize,
    /// More letters matched than one set takes ([`MAX_SET`]).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    truncated: bool,
    /// Replayed (or, in a dry run, that would be); purged for a purge.
    done: u64,
    by_class: std::collections::BTreeMap<&'static str, u64>,
    skipped_total: usize,
    skipped: Vec<SkippedView>,
    /// The value the real run names; dry runs only.
    #[serde(skip_serializing_if = "Option::is_none")]
    confirm: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    confirm_expires_in_ms: Option<u64>,
    /// A run answered before its end (`202`): it goes on.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    running: bool,
    /// How long such a run takes at the replay rate.
    #[serde(skip_serializing_if = "Option::is_none")]
    estimated_ms: Option<u64>,
    /// For a run that stopped on a store's failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'static str>,
}

#[derive(Debug, Serialize)]
struct SkippedView {
    id: String,
    reason: String,
    /// `replay_limit`, `reference`, `unreadable`, `not_found`.
    kind: &'static str,
}

/// Passes the guard or answers its refusal (audited).
pub(super) fn authorize(
    console: &Console,
    request: &Request<Bytes>,
    peer: Option<SocketAddr>,
) -> Result<(), Refusal> {
    guard::authorize(console.settings(), request.headers()).map_err(|denied| {
        console.audit(AuditEntry::new(
            Now::new().unix_now_ms(),
            actor("anonymous", peer),
            format!(
                "{} {}",
                request.method(),
                api::capped(request.uri().path(), 256)
            ),
            "dead letters",
            format!("refused: {}", denied.reason()),
        ));
        (denied.status(), denied.reason())
    })
}

/// Who acted, as the audit log names them: `token from 127.0.0.1:5000`.
pub(super) fn actor(who: &str, peer: Option<SocketAddr>) -> String {
    match peer {
        Some(peer) => format!("{who} from {peer}"),
        None => who.to_owned(),
    }
}

/// `POST .../dead_letters/replay`.
pub(super) async fn replay(
    console: &Console,
    route: &str,
    store: Store,
    body: &Bytes,
    peer: Option<SocketAddr>,
) -> Result<Response<String>, Refusal> {
    run(console, route, store, body, peer, Action::Replay).await
}

/// `POST .../dead_letters/purge`.
pub(super) async fn purge(
    console: &Console,
    route: &str,
    store: Store,
    body: &Bytes,
    peer: Option<SocketAddr>,
) -> Result<Response<String>, Refusal> {
    run(console, route, store, body, peer, Action::Purge).await
}

async fn run(
    console: &Console,
    route: &str,
    store: Store,
    body: &Bytes,
    peer: Option<SocketAddr>,
    action: Action,
) -> Result<Response<String>, Refusal> {
    let body: ActionBody = serde_json::from_slice(if body.is_empty() { b"{}" } else { body })
        .map_err(|_| {
            (
                StatusCode::BAD_REQUEST,
                "the body is not a valid JSON request",
            )
        })?;
    let to_origin = match body.target.as_deref() {
        None | Some("group") => false,
        Some("origin") => true,
        Some(_) => return Err((StatusCode::BAD_REQUEST, "target is group or origin")),
    };
    let audit = |dry_run: bool, count: u64, outcome: String| {
        console.audit(
            AuditEntry::new(
                Now::new().unix_now_ms(),
                actor("token", peer),
                action.name(),
                format!("route {route}"),
                outcome,
            )
            .dry_run(dry_run)
            .count(count),
        );
    };
    let replay_of = |to_origin: bool| {
        if to_origin {
            Replay::to_origin()
        } else {
            Replay::to_group()
        }
    };
    if body.dry_run {
        let filter = body
            .filter
            .filter()
            .map_err(|reason| (StatusCode::BAD_REQUEST, reason))?;
        let (ids, truncated) = collect(console, &store, &body.filter, &filter).await?;
        let mut answer = answer(route, action, true, ids.len(), truncated);
        match action {
            Action::Replay => {
                let report = store
                    .replay(
                        &Selection::Ids(ids.clone()),
                        &replay_of(to_origin).dry_run(true),
                    )
                    .await
                    .map_err(refused_replay)?;
                fill(&mut answer, &report);
            }
            Action::Purge => answer.done = ids.len() as u64,
        }
        let confirm = remember(console, route, action, to_origin, ids);
        answer.confirm = Some(confirm);
        answer.confirm_expires_in_ms = Some(super::view::millis(CONFIRM_FOR));
        audit(true, answer.letters as u64, "done".to_owned());
        return api::json(&answer);
    }
    let Some(confirm) = body.confirm.as_deref() else {
        return Err((
            StatusCode::BAD_REQUEST,
            "a run that is no dry run needs the dry run's confirm value",
        ));
    };
    let store_name = store.destination().to_owned();
    let Some(pending) = take(console, route, action, confirm) else {
        audit(false, 0, "refused: unknown confirm value".to_owned());
        return Err((
            StatusCode::CONFLICT,
            "the confirm value is unknown, used or expired: dry-run again",
        ));
    };
    let count = pending.ids.len();
    let rate = console.settings().replay_rate;
    let estimate = match action {
        Action::Replay => Duration::from_secs_f64(count as f64 / f64::from(rate)),
        Action::Purge => Duration::ZERO,
    };
    let work = {
        let console = console.clone();
        let route = route.to_owned();
        let actor = actor("token", peer);
        tokio::spawn(async move {
            let (report, error) = match pending.action {
                Action::Replay => {
                    paced_replay(&store, pending.ids, replay_of(pending.to_origin), rate).await
                }
                Action::Purge => purge_all(&store, pending.ids).await,
            };
            let outcome = match &error {
                None => "done".to_owned(),
                Some(error) => format!("failed after {} letters: {error}", report.replayed),
            };
            // The task's own entry: a run answered 202 ends here.
            console.audit(
                AuditEntry::new(
                    Now::new().unix_now_ms(),
                    actor,
                    action.name(),
                    format!("route {route}"),
                    outcome,
                )
                .count(report.replayed),
            );
            (report, error)
        })
    };
    let mut answer = answer(route, action, false, count, false);
    if estimate > ANSWER_WITHIN {
        // Longer than a client or the listener waits: answered now; the
        // audit log says how it ended.
        answer.running = true;
        answer.estimated_ms = Some(super::view::millis(estimate));
        let mut response = api::json(&answer)?;
        *response.status_mut() = StatusCode::ACCEPTED;
        return Ok(response);
    }
    let (report, error) = match work.await {
        Ok(done) => done,
        Err(_) => {
            let error =
                StoreError::broker("finish a console run on", store_name, "its task panicked");
            audit(false, 0, format!("failed: {error}"));
            (ReplayReport::default(), Some(error))
        }
    };
    fill(&mut answer, &report);
    if let Some(error) = error {
        let _ = failed(error);
        answer.error = Some("the dead-letter store failed part way; see done and the log");
        let mut response = api::json(&answer)?;
        *response.status_mut() = StatusCode::BAD_GATEWAY;
        return Ok(response);
    }
    api::json(&answer)
}

fn answer(
    route: &str,
    action: Action,
    dry_run: bool,
    letters: usize,
    truncated: bool,
) -> ActionAnswer {
    ActionAnswer {
        route: route.to_owned(),
        action: action.name(),
        dry_run,
        letters,
        truncated,
        done: 0,
        by_class: Default::default(),
        skipped_total: 0,
        skipped: Vec::new(),
        confirm: None,
        confirm_expires_in_ms: None,
        running: false,
        estimated_ms: None,
        error: None,
    }
}

fn fill(answer: &mut ActionAnswer, report: &ReplayReport) {
    answer.done = report.replayed;
    answer.by_class = report.by_class.clone();
    answer.skipped_total = report.skipped.len();
    answer.skipped = report
        .skipped
        .iter()
        .take(MAX_SKIPPED_SHOWN)
        .map(|skipped| SkippedView {
            id: skipped.id.to_string(),
            reason: skipped.reason.to_string(),
            kind: match skipped.reason {
                SkipReason::ReplayLimit { .. } => "replay_limit",
                SkipReason::Reference => "reference",
                SkipReason::Unreadable => "unreadable",
                SkipReason::NotFound => "not_found",
            },
        })
        .collect();
}

/// A refused replay: no way back to the group is the caller's to fix.
fn refused_replay(error: StoreError) -> Refusal {
    match error {
        StoreError::NoWayBackToGroup { .. } => (
            StatusCode::CONFLICT,
            "this store knows no way back to the group alone; replay with \"target\": \"origin\" if every group of the origin should handle the letters",
        ),
        error => failed(error),
    }
}

/// The ids of the letters `filter` and the text search select, oldest
/// first, at most [`MAX_SET`]; and whether more matched.
async fn collect(
    console: &Console,
    store: &Store,
    query: &LetterQuery,
    filter: &crate::dead_letter::store::Filter,
) -> Result<(Vec<LetterId>, bool), Refusal> {
    let needle = query.needle();
    let redaction = &console.settings().redaction;
    let mut ids = Vec::new();
    let mut after: Option<LetterId> = None;
    loop {
        let page = store
            .list(filter, COLLECT_PAGE, after.as_ref())
            .await
            .map_err(failed)?;
        for bare in page.letters {
            if ids.len() >= MAX_SET {
                return Ok((ids, true));
            }
            let Some(needle) = &needle else {
                ids.push(bare.id);
                continue;
            };
            // The payload is read only where the policy shows it.
            let stored = if redaction.shows_payload() {
                match store.read(&bare.id).await {
                    Ok(stored) => stored,
                    Err(StoreError::NotFound { .. }) => continue,
                    Err(error) => return Err(failed(error)),
                }
            } else {
                bare
            };
            let shown = redaction
                .shows_payload()
                .then(|| {
                    redaction
                        .show(&stored, super::redaction::LIST_PREVIEW)
                        .preview
                })
                .flatten();
            if letter_view::holds(&stored, needle, shown.as_deref()) {
                ids.push(stored.id);
            }
        }
        match page.next {
            Some(id) if after.as_ref() != Some(&id) => after = Some(id),
            _ => return Ok((ids, false)),
        }
    }
}

/// Keeps `ids` for the real run; the confirm value.
fn remember(
    console: &Console,
    route: &str,
    action: Action,
    to_origin: bool,
    ids: Vec<LetterId>,
) -> String {
    let confirm = format!("{:032x}", rand::random::<u128>());
    let mut pending = lock(&console.inner.dead_letters.pending);
    pending.retain(|waiting| waiting.at.elapsed() < CONFIRM_FOR);
    if pending.len() >= MAX_PENDING {
        pending.remove(0);
    }
    pending.push(Pending {
        confirm: confirm.clone(),
        route: route.to_owned(),
        action,
        to_origin,
        ids,
        at: Instant::now(),
    });
    confirm
}

/// The dry run `confirm` names, for this route and action, if it holds.
fn take(console: &Console, route: &str, action: Action, confirm: &str) -> Option<Pending> {
    let mut pending = lock(&console.inner.dead_letters.pending);
    pending.retain(|waiting| waiting.at.elapsed() < CONFIRM_FOR);
    // Only a caller with the token gets here, and a confirm value only
    // binds a set that caller's own dry run chose: a plain comparison.
    let index = pending.iter().position(|waiting| {
        waiting.confirm == confirm && waiting.route == route && waiting.action == action
    })?;
    Some(pending.remove(index))
}

/// Replays `ids` at most `rate` letters a second; the report, and the
/// failure that stopped it, if any.
async fn paced_replay(
    store: &Store,
    ids: Vec<LetterId>,
    replay: Replay,
    rate: u32,
) -> (ReplayReport, Option<StoreError>) {
    let batch = usize::try_from(rate / 10).unwrap_or(1).clamp(1, 1_000);
    let started = tokio::time::Instant::now();
    let mut total = ReplayReport::default();
    let mut taken = 0_u64;
    for chunk in ids.chunks(batch) {
        match store.replay(&Selection::Ids(chunk.to_vec()), &replay).await {
            Ok(report) => {
                total.replayed += report.replayed;
                for (class, count) in report.by_class {
                    *total.by_class.entry(class).or_default() += count;
                }
                total.skipped.extend(report.skipped);
            }
            Err(error) => {
                if let StoreError::Replay { report, .. } = &error {
                    total.replayed += report.replayed;
                    total.skipped.extend(report.skipped.iter().cloned());
                }
                return (total, Some(error));
            }
        }
        taken += chunk.len() as u64;
        let due = Duration::from_secs_f64(taken as f64 / f64::from(rate));
        tokio::time::sleep_until(started + due).await;
    }
    (total, None)
}

/// Purges `ids`, a thousand at a time; the count in `replayed`.
async fn purge_all(store: &Store, ids: Vec<LetterId>) -> (ReplayReport, Option<StoreError>) {
    let mut total = ReplayReport::default();
    for chunk in ids.chunks(1_000) {
        match store.purge(&Selection::Ids(chunk.to_vec())).await {
            Ok(purged) => total.replayed += purged,
            Err(error) => return (total, Some(error)),
        }
    }
    (total, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::{ConsoleSettings, Health};

    #[test]
    fn a_confirm_value_holds_for_its_route_and_action_once_and_the_oldest_goes() {
        let console = Console::new(Health::default(), ConsoleSettings::default());
        let ids = vec![LetterId::from("1"), LetterId::from("2")];
        let confirm = remember(&console, "orders", Action::Replay, false, ids.clone());
        assert_eq!(confirm.len(), 32);
        assert!(take(&console, "payments", Action::Replay, &confirm).is_none());
        assert!(take(&console, "orders", Action::Purge, &confirm).is_none());
        assert!(take(&console, "orders", Action::Replay, "0").is_none());
        let pending = take(&console, "orders", Action::Replay, &confirm).expect("held");
        assert_eq!(pending.ids, ids);
        assert!(
            take(&console, "orders", Action::Replay, &confirm).is_none(),
            "used once"
        );

        let first = remember(&console, "orders", Action::Purge, false, Vec::new());
        for _ in 0..MAX_PENDING {
            remember(&console, "orders", Action::Purge, false, Vec::new());
        }
        assert_eq!(lock(&console.inner.dead_letters.pending).len(), MAX_PENDING);
        assert!(
            take(&console, "orders", Action::Purge, &first).is_none(),
            "the oldest went"
        );
    }
}
