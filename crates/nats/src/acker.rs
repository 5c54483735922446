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

use std::sync::Arc;
use std::time::Duration;

use async_nats::Subject;
use bytes::Bytes;
use intake_core::{
    BackoffPolicy, Position,
    backend::{AckBatch, AckError, AckMode, Acker},
};

use crate::confirm::Confirmations;
use crate::counters::Counters;
use crate::deliveries::Deliveries;

/// Sends acknowledgements for a [`NatsSource`](crate::NatsSource); get it
/// from [`NatsSource::acker`](crate::NatsSource::acker).
pub struct NatsAcker {
    deliveries: Arc<Deliveries>,
    confirmations: Confirmations,
    redelivery_backoff: Arc<dyn BackoffPolicy>,
    /// The nak delay once the redelivery backoff gives up: the consumer's
    /// `ack_wait`, the pace of a delivery nobody acknowledged.
    nak_delay_cap: Duration,
    ack_timeout: Duration,
    endpoint: Arc<str>,
    counters: Arc<Counters>,
    /// Reused per batch.
    sequences: Vec<u64>,
    requeued: Vec<u64>,
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
        redelivery_backoff: Arc<dyn BackoffPolicy>,
        nak_delay_cap: Duration,
        ack_timeout: Duration,
        endpoint: Arc<str>,
        counters: Arc<Counters>,
    ) -> Self {
        Self {
            deliveries,
            confirmations: Confirmations::new(client),
            redelivery_backoff,
            nak_delay_cap,
            ack_timeout,
            endpoint,
            counters,
            sequences: Vec::new(),
            requeued: Vec::new(),
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

/// `-NAK {"delay":…}`: redeliver after `delay`, not at once.
pub(crate) fn nak_with_delay(delay: Duration) -> Bytes {
    Bytes::from(format!("-NAK {{\"delay\":{}}}", delay.as_nanos()))
}

const ACK: Bytes = Bytes::from_static(b"+ACK");

impl Acker for NatsAcker {
    fn mode(&self) -> AckMode {
        AckMode::Ids
    }

    fn supports_requeue(&self) -> bool {
        true
    }

    async fn ack(&mut self, batch: &AckBatch) -> Result<(), AckError> {
        self.sequences.clear();
        self.requeued.clear();
        for partition in &batch.partitions {
            self.requeued
                .extend(partition.requeue.iter().copied().filter_map(sequence));
            self.sequences
                .extend(partition.completed.iter().copied().filter_map(sequence));
        }
        if self.sequences.is_empty() && self.requeued.is_empty() {
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
