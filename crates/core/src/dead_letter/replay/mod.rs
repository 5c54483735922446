//! Replay as a consumer: the dead-letter destination read by an ordinary
//! consumer through the same handler stack as the original one.
//!
//! A consumer of a dead-letter destination (a Kafka `<topic>.<group>.dlq`
//! topic, the Redis `<stream>:dlq` stream, an AMQP dead-letter queue, a NATS
//! dead-letter subject, the memory broker's `<topic>.<group>.dlq` topic)
//! receives dead letters. [`ReplayLayer`] reads each as a [`DeadLetter`]
//! and hands the handler it wraps the **original** message:
//!
//! - the original payload, key and producer headers;
//! - the original metadata: the source, partition and position the message
//!   was first consumed at (the envelope's `intake.origin.*` fields), so
//!   that an exactly-once marker keyed by origin skips what was already
//!   applied, and traces and metrics name the original source;
//! - as its attempt, the delivery attempt of the record being replayed
//!   (a replay starts at attempt 1, so the retry layer grants it all its
//!   retries); no timestamp (the envelope keeps none of the original's);
//! - the headers `intake.replays`, one more than the letter's count, and
//!   `intake.failed.first`, the letter's first failure, as
//!   [`Replay`](super::store::Replay) sets them: if the replay fails for
//!   good again, a [`DeadLetterLayer`](super::DeadLetterLayer) inside this
//!   one writes a new letter with the count one higher and the first
//!   failure time kept.
//!
//! Which record key is the original key depends on the carrier, so the
//! caller says it, as the stores do: [`ReplayLayer::keyed`] for a Kafka or
//! memory-broker topic (the letter's record key is the original key),
//! [`ReplayLayer::keyless`] for Redis, AMQP and NATS (the key is in the
//! envelope). NATS letters keep their `Nats-…` headers under their carried
//! names (`intake.nats.…`).
//!
//! # What is not replayed
//!
//! Three kinds of record never reach the handler; each comes out as a
//! [permanent](crate::error::HandlerError::permanent) failure whose cause is a
//! [`ReplayRefused`]:
//!
//! - the **loop guard**: a letter whose message was replayed
//!   [`max_replays`](ReplayLayer::max_replays) times already (default
//!   [`DEFAULT_MAX_REPLAYS`](super::DEFAULT_MAX_REPLAYS), the store's limit too):
//!   [`ReplayRefused::ReplayLimit`]. A message that fails on every replay
//!   goes round at most that often;
//! - a [reference letter](super::PayloadReference) (no payload; the
//!   original is at its origin while the origin keeps it):
//!   [`ReplayRefused::Reference`];
//! - a record that is no readable dead letter (hostile or foreign input):
//!   [`ReplayRefused::Unreadable`], with the
//!   [`EnvelopeError`](super::EnvelopeError) as its
//!   source. Reading never panics on any record.
//!
//! Permanent, not retryable: the same record delivered again would be
//! refused again. What becomes of it is the policy outside the replay
//! layer: without one, the runtime logs it and acknowledges it. On a log
//! (Kafka, Redis Streams, NATS, memory) that moves only the replaying
//! group's position past it, and the letter stays in the destination (its
//! [store](super::store) still lists it). On an AMQP queue an
//! acknowledgement removes the message: put a
//! [`DeadLetterLayer`](super::DeadLetterLayer) outside the replay layer
//! whose sink keeps what is refused (a destination of its own), or the
//! refused letters are gone. That outer layer sees the record as it was
//! consumed, so the letter it writes holds the whole dead letter
//! (its envelope among the headers, under `intake.producer.`), and
//! [`DeadLetter::read`] of that letter's message gives the refused letter
//! back.
//!
//! # The dry run
//!
//! With [`dry_run(true)`](ReplayLayer::dry_run) no handler is called: each
//! record is counted in the [`ReplayCounters`] (per class of its last
//! failure, refused by the loop guard, references, unreadable) and comes
//! out as an [`Ignore`](crate::error::ErrorClass::Ignore) failure
//! ([`DryRunCounted`]), which the runtime acknowledges. A consumer cannot
//! look at a record without its group taking it, and every other outcome
//! is worse: an outcome the runtime does not acknowledge (retryable,
//! interrupted) is delivered again, so the dry run would count the first
//! record for ever and never reach the second.
//!
//! So the dry run is honest only where an acknowledgement removes nothing
//! but a group's position: a Kafka topic, a Redis stream, a NATS stream
//! with limits retention (the sink's), a memory-broker topic. Run it under
//! a **consumer group of its own** (a throwaway name), never under the
//! group that will replay: that group's position is unchanged, and the
//! letters are all still there for it and for the store. Stop it once the
//! group has no lag; the counters then hold the counts. On an **AMQP
//! queue** (an acknowledgement deletes the message) do not run it: use the
//! store's dry run ([`Replay::dry_run`](super::store::Replay::dry_run),
//! `intake dlq replay --dry-run`), which takes letters without
//! acknowledging them.
//!
//! # Where it goes in the stack
//!
//! Outermost, or inside only a layer meant for the dead-letter records
//! themselves (a [`DeadLetterLayer`](super::DeadLetterLayer) for refused
//! records). Everything inside it sees the original message: the trace and
//! metrics layers name the original source, the dead-letter layer writes a
//! replay that fails again with `intake.replays` one higher. Each replay
//! runs in a `replay` span (level `DEBUG`) with the letter's place in the
//! dead-letter destination (`dead_letter.source`, `dead_letter.partition`,
//! `dead_letter.position`) and `replays`; spans of the layers inside are
//! its children.
//!
//! ```
//! use intake_core::backend::DeadLetterSink;
//! use intake_core::dead_letter::replay::ReplayLayer;
//! use intake_core::{DeadLetter, DeadLetterLayer, HandlerError, Message, Metadata, Position};
//! use intake_core::memory::MemoryBroker;
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = MemoryBroker::new();
//! broker.create_topic("orders", 1)?;
//! let sink = broker.dead_letter_sink("orders", "billing")?;
//! let poison = Message::new("{not json", Metadata::new("orders".into(), 0, Position::Offset(41)))
//!     .with_key("customer-7");
//! sink.write(&DeadLetter::new(poison, "expected value", 1)).await?;
//!
//! // What a consumer of `orders.billing.dlq` receives: the dead letter.
//! let record = broker.messages("orders.billing.dlq", 0, 0)?.remove(0);
//! let replay = ReplayLayer::keyed();
//! let counters = replay.counters();
//! let handler = ServiceBuilder::new()
//!     .layer(replay)
//!     // A replay that fails for good again is a new letter, replays + 1.
//!     .layer(DeadLetterLayer::new(sink))
//!     .service(service_fn(|message: Message| async move {
//!         // The original message, where it was first consumed.
//!         assert_eq!(&**message.metadata().source(), "orders");
//!         assert_eq!(message.metadata().position(), Position::Offset(41));
//!         assert_eq!(message.key().map(|key| &key[..]), Some(&b"customer-7"[..]));
//!         assert_eq!(message.headers().get_str("intake.replays"), Some("1"));
//!         Ok::<(), HandlerError>(())
//!     }));
//! handler.oneshot(record).await?;
//! assert_eq!((counters.snapshot().replayed, counters.snapshot().succeeded), (1, 1));
//! # Ok(())
//! # }
//! ```
//!
//! [`DeadLetter`]: super::DeadLetter
//! [`DeadLetter::read`]: super::DeadLetter::read

mod counters;
mod error;
mod future;
mod layer;
mod service;

pub use self::counters::{ReplayCounters, ReplayCounts};
pub use self::error::{DryRunCounted, ReplayRefused};
pub use self::future::ReplayFuture;
pub use self::layer::ReplayLayer;
pub use self::service::ReplayService;

/// What a [`ReplayLayer`] gives each of its services.
#[derive(Clone, Debug)]
struct Config {
    /// Whether the consumed record's key is the original key.
    key_slot: bool,
    max_replays: u32,
    dry_run: bool,
    counters: ReplayCounters,
}
