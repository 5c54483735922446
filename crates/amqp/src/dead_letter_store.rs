//! [`AmqpDeadLetterStore`]: the dead letters waiting in an AMQP queue, as
//! a [`DeadLetterStore`].

use std::collections::HashSet;
use std::fmt;
use std::time::{Duration, UNIX_EPOCH};

use intake_core::ConfigError;
use intake_core::dead_letter::DeadLetter;
use intake_core::dead_letter::store::{
    DeadLetterStore, Filter, LetterId, Page, Redrive, RedriveReport, Selection, SkipReason,
    Skipped, StoreError, StoredLetter, Summary,
};
use intake_core::publish::Publisher;
use lapin::options::{BasicAckOptions, BasicGetOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};

use crate::connection::{DEFAULT_CONNECT_TIMEOUT, open_within};
use crate::dead_letter::read_dead_letter;
use crate::error::{Error, Operation, classify};
use crate::publisher::AmqpPublisher;
use crate::tls::Tls;
use crate::url::AmqpUrl;

/// Letters published before their confirmations are awaited.
const BATCH: usize = 256;

/// The dead letters waiting in an AMQP queue, counted, listed, read,
/// redriven and purged. Build one with [`AmqpDeadLetterStore::builder`].
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
/// store takes every ready message of the queue with `basic_get` (at most
/// [`max_letters`](AmqpDeadLetterStoreBuilder::max_letters), without
/// acknowledging), acts on them, acknowledges the ones it redrove (after
/// their publisher confirm) or purged, and closes the channel: the broker
/// puts every other message back where it was (a classic queue keeps their
/// order). A store that dies mid-pass loses its connection, which puts
/// them back too.
///
/// What this costs, and why it was chosen over the alternatives (a stream
/// queue, or a consumer nacking messages back one by one, which would hand
/// the same message back at once and loop):
///
/// - a pass holds the whole queue (up to `max_letters`) unacknowledged in
///   the broker and in this process while it runs;
/// - messages other consumers of the queue hold are not seen, and a
///   message taken by a pass is invisible to them until it ends;
/// - on a **quorum** queue, RabbitMQ counts a message put back towards its
///   `x-delivery-limit`: declare the dead-letter queue classic (or without
///   a delivery limit), or repeated listings may drop letters;
/// - a letter has no id of the broker's: its [`LetterId`] is made from its
///   envelope, `<failed at, ms>@<origin queue>/<partition>/<position>`,
///   the same on every pass (two letters of the same original given up in
///   the same millisecond share one, and an operation on it takes both);
///   an entry that is no dead letter is `unreadable#<n>`, its place in the
///   pass.
///
/// A redrive to the origin publishes to the origin queue's name as the
/// [`AmqpPublisher`]'s destination: a publisher on the default exchange (its
/// default) routes it to that queue. The routing key is then the queue's
/// name, which is what the origin's consumer reads as the message's key;
/// the letter's key travels in the
/// [`intake.key`](AmqpPublisher::KEY_HEADER) header.
pub struct AmqpDeadLetterStore {
    url: AmqpUrl,
    tls: Tls,
    queue: String,
    publisher: AmqpPublisher,
    command_timeout: Duration,
    max_letters: usize,
}

impl fmt::Debug for AmqpDeadLetterStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpDeadLetterStore")
            .field("endpoint", &self.url.endpoint())
            .field("queue", &self.queue)
            .field("max_letters", &self.max_letters)
            .finish_non_exhaustive()
    }
}

/// Builds an [`AmqpDeadLetterStore`]; see [`AmqpDeadLetterStore::builder`].
#[must_use = "a builder does nothing until `.build(publisher).await`"]
pub struct AmqpDeadLetterStoreBuilder {
    url: String,
    tls: Tls,
    queue: Option<String>,
    command_timeout: Duration,
    max_letters: usize,
}

impl fmt::Debug for AmqpDeadLetterStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpDeadLetterStoreBuilder")
            .field("url", &intake_core::redact::url(&self.url))
            .field("queue", &self.queue)
            .field("max_letters", &self.max_letters)
            .finish_non_exhaustive()
    }
}

