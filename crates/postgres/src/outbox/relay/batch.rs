//! What one batch of the relay knows of its rows as they are settled: the
//! rows in flight (and how many of each key, for key order), the keys whose
//! rows stay, and the rows published, refused, not confirmed and not sent.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use intake_core::publish::PublishError;

use crate::outbox::{OutboxError, error_text};

/// A row sent and not yet confirmed.
pub(super) struct Sent<R> {
    pub(super) id: i64,
    pub(super) key: u64,
    pub(super) receipt: R,
}

/// A row to move to the failed table.
pub(super) struct Refusal {
    pub(super) id: i64,
    pub(super) destination: Option<Arc<str>>,
    /// Sends before this one.
    pub(super) attempts: u32,
    pub(super) kind: &'static str,
    pub(super) error: String,
}

/// One batch's rows as they are settled.
pub(super) struct Batch<R> {
    pub(super) in_flight: VecDeque<Sent<R>>,
    /// How many rows of each key are in flight.
    pub(super) in_flight_keys: HashMap<u64, u32>,
    /// Keys with a row that stays: their later confirmed rows stay too.
    pub(super) stays: HashSet<u64>,
    pub(super) published: Vec<i64>,
    pub(super) refused: Vec<Refusal>,
    /// Rows not confirmed, with their sends so far.
    pub(super) unconfirmed: HashMap<i64, u32>,
    /// Rows not sent, after the batch stopped sending.
    pub(super) unsent: Vec<i64>,
    /// The batch stopped sending at its deadline: rows wait.
    pub(super) cut_short: bool,
    pub(super) failure: Option<OutboxError>,
}

impl<R> Batch<R> {
    pub(super) fn with_capacity(rows: usize) -> Self {
        Self {
            in_flight: VecDeque::with_capacity(rows),
            in_flight_keys: HashMap::with_capacity(rows),
            stays: HashSet::new(),
            published: Vec::with_capacity(rows),
            refused: Vec::new(),
            unconfirmed: HashMap::new(),
            unsent: Vec::new(),
            cut_short: false,
            failure: None,
        }
    }

    pub(super) fn refuse(
        &mut self,
        id: i64,
        destination: Option<Arc<str>>,
        error: &PublishError,
        previous: &HashMap<i64, u32>,
    ) {
        self.refused.push(Refusal {
            id,
            destination,
            attempts: previous.get(&id).copied().unwrap_or(0),
            kind: error.kind().as_str(),
            error: error_text(error),
        });
    }

    /// Row `id` was not confirmed: it stays, the rows of its key after it
    /// stay, and the batch sends nothing more (the first failure is the
    /// batch's error).
    pub(super) fn fail(
        &mut self,
        id: i64,
        key: u64,
        error: OutboxError,
        previous: &HashMap<i64, u32>,
    ) {
        self.stays.insert(key);
        let sends = previous.get(&id).copied().unwrap_or(0).saturating_add(1);
        self.unconfirmed.insert(id, sends);
        self.failure.get_or_insert(error);
    }
}
