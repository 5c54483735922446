//! [`Replay`]: where replayed messages go ([`Target`]), the loop guard,
//! the dry run, and the message that replays a letter.

use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use super::{SkipReason, StoreError, StoredLetter};
use crate::dead_letter::envelope::{FAILED_FIRST, REPLAYS};
use crate::dead_letter::{DEFAULT_MAX_REPLAYS, DeadLetter};
use crate::message::Headers;
use crate::publish::Output;

/// Where a replayed message goes.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Target {
    /// Back to the consumer group whose letter it is, alone: through the
    /// group's own way back in
    /// ([`DeadLetterLog::way_back_to_group`](super::DeadLetterLog::way_back_to_group):
    /// a Kafka return topic, a Redis return stream, the group's own AMQP
    /// queue), which no other group reads. A store that knows none refuses
    /// ([`StoreError::NoWayBackToGroup`]) rather than republish to every
    /// group of the origin.
    Group,
    /// The topic, stream or queue it was consumed from
    /// ([`Metadata::source`](crate::Metadata::source)), into the partition
    /// it was consumed from. Every consumer group of the origin handles it
    /// again, not only the one whose letter it is.
    Origin,
    /// Another destination, as the store's publisher names it (an
    /// [`Output`]'s destination).
    Destination(Arc<str>),
}

/// Called with the number of letters replayed so far, after each batch.
pub type Progress = Arc<dyn Fn(u64) + Send + Sync>;

/// How to [`replay`](super::DeadLetterStore::replay): where to, how often a
/// message may be replayed, and whether to move anything at all.
#[derive(Clone)]
#[must_use = "a Replay does nothing until a store is given it"]
pub struct Replay {
    target: Target,
    dry_run: bool,
    max_replays: u32,
    progress: Option<Progress>,
}

impl Replay {
    /// Each message back to its consumer group alone (see
    /// [`Target::Group`]): what an operator means by "replay these letters".
    pub fn to_group() -> Self {
        Self {
            target: Target::Group,
            dry_run: false,
            max_replays: DEFAULT_MAX_REPLAYS,
            progress: None,
        }
    }

    /// Each message back to where it was consumed from, for **every**
    /// consumer group of it (see [`Target::Origin`]).
    pub fn to_origin() -> Self {
        Self {
            target: Target::Origin,
            ..Self::to_group()
        }
    }

    /// Each message to `destination` (an [`Output`]'s destination).
    pub fn to(destination: impl Into<Arc<str>>) -> Self {
        Self {
            target: Target::Destination(destination.into()),
            ..Self::to_group()
        }
    }

    /// Publishes nothing and removes nothing, only reports what would move
    /// and what would be skipped.
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// The loop guard: a letter whose message was replayed this often
    /// already is skipped ([`SkipReason::ReplayLimit`]). 0 replays
    /// nothing.
    pub fn max_replays(mut self, max_replays: u32) -> Self {
        self.max_replays = max_replays;
        self
    }

    /// Calls `progress` with the count replayed so far after each batch
    /// (a progress bar on a long replay).
    pub fn on_progress(mut self, progress: impl Fn(u64) + Send + Sync + 'static) -> Self {
        self.progress = Some(Arc::new(progress));
        self
    }

    /// Where messages go.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Whether it is a dry run.
    pub fn is_dry_run(&self) -> bool {
        self.dry_run
    }

    /// The loop guard's limit.
    pub fn replay_limit(&self) -> u32 {
        self.max_replays
    }

    /// Why `stored` is not replayed, `None` when it is: unreadable, a
    /// reference letter, or past the loop guard.
    pub fn skips(&self, stored: &StoredLetter) -> Option<SkipReason> {
        match &stored.letter {
            Err(_) => Some(SkipReason::Unreadable),
            Ok(letter) if letter.reference.is_some() => Some(SkipReason::Reference),
            Ok(letter) if letter.replays >= self.max_replays => Some(SkipReason::ReplayLimit {
                replays: letter.replays,
            }),
            Ok(_) => None,
        }
    }

    /// Calls the [progress](Self::on_progress) callback, if any, with
    /// `replayed`.
    pub fn report_progress(&self, replayed: u64) {
        if let Some(progress) = &self.progress {
            progress(replayed);
        }
    }

    /// The output that replays `letter`: its original payload, key and
    /// headers, with [`REPLAYS`] one higher and [`FAILED_FIRST`] kept, so
    /// that a failure of the replay is dead-lettered with the count and
    /// time that make the loop guard work. The park headers it carried are
    /// dropped: a replay starts with every park of its budget.
    ///
    /// `way_back_to_group` is the group's way back in, for a replay to
    /// the [group](Target::Group): there the message is marked as the
    /// message first delivered at its origin (the parking layer's
    /// [`ORIGIN`](crate::parking::ORIGIN) headers), so its key keeps its
    /// origin's order and an exactly-once marker knows it. To the group or
    /// the origin it goes into the partition it was consumed from.
    pub fn output_of(
        &self,
        letter: &DeadLetter,
        way_back_to_group: Option<&Arc<str>>,
    ) -> Result<Output, StoreError> {
        use crate::parking::{ORIGIN, ORIGIN_PARTITION, ORIGIN_POSITION, is_park_header};
        let metadata = letter.message.metadata();
        let (destination, partition): (Arc<str>, _) = match &self.target {
            Target::Group => match way_back_to_group {
                Some(way_back) => (way_back.clone(), Some(metadata.partition())),
                None => {
                    return Err(StoreError::NoWayBackToGroup {
                        origin: metadata.source().to_string(),
                    });
                }
            },
            Target::Origin => (Arc::from(&**metadata.source()), Some(metadata.partition())),
            Target::Destination(destination) => (destination.clone(), None),
        };
        let mut headers: Headers = letter
            .message
            .headers()
            .iter()
            .filter(|header| !is_park_header(&header.name))
            .map(|header| (header.name.clone(), header.value.clone()))
            .collect();
        headers.set(REPLAYS, letter.replays.saturating_add(1).to_string());
        headers.set(
            FAILED_FIRST,
            epoch_millis(letter.first_failed_at).to_string(),
        );
        if self.target == Target::Group && destination != *metadata.source() {
            headers.set(ORIGIN, metadata.source().to_string());
            headers.set(ORIGIN_PARTITION, metadata.partition().to_string());
            headers.set(ORIGIN_POSITION, metadata.position().to_string());
        }
        let mut output =
            Output::new(destination, letter.message.payload().clone()).with_headers(headers);
        if let Some(partition) = partition {
            output = output.with_partition(partition);
        }
        Ok(match letter.message.key() {
            Some(key) => output.with_key(key.clone()),
            None => output,
        })
    }
}

impl fmt::Debug for Replay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replay")
            .field("target", &self.target)
            .field("dry_run", &self.dry_run)
            .field("max_replays", &self.max_replays)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

/// Milliseconds since the Unix epoch, as the envelope writes times.
fn epoch_millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    })
}
