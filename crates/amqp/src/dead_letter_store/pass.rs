//! A pass over the dead-letter queue: the letters it takes without
//! acknowledging them, their ids, and how far it got.

use std::collections::HashMap;
use std::time::{Duration, UNIX_EPOCH};

use intake_core::dead_letter::store::{LetterId, StoreError, StoredLetter};
use intake_core::dead_letter::{DeadLetter, EnvelopeError};
use lapin::options::{BasicAckOptions, BasicGetOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};

use crate::connection::open_within;
use crate::dead_letter::read_stored;
use crate::error::{Error, Operation, classify};

use super::AmqpDeadLetterStore;

/// One pass over the queue: the connection, the channel holding every
/// letter taken and not acknowledged, and how far it got.
pub(super) struct Pass {
    pub(super) connection: Connection,
    pub(super) channel: Channel,
    /// Letters ready when the pass began: it takes no more.
    pub(super) ready: u64,
    /// Letters taken so far.
    pub(super) taken: u64,
    /// Letters taken and not acknowledged: the broker puts them back when
    /// the pass ends.
    pub(super) held: usize,
    /// Whether the queue had no more to give (another reader holds them).
    pub(super) drained: bool,
    pub(super) ids: Ids,
}

/// Makes the ids of a pass's letters.
#[derive(Default)]
pub(super) struct Ids {
    /// How often each id of a letter without a sink's id came up.
    repeated: HashMap<String, u32>,
}

pub(super) async fn close(connection: Connection, channel: Channel) {
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

pub(super) async fn bounded<T>(
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
pub(super) enum BoundedError {
    #[error("the broker failed the request")]
    Broker(#[source] lapin::Error),
    #[error("the broker did not answer within {0:?}")]
    TimedOut(Duration),
}

impl AmqpDeadLetterStore {
    pub(super) fn failed(
        &self,
        operation: &'static str,
        error: impl Into<intake_core::BoxError>,
    ) -> StoreError {
        StoreError::broker(operation, &self.queue, error)
    }

    pub(super) fn broker_error(&self, error: BoundedError) -> Error {
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

    pub(super) async fn open(&self) -> Result<(Connection, Channel), Error> {
        let connection = open_within(
            &self.url,
            Some(&self.connection_name),
            &self.tls,
            self.connect_timeout,
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
    pub(super) async fn ready(&self, channel: &Channel) -> Result<u32, Error> {
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
    pub(super) async fn pass(&self, operation: &'static str) -> Result<Pass, StoreError> {
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
    pub(super) async fn next(&self, pass: &mut Pass) -> Result<Option<Entry>, Error> {
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
    pub(super) async fn ack(&self, pass: &mut Pass, tags: &[u64]) -> Result<(), Error> {
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
    pub(super) fn short(&self, pass: &Pass) -> bool {
        !self.partial_answers && pass.stopped_short()
    }

    /// The error of an operation on every letter that `pass` could not
    /// look at in full; `done` says what it did meanwhile.
    pub(super) fn stopped_short(
        &self,
        operation: &'static str,
        pass: &Pass,
        done: String,
    ) -> StoreError {
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
}
/// A letter a pass took, with the delivery tag that acknowledges it.
pub(super) struct Entry {
    pub(super) tag: u64,
    pub(super) stored: StoredLetter,
}

impl Pass {
    /// Whether the pass ended before it took every letter ready when it
    /// began (it held `max_letters` unacknowledged), so that letters past
    /// it were not looked at.
    pub(super) fn stopped_short(&self) -> bool {
        !self.drained && self.taken < self.ready
    }
}

impl Ids {
    /// The id of the `index`th letter of the pass, made from its envelope
    /// so that every pass gives the same: `<failed at, ms>@<origin
    /// queue>/<partition>/<position>/<sink's id>`. A letter without a
    /// sink's id (written before it had one) gets `~2`, `~3`, … appended
    /// when the same id came before it in this pass.
    pub(super) fn id_of(
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
