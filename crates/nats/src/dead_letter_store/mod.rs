//! [`NatsDeadLetters`]: a JetStream dead-letter stream as a
//! [`DeadLetterLog`](intake_core::dead_letter::store::DeadLetterLog), the
//! log of [`NatsDeadLetterStore`], and [`NatsReplayPublisher`], which sends
//! a replayed message back to the subject it was consumed from.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use intake_core::dead_letter::store::LogStore;

use crate::publisher::NatsPublisher;
use crate::settings::NatsSettings;

mod builder;
mod entries;
mod log;
mod replay;

pub use builder::NatsDeadLettersBuilder;
pub use replay::NatsReplayPublisher;

/// The dead-letter store of a JetStream dead-letter stream.
pub type NatsDeadLetterStore = LogStore<NatsDeadLetters, NatsReplayPublisher>;

/// A JetStream dead-letter stream as a
/// [`DeadLetterLog`](intake_core::dead_letter::store::DeadLetterLog) (its
/// ids are stream sequences, `41`), so that [`NatsDeadLetterStore`] (a
/// [`LogStore`] replaying through a [`NatsReplayPublisher`]) counts, lists, reads,
/// replays and purges what a
/// [`NatsDeadLetterSink`](crate::NatsDeadLetterSink) wrote. Build one with
/// [`NatsDeadLetters::builder`]; it is cheap to clone.
///
/// It reads the letters of one subject (the sink's default
/// `<stream>.<consumer>.dlq`, since the stream `<stream>_dlq` stores the
/// letters of every consumer of `<stream>`), or of the whole stream.
///
/// | store operation | JetStream |
/// |---|---|
/// | count everything | stream info: `messages`, or the subject's count (`subjects_filter`) |
/// | count with a filter, summary, list | `STREAM.MSG.GET` with `next_by_subj`, one entry per request, from the sequence after the cursor |
/// | read | `STREAM.MSG.GET` by sequence |
/// | replay | a publish to the original subject, confirmed, then `STREAM.MSG.DELETE` |
/// | purge | `STREAM.MSG.DELETE` |
///
/// Why message gets and not an ordered consumer: each get is one request
/// with one reply, bounded by the request timeout, leaves nothing on the
/// server (a consumer would have to be created, fed by flow control and
/// deleted, and an interrupted command would leave it behind), and skips
/// deleted sequences on the server's side. The cost is a round trip per
/// letter scanned: `intake dlq count` (a summary, so a scan) of 5,000
/// letters took 1.7 s on a local server (debug build, 2 busy cores).
/// Direct gets (`allow_direct`) would save nothing per letter and need a
/// stream setting the sink does not make.
///
/// A letter is read back as
/// [`read_dead_letter`](crate::read_dead_letter) reads it. The client
/// parses each entry's header block: an entry whose headers it cannot read
/// (not UTF-8, which no intake sink writes) fails the operation that meets
/// it; remove it with `nats stream rmm`.
///
/// ```no_run
/// use intake_core::dead_letter::store::{DeadLetterStore, Filter, Replay, Selection};
/// use intake_nats::{NatsDeadLetters, NatsPublisher};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let url = "nats://127.0.0.1:4222";
/// let store = NatsDeadLetters::builder(url)
///     .dead_letters_of("ORDERS", "billing") // `ORDERS.billing.dlq` on `ORDERS_dlq`
///     .build()
///     .await?
///     .store(NatsPublisher::builder(url).build().await?);
/// println!("{} dead letters", store.count(&Filter::all()).await?);
/// let report = store
///     .replay(&Selection::Matching(Filter::all()), &Replay::to_origin())
///     .await?;
/// println!("{} back on their subjects, {} skipped", report.replayed, report.skipped.len());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct NatsDeadLetters {
    context: jetstream::Context,
    endpoint: Arc<str>,
    stream: Arc<str>,
    subject: Option<Arc<str>>,
    timeout: Duration,
}

impl fmt::Debug for NatsDeadLetters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsDeadLetters")
            .field("endpoint", &self.endpoint)
            .field("stream", &self.stream)
            .field("subject", &self.subject)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl NatsDeadLetters {
    /// A builder of the dead-letter stream's reader on a connection of its
    /// own, made with `settings` ([`NatsSettings`]), or to the server(s) at
    /// a URL (`nats://[user:password@|token@]host[:port]`, several
    /// separated by commas, `tls://` for TLS).
    pub fn builder(settings: impl Into<NatsSettings>) -> NatsDeadLettersBuilder {
        NatsDeadLettersBuilder::new(settings.into())
    }

    /// The store of this stream, replaying through `publisher` (see
    /// [`NatsReplayPublisher`] for where a replay goes).
    pub fn store(self, publisher: NatsPublisher) -> NatsDeadLetterStore {
        let replay = NatsReplayPublisher::new(self.context.clone(), publisher, self.timeout);
        LogStore::new(self, replay)
    }

    /// The dead-letter stream.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The subject whose letters it reads, `None` for the whole stream.
    pub fn subject(&self) -> Option<&str> {
        self.subject.as_deref()
    }
}