impl AmqpDeadLetterStoreBuilder {
    /// The queue the dead letters wait in (the one bound to the sink's
    /// exchange and routing key).
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// TLS settings for an `amqps://` URL.
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = tls;
        self
    }

    /// How long to wait for the connection and each broker reply (default
    /// 10 s).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// The most letters one pass takes (default 10,000): a pass holds them
    /// all unacknowledged, so this bounds the memory of the broker and of
    /// this process. Letters behind them are not seen until those before
    /// are redriven or purged.
    pub fn max_letters(mut self, max: usize) -> Self {
        self.max_letters = max;
        self
    }

    /// Checks the settings and that the queue exists, and returns the
    /// store, redriving through `publisher`.
    ///
    /// # Errors
    ///
    /// [`Error`] for a bad URL or setting, an unreachable broker, refused
    /// credentials or a queue that does not exist.
    pub async fn build(self, publisher: AmqpPublisher) -> Result<AmqpDeadLetterStore, Error> {
        let url = AmqpUrl::parse(&self.url)?;
        self.tls.check_for(&url)?;
        let queue = match self.queue {
            Some(queue) if !queue.is_empty() => queue,
            _ => {
                return Err(
                    ConfigError::new("queue", "is not set; name the dead-letter queue").into(),
                );
            }
        };
        if self.max_letters == 0 {
            return Err(
                ConfigError::new("max_letters", "is zero; a pass must take something").into(),
            );
        }
        if self.command_timeout.is_zero() {
            return Err(
                ConfigError::new("command_timeout", "is zero; give the broker time").into(),
            );
        }
        let store = AmqpDeadLetterStore {
            url,
            tls: self.tls,
            queue,
            publisher,
            command_timeout: self.command_timeout,
            max_letters: self.max_letters,
        };
        let (connection, channel) = store.open().await?;
        let declared = store.ready(&channel).await;
        close(connection, channel).await;
        declared.map(|_| store)
    }
}

/// One pass over the queue: the connection, the channel holding every
/// message taken, and those messages' delivery tags with the letters.
struct Pass {
    connection: Connection,
    channel: Channel,
    entries: Vec<(u64, StoredLetter)>,
}

async fn close(connection: Connection, channel: Channel) {
    // Closing the channel puts back what it holds unacknowledged; a close
    // that fails or hangs is followed by the connection's, and a connection
    // that is gone has put everything back already.
    let timeout = Duration::from_secs(5);
    if let Err(error) = bounded(timeout, channel.close(200, "pass done".into())).await {
        tracing::debug!(%error, "closing the dead-letter store's channel");
    }
    if let Err(error) = bounded(timeout, connection.close(200, "pass done".into())).await {
        tracing::debug!(%error, "closing the dead-letter store's connection");
    }
}

async fn bounded<T>(
    timeout: Duration,
    future: impl Future<Output = Result<T, lapin::Error>>,
) -> Result<T, BoundedError> {
    match tokio::time::timeout(timeout, future).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(BoundedError::Broker(error)),
        Err(_) => Err(BoundedError::TimedOut(timeout)),
    }
}

#[derive(Debug, thiserror::Error)]
enum BoundedError {
    #[error("the broker failed the request")]
    Broker(#[source] lapin::Error),
    #[error("the broker did not answer within {0:?}")]
    TimedOut(Duration),
}

impl AmqpDeadLetterStore {
    /// A builder of the store of the dead letters in a queue of the broker
    /// at `url`.
    pub fn builder(url: impl Into<String>) -> AmqpDeadLetterStoreBuilder {
        AmqpDeadLetterStoreBuilder {
            url: url.into(),
            tls: Tls::default(),
            queue: None,
            command_timeout: DEFAULT_CONNECT_TIMEOUT,
            max_letters: 10_000,
        }
    }

    fn failed(
        &self,
        operation: &'static str,
        error: impl Into<intake_core::BoxError>,
    ) -> StoreError {
        StoreError::broker(operation, &self.queue, error)
    }

    fn broker_error(&self, error: BoundedError) -> Error {
        match error {
            BoundedError::Broker(error) => classify(
                error,
                self.url.endpoint(),
                self.url.vhost(),
                Operation::UseQueue(&self.queue),
            ),
            BoundedError::TimedOut(_) => Error::Unreachable {
                endpoint: self.url.endpoint().to_owned(),
                source: Box::new(error),
            },
        }
    }

    async fn open(&self) -> Result<(Connection, Channel), Error> {
        let connection = open_within(
            &self.url,
            Some("intake dead-letter store"),
            &self.tls,
            self.command_timeout,
        )
        .await?;
        match bounded(self.command_timeout, connection.create_channel()).await {
            Ok(channel) => Ok((connection, channel)),
            Err(error) => {
                let _ = bounded(Duration::from_secs(5), connection.close(200, "".into())).await;
                Err(self.broker_error(error))
            }
        }
    }

    /// The ready messages of the queue (a passive declare).
    async fn ready(&self, channel: &Channel) -> Result<u32, Error> {
        let declared = bounded(
            self.command_timeout,
            channel.queue_declare(
                self.queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            ),
        )
        .await
        .map_err(|error| self.broker_error(error))?;
        Ok(declared.message_count())
    }

