//! [`AmqpDeadLetterStore`]: the dead letters waiting in an AMQP queue, as
//! a [`DeadLetterStore`].

use std::fmt;
use std::time::Duration;

use intake_core::dead_letter::store::{
    DeadLetterStore, Filter, LetterId, Page, Replay, ReplayReport, Selection, StoreError,
    StoredLetter, Summary,
};

use crate::publisher::AmqpPublisher;
use crate::tls::Tls;
use crate::url::AmqpUrl;

mod builder;
mod pass;
mod replay;
mod selection;
#[cfg(test)]
mod tests;

pub use builder::AmqpDeadLetterStoreBuilder;
use pass::close;
use selection::Wanted;
/// The dead letters waiting in an AMQP queue, counted, listed, read,
/// replayed and purged. Build one with [`AmqpDeadLetterStore::builder`].
///
/// ```no_run
/// use intake_amqp::{AmqpDeadLetterStore, AmqpPublisher};
/// use intake_core::dead_letter::store::{DeadLetterStore, Filter};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let url = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// let store = AmqpDeadLetterStore::builder(url)
///     .queue("orders.dlq")
///     .build(AmqpPublisher::builder(url).build().await?)
///     .await?;
/// println!("{} dead letters", store.count(&Filter::all()).await?);
/// # Ok(())
/// # }
/// ```
///
/// A queue cannot be read without taking its messages, so every operation
/// but an unfiltered count is a **pass**: on a connection of its own, the
/// store takes the messages that were ready when it began, one at a time
/// with `basic_get`, without acknowledging them; it acknowledges a letter
/// it purges at once, and one it replays once the publisher confirmed
/// it, and when it is done it closes the channel: the broker puts every
/// other message back where it was (a classic queue keeps their order). A
/// store that dies mid-pass loses its connection, which puts them back too.
///
/// What this costs, and why it was chosen over the alternatives (a stream
/// queue, or a consumer nacking messages back one by one, which would hand
/// the same message back at once and loop):
///
/// - a pass holds unacknowledged in the broker every letter it looked at
///   and did not remove, at most
///   [`max_letters`](AmqpDeadLetterStoreBuilder::max_letters) (default
///   10,000). In this process it holds one letter at a time, besides a
///   listing's page (without payloads) and a replay's letters awaiting
///   their confirms (at most 256, and 32 MiB of payload beyond the first):
///   the memory does not grow with the queue;
/// - **when a pass holds `max_letters`, it stops**, and what needed every
///   letter says so with [`Error::PassLimit`](crate::Error::PassLimit) (the source of a
///   [`StoreError::Broker`]), naming how many letters it looked at and what
///   it did: a count or summary with a filter, a listing that reaches the
///   end of what it looked at, a read of an id it did not find, a purge or
///   replay by filter, or of ids it did not find. A purge or replay
///   removes what it acted on as it goes, so it stops only when
///   `max_letters` letters it leaves in the queue come before the rest;
///   letters it purged or redrove before it stopped are gone;
/// - messages other consumers of the queue hold are not seen, and a
///   message taken by a pass is invisible to them until it ends;
/// - on a **quorum** queue, RabbitMQ counts a message put back towards its
///   `x-delivery-limit`: declare the dead-letter queue classic (or without
///   a delivery limit), or repeated listings may drop letters;
/// - a letter has no id of the broker's: its [`LetterId`] is made from its
///   envelope and the id its sink gave it
///   ([`LETTER_ID`](crate::headers::LETTER_ID): the sink's random instance
///   and a counter), `<failed at, ms>@<origin queue>/<partition>/<position>/<sink's id>`,
///   the same on every pass and never shared with another letter, though
///   channel epochs and delivery tags repeat in every process. A letter
///   written before sinks gave ids has no last part, and the second, third
///   … letter of a pass with the same id get `~2`, `~3`; an entry that is
///   no dead letter is `unreadable#<n>`, its place in the pass.
///
/// A replay to the origin publishes to the origin queue's name as the
/// [`AmqpPublisher`]'s destination: a publisher on the default exchange (its
/// default) routes it to that queue. The routing key is then the queue's
/// name, which is what the origin's consumer reads as the message's key;
/// the letter's key travels in the
/// [`intake.key`](AmqpPublisher::KEY_HEADER) header.
pub struct AmqpDeadLetterStore {
    url: AmqpUrl,
    tls: Tls,
    connection_name: String,
    connect_timeout: Duration,
    queue: String,
    publisher: AmqpPublisher,
    command_timeout: Duration,
    max_letters: usize,
    partial_answers: bool,
}

