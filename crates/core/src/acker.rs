//! How finished work reaches the broker: the [`Acker`] trait and [`AckBatch`].
//!
//! Handlers never acknowledge by hand. The commit engine turns completions
//! into per-partition batches and the runtime hands each batch to the
//! backend's `Acker`, one batch at a time: while a batch is with the broker,
//! new completions accumulate into the next one, so a slow broker gets bigger
//! batches rather than a longer queue.

use std::future::Future;

use crate::error::BoxError;
use crate::message::{PartitionKey, Position};

/// What the commit engine collects for the acker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AckMode {
    /// Only the contiguous watermark per partition (Kafka offsets, AMQP
    /// `ack multiple`, the memory broker). Cheapest.
    Watermark,
    /// The watermark and the position of every completed message (Redis
    /// `XACK` acknowledges ids, in any order).
    Ids,
}

/// The acknowledgement work for one partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionAck {
    /// The partition.
    pub partition: PartitionKey,
    /// The new watermark: every message up to and including this position is
    /// done. `None` when it did not move since the last batch.
    pub watermark: Option<Position>,
    /// Positions completed since the last batch, in completion order. Filled
    /// only in [`AckMode::Ids`].
    pub completed: Vec<Position>,
    /// Positions to hand back to the broker for a later redelivery (AMQP
    /// `basic.reject(requeue)`; Redis leaves them pending). Only for ackers
    /// that [support requeue](Acker::supports_requeue). An acker applies these
    /// before it applies the watermark.
    pub requeue: Vec<Position>,
    /// Positions to hand back for a redelivery no sooner than the delay
    /// (NATS `nak` with a delay): a message [parked](crate::parking) by the
    /// broker itself. Only for ackers that
    /// [support it](Acker::supports_delayed_requeue); applied with
    /// [`requeue`](Self::requeue), before the watermark.
    pub requeue_after: Vec<(Position, std::time::Duration)>,
}

impl PartitionAck {
    /// Acknowledgement work for `partition` with nothing in it yet.
    pub fn new(partition: PartitionKey) -> Self {
        Self {
            partition,
            watermark: None,
            completed: Vec::new(),
            requeue: Vec::new(),
            requeue_after: Vec::new(),
        }
    }

    /// Whether there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.watermark.is_none()
            && self.completed.is_empty()
            && self.requeue.is_empty()
            && self.requeue_after.is_empty()
    }
}

/// One round trip's worth of acknowledgements, across partitions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AckBatch {
    /// Work per partition; a partition appears at most once.
    pub partitions: Vec<PartitionAck>,
    /// The runtime waits for this batch before it releases partitions (a
    /// revocation) or stops (shutdown): commit synchronously.
    pub sync: bool,
}

impl AckBatch {
    /// Whether there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.partitions.iter().all(PartitionAck::is_empty)
    }

    /// Number of messages acknowledged or requeued by this batch, counting a
    /// watermark move as one.
    pub fn len(&self) -> usize {
        self.partitions
            .iter()
            .map(|ack| {
                ack.completed
                    .len()
                    .max(usize::from(ack.watermark.is_some()))
                    + ack.requeue.len()
                    + ack.requeue_after.len()
            })
            .sum()
    }
}

/// A failed acknowledgement.
///
/// The runtime logs it, counts it and goes on: a later watermark supersedes a
/// lost one, and an id that was never acknowledged is delivered again, which
/// the at-least-once contract allows. It is never a reason to ack more.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AckError {
    /// The broker answered with an error.
    #[error("the broker rejected the acknowledgement")]
    Broker(#[source] BoxError),
    /// The connection was lost before the broker confirmed.
    #[error("the connection was lost before the acknowledgement was confirmed")]
    Disconnected(#[source] BoxError),
    /// The partition now belongs to another consumer (or channel), so its
    /// positions may not be acknowledged by this one.
    #[error("partition {0} is no longer assigned to this consumer")]
    NotAssigned(PartitionKey),
}

/// Sends acknowledgements and commits to the broker.
pub trait Acker: Send + 'static {
    /// What the commit engine should collect for this acker.
    fn mode(&self) -> AckMode {
        AckMode::Watermark
    }

    /// Whether the broker can take a message back for redelivery. When it
    /// cannot (Kafka, the memory broker), the runtime keeps a copy of each
    /// message and re-dispatches a retryable failure itself.
    fn supports_requeue(&self) -> bool {
        false
    }

    /// Whether the broker can take a message back for a redelivery no
    /// sooner than a delay ([`PartitionAck::requeue_after`]). When it can,
    /// a [`ParkingLayer`](crate::parking::ParkingLayer) parks through it
    /// instead of writing a copy elsewhere.
    fn supports_delayed_requeue(&self) -> bool {
        false
    }

    /// Sends one batch. Resolves when the broker confirmed it (or, for a
    /// non-[`sync`](AckBatch::sync) batch, when it was handed to a client
    /// library that will send it in order).
    fn ack(&mut self, batch: &AckBatch) -> impl Future<Output = Result<(), AckError>> + Send;
}
