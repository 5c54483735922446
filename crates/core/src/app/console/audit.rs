//! The audit trail: every console action (who, what, on what, dry run or
//! not, how many messages, how it ended) goes to the tracing target
//! `intake::console::audit` and into a bounded ring the API serves
//! (`GET /console/api/v1/audit`).
//!
//! Every mutating call is recorded here, done or refused: pause and resume
//! (`control.rs`), dead-letter replay and purge (`dead_letters.rs`), each
//! through [`Console::audit`](super::Console::audit).

use serde::Serialize;

/// The tracing target of the audit log.
pub const AUDIT_TARGET: &str = "intake::console::audit";

/// How many audit entries the console keeps for the API.
pub(super) const AUDIT_ENTRIES: usize = 256;

/// One console action, as the audit log records it. It never holds a token
/// or a payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct AuditEntry {
    /// When, in Unix milliseconds.
    pub at_unix_ms: u64,
    /// Who: `token` for a request that presented the console's token,
    /// `anonymous` otherwise (a peer address when the server knows it).
    pub actor: String,
    /// What: `pause`, `resume`, `replay`, `purge`, ... or the request's
    /// method and path for a refused one.
    pub action: String,
    /// On what: a route, a partition, a set of letters.
    pub target: String,
    /// Whether it was a dry run.
    pub dry_run: bool,
    /// How many messages or letters it concerned, when it counts any.
    pub count: Option<u64>,
    /// How it ended: `done`, `refused: <reason>`, `failed: <reason>`.
    pub outcome: String,
}

impl AuditEntry {
    /// An entry for `action` on `target` by `actor`, ended with `outcome`,
    /// at `at_unix_ms`.
    pub fn new(
        at_unix_ms: u64,
        actor: impl Into<String>,
        action: impl Into<String>,
        target: impl Into<String>,
        outcome: impl Into<String>,
    ) -> Self {
        Self {
            at_unix_ms,
            actor: actor.into(),
            action: action.into(),
            target: target.into(),
            dry_run: false,
            count: None,
            outcome: outcome.into(),
        }
    }

    /// Marks it a dry run.
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// How many messages or letters it concerned.
    pub fn count(mut self, count: u64) -> Self {
        self.count = Some(count);
        self
    }
}

/// Writes `entry` to the audit log's tracing target.
pub(super) fn log(entry: &AuditEntry) {
    tracing::info!(
        target: AUDIT_TARGET,
        actor = %entry.actor,
        action = %entry.action,
        subject = %entry.target,
        dry_run = entry.dry_run,
        count = entry.count,
        outcome = %entry.outcome,
        "console action"
    );
}
