//! [`AmqpDeadLetterStore`]: the dead letters waiting in an AMQP queue, as
//! a [`DeadLetterStore`].

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::time::{Duration, UNIX_EPOCH};

use intake_core::dead_letter::store::{
    DeadLetterStore, Filter, LetterId, Page, Redrive, RedriveReport, Selection, SkipReason,
    Skipped, StoreError, StoredLetter, Summary,
};
use intake_core::dead_letter::{DeadLetter, EnvelopeError};
use intake_core::publish::PublishError;
use intake_core::publish::Publisher;
use intake_core::{ConfigError, ErrorClass};
use lapin::options::{BasicAckOptions, BasicGetOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};

use crate::connection::{DEFAULT_CONNECT_TIMEOUT, open_within};
use crate::dead_letter::read_stored;
use crate::error::{Error, Operation, classify};
use crate::publisher::{AmqpPublisher, AmqpReceipt};
use crate::tls::Tls;
use crate::url::AmqpUrl;

/// Letters a redrive publishes before it awaits their confirms.
const BATCH: usize = 256;

/// Payload bytes a redrive publishes before it awaits their confirms (one
/// letter at least): with [`BATCH`], what a pass holds in memory at most,
/// besides the letter it reads.
const WINDOW_BYTES: usize = 32 << 20;

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
/// store takes the messages that were ready when it began, one at a time
/// with `basic_get`, without acknowledging them; it acknowledges a letter
/// it purges at once, and one it redrives once the publisher confirmed
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
///   listing's page (without payloads) and a redrive's letters awaiting
///   their confirms (at most 256, and 32 MiB of payload beyond the first):
///   the memory does not grow with the queue;
/// - **when a pass holds `max_letters`, it stops**, and what needed every
///   letter says so with [`Error::PassLimit`] (the source of a
///   [`StoreError::Broker`]), naming how many letters it looked at and what
///   it did: a count or summary with a filter, a listing that reaches the
///   end of what it looked at, a read of an id it did not find, a purge or
///   redrive by filter, or of ids it did not find. A purge or redrive
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

/// Builds an [`AmqpDeadLetterStore`]; see [`AmqpDeadLetterStore::builder`].
#[must_use = "a builder does nothing until `.build(publisher).await`"]
pub struct AmqpDeadLetterStoreBuilder {
    url: String,
    tls: Tls,
    queue: Option<String>,
    command_timeout: Duration,
    max_letters: usize,
    partial_answers: bool,
}

impl fmt::Debug for AmqpDeadLetterStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpDeadLetterStoreBuilder")
            .field("url", &intake_core::redact::url(&self.url))
            .field("queue", &self.queue)
            .field("max_letters", &self.max_letters)
            .field("partial_answers", &self.partial_answers)
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

    /// The most letters one pass holds unacknowledged (default 10,000):
    /// the letters it looked at and leaves in the queue. It bounds what the
    /// broker holds for the pass; a pass that reaches it stops, and an
    /// operation that needed every letter fails with
    /// [`Error::PassLimit`](crate::Error::PassLimit) (see the
    /// [type docs](AmqpDeadLetterStore)).
    pub fn max_letters(mut self, max: usize) -> Self {
        self.max_letters = max;
        self
    }

    /// Operations that need every letter answer for the letters one pass
    /// looked at when it stops at
    /// [`max_letters`](Self::max_letters), instead of failing with
    /// [`Error::PassLimit`](crate::Error::PassLimit): a count or summary
    /// counts those, a listing ends after them, a read or an id not among
    /// them is not found, a purge or redrive acts on them. Silent about the
    /// rest: for a caller that says itself that letters remain (an
    /// unfiltered [`count`](DeadLetterStore::count) is exact: the queue's
    /// ready messages).
    pub fn partial_answers(mut self) -> Self {
        self.partial_answers = true;
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
            partial_answers: self.partial_answers,
        };
        let (connection, channel) = store.open().await?;
        let declared = store.ready(&channel).await;
        close(connection, channel).await;
        declared.map(|_| store)
    }
}

/// One pass over the queue: the connection, the channel holding every
/// letter taken and not acknowledged, and how far it got.
struct Pass {
    connection: Connection,
    channel: Channel,
    /// Letters ready when the pass began: it takes no more.
    ready: u64,
    /// Letters taken so far.
    taken: u64,
    /// Letters taken and not acknowledged: the broker puts them back when
    /// the pass ends.
    held: usize,
    /// Whether the queue had no more to give (another reader holds them).
    drained: bool,
    ids: Ids,
}