    /// Takes every ready message (up to `max_letters`) without
    /// acknowledging it.
    async fn pass(&self, operation: &'static str) -> Result<Pass, StoreError> {
        let (connection, channel) = self
            .open()
            .await
            .map_err(|error| self.failed(operation, error))?;
        let taken = self.take(&channel).await;
        match taken {
            Ok(entries) => Ok(Pass {
                connection,
                channel,
                entries,
            }),
            Err(error) => {
                close(connection, channel).await;
                Err(self.failed(operation, error))
            }
        }
    }

    async fn take(&self, channel: &Channel) -> Result<Vec<(u64, StoredLetter)>, Error> {
        let ready = self.ready(channel).await?;
        let ready = usize::try_from(ready)
            .unwrap_or(usize::MAX)
            .min(self.max_letters);
        let mut entries = Vec::with_capacity(ready.min(BATCH));
        for index in 0..ready {
            let got = bounded(
                self.command_timeout,
                channel.basic_get(
                    self.queue.as_str().into(),
                    BasicGetOptions { no_ack: false },
                ),
            )
            .await
            .map_err(|error| self.broker_error(error))?;
            // Another reader took the rest: the pass holds what was left.
            let Some(message) = got else {
                break;
            };
            let delivery = message.delivery;
            let tag = delivery.delivery_tag;
            let payload_bytes = delivery.data.len();
            let letter = read_dead_letter(delivery);
            let id = letter_id(&letter, index);
            entries.push((tag, StoredLetter::new(id, payload_bytes, letter)));
        }
        Ok(entries)
    }

    /// Acknowledges `tags`: the letters leave the queue.
    async fn ack(&self, channel: &Channel, tags: &[u64]) -> Result<(), Error> {
        for &tag in tags {
            bounded(
                self.command_timeout,
                channel.basic_ack(tag, BasicAckOptions::default()),
            )
            .await
            .map_err(|error| self.broker_error(error))?;
        }
        Ok(())
    }

    /// The entries of `pass` that `selection` takes; ids it does not hold
    /// come as `Err(id)`.
    fn select<'p>(
        pass: &'p Pass,
        selection: &Selection,
    ) -> Vec<Result<&'p (u64, StoredLetter), LetterId>> {
        match selection {
            Selection::Matching(filter) => pass
                .entries
                .iter()
                .filter(|(_, stored)| filter.matches(stored))
                .map(Ok)
                .collect(),
            Selection::Ids(ids) => {
                let wanted: HashSet<&LetterId> = ids.iter().collect();
                let held: HashSet<&LetterId> =
                    pass.entries.iter().map(|(_, stored)| &stored.id).collect();
                let mut selected: Vec<_> = pass
                    .entries
                    .iter()
                    .filter(|(_, stored)| wanted.contains(&stored.id))
                    .map(Ok)
                    .collect();
                selected.extend(
                    ids.iter()
                        .filter(|id| !held.contains(id))
                        .map(|id| Err(id.clone())),
                );
                selected
            }
        }
    }

    async fn redrive_pass(
        &self,
        pass: &Pass,
        selection: &Selection,
        redrive: &Redrive,
        report: &mut RedriveReport,
    ) -> Result<(), StoreError> {
        let mut taken: Vec<(u64, &LetterId, &DeadLetter)> = Vec::new();
        for entry in Self::select(pass, selection) {
            let (tag, stored) = match entry {
                Ok((tag, stored)) => (*tag, stored),
                Err(id) => {
                    report.skipped.push(skipped(id, SkipReason::NotFound));
                    continue;
                }
            };
            match (redrive.skips(stored), &stored.letter) {
                (Some(reason), _) => report.skipped.push(skipped(stored.id.clone(), reason)),
                (None, Ok(letter)) => taken.push((tag, &stored.id, letter)),
                (None, Err(_)) => {}
            }
        }
        if redrive.is_dry_run() {
            for (_, _, letter) in &taken {
                report.redriven += 1;
                *report.by_class.entry(letter.class.as_str()).or_default() += 1;
            }
            redrive.report_progress(report.redriven);
            return Ok(());
        }
        for batch in taken.chunks(BATCH) {
            let mut receipts = Vec::with_capacity(batch.len());
            let mut failure = None;
            for (tag, id, letter) in batch {
                // A queue is its consumers' own: the way back to the group
                // is the queue the letter came from.
                let output = redrive.output_of(letter, Some(letter.message.metadata().source()))?;
                match self.publisher.send(output).await {
                    Ok(receipt) => receipts.push((*tag, *id, letter.class, receipt)),
                    Err(error) => {
                        failure = Some(((*id).clone(), error));
                        break;
                    }
                }
            }
            let mut confirmed = Vec::with_capacity(receipts.len());
            for (tag, id, class, receipt) in receipts {
                match receipt.await {
                    Ok(_) => confirmed.push((tag, class)),
                    Err(error) => {
                        if failure.is_none() {
                            failure = Some((id.clone(), error));
                        }
                    }
                }
            }
            let tags: Vec<u64> = confirmed.iter().map(|(tag, _)| *tag).collect();
            self.ack(&pass.channel, &tags)
                .await
                .map_err(|error| self.failed("remove letters from", error))?;
            report.redriven += tags.len() as u64;
            for (_, class) in confirmed {
                *report.by_class.entry(class.as_str()).or_default() += 1;
            }
            redrive.report_progress(report.redriven);
            if let Some((id, source)) = failure {
                return Err(StoreError::Redrive {
                    id,
                    report: Box::new(std::mem::take(report)),
                    source,
                });
            }
        }
        Ok(())
    }
}