impl fmt::Debug for AmqpDeadLetterStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpDeadLetterStore")
            .field("endpoint", &self.url.endpoint())
            .field("queue", &self.queue)
            .field("max_letters", &self.max_letters)
            .field("partial_answers", &self.partial_answers)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl DeadLetterStore for AmqpDeadLetterStore {
    fn destination(&self) -> &str {
        &self.queue
    }

    async fn count(&self, filter: &Filter) -> Result<u64, StoreError> {
        if !filter.is_all() {
            return Ok(self.summary(filter).await?.total);
        }
        let (connection, channel) = self
            .open()
            .await
            .map_err(|error| self.failed("count", error))?;
        let ready = self.ready(&channel).await;
        close(connection, channel).await;
        ready
            .map(u64::from)
            .map_err(|error| self.failed("count", error))
    }

    async fn summary(&self, filter: &Filter) -> Result<Summary, StoreError> {
        let mut pass = self.pass("read").await?;
        let mut summary = Summary::default();
        let walked = loop {
            match self.next(&mut pass).await {
                Ok(Some(entry)) if filter.matches(&entry.stored) => summary.add(&entry.stored),
                Ok(Some(_)) => {}
                Ok(None) => break Ok(()),
                Err(error) => break Err(self.failed("read", error)),
            }
        };
        let short = self.short(&pass);
        let outcome = match walked {
            Ok(()) if short => Err(self.stopped_short(
                "count every letter of",
                &pass,
                "nothing was changed".to_owned(),
            )),
            Ok(()) => Ok(summary),
            Err(error) => Err(error),
        };
        close(pass.connection, pass.channel).await;
        outcome
    }

    async fn list(
        &self,
        filter: &Filter,
        limit: usize,
        after: Option<&LetterId>,
    ) -> Result<Page, StoreError> {
        let mut pass = self.pass("list").await?;
        let mut started = after.is_none();
        let mut page = Page::default();
        let mut looked_at = None;
        let walked = loop {
            let entry = match self.next(&mut pass).await {
                Ok(Some(entry)) => entry,
                Ok(None) => break Ok(false),
                Err(error) => break Err(self.failed("list", error)),
            };
            let stored = entry.stored;
            if !started {
                started = after == Some(&stored.id);
                continue;
            }
            if page.letters.len() == limit {
                page.next = looked_at.take();
                break Ok(true);
            }
            looked_at = Some(stored.id.clone());
            if filter.matches(&stored) {
                page.letters.push(stored.without_payload());
            }
        };
        let outcome = match walked {
            Ok(true) => Ok(page),
            Ok(false) if self.short(&pass) && page.letters.len() == limit && started => {
                page.next = looked_at;
                Ok(page)
            }
            Ok(false) if self.short(&pass) => Err(self.stopped_short(
                "list every letter of",
                &pass,
                "nothing was changed".to_owned(),
            )),
            Ok(false) => Ok(page),
            Err(error) => Err(error),
        };
        close(pass.connection, pass.channel).await;
        outcome
    }

    async fn read(&self, id: &LetterId) -> Result<StoredLetter, StoreError> {
        let mut pass = self.pass("read").await?;
        let found = loop {
            match self.next(&mut pass).await {
                Ok(Some(entry)) if &entry.stored.id == id => break Ok(Some(entry.stored)),
                Ok(Some(_)) => {}
                Ok(None) => break Ok(None),
                Err(error) => break Err(self.failed("read", error)),
            }
        };
        let outcome = match found {
            Ok(Some(stored)) => Ok(stored),
            Ok(None) if self.short(&pass) => Err(self.stopped_short(
                "find a letter in",
                &pass,
                format!("{id} is not among them"),
            )),
            Ok(None) => Err(StoreError::NotFound { id: id.clone() }),
            Err(error) => Err(error),
        };
        close(pass.connection, pass.channel).await;
        outcome
    }

    async fn replay(
        &self,
        selection: &Selection,
        replay: &Replay,
    ) -> Result<ReplayReport, StoreError> {
        let mut pass = self.pass("read").await?;
        let mut report = ReplayReport::default();
        report.dry_run = replay.is_dry_run();
        let outcome = self
            .replay_pass(&mut pass, selection, replay, &mut report)
            .await;
        close(pass.connection, pass.channel).await;
        outcome.map(|()| report)
    }

    async fn purge(&self, selection: &Selection) -> Result<u64, StoreError> {
        let mut pass = self.pass("read").await?;
        let mut wanted = Wanted::of(selection);
        let mut purged = 0;
        let walked = loop {
            if wanted.all_found() {
                break Ok(());
            }
            let entry = match self.next(&mut pass).await {
                Ok(Some(entry)) => entry,
                Ok(None) => break Ok(()),
                Err(error) => break Err(self.failed("read", error)),
            };
            if !wanted.takes(&entry.stored) {
                continue;
            }
            if let Err(error) = self.ack(&mut pass, &[entry.tag]).await {
                break Err(self.failed("remove letters from", error));
            }
            purged += 1;
        };
        let short = self.short(&pass) && (wanted.is_filter() || !wanted.missing().is_empty());
        let outcome = match walked {
            Ok(()) if short => Err(self.stopped_short(
                "purge every letter of",
                &pass,
                format!("{purged} were purged"),
            )),
            Ok(()) => Ok(purged),
            Err(error) => Err(error),
        };
        close(pass.connection, pass.channel).await;
        outcome
    }
}
