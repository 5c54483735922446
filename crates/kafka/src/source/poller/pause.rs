//! The polling thread's pauses: every partition paused while the handoff is
//! full (backpressure), and the partitions the runtime holds (a hold, see
//! `handoff`), released with or without a rewind.

use std::sync::atomic::Ordering;

use intake_core::PartitionKey;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::Consumer;
use rdkafka::topic_partition_list::Offset;

use super::*;

impl Poller {
    /// Pauses every assigned partition when the handoff is full and resumes
    /// them once it drained, polling all the while. After an assignment
    /// change the new assignment is brought to the current state either way:
    /// librdkafka keeps a partition's pause across an unassignment, so a
    /// partition revoked while paused would come back paused and never fetch.
    /// A partition the runtime paused (a hold, see `handoff`) is never
    /// resumed here: only its release resumes it ([`Self::apply_holds`]).
    pub(super) fn apply_backpressure(&mut self) {
        let fill = self.shared.handoff.fill();
        let changed = self.shared.assignment_changed.swap(false, Ordering::AcqRel);
        if changed {
            self.assignment_epoch = self.assignment_epoch.wrapping_add(1);
        }
        if self.paused {
            if self.shared.handoff.has_room(fill) {
                self.set_paused(false);
            } else if changed {
                self.set_paused(true);
            }
        } else if self.shared.handoff.is_full(fill)
            && !self.shared.handoff.wait_for_room(PAUSE_AFTER)
        {
            self.set_paused(true);
        } else if changed {
            self.set_paused(false);
        }
    }

    pub(super) fn set_paused(&mut self, pause: bool) {
        let assignment = match self.consumer.assignment() {
            Ok(assignment) => assignment,
            Err(error) => {
                tracing::warn!(%error, "cannot read the kafka assignment to pause or resume it");
                return;
            }
        };
        self.paused = pause;
        let assignment = if pause {
            assignment
        } else {
            without_held(assignment, &self.shared.handoff.held())
        };
        if assignment.count() == 0 {
            return;
        }
        let result = if pause {
            self.consumer.pause(&assignment)
        } else {
            self.consumer.resume(&assignment)
        };
        match result {
            Ok(()) => tracing::debug!(
                pause,
                partitions = assignment.count(),
                "kafka fetch backpressure"
            ),
            Err(error) => tracing::warn!(%error, pause, "kafka pause/resume failed"),
        }
    }

    /// Pauses in librdkafka the partitions the runtime paused since the
    /// last call, and fetches again those it resumed: from the first
    /// message the handoff left out (librdkafka would go on after the last
    /// one polled), and resumed unless the whole assignment is paused for
    /// backpressure (then its resume resumes them). Both on this thread,
    /// between two polls, so that they never cross the backpressure's own
    /// pauses and resumes. An atomic load when nothing changed.
    pub(super) fn apply_holds(&mut self) {
        let mut changes = Vec::new();
        self.shared.handoff.take_hold_changes(&mut changes);
        for change in changes {
            match change {
                HoldChange::Pause(partition) => {
                    let Some(list) = partition_list(&partition, None) else {
                        continue;
                    };
                    match self.consumer.pause(&list) {
                        Ok(()) => {
                            tracing::debug!(%partition, "kafka partition paused by the runtime")
                        }
                        Err(error) => {
                            tracing::warn!(%error, %partition, "pausing a kafka partition failed; its messages are left out until it is resumed")
                        }
                    }
                }
                HoldChange::Resume {
                    partition,
                    rewind,
                    applied,
                } => {
                    // Seeking first, while it is still paused: librdkafka
                    // then resumes at the sought offset, not after the last
                    // message polled.
                    if let Some(offset) = rewind
                        && let Some(list) = partition_list(&partition, Some(offset))
                        && let Err(error) = self.consumer.seek_partitions(list, Duration::ZERO)
                    {
                        tracing::warn!(%error, %partition, offset, "seeking a resumed kafka partition back failed; its messages from that offset are delivered by its next owner");
                    }
                    if applied && !self.paused {
                        let Some(list) = partition_list(&partition, None) else {
                            continue;
                        };
                        if let Err(error) = self.consumer.resume(&list) {
                            tracing::warn!(%error, %partition, "resuming a kafka partition failed");
                        }
                    }
                    tracing::debug!(%partition, ?rewind, "kafka partition resumed by the runtime");
                }
            }
        }
    }
}

/// Whether `partition` of `topic` is among `held`.
pub(super) fn is_held(held: &[PartitionKey], topic: &str, partition: i32) -> bool {
    held.iter()
        .any(|key| i32::try_from(key.partition) == Ok(partition) && &*key.source == topic)
}

/// `assignment` without the partitions in `held`.
pub(super) fn without_held(
    assignment: TopicPartitionList,
    held: &[PartitionKey],
) -> TopicPartitionList {
    if held.is_empty() {
        return assignment;
    }
    let mut kept = TopicPartitionList::new();
    for element in assignment.elements() {
        if !is_held(held, element.topic(), element.partition()) {
            // Adding to a new list cannot fail for a valid offset.
            let _ =
                kept.add_partition_offset(element.topic(), element.partition(), element.offset());
        }
    }
    kept
}

/// A list of `partition` alone, at `offset` if given; `None` for a
/// partition number librdkafka cannot take (above `i32::MAX`: not Kafka's).
pub(super) fn partition_list(
    partition: &PartitionKey,
    offset: Option<i64>,
) -> Option<TopicPartitionList> {
    let number = i32::try_from(partition.partition).ok()?;
    let mut list = TopicPartitionList::new();
    match offset {
        Some(offset) => list
            .add_partition_offset(&partition.source, number, Offset::Offset(offset))
            .ok()?,
        None => {
            list.add_partition(&partition.source, number);
        }
    }
    Some(list)
}
