//! The watchdog's broker queries, on a thread of their own.
//!
//! A stall check asks the brokers for the group's committed offsets and
//! the partitions' watermarks. Each answer may take long: a broker answers
//! one request of a connection at a time, so a watermark query waits
//! behind the consumer's fetch long poll (`fetch.wait.max.ms`, 500 ms by
//! default), and a broker that stopped answering holds it until its
//! timeout. On the polling thread that time was taken from polling, from
//! rebalance callbacks and from pausing and resuming. Here the polling
//! thread only hands over what it sees (its partitions' positions, read
//! locally) and later takes the answer: the partitions found behind their
//! high watermark, which it restarts only if nothing changed meanwhile
//! (the same assignment, the same positions).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Weak};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use super::context::{KafkaContext, Shared};
use super::watchdog::{OffsetReset, stalled_at};

/// Bound on each broker query of a check (committed offsets, the high
/// watermarks of every partition in one round, the low ones in another).
/// Off the polling thread, it bounds only how stale an answer may be.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// One assigned partition as the polling thread saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Watched {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    /// The next offset the consumer returns, `None` before its first
    /// message of the partition.
    pub(crate) position: Option<i64>,
    /// Where the partition starts without a committed offset.
    pub(crate) reset: OffsetReset,
}

/// A partition found behind its high watermark, to resume at `resume_at`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Stalled {
    pub(crate) seen: Watched,
    pub(crate) resume_at: i64,
}

struct Request {
    /// The polling thread's assignment epoch when it asked.
    epoch: u64,
    partitions: Vec<Watched>,
}

/// The answer to a [`Request`].
pub(crate) struct Answer {
    pub(crate) epoch: u64,
    pub(crate) stalled: Vec<Stalled>,
}

/// The polling thread's end of the checker: at most one check in flight.
pub(crate) struct StallCheck {
    requests: SyncSender<Request>,
    answers: Receiver<Answer>,
    in_flight: bool,
}

impl StallCheck {
    /// Starts the checker thread. It holds the consumer only while it asks
    /// the brokers, and ends once this end is dropped (after the check in
    /// flight, at most two [`QUERY_TIMEOUT`]s and a committed-offsets
    /// query).
    pub(crate) fn spawn(
        consumer: Weak<BaseConsumer<KafkaContext>>,
        shared: Arc<Shared>,
    ) -> std::io::Result<Self> {
        let (requests, asked) = std::sync::mpsc::sync_channel::<Request>(1);
        let (answer, answers) = std::sync::mpsc::sync_channel::<Answer>(1);
        std::thread::Builder::new()
            .name("intake-kafka-watch".into())
            .spawn(move || {
                while let Ok(request) = asked.recv() {
                    let Some(consumer) = consumer.upgrade() else {
                        return;
                    };
                    shared.stall_checks_begun.fetch_add(1, Ordering::AcqRel);
                    let stalled = check(&consumer, &request.partitions, &shared.stop);
                    drop(consumer);
                    shared.stall_checks_ended.fetch_add(1, Ordering::AcqRel);
                    let answered = Answer {
                        epoch: request.epoch,
                        stalled,
                    };
                    if answer.send(answered).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Self {
            requests,
            answers,
            in_flight: false,
        })
    }

    /// Whether a check was asked for and not answered yet.
    pub(crate) fn in_flight(&self) -> bool {
        self.in_flight
    }

    /// Asks for a check of `partitions`; false when one is in flight or
    /// the checker is gone.
    pub(crate) fn ask(&mut self, epoch: u64, partitions: Vec<Watched>) -> bool {
        if self.in_flight {
            return false;
        }
        match self.requests.try_send(Request { epoch, partitions }) {
            Ok(()) => {
                self.in_flight = true;
                true
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        }
    }

    /// The answer to the check in flight, if it came.
    pub(crate) fn answer(&mut self) -> Option<Answer> {
        match self.answers.try_recv() {
            Ok(answer) => {
                self.in_flight = false;
                Some(answer)
            }
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => {
                self.in_flight = false;
                None
            }
        }
    }
}

/// The partitions of `partitions` that are behind their high watermark:
/// their position (or, before their first message, the group's committed
/// offset, else where the reset policy starts them) below it. A partition
/// the brokers did not answer for is left out.
fn check(
    consumer: &BaseConsumer<KafkaContext>,
    partitions: &[Watched],
    stop: &AtomicBool,
) -> Vec<Stalled> {
    let mut unstarted = TopicPartitionList::new();
    for watched in partitions
        .iter()
        .filter(|watched| watched.position.is_none())
    {
        unstarted.add_partition(&watched.topic, watched.partition);
    }
    let starts = if unstarted.count() > 0 {
        consumer.committed_offsets(unstarted, QUERY_TIMEOUT).ok()
    } else {
        None
    };
    let start_of = |watched: &Watched| -> Option<i64> {
        let start = starts
            .as_ref()?
            .find_partition(&watched.topic, watched.partition)?;
        match start.offset() {
            Offset::Offset(next) => Some(next),
            _ => None,
        }
    };
    if stop.load(Ordering::Acquire) {
        return Vec::new();
    }
    let Some(highs) = watermarks(consumer, partitions.iter(), Offset::End) else {
        return Vec::new();
    };
    // Low watermarks only where the start depends on them.
    let from_low: Vec<&Watched> = partitions
        .iter()
        .filter(|watched| {
            watched.position.is_none()
                && start_of(watched).is_none()
                && watched.reset == OffsetReset::Earliest
        })
        .collect();
    let lows = if from_low.is_empty() || stop.load(Ordering::Acquire) {
        None
    } else {
        watermarks(consumer, from_low.iter().copied(), Offset::Beginning)
    };
    let offset_in = |list: Option<&TopicPartitionList>, watched: &Watched| -> Option<i64> {
        let element = list?.find_partition(&watched.topic, watched.partition)?;
        if element.error().is_err() {
            return None;
        }
        match element.offset() {
            Offset::Offset(offset) => Some(offset),
            _ => None,
        }
    };
    partitions
        .iter()
        .filter_map(|watched| {
            let high = offset_in(Some(&highs), watched)?;
            let position = watched
                .position
                .or_else(|| start_of(watched))
                .or(match watched.reset {
                    OffsetReset::Earliest => offset_in(lows.as_ref(), watched),
                    // Starts at the end: nothing the broker holds now is due.
                    OffsetReset::Latest | OffsetReset::Error => None,
                });
            let resume_at = stalled_at(position, high)?;
            Some(Stalled {
                seen: watched.clone(),
                resume_at,
            })
        })
        .collect()
}

/// The high (`Offset::End`) or low (`Offset::Beginning`) watermarks of
/// `partitions`, in one query per leader broker (librdkafka's
/// `offsets_for_times` with the logical offsets as times), not one round
/// trip per partition. `None` when the brokers did not answer in time.
fn watermarks<'a>(
    consumer: &BaseConsumer<KafkaContext>,
    partitions: impl Iterator<Item = &'a Watched>,
    which: Offset,
) -> Option<TopicPartitionList> {
    let mut list = TopicPartitionList::new();
    for watched in partitions {
        // A partition of the consumer's own assignment: adding it with a
        // logical offset cannot fail.
        let _ = list.add_partition_offset(&watched.topic, watched.partition, which);
    }
    if list.count() == 0 {
        return None;
    }
    match consumer.offsets_for_times(list, QUERY_TIMEOUT) {
        Ok(answered) => Some(answered),
        Err(error) => {
            tracing::debug!(%error, "the stall check's watermark query failed; the next check asks again");
            None
        }
    }
}
