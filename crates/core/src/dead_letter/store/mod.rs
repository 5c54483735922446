//! Dead letters as data: a [`DeadLetterStore`] counts, lists, reads,
//! replays and purges what a [`DeadLetterSink`](super::DeadLetterSink)
//! wrote, on the one [envelope](super::envelope).
//!
//! Every backend's store has the same shape, so an operator tool (the
//! `intake` command) holds a `Box<dyn DeadLetterStore>` whatever the broker:
//!
//! - [`count`](DeadLetterStore::count) and
//!   [`summary`](DeadLetterStore::summary) (counts per error class and the
//!   oldest letter, what a dry run shows and what
//!   `metrics::DeadLetterExporter` exports);
//! - [`list`](DeadLetterStore::list), a page at a time after a cursor,
//!   filtered by error class, time of failure and key;
//! - [`read`](DeadLetterStore::read), one letter with its payload;
//! - [`replay`](DeadLetterStore::replay): each letter's original message
//!   (payload, key, headers, with [`REPLAYS`](super::envelope::REPLAYS) one
//!   higher) published through a [`Publisher`](crate::publish::Publisher) to
//!   its origin or another destination, and removed from the store only
//!   once the publish is confirmed. A letter replayed
//!   [`max_replays`](Replay::max_replays) times already is not replayed
//!   again but [skipped](SkipReason::ReplayLimit): a message that fails on
//!   every replay does not circle for ever;
//! - [`purge`](DeadLetterStore::purge).
//!
//! A backend whose dead-letter destination is an ordered log addressed by
//! id (a memory-broker topic, a Redis stream) implements the few
//! primitives of [`DeadLetterLog`] and gets the whole store from
//! [`LogStore`].
//!
//! ```
//! use intake_core::dead_letter::store::{DeadLetterStore, Filter, Replay, Selection};
//! use intake_core::memory::{MemoryBroker, Record};
//! use intake_core::{DeadLetter, ErrorClass, Message, Metadata, Position};
//! use intake_core::backend::DeadLetterSink;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = MemoryBroker::new();
//! broker.create_topic("orders", 1)?;
//! let poison = Message::new("{not json", Metadata::new("orders".into(), 0, Position::Offset(0)));
//! broker
//!     .dead_letter_sink("orders", "billing")?
//!     .write(&DeadLetter::new(poison, "expected value", 1))
//!     .await?;
//!
//! let store: Box<dyn DeadLetterStore> = Box::new(broker.dead_letter_store("orders", "billing")?);
//! let permanent = Filter::all().with_class(ErrorClass::Permanent);
//! assert_eq!(store.count(&permanent).await?, 1);
//!
//! // A dry run says what would move, and moves nothing.
//! let dry = store.replay(&Selection::Matching(permanent.clone()), &Replay::to_origin().dry_run(true)).await?;
//! assert_eq!((dry.replayed, store.count(&permanent).await?), (1, 1));
//!
//! let done = store.replay(&Selection::Matching(permanent.clone()), &Replay::to_origin()).await?;
//! assert_eq!(done.replayed, 1);
//! assert_eq!(store.count(&Filter::all()).await?, 0);
//! let replayed = &broker.messages("orders", 0, 0)?[0];
//! assert_eq!(replayed.headers().get_str("intake.replays"), Some("1"));
//! # Ok(())
//! # }
//! ```

mod dead_letter_log;
mod dead_letter_store;
mod error;
mod filter;
mod id;
mod log_store;
mod page;
mod pages;
mod replay;
mod report;
mod selection;
mod stored;
mod summary;

pub use self::dead_letter_log::DeadLetterLog;
pub use self::dead_letter_store::DeadLetterStore;
pub use self::error::StoreError;
pub use self::filter::Filter;
pub use self::id::LetterId;
pub use self::log_store::LogStore;
pub use self::page::Page;
pub use self::replay::{Progress, Replay, Target};
pub use self::report::{ReplayReport, SkipReason, Skipped};
pub use self::selection::Selection;
pub use self::stored::StoredLetter;
pub use self::summary::Summary;

#[cfg(test)]
mod tests;
