//! [`NatsAcker`]: every finished delivery acknowledged on its own (`+ACK`,
//! the commit engine's ids mode), every retry handed back with `-NAK` and
//! the redelivery backoff's delay, each batch confirmed by the server.
//!
//! JetStream acknowledges deliveries one by one, not a position: there is
//! no watermark to commit, so the acker ignores the watermark and sends
//! the completed ids, in any order, as soon as they finish. The server
//! confirms a batch with one reply to its last ack (see `confirm.rs` for
//! why that confirms them all), and only then does the acker forget the
//! deliveries; a batch that was not confirmed fails, and the runtime sends
//! its work again.
//!
//! A message [parked](crate::NatsParking) (`PartitionAck::requeue_after`
//! of a delivery the parking kept) waits in the process until due, still
//! held: nothing is sent for it, and the source gives it back once due.
//!
//! Any other delivery handed back with a delay (a handler's `retry_later`
//! without the parking layer, a park past the room for parked messages)
//! goes back with `-NAK {"delay":…}`, in the same batch and under the same
//! confirmation as the rest. Such a delivery leaves the held set *before*
//! its nak is sent, not after the confirmation: the server takes a `+WPI`
//! that arrives after a delayed nak as "redeliver `ack_wait` from now"
//! (measured on nats-server 2.9.10: a 3 s delay with a 1 s `ack_wait` came
//! back after 1 s), so a progress report landing behind the nak would
//! bring a long delay back early. If the batch is not confirmed, the
//! runtime's resend finds it no longer held and sends nothing: the server
//! redelivers it after its delay if the nak landed, after `ack_wait` if
//! not; never lost.

use std::sync::Arc;
use std::time::Duration;

use async_nats::Subject;
use bytes::Bytes;
use intake_core::{
    BackoffPolicy, Position,
    backend::{AckBatch, AckError, AckMode, Acker},
};
use tokio::time::Instant;

use crate::confirm::Confirmations;
use crate::counters::NatsCounters;
use crate::deliveries::Deliveries;
use crate::parking::ParkedHere;

/// Sends acknowledgements for a [`NatsSource`](crate::NatsSource); get it
/// from [`NatsSource::acker`](crate::NatsSource::acker).
pub struct NatsAcker {
    deliveries: Arc<Deliveries>,
    parked_here: Arc<ParkedHere>,
    confirmations: Confirmations,
    redelivery_backoff: Arc<dyn BackoffPolicy>,
    /// The nak delay once the redelivery backoff gives up: the consumer's
    /// `ack_wait`, the pace of a delivery nobody acknowledged.
    nak_delay_cap: Duration,
    ack_timeout: Duration,
    endpoint: Arc<str>,
    counters: Arc<NatsCounters>,
    /// Reused per batch.
    sequences: Vec<u64>,
    requeued: Vec<u64>,
    requeued_after: Vec<(u64, Duration)>,
    /// The parked deliveries of a batch, out of the held set before their
    /// naks go.
    parked: Vec<(u64, u32)>,
    acks: Vec<(Subject, Bytes)>,
    settled: Vec<(u64, u32)>,
}

impl std::fmt::Debug for NatsAcker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsAcker")
            .field("endpoint", &self.endpoint)
            .field("held", &self.deliveries.len())
            .finish_non_exhaustive()
    }
}

/// The stream sequence a position stands for.
pub(crate) fn sequence(position: Position) -> Option<u64> {
    match position {
        Position::Offset(offset) => u64::try_from(offset).ok(),
        other => {
            tracing::error!(%other, "a NATS acker was given a position that is not a stream sequence; ignored");
            None
        }
    }
}

impl NatsAcker {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        client: async_nats::Client,
        deliveries: Arc<Deliveries>,
        parked_here: Arc<ParkedHere>,
        redelivery_backoff: Arc<dyn BackoffPolicy>,
        nak_delay_cap: Duration,
        ack_timeout: Duration,
        endpoint: Arc<str>,
        counters: Arc<NatsCounters>,
    ) -> Self {
        Self {
            deliveries,
            parked_here,
            confirmations: Confirmations::new(client),
            redelivery_backoff,
            nak_delay_cap,
            ack_timeout,
            endpoint,
            counters,
            sequences: Vec::new(),
            requeued: Vec::new(),
            requeued_after: Vec::new(),
            parked: Vec::new(),
            acks: Vec::new(),
            settled: Vec::new(),
        }
    }
}

/// The `-NAK` body for a delivery the server made `delivered` times: the
/// redelivery backoff's delay for that retry, at most `cap`.
fn nak(backoff: &dyn BackoffPolicy, cap: Duration, delivered: u32) -> Bytes {
    let delay = backoff
        .delay(delivered.max(1))
        .unwrap_or(cap)
        .min(cap.max(Duration::from_millis(1)));
    nak_with_delay(delay)
}

