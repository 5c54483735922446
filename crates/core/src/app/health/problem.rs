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
                write!(f, "broker unreachable for {}", Elapsed(*since))
            }
            Problem::BackingOff { since } => {
                write!(f, "backing off for {}", Elapsed(*since))
            }
            Problem::Starved { since } => {
                write!(f, "no room in the shared budget for {}", Elapsed(*since))
            }
            Problem::CommitsFailing { since } => {
                write!(f, "commits failing for {}", Elapsed(*since))
            }
            Problem::Part { reason } => f.write_str(reason),
            Problem::Stalled { partition, since } => {
                write!(f, "partition {partition} stalled for {}", Elapsed(*since))
            }
        }
    }
}

/// A duration as an operator reads it in a probe's body or the console:
/// tenths of a second below a minute (`1.3 s`), whole seconds above
/// (`4 min 05 s`, `2 h 03 min`), not `Duration`'s `1.2777041s`.
struct Elapsed(Duration);

impl std::fmt::Display for Elapsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let seconds = self.0.as_secs();
        match seconds {
            0..60 => write!(f, "{:.1} s", self.0.as_secs_f64()),
            60..3600 => write!(f, "{} min {:02} s", seconds / 60, seconds % 60),
            _ => write!(f, "{} h {:02} min", seconds / 3600, seconds % 3600 / 60),
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Elapsed;

    #[test]
    fn elapsed_time_reads_as_an_operator_would_say_it() {
        let said = |duration| Elapsed(duration).to_string();
        assert_eq!(said(Duration::ZERO), "0.0 s");
        assert_eq!(said(Duration::from_micros(1_277_704)), "1.3 s");
        assert_eq!(said(Duration::from_millis(59_940)), "59.9 s");
        assert_eq!(said(Duration::from_secs(60)), "1 min 00 s");
        assert_eq!(said(Duration::from_secs(245)), "4 min 05 s");
        assert_eq!(
            said(Duration::from_secs(2 * 3600 + 3 * 60 + 59)),
            "2 h 03 min"
        );
        assert_eq!(
            said(Duration::MAX),
            format!("{} h {:02} min", u64::MAX / 3600, u64::MAX % 3600 / 60)
        );
    }
}
