//! [`Problem`] and [`HealthReport`]: what [`Health`](super::Health)
//! answers, and why a route is not ready or not live.

use std::time::Duration;

use crate::message::PartitionKey;

/// Why a route is not ready, or not live.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// The route has not started, or has ended.
    NotRunning,
    /// The route is draining.
    Stopping,
    /// No assignment yet (within the assignment grace).
    NoAssignment,
    /// The last acknowledgement failed.
    AcksFailing,
    /// Fetching fails.
    SourceFailing,
    /// The source cannot reach its broker (it keeps reconnecting).
    Unreachable {
        /// How long it has not reached it.
        since: Duration,
    },
    /// The consumer has been backing off (everything it handles fails)
    /// for longer than the backoff grace.
    BackingOff {
        /// How long it has been backing off.
        since: Duration,
    },
    /// The route has asked its shared budget for room and got none, for
    /// the stall window: the other routes sharing it hold it all.
    Starved {
        /// How long it has waited.
        since: Duration,
    },
    /// Every acknowledgement (commit) has failed for the stall window.
    CommitsFailing {
        /// How long since the first of these failures.
        since: Duration,
    },
    /// A part besides the routes said so ([`Health::add_check`](super::Health::add_check)).
    Part {
        /// What it said.
        reason: String,
    },
    /// A partition's watermark has not moved for the stall window.
    Stalled {
        /// The partition.
        partition: PartitionKey,
        /// How long since it last moved.
        since: Duration,
    },
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::NotRunning => f.write_str("not running"),
            Problem::Stopping => f.write_str("stopping"),
            Problem::NoAssignment => f.write_str("no assignment yet"),
            Problem::AcksFailing => f.write_str("acknowledgements failing"),
            Problem::SourceFailing => f.write_str("fetching failing"),
            Problem::Unreachable { since } => {
                write!(f, "broker unreachable for {since:?}")
            }
            Problem::BackingOff { since } => {
                write!(f, "backing off for {since:?}")
            }
            Problem::Starved { since } => {
                write!(f, "no room in the shared budget for {since:?}")
            }
            Problem::CommitsFailing { since } => {
                write!(f, "commits failing for {since:?}")
            }
            Problem::Part { reason } => f.write_str(reason),
            Problem::Stalled { partition, since } => {
                write!(f, "partition {partition} stalled for {since:?}")
            }
        }
    }
}

/// A health answer: each route's problems (empty when healthy).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthReport {
    /// Each route's name and problems, in the order added.
    pub routes: Vec<(String, Vec<Problem>)>,
}

impl HealthReport {
    /// Whether no route has a problem.
    pub fn is_healthy(&self) -> bool {
        self.routes.iter().all(|(_, problems)| problems.is_empty())
    }
}

impl std::fmt::Display for HealthReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (route, problems) in &self.routes {
            if problems.is_empty() {
                writeln!(f, "{route}: ok")?;
            } else {
                let list: Vec<String> = problems.iter().map(ToString::to_string).collect();
                writeln!(f, "{route}: {}", list.join(", "))?;
            }
        }
        Ok(())
    }
}