/// Makes the ids of a pass's letters.
#[derive(Default)]
struct Ids {
    /// How often each id of a letter without a sink's id came up.
    repeated: HashMap<String, u32>,
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
            partial_answers: false,
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

    /// Starts a pass: its own connection and channel, and the number of
    /// letters ready now (it takes no more: later ones are for the next).
    async fn pass(&self, operation: &'static str) -> Result<Pass, StoreError> {
        let (connection, channel) = self
            .open()
            .await
            .map_err(|error| self.failed(operation, error))?;
        match self.ready(&channel).await {
            Ok(ready) => Ok(Pass {
                connection,
                channel,
                ready: u64::from(ready),
                taken: 0,
                held: 0,
                drained: false,
                ids: Ids::default(),
            }),
            Err(error) => {
                close(connection, channel).await;
                Err(self.failed(operation, error))
            }
        }
    }

    /// The next letter of `pass`, taken unacknowledged; `None` once it took
    /// every letter ready when it began, or holds
    /// [`max_letters`](AmqpDeadLetterStoreBuilder::max_letters)
    /// unacknowledged (then [`Pass::stopped_short`]).
    async fn next(&self, pass: &mut Pass) -> Result<Option<Entry>, Error> {
        if pass.drained || pass.taken >= pass.ready || pass.held >= self.max_letters {
            return Ok(None);
        }
        let got = bounded(
            self.command_timeout,
            pass.channel.basic_get(
                self.queue.as_str().into(),
                BasicGetOptions { no_ack: false },
            ),
        )
        .await
        .map_err(|error| self.broker_error(error))?;
        // Another reader took the rest: the pass saw what was left.
        let Some(message) = got else {
            pass.drained = true;
            return Ok(None);
        };
        let index = pass.taken;
        pass.taken += 1;
        pass.held += 1;
        let delivery = message.delivery;
        let tag = delivery.delivery_tag;
        let payload_bytes = delivery.data.len();
        let (letter, token) = read_stored(delivery);
        let id = pass.ids.id_of(&letter, token.as_deref(), index);
        Ok(Some(Entry {
            tag,
            stored: StoredLetter::new(id, payload_bytes, letter),
        }))
    }

    /// Acknowledges `tags` of `pass`: the letters leave the queue.
    async fn ack(&self, pass: &mut Pass, tags: &[u64]) -> Result<(), Error> {
        for &tag in tags {
            bounded(
                self.command_timeout,
                pass.channel.basic_ack(tag, BasicAckOptions::default()),
            )
            .await
            .map_err(|error| self.broker_error(error))?;
            pass.held = pass.held.saturating_sub(1);
        }
        Ok(())
    }

    /// Whether `pass` stopped before it looked at every letter, and this
    /// store says so rather than answer for what it saw.
    fn short(&self, pass: &Pass) -> bool {
        !self.partial_answers && pass.stopped_short()
    }

    /// The error of an operation on every letter that `pass` could not
    /// look at in full; `done` says what it did meanwhile.
    fn stopped_short(&self, operation: &'static str, pass: &Pass, done: String) -> StoreError {
        self.failed(
            operation,
            Error::PassLimit {
                endpoint: self.url.endpoint().to_owned(),
                queue: self.queue.clone(),
                ready: pass.ready,
                looked_at: pass.taken,
                max_letters: self.max_letters,
                done,
            },
        )
    }

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