fn skipped(id: LetterId, reason: SkipReason) -> Skipped {
    Skipped::new(id, reason)
}

/// A letter's id, made from its envelope so that every pass gives the same.
fn letter_id(
    letter: &Result<DeadLetter, intake_core::dead_letter::EnvelopeError>,
    index: usize,
) -> LetterId {
    match letter {
        Ok(letter) => {
            let metadata = letter.message.metadata();
            let millis = letter
                .failed_at
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| since.as_millis());
            LetterId::new(format!(
                "{millis}@{}/{}/{}",
                metadata.source(),
                metadata.partition(),
                metadata.position()
            ))
        }
        Err(_) => LetterId::new(format!("unreadable#{index}")),
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
        let pass = self.pass("read").await?;
        let mut summary = Summary::default();
        for (_, stored) in pass
            .entries
            .iter()
            .filter(|(_, stored)| filter.matches(stored))
        {
            summary.add(stored);
        }
        close(pass.connection, pass.channel).await;
        Ok(summary)
    }

    async fn list(
        &self,
        filter: &Filter,
        limit: usize,
        after: Option<&LetterId>,
    ) -> Result<Page, StoreError> {
        let pass = self.pass("list").await?;
        let start = match after {
            None => 0,
            Some(after) => pass
                .entries
                .iter()
                .position(|(_, stored)| &stored.id == after)
                .map_or(pass.entries.len(), |at| at + 1),
        };
        let mut page = Page::default();
        let mut looked_at = None;
        for (_, stored) in pass.entries.get(start..).unwrap_or_default() {
            if page.letters.len() == limit {
                page.next = looked_at;
                break;
            }
            looked_at = Some(stored.id.clone());
            if filter.matches(stored) {
                page.letters.push(stored.clone().without_payload());
            }
        }
        close(pass.connection, pass.channel).await;
        Ok(page)
    }

    async fn read(&self, id: &LetterId) -> Result<StoredLetter, StoreError> {
        let pass = self.pass("read").await?;
        let found = pass
            .entries
            .iter()
            .find(|(_, stored)| &stored.id == id)
            .map(|(_, stored)| stored.clone());
        close(pass.connection, pass.channel).await;
        found.ok_or_else(|| StoreError::NotFound { id: id.clone() })
    }

    async fn redrive(
        &self,
        selection: &Selection,
        redrive: &Redrive,
    ) -> Result<RedriveReport, StoreError> {
        let pass = self.pass("read").await?;
        let mut report = RedriveReport::default();
        report.dry_run = redrive.is_dry_run();
        let outcome = self
            .redrive_pass(&pass, selection, redrive, &mut report)
            .await;
        close(pass.connection, pass.channel).await;
        outcome.map(|()| report)
    }

    async fn purge(&self, selection: &Selection) -> Result<u64, StoreError> {
        let pass = self.pass("read").await?;
        let tags: Vec<u64> = Self::select(&pass, selection)
            .into_iter()
            .filter_map(Result::ok)
            .map(|(tag, _)| *tag)
            .collect();
        let acked = self.ack(&pass.channel, &tags).await;
        close(pass.connection, pass.channel).await;
        acked.map_err(|error| self.failed("remove letters from", error))?;
        Ok(tags.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use intake_core::dead_letter::EnvelopeError;
    use intake_core::{Message, Metadata, Position};

    use super::*;

    #[test]
    fn a_letter_id_names_its_failure_time_and_origin_and_an_unreadable_entry_its_place() {
        let metadata = Metadata::new("orders".into(), 2, Position::Tag(7));
        let mut letter = DeadLetter::new(Message::new("x", metadata), "bad", 1);
        letter.failed_at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(
            letter_id(&Ok(letter), 0).as_str(),
            "1700000000123@orders/2/7"
        );
        let unreadable = Err(EnvelopeError::Missing {
            field: "intake.dlq.version",
        });
        assert_eq!(letter_id(&unreadable, 3).as_str(), "unreadable#3");
    }
}
