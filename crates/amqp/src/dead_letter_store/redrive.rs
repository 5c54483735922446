//! Redriving a pass's letters: published in windows, acknowledged once
//! confirmed.

use intake_core::ErrorClass;
use intake_core::dead_letter::store::{
    LetterId, Redrive, RedriveReport, Selection, SkipReason, StoreError,
};
use intake_core::publish::PublishError;
use intake_core::publish::Publisher;

use crate::publisher::AmqpReceipt;

use super::AmqpDeadLetterStore;
use super::pass::{Entry, Pass};
use super::selection::{Wanted, skipped};

/// Letters a redrive publishes before it awaits their confirms.
const BATCH: usize = 256;

/// Payload bytes a redrive publishes before it awaits their confirms (one
/// letter at least): with [`BATCH`], what a pass holds in memory at most,
/// besides the letter it reads.
const WINDOW_BYTES: usize = 32 << 20;

impl AmqpDeadLetterStore {
    /// Publishes the letters of `window` (sent already), waits for their
    /// confirms, acknowledges the confirmed ones; the first failure stops
    /// the redrive.
    async fn settle(
        &self,
        pass: &mut Pass,
        window: &mut Window,
        report: &mut RedriveReport,
        redrive: &Redrive,
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
        report.redriven += tags.len() as u64;
        for (_, class) in confirmed {
            *report.by_class.entry(class.as_str()).or_default() += 1;
        }
        redrive.report_progress(report.redriven);
        match failure {
            Some((id, source)) => Err(StoreError::Redrive {
                id,
                report: Box::new(std::mem::take(report)),
                source,
            }),
            None => Ok(()),
        }
    }

    pub(super) async fn redrive_pass(
        &self,
        pass: &mut Pass,
        selection: &Selection,
        redrive: &Redrive,
        report: &mut RedriveReport,
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
            let letter = match (redrive.skips(&stored), &stored.letter) {
                (Some(reason), _) => {
                    report.skipped.push(skipped(stored.id, reason));
                    continue;
                }
                (None, Ok(letter)) => letter,
                (None, Err(_)) => continue,
            };
            if redrive.is_dry_run() {
                report.redriven += 1;
                *report.by_class.entry(letter.class.as_str()).or_default() += 1;
                continue;
            }
            // A queue is its consumers' own: the way back to the group is
            // the queue the letter came from.
            let output = redrive.output_of(letter, Some(letter.message.metadata().source()))?;
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
                self.settle(pass, &mut window, report, redrive).await?;
            }
        }
        self.settle(pass, &mut window, report, redrive).await?;
        if redrive.is_dry_run() {
            redrive.report_progress(report.redriven);
        }
        let missing = wanted.missing();
        if self.short(pass) && (wanted.is_filter() || !missing.is_empty()) {
            return Err(self.stopped_short(
                "redrive every letter of",
                pass,
                format!(
                    "{} {} redriven",
                    report.redriven,
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

/// The redriven letters whose confirms are awaited: at most [`BATCH`]
/// letters and about [`WINDOW_BYTES`] of payload.
#[derive(Default)]
struct Window {
    receipts: Vec<(u64, LetterId, ErrorClass, AmqpReceipt)>,
    bytes: usize,
    /// A letter whose publish failed: the redrive stops after the window.
    failure: Option<(LetterId, PublishError)>,
}