    async fn redrive_pass(
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

/// A letter a pass took, with the delivery tag that acknowledges it.
struct Entry {
    tag: u64,
    stored: StoredLetter,
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

/// The letters a selection takes, and for ids, which were found.
enum Wanted<'s> {
    Matching(&'s Filter),
    Ids {
        wanted: HashSet<&'s LetterId>,
        found: HashSet<&'s LetterId>,
        order: &'s [LetterId],
    },
}

impl<'s> Wanted<'s> {
    fn of(selection: &'s Selection) -> Self {
        match selection {
            Selection::Matching(filter) => Wanted::Matching(filter),
            Selection::Ids(ids) => Wanted::Ids {
                wanted: ids.iter().collect(),
                found: HashSet::new(),
                order: ids,
            },
        }
    }

    fn is_filter(&self) -> bool {
        matches!(self, Wanted::Matching(_))
    }

    /// Whether `stored` is selected (an id, once).
    fn takes(&mut self, stored: &StoredLetter) -> bool {
        match self {
            Wanted::Matching(filter) => filter.matches(stored),
            Wanted::Ids { wanted, found, .. } => match wanted.get(&stored.id) {
                Some(id) => found.insert(id),
                None => false,
            },
        }
    }

    /// Whether every id was found (never, for a filter).
    fn all_found(&self) -> bool {
        match self {
            Wanted::Matching(_) => false,
            Wanted::Ids { wanted, found, .. } => found.len() == wanted.len(),
        }
    }

    /// The ids not found, in the order given, once each.
    fn missing(&self) -> Vec<LetterId> {
        match self {
            Wanted::Matching(_) => Vec::new(),
            Wanted::Ids { found, order, .. } => {
                let mut seen = HashSet::new();
                order
                    .iter()
                    .filter(|id| !found.contains(id) && seen.insert(*id))
                    .cloned()
                    .collect()
            }
        }
    }
}

fn skipped(id: LetterId, reason: SkipReason) -> Skipped {
    Skipped::new(id, reason)
}

impl Pass {
    /// Whether the pass ended before it took every letter ready when it
    /// began (it held `max_letters` unacknowledged), so that letters past
    /// it were not looked at.
    fn stopped_short(&self) -> bool {
        !self.drained && self.taken < self.ready
    }
}

impl Ids {
    /// The id of the `index`th letter of the pass, made from its envelope
    /// so that every pass gives the same: `<failed at, ms>@<origin
    /// queue>/<partition>/<position>/<sink's id>`. A letter without a
    /// sink's id (written before it had one) gets `~2`, `~3`, … appended
    /// when the same id came before it in this pass.
    fn id_of(
        &mut self,
        letter: &Result<DeadLetter, EnvelopeError>,
        token: Option<&str>,
        index: u64,
    ) -> LetterId {
        let Ok(letter) = letter else {
            return LetterId::new(format!("unreadable#{index}"));
        };
        let metadata = letter.message.metadata();
        let millis = letter
            .failed_at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis());
        let base = format!(
            "{millis}@{}/{}/{}",
            metadata.source(),
            metadata.partition(),
            metadata.position()
        );
        match token {
            Some(token) => LetterId::new(format!("{base}/{token}")),
            None => {
                let seen = self.repeated.entry(base.clone()).or_insert(0);
                *seen += 1;
                match *seen {
                    1 => LetterId::new(base),
                    repeat => LetterId::new(format!("{base}~{repeat}")),
                }
            }
        }
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

    async fn redrive(
        &self,
        selection: &Selection,
        redrive: &Redrive,
    ) -> Result<RedriveReport, StoreError> {
        let mut pass = self.pass("read").await?;
        let mut report = RedriveReport::default();
        report.dry_run = redrive.is_dry_run();
        let outcome = self
            .redrive_pass(&mut pass, selection, redrive, &mut report)
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use intake_core::dead_letter::EnvelopeError;
    use intake_core::{Message, Metadata, Position};

    use super::*;

    #[test]
    fn a_letter_id_names_its_failure_time_origin_and_sink_and_an_unreadable_entry_its_place() {
        let metadata = Metadata::new("orders".into(), 2, Position::Tag(7));
        let mut letter = DeadLetter::new(Message::new("x", metadata), "bad", 1);
        letter.failed_at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        let letter = Ok(letter);
        let mut ids = Ids::default();
        assert_eq!(
            ids.id_of(&letter, Some("9f3a-12"), 0).as_str(),
            "1700000000123@orders/2/7/9f3a-12"
        );
        // Letters written before sinks gave ids: a repeat is told apart by
        // its place among the repeats.
        assert_eq!(
            ids.id_of(&letter, None, 1).as_str(),
            "1700000000123@orders/2/7"
        );
        assert_eq!(
            ids.id_of(&letter, None, 2).as_str(),
            "1700000000123@orders/2/7~2"
        );
        let unreadable = Err(EnvelopeError::Missing {
            field: "intake.dlq.version",
        });
        assert_eq!(ids.id_of(&unreadable, None, 3).as_str(), "unreadable#3");
    }
}
