//! Why a command failed, and the exit code each reason maps to.
//!
//! The codes are the command's interface for scripts (see the crate docs):
//! they only ever grow, and a code never changes its meaning.

use std::error::Error as StdError;
use std::process::ExitCode;
use std::time::Duration;

use crate::output::escaped;

/// Any error a backend's client returns.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Exit code: the broker could not be reached, did not answer in time, or
/// the connection broke. Trying again later may succeed.
pub const EXIT_UNAVAILABLE: u8 = 1;
/// Exit code: the arguments are wrong (clap's own code for usage errors).
pub const EXIT_USAGE: u8 = 2;
/// Exit code: the broker answered but refused (an unknown source, group,
/// queue or consumer, a permission), or knows nothing of the source.
/// Trying again will not help until something changes.
pub const EXIT_REFUSED: u8 = 3;
/// Exit code: the command is not supported yet for this broker.
pub const EXIT_UNSUPPORTED: u8 = 4;
/// Exit code: a purge was not confirmed; nothing was deleted.
pub const EXIT_NOT_CONFIRMED: u8 = 5;

/// Why a command failed. `Display` says this level only; the client's
/// error, where there is one, is the [`source`](StdError::source).
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// The arguments are wrong; the text says what to change.
    #[error("{0}")]
    Usage(String),
    /// The broker could not be reached or the connection broke.
    #[error("{what}: the broker could not be reached")]
    Unavailable {
        /// What the command was doing.
        what: String,
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// The broker did not answer in time.
    #[error("{what}: the broker did not answer within {after:?}")]
    TimedOut {
        /// What the command was doing.
        what: String,
        /// How long it waited.
        after: Duration,
    },
    /// The broker refused or answered something unusable.
    #[error("{what}: the broker refused")]
    Refused {
        /// What the command was doing.
        what: String,
        /// The broker's or client's error.
        #[source]
        source: BoxError,
    },
    /// The broker knows nothing of what was asked.
    #[error("{0}")]
    NotFound(String),
    /// What was asked cannot be done as asked (a replay to a group that
    /// has no way back of its own); the text says what to do instead.
    #[error("{0}")]
    NotPossible(String),
    /// A RabbitMQ pass held its most letters (`--amqp-max-letters`) and
    /// stopped before it looked at every letter the command needed; the
    /// source says how far it got and what it did.
    #[error(
        "{what}: the queue holds more letters than one pass reads (--amqp-max-letters, default \
         10000): nothing past them was looked at. Raise --amqp-max-letters (the broker holds \
         that many unacknowledged while the command runs), or replay or purge the letters \
         before them first (purge --yes removes as it goes)"
    )]
    PassLimit {
        /// What the command was doing.
        what: String,
        /// The store's error.
        #[source]
        source: BoxError,
    },
    /// The command exists, but not for this broker yet.
    #[allow(
        dead_code,
        reason = "every broker has a dead-letter store now; exit code 4 stays reserved for one added without"
    )]
    #[error("{command} is not supported yet for this broker ({broker})")]
    Unsupported {
        /// The command, as typed (`dlq count`).
        command: String,
        /// The broker's name.
        broker: &'static str,
    },
    /// A purge was declined at the prompt.
    #[error("purge not confirmed: nothing was deleted")]
    NotConfirmed,
}

impl Failure {
    /// A client's error while doing `what`: [`Unavailable`](Self::Unavailable)
    /// when the client says waiting may fix it (`transient`), otherwise
    /// [`Refused`](Self::Refused).
    pub fn from_client(
        what: &str,
        transient: bool,
        error: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        let what = what.to_owned();
        let source = Box::new(error);
        if transient {
            Failure::Unavailable { what, source }
        } else {
            Failure::Refused { what, source }
        }
    }

    /// The exit code scripts see for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Usage(_) => EXIT_USAGE,
            Failure::Unavailable { .. } | Failure::TimedOut { .. } => EXIT_UNAVAILABLE,
            Failure::Refused { .. }
            | Failure::NotFound(_)
            | Failure::NotPossible(_)
            | Failure::PassLimit { .. } => EXIT_REFUSED,
            Failure::Unsupported { .. } => EXIT_UNSUPPORTED,
            Failure::NotConfirmed => EXIT_NOT_CONFIRMED,
        }
    }

    /// What to print on stderr: this failure and each cause on a line of
    /// its own, each secret of `url` scrubbed out (the backends redact
    /// their errors already; a client's text quoting the URL is the case
    /// this catches).
    ///
    /// Each line is [escaped]: an error may quote a
    /// name a producer chose (a letter's origin) or a broker's text.
    pub fn report(&self, url: Option<&str>) -> String {
        let mut text = format!("error: {}", escaped(&self.to_string()));
        let mut cause = self.source();
        // Bounded: a cyclic or very deep chain is cut, not followed.
        for _ in 0..16 {
            let Some(error) = cause else { break };
            text.push_str(&format!("\n  caused by: {}", escaped(&error.to_string())));
            cause = error.source();
        }
        match url {
            Some(url) => intake_core::redact::scrub(&text, url),
            None => text,
        }
    }

    /// The exit code as the process returns it.
    pub fn exit(&self) -> ExitCode {
        ExitCode::from(self.exit_code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_the_documented_ones() {
        let io = || -> BoxError { Box::new(std::io::Error::other("x")) };
        let cases = [
            (Failure::Usage("u".into()), 2),
            (
                Failure::Unavailable {
                    what: "w".into(),
                    source: io(),
                },
                1,
            ),
            (
                Failure::TimedOut {
                    what: "w".into(),
                    after: Duration::from_secs(1),
                },
                1,
            ),
            (
                Failure::Refused {
                    what: "w".into(),
                    source: io(),
                },
                3,
            ),
            (Failure::NotFound("n".into()), 3),
            (Failure::NotPossible("n".into()), 3),
            (
                Failure::PassLimit {
                    what: "w".into(),
                    source: io(),
                },
                3,
            ),
            (
                Failure::Unsupported {
                    command: "dlq count".into(),
                    broker: "Kafka",
                },
                4,
            ),
            (Failure::NotConfirmed, 5),
        ];
        for (failure, code) in cases {
            assert_eq!(failure.exit_code(), code, "{failure}");
        }
    }

    #[test]
    fn the_report_escapes_what_a_broker_or_a_letter_put_in_an_error() {
        // A publish error names the letter's origin, which a producer
        // controls; a client's error may quote what the broker sent.
        let failure = Failure::Refused {
            what: "dlq replay".into(),
            source: Box::new(std::io::Error::other(
                "no such queue \x1b]0;owned\x07\u{9b}2J\u{202e}\nerror: forged",
            )),
        };
        let report = failure.report(None);
        assert_eq!(
            report,
            "error: dlq replay: the broker refused\n  \
             caused by: no such queue \\x1b]0;owned\\x07\\u{9b}2J\\u{202e}\\nerror: forged"
        );
    }

    #[test]
    fn the_report_prints_the_chain_once_and_no_password() {
        let failure = Failure::Unavailable {
            what: "lag of orders".into(),
            source: Box::new(std::io::Error::other(
                "connect to amqp://app:s3cret@h:5672 refused",
            )),
        };
        let report = failure.report(Some("amqp://app:s3cret@h:5672/%2f"));
        assert_eq!(
            report,
            "error: lag of orders: the broker could not be reached\n  \
             caused by: connect to amqp://app:***@h:5672 refused"
        );
    }
}
