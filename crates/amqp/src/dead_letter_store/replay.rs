//! Replaying a pass's letters: published in windows, acknowledged once
//! confirmed.

use intake_core::ErrorClass;
use intake_core::dead_letter::store::{
    LetterId, Replay, ReplayReport, Selection, SkipReason, StoreError,
};
use intake_core::publish::PublishError;
use intake_core::publish::Publisher;

use crate::publisher::AmqpReceipt;

use super::AmqpDeadLetterStore;
use super::pass::{Entry, Pass};
use super::selection::{Wanted, skipped};

/// Letters a replay publishes before it awaits their confirms.
const BATCH: usize = 256;

/// Payload bytes a replay publishes before it awaits their confirms (one
/// letter at least): with [`BATCH`], what a pass holds in memory at most,
/// besides the letter it reads.
const WINDOW_BYTES: usize = 32 << 20;

impl AmqpDeadLetterStore {
    /// Publishes the letters of `window` (sent already), waits for their
    /// confirms, acknowledges the confirmed ones; the first failure stops
    /// the replay.
    async fn settle(
        &self,
        pass: &mut Pass,
        window: &mut Window,
        report: &mut ReplayReport,
        replay: &Replay,
    ) -> Result<(), StoreError> {
        if window.receipts.is_empty() && window.failure.is_none() {
            return Ok(());
        }
        let mut failure = window.failure.take();
        let mut confirmed = Vec::with_capacity(window.receipts.len());
        for (tag, id, class, receipt) in window.receipts.drain(..) {
            match receipt.await {
                Ok(_) => confirmed.push((tag, class)),
                Err(error) => {
                    if failure.is_none() {
                        failure = Some((id, error));
                    }
                }
            }
        }
        window.bytes = 0;
        let tags: Vec<u64> = confirmed.iter().map(|(tag, _)| *tag).collect();
        self.ack(pass, &tags)
            .await
            .map_err(|error| self.failed("remove letters from", error))?;
        report.replayed += tags.len() as u64;
        for (_, class) in confirmed {
            *report.by_class.entry(class.as_str()).or_default() += 1;
        }
        replay.report_progress(report.replayed);
        match failure {
            Some((id, source)) => Err(StoreError::Replay {
                id,
                report: Box::new(std::mem::take(report)),
                source,
            }),
            None => Ok(()),
        }
    }

    pub(super) async fn replay_pass(
        &self,
        pass: &mut Pass,
        selection: &Selection,
        replay: &Replay,
        report: &mut ReplayReport,
    ) -> Result<(), StoreError> {
        let mut wanted = Wanted::of(selection);
        let mut window = Window::default();
        while !wanted.all_found() {
            let Some(entry) = self
                .next(pass)
                .await
                .map_err(|error| self.failed("read", error))?
            else {
                break;
            };
            let Entry { tag, stored } = entry;
            if !wanted.takes(&stored) {
                continue;
            }
            let letter = match (replay.skips(&stored), &stored.letter) {
                (Some(reason), _) => {
                    report.skipped.push(skipped(stored.id, reason));
                    continue;
                }
                (None, Ok(letter)) => letter,
                (None, Err(_)) => continue,
            };
            if replay.is_dry_run() {
                report.replayed += 1;
                *report.by_class.entry(letter.class.as_str()).or_default() += 1;
                continue;
            }
            // A queue is its consumers' own: the way back to the group is
            // the queue the letter came from.
            let output = replay.output_of(letter, Some(letter.message.metadata().source()))?;
            match self.publisher.send(output).await {
                Ok(receipt) => {
                    window.bytes += stored.payload_bytes;
                    window
                        .receipts
                        .push((tag, stored.id, letter.class, receipt));
                }
                Err(error) => window.failure = Some((stored.id, error)),
            }
            if window.failure.is_some()
                || window.receipts.len() >= BATCH
                || window.bytes >= WINDOW_BYTES
            {
                self.settle(pass, &mut window, report, replay).await?;
            }
        }
        self.settle(pass, &mut window, report, replay).await?;
        if replay.is_dry_run() {
            replay.report_progress(report.replayed);
        }
        let missing = wanted.missing();
        if self.short(pass) && (wanted.is_filter() || !missing.is_empty()) {
            return Err(self.stopped_short(
                "replay every letter of",
                pass,
                format!(
                    "{} {} replayed",
                    report.replayed,
                    if report.dry_run { "would be" } else { "were" }
                ),
            ));
        }
        report.skipped.extend(
            missing
                .into_iter()
                .map(|id| skipped(id, SkipReason::NotFound)),
        );
        Ok(())
    }
}

/// The replayed letters whose confirms are awaited: at most [`BATCH`]
/// letters and about [`WINDOW_BYTES`] of payload.
#[derive(Default)]
struct Window {
    receipts: Vec<(u64, LetterId, ErrorClass, AmqpReceipt)>,
    bytes: usize,
    /// A letter whose publish failed: the replay stops after the window.
    failure: Option<(LetterId, PublishError)>,
}
