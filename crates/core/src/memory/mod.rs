//! An in-process broker with Kafka's model, for tests, examples and
//! benchmarks: topics of partitions, consumer groups with committed offsets
//! and rebalances, dead-letter topics, and fault injection.
//!
//! It is a backend like any other: [`MemorySource`] implements
//! [`Source`](crate::backend::Source), [`MemoryAcker`] implements
//! [`Acker`](crate::backend::Acker) and [`MemoryDeadLetterSink`] implements
//! [`DeadLetterSink`](crate::backend::DeadLetterSink), so a handler tested on it runs
//! unchanged on Kafka, Redis or AMQP.
//!
//! - **Produce** with [`MemoryBroker::send`]: a keyed [`Record`] goes to the
//!   partition its key hashes to (as Kafka's default partitioner does), one
//!   without a key to each partition in turn, or to an explicit partition.
//! - **Consume** with [`MemoryBroker::consumer`]: each source is a member of
//!   its group. Offsets are [`Position::Offset`](crate::Position::Offset);
//!   the acker commits `watermark + 1`.
//! - **Rebalance** when a member joins or leaves: a partition moving away
//!   from a live member is revoked from it first
//!   ([`SourceEvent::Revoked`](crate::backend::SourceEvent::Revoked)), and its new
//!   owner gets it (`Assigned`) only once the revocation completed, the old
//!   member left, or the [rebalance timeout](MemoryBrokerBuilder::rebalance_timeout)
//!   passed. A member's commits of a partition it lost, or sent under an
//!   earlier assignment of it, are refused.
//! - **Crash** by dropping a source without `close`: what it did not commit
//!   is delivered again to the next owner, with
//!   [`Metadata::attempt`](crate::Metadata::attempt) above 1.
//! - **Inspect** committed offsets, lag, assignment ([`MemoryBroker::group`])
//!   and dead letters ([`MemoryBroker::dead_letters`]).
//! - **Inject faults** per group with [`MemoryBroker::faults`].
//!
//! Delivering a message is a clone of the stored one (reference-count bumps,
//! no allocation) under one lock per batch.
//!
//! Messages are kept for the broker's lifetime (there is no retention), and
//! producing is synchronous. Sources wait on Tokio primitives; the wait for a
//! partition's release is bounded by a Tokio timer, so consume inside a Tokio
//! runtime with time enabled.
//!
//! # Example
//!
//! ```
//! use intake_core::memory::{MemoryBroker, Record};
//! use intake_core::backend::{AckBatch, Acker, PartitionAck, Source, SourceEvent};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = MemoryBroker::new();
//! broker.create_topic("orders", 2)?;
//! broker.send("orders", Record::new("order 1").with_key("customer-7"))?;
//!
//! let (mut source, mut acker) = broker.consumer("orders", "billing")?;
//! let mut deliveries = Vec::new();
//! // A new member first learns its partitions, then receives messages.
//! let SourceEvent::Assigned(partitions) = source.next(&mut deliveries, 100).await? else {
//!     unreachable!("a new member is assigned its partitions first");
//! };
//! assert_eq!(partitions.len(), 2);
//! source.next(&mut deliveries, 100).await?;
//! assert_eq!(deliveries[0].payload(), "order 1");
//!
//! // Commit it: the group's lag drops to zero.
//! let message = &deliveries[0];
//! let mut done = PartitionAck::new(message.metadata().partition_key());
//! done.watermark = Some(message.metadata().position());
//! acker.ack(&AckBatch { partitions: vec![done], sync: true }).await?;
//! assert_eq!(broker.lag("orders", "billing")?, 0);
//! source.close().await?;
//! # Ok(())
//! # }
//! ```

mod acker;
mod assignment;
mod broker;
mod consumer;
mod control_channel;
mod dead_letter;
mod dead_letter_store;
mod error;
mod faults;
mod fetch;
mod group;
mod lag;
mod parking;
mod partitioner;
mod parts;
mod publisher;
mod record;
mod snapshot;
mod source;
mod topic;

#[cfg(test)]
mod runtime_tests;
#[cfg(test)]
mod tests;

pub use acker::MemoryAcker;
pub use assignment::AssignmentStrategy;
pub use broker::{BrokerConfig, MemoryBroker, MemoryBrokerBuilder};
pub use consumer::{MemoryConsumerBuilder, OffsetReset};
pub use control_channel::MemoryControlChannel;
pub use dead_letter::{MemoryDeadLetterSink, dead_letter_topic};
pub use dead_letter_store::{MemoryDeadLetterStore, MemoryDeadLetters};
pub use error::MemoryError;
pub use faults::{Faults, InjectedFault};
pub use group::MemberId;
pub use lag::MemoryLagProbe;
pub use parking::MemoryParking;
pub use publisher::MemoryPublisher;
pub use record::{Produced, Record};
pub use snapshot::{GroupSnapshot, MemberSnapshot, PartitionOwner, PartitionState};
pub use source::MemorySource;
