//! A consumer group's control channel: the log through which the instances
//! of a group share pauses, resumes and what each of them runs, through the
//! broker itself.
//!
//! A service runs as several instances (replicas) of one consumer group. A
//! pause issued at any of them must reach the instance that owns the
//! partition now, and must still hold after a rebalance moves the partition
//! to another instance. Each backend keeps, per group, two append-only logs
//! on its broker ([`ControlLog`]):
//!
//! - **commands** ([`GroupCommand`]): pause and resume. Every instance reads
//!   the whole log from its start and applies each command, in log order,
//!   to its own routes ([`AppControl`](crate::app::AppControl)). Since a
//!   pause names a partition and every instance holds it, the partition is
//!   paused wherever the group assigns it, now or after any rebalance, and
//!   an instance started later replays the log and holds it too. The log is
//!   kept without a time limit: a pause lasts until a resume.
//! - **status**: what each instance runs (its routes, partitions, positions,
//!   pauses), appended by each instance at every console sample, so that any
//!   instance's console shows the group. Kept for a short time only.
//!
//! Where each backend keeps them:
//!
//! | backend | commands | status |
//! |---|---|---|
//! | memory | in the broker, per group | in the broker, per group |
//! | Kafka | topic `{group}.intake-control`, one partition | topic `{group}.intake-status`, one partition, one hour's retention |
//! | Redis Streams | stream `{group}:intake-control` | stream `{group}:intake-status`, trimmed to about 10,000 entries |
//! | RabbitMQ | stream queue `{group}.intake-control` | stream queue `{group}.intake-status`, one hour's age |
//! | NATS JetStream | stream `INTAKE_CONTROL_{group}` | stream `INTAKE_STATUS_{group}`, one hour's age |
//!
//! A [`ControlChannel`] moves opaque records: the encoding is core's
//! ([`GroupCommand::encode`]), the same on every backend.
//!
//! ```
//! use futures_util::StreamExt;
//! use intake_core::group_control::{ControlChannel, ControlLog, GroupCommand};
//! use intake_core::memory::MemoryBroker;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = MemoryBroker::new();
//! let channel = broker.group_control_channel("billing", ControlLog::Commands);
//! channel
//!     .append(GroupCommand::pause_partition("orders", "orders", 1, "instance-a").encode())
//!     .await?;
//! let mut feed = channel.follow().await?;
//! let record = feed.next().await.expect("the pause")?;
//! assert!(GroupCommand::decode(&record)?.pause);
//! # Ok(())
//! # }
//! ```

mod command;
mod group;

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::BoxStream;

use crate::error::BoxError;

use command::Entry;
pub use command::{CommandTarget, GroupCommand, MalformedCommand};
pub use group::{CatchUpError, GroupControl};

/// Which of a group's two control logs a channel reads and appends to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ControlLog {
    /// Pauses and resumes: read from the start by every instance, kept
    /// until deleted.
    Commands,
    /// What each instance runs: short-lived (an hour, or a bounded count).
    Status,
}

impl ControlLog {
    /// `control` or `status`: the part of a broker-side name that says
    /// which log it is (`{group}.intake-control`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Commands => "control",
            Self::Status => "status",
        }
    }

    /// How long a backend with time-based retention keeps the log's
    /// records: `None` for commands (until deleted), an hour for status.
    pub fn retention(self) -> Option<Duration> {
        match self {
            Self::Commands => None,
            Self::Status => Some(Duration::from_secs(3600)),
        }
    }
}

/// The records of a log, oldest first: every record appended before the
/// feed was opened, then each new one as it is appended. The feed ends
/// only with an error (or when its channel's broker is gone); whoever
/// follows opens a new one after an error and skips what it has seen.
pub type ControlFeed = BoxStream<'static, Result<Bytes, ControlError>>;

/// One of a group's control logs on a broker (see the
/// [module docs](self)): append a record, follow the log from its start.
///
/// Every call is bounded: an append or an open gives up after the backend's
/// timeout with [`ControlError::TimedOut`] or
/// [`ControlError::Unavailable`], and a feed whose broker goes away ends
/// with an error rather than waiting forever, so that the follower can say
/// so and open it again.
pub trait ControlChannel: Send + Sync + 'static {
    /// Which of the group's logs this is.
    fn log(&self) -> ControlLog;

    /// Appends `record`; done once the broker has stored it.
    fn append(&self, record: Bytes) -> impl Future<Output = Result<(), ControlError>> + Send;

    /// Opens a feed of the log from its start (see [`ControlFeed`]).
    fn follow(&self) -> impl Future<Output = Result<ControlFeed, ControlError>> + Send;
}

/// A control channel's call that did not succeed.
///
/// The broker's or client's own error is the
/// [`source`](std::error::Error::source); no variant carries a password or
/// a secret of the connection settings.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// The broker did not answer within the channel's timeout: try again.
    #[error("the broker did not answer on the group's control log within {0:?}")]
    TimedOut(Duration),
    /// The broker could not be reached or the connection broke: trying
    /// again later may succeed.
    #[error("the group's control log could not be reached")]
    Unavailable(#[source] BoxError),
    /// The broker refused the call (a permission, a name it does not
    /// allow): trying again will not help until something changes.
    #[error("the broker refused the call on the group's control log")]
    Refused(#[source] BoxError),
}

impl ControlError {
    /// A backend's failed call: [`Unavailable`](Self::Unavailable) when the
    /// backend deems `error` transient, else [`Refused`](Self::Refused).
    pub fn from_backend(
        error: impl std::error::Error + Send + Sync + 'static,
        transient: bool,
    ) -> Self {
        match transient {
            true => Self::Unavailable(Box::new(error)),
            false => Self::Refused(Box::new(error)),
        }
    }

    /// Whether the same call may succeed later without a change of
    /// settings.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::TimedOut(_) | Self::Unavailable(_))
    }
}