/// The longest delay a nak can carry: nats-server reads it as a Go
/// `time.Duration`, nanoseconds in an `i64`. A larger number fails to parse,
/// and the server takes the nak as one without a delay: redelivered at
/// once, the opposite of what was asked.
const MAX_NAK_DELAY: Duration = Duration::from_nanos(i64::MAX as u64);

/// `-NAK {"delay":…}`: redeliver after `delay` (at most about 292 years),
/// not at once.
pub(crate) fn nak_with_delay(delay: Duration) -> Bytes {
    Bytes::from(format!(
        "-NAK {{\"delay\":{}}}",
        delay.min(MAX_NAK_DELAY).as_nanos()
    ))
}

const ACK: Bytes = Bytes::from_static(b"+ACK");

impl Acker for NatsAcker {
    fn mode(&self) -> AckMode {
        AckMode::Ids
    }

    fn supports_requeue(&self) -> bool {
        true
    }

    /// A parked message goes back with `-NAK {"delay":…}`: the server holds
    /// it, unacknowledged, until the delay is over.
    fn supports_delayed_requeue(&self) -> bool {
        true
    }

    async fn ack(&mut self, batch: &AckBatch) -> Result<(), AckError> {
        self.sequences.clear();
        self.requeued.clear();
        self.requeued_after.clear();
        for partition in &batch.partitions {
            self.requeued
                .extend(partition.requeue.iter().copied().filter_map(sequence));
            self.requeued_after.extend(
                partition
                    .requeue_after
                    .iter()
                    .filter_map(|&(position, delay)| Some((sequence(position)?, delay))),
            );
            self.sequences
                .extend(partition.completed.iter().copied().filter_map(sequence));
        }
        if self.sequences.is_empty() && self.requeued.is_empty() && self.requeued_after.is_empty() {
            return Ok(());
        }
        // Naks first: a batch applies its requeues before its acks. A
        // sequence no longer held was settled before (a dead letter's
        // term, a batch resent after its confirmation was lost): nothing
        // to send for it.
        let (backoff, cap) = (&*self.redelivery_backoff, self.nak_delay_cap);
        let (acks, settled) = (&mut self.acks, &mut self.settled);
        acks.clear();
        settled.clear();
        self.deliveries.lookup(&self.requeued, |sequence, held| {
            acks.push((held.reply.clone(), nak(backoff, cap, held.delivered)));
            settled.push((sequence, held.delivered));
        });
        let parked = &mut self.parked;
        parked.clear();
        let now = Instant::now();
        let mut parked_here = 0;
        // One lookup per park, each with its own delay: parks are rare
        // beside acks.
        for &(sequence, delay) in &self.requeued_after {
            // A park the parking asked to keep here waits here, still held
            // (see `NatsParking`): no nak, no delivery more.
            if let Some(message) = self.parked_here.take_asked(sequence) {
                if self.deliveries.get(sequence).is_some() {
                    self.parked_here.wait(sequence, message, now + delay);
                    parked_here += 1;
                }
                continue;
            }
            // Parked here already: a batch sent again after a lost
            // confirmation.
            if self.parked_here.is_waiting(sequence) {
                continue;
            }
            self.deliveries.lookup(&[sequence], |sequence, held| {
                acks.push((held.reply.clone(), nak_with_delay(delay)));
                parked.push((sequence, held.delivered));
            });
        }
        if parked_here > 0 {
            self.counters.add_parked_here(parked_here);
        }
        // Parks asked for but finished otherwise (not handed back) are
        // forgotten.
        self.parked_here.forget_asked(&self.sequences);
        self.parked_here.forget_asked(&self.requeued);
        // Out of the held set before the naks go, so that the progress task
        // sends no `+WPI` behind them (see the module docs).
        if !self.parked.is_empty() {
            self.deliveries.release(self.parked.drain(..));
        }
        let naks = acks.len();
        self.deliveries.lookup(&self.sequences, |sequence, held| {
            acks.push((held.reply.clone(), ACK));
            settled.push((sequence, held.delivered));
        });
        // One confirmation for the whole batch: sound because the server
        // applies one connection's acks to a consumer in order (see
        // `confirm.rs`).
        self.confirmations
            .send(self.acks.drain(..), self.ack_timeout)
            .await
            .map_err(|unconfirmed| {
                AckError::from(unconfirmed.into_error(
                    &self.endpoint,
                    "acknowledgements",
                    self.ack_timeout,
                ))
            })?;
        self.counters.add_naks(naks);
        self.deliveries.release(self.settled.drain(..));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nak_carries_its_delay_in_nanoseconds() {
        assert_eq!(
            &nak_with_delay(Duration::from_millis(1_500))[..],
            b"-NAK {\"delay\":1500000000}"
        );
    }

    /// A delay past an `i64` of nanoseconds would not parse on the server,
    /// which then redelivers at once.
    #[test]
    fn a_delay_too_long_for_the_server_is_capped_not_dropped() {
        let body = nak_with_delay(Duration::MAX);
        assert_eq!(
            &body[..],
            format!("-NAK {{\"delay\":{}}}", i64::MAX).as_bytes()
        );
    }
}
