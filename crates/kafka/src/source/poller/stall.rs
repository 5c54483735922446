//! The polling thread's side of the stall check: after an interval without
//! messages it asks the checker (a thread of its own) whether a partition
//! is stalled behind its high watermark, and acts on the answer.

use super::pause::is_held;
use super::*;

impl Poller {
    /// Asks the checker (a thread of its own) whether a partition is
    /// stalled behind its high watermark: called after an interval without
    /// messages. The polling thread reads its positions (locally) and goes
    /// on polling; the brokers' answers come back in
    /// [`take_stall_answer`](Self::take_stall_answer).
    pub(super) fn ask_for_stall_check(&mut self) {
        if self.paused || self.shared.handoff.fill().messages > 0 {
            return;
        }
        let Some(check) = &mut self.stall_check else {
            return;
        };
        if check.in_flight() {
            return;
        }
        let Ok(positions) = self.consumer.position() else {
            return;
        };
        // A partition the runtime paused is behind its high watermark on
        // purpose.
        let held = self.shared.handoff.held();
        let partitions: Vec<Watched> = positions
            .elements()
            .iter()
            .filter(|element| !is_held(&held, element.topic(), element.partition()))
            .map(|element| Watched {
                topic: element.topic().to_owned(),
                partition: element.partition(),
                position: match element.offset() {
                    Offset::Offset(next) => Some(next),
                    _ => None,
                },
                reset: if self.earliest.contains(element.topic()) {
                    OffsetReset::Earliest
                } else {
                    self.reset
                },
            })
            .collect();
        if !partitions.is_empty() {
            check.ask(self.assignment_epoch, partitions);
        }
    }

    /// Restarts the fetchers of the partitions the checker found stalled,
    /// if nothing changed since it was asked: the same assignment, not
    /// paused, nothing waiting for the runtime, and each partition still at
    /// the position the check judged (one that moved is not stalled). The
    /// next check comes an interval after this answer, not after the ask:
    /// a check slower than the interval never follows another at once.
    pub(super) fn take_stall_answer(&mut self) {
        let Some(answer) = self.stall_check.as_mut().and_then(StallCheck::answer) else {
            return;
        };
        self.watchdog.restart(Instant::now());
        if answer.stalled.is_empty() {
            return;
        }
        if answer.epoch != self.assignment_epoch
            || self.shared.assignment_changed.load(Ordering::Acquire)
            || self.paused
            || self.shared.handoff.fill().messages > 0
        {
            tracing::debug!(
                "the assignment or the flow changed during the stall check; its answer is dropped"
            );
            return;
        }
        let Ok(positions) = self.consumer.position() else {
            return;
        };
        let held = self.shared.handoff.held();
        let mut stalled = TopicPartitionList::new();
        for found in &answer.stalled {
            let seen = &found.seen;
            if is_held(&held, &seen.topic, seen.partition) {
                // Paused by the runtime since the check was asked.
                continue;
            }
            let now = positions
                .find_partition(&seen.topic, seen.partition)
                .map(|element| match element.offset() {
                    Offset::Offset(next) => Some(next),
                    _ => None,
                });
            if now != Some(seen.position) {
                continue;
            }
            // Adding to a list of this consumer's own partitions cannot fail.
            let _ = stalled.add_partition_offset(
                &seen.topic,
                seen.partition,
                Offset::Offset(found.resume_at),
            );
        }
        if stalled.count() == 0 {
            return;
        }
        tracing::warn!(
            partitions = ?stalled.elements().iter().map(|e| (e.topic().to_owned(), e.partition())).collect::<Vec<_>>(),
            "kafka consumer stalled behind the high watermark; restarting its fetchers"
        );
        if let Err(error) = self.consumer.resume(&stalled) {
            tracing::warn!(%error, "watchdog resume failed");
        }
        if let Err(error) = self.consumer.seek_partitions(stalled, Duration::ZERO) {
            tracing::warn!(%error, "watchdog seek failed");
        }
    }
}
