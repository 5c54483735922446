//! The dead-letter stream as a [`DeadLetterLog`]: its requests (stream
//! info, message gets by subject or by sequence, message deletes), each
//! bounded by the request timeout.

use std::future::Future;

use async_nats::jetstream::{self, ErrorCode, context::GetStreamErrorKind, stream::Stream};
use futures_util::StreamExt;
use intake_core::dead_letter::store::{DeadLetterLog, LetterId, StoreError, StoredLetter};

use super::NatsDeadLetters;
use super::entries::{NOT_THERE, gone, sequence_of, stored, subject_matches};
use crate::error::{Error, boxed};

impl NatsDeadLetters {
    /// The subject filter of a scan: the store's subject, or every subject.
    fn filter(&self) -> &str {
        self.subject.as_deref().unwrap_or(">")
    }

    fn failed(&self, operation: &'static str, what: String, error: BoxedCause) -> StoreError {
        let error = match error {
            BoxedCause::TimedOut => Error::Unconfirmed {
                endpoint: self.endpoint.to_string(),
                what,
                waited: self.timeout,
            },
            BoxedCause::Client(source) => Error::JetStream {
                endpoint: self.endpoint.to_string(),
                operation: what,
                transient: true,
                source,
            },
        };
        StoreError::broker(operation, &*self.stream, error)
    }

    /// Runs `request` within the request timeout.
    async fn bounded<T, E>(
        &self,
        operation: &'static str,
        what: impl FnOnce() -> String,
        request: impl Future<Output = Result<T, E>>,
    ) -> Result<Result<T, E>, StoreError> {
        tokio::time::timeout(self.timeout, request)
            .await
            .map_err(|_| self.failed(operation, what(), BoxedCause::TimedOut))
    }

    /// The stream with its info, `None` when it does not exist (no letter
    /// was ever written: the sink creates it with the first).
    async fn info(&self, operation: &'static str) -> Result<Option<Stream>, StoreError> {
        let what = || format!("get the info of stream `{}`", self.stream);
        match self
            .bounded(operation, what, self.context.get_stream(&*self.stream))
            .await?
        {
            Ok(stream) => Ok(Some(stream)),
            Err(error)
                if matches!(error.kind(), GetStreamErrorKind::JetStream(ref js)
                    if js.error_code() == ErrorCode::STREAM_NOT_FOUND) =>
            {
                Ok(None)
            }
            Err(error) => Err(self.failed(operation, what(), BoxedCause::Client(boxed(error)))),
        }
    }

    /// The stream's handle, without its info, for `operation`.
    async fn open(&self, operation: &'static str) -> Result<Stream<()>, StoreError> {
        self.context
            .get_stream_no_info(&*self.stream)
            .await
            .map_err(|error| {
                self.failed(
                    operation,
                    format!("open stream `{}`", self.stream),
                    BoxedCause::Client(boxed(error)),
                )
            })
    }

    /// The first entry of the store's subject at or after `sequence`.
    async fn first_from(
        &self,
        stream: &Stream<()>,
        sequence: u64,
    ) -> Result<Option<StoredLetter>, StoreError> {
        let what = || format!("read stream `{}` from sequence {sequence}", self.stream);
        let got = self
            .bounded(
                "list",
                what,
                stream.get_first_raw_message_by_subject(self.filter(), sequence),
            )
            .await?;
        match got {
            Ok(message) => Ok(Some(stored(message))),
            Err(error) if gone(error.kind()) => Ok(None),
            Err(error) => Err(self.failed("list", what(), BoxedCause::Client(boxed(error)))),
        }
    }
}

enum BoxedCause {
    TimedOut,
    Client(intake_core::BoxError),
}

#[async_trait::async_trait]
impl DeadLetterLog for NatsDeadLetters {
    fn name(&self) -> &str {
        self.subject.as_deref().unwrap_or(&self.stream)
    }

    async fn entries(&self) -> Result<u64, StoreError> {
        let Some(stream) = self.info("count").await? else {
            return Ok(0);
        };
        let Some(subject) = &self.subject else {
            return Ok(stream.cached_info().state.messages);
        };
        let what = || format!("count subject `{subject}` of stream `{}`", self.stream);
        let counted = self
            .bounded("count", what, async {
                let mut subjects = stream.info_with_subjects(&**subject).await.map_err(boxed)?;
                let mut total = 0u64;
                while let Some(entry) = subjects.next().await {
                    let (_, count) = entry.map_err(boxed)?;
                    total = total.saturating_add(count as u64);
                }
                Ok::<u64, intake_core::BoxError>(total)
            })
            .await?;
        counted.map_err(|error| self.failed("count", what(), BoxedCause::Client(error)))
    }

    /// The stream's last sequence: at or after the newest letter of the
    /// subject, which is all a scan's end needs (a deleted or other
    /// subject's sequence there ends the scan at the same place).
    async fn last(&self) -> Result<Option<LetterId>, StoreError> {
        let Some(stream) = self.info("read").await? else {
            return Ok(None);
        };
        let state = &stream.cached_info().state;
        Ok((state.messages > 0 && state.last_sequence > 0)
            .then(|| LetterId::new(state.last_sequence.to_string())))
    }

    async fn scan(
        &self,
        after: Option<&LetterId>,
        through: Option<&LetterId>,
        max: usize,
    ) -> Result<Vec<StoredLetter>, StoreError> {
        let mut next = match after.map(sequence_of).transpose()? {
            None => 1,
            Some(after) => match after.checked_add(1) {
                Some(next) => next,
                None => return Ok(Vec::new()),
            },
        };
        let through = through.map(sequence_of).transpose()?.unwrap_or(u64::MAX);
        let stream = self.open("list").await?;
        let mut entries = Vec::with_capacity(max.min(256));
        while entries.len() < max && next <= through {
            let Some(entry) = self.first_from(&stream, next).await? else {
                break;
            };
            let sequence = sequence_of(&entry.id)?;
            if sequence > through {
                break;
            }
            entries.push(entry);
            match sequence.checked_add(1) {
                Some(after) => next = after,
                None => break,
            }
        }
        Ok(entries)
    }

    async fn get(&self, id: &LetterId) -> Result<Option<StoredLetter>, StoreError> {
        let sequence = sequence_of(id)?;
        let stream = self.open("read").await?;
        let what = || format!("read sequence {sequence} of stream `{}`", self.stream);
        match self
            .bounded("read", what, stream.get_raw_message(sequence))
            .await?
        {
            // A sequence of another subject is no letter of this store: a
            // purge by id must not delete another consumer's letter.
            Ok(message)
                if self
                    .subject
                    .as_deref()
                    .is_some_and(|filter| !subject_matches(filter, &message.subject)) =>
            {
                Ok(None)
            }
            Ok(message) => Ok(Some(stored(message))),
            Err(error) if gone(error.kind()) => Ok(None),
            Err(error) => Err(self.failed("read", what(), BoxedCause::Client(boxed(error)))),
        }
    }

    async fn remove(&self, ids: &[LetterId]) -> Result<u64, StoreError> {
        let sequences = ids.iter().map(sequence_of).collect::<Result<Vec<_>, _>>()?;
        if sequences.is_empty() {
            return Ok(0);
        }
        let stream = self.open("remove letters from").await?;
        let mut removed = 0;
        for sequence in sequences {
            let what = || format!("delete sequence {sequence} of stream `{}`", self.stream);
            match self
                .bounded("remove letters from", what, stream.delete_message(sequence))
                .await?
            {
                Ok(true) => removed += 1,
                Ok(false) => {}
                // Deleted meanwhile (another purge), or never there: a file
                // stream of nats-server 2.9 answers 10057 (delete failed), a
                // memory stream 10043 (sequence not found).
                Err(error)
                    if matches!(error.kind(), jetstream::stream::DeleteMessageErrorKind::JetStream(ref js)
                        if NOT_THERE.contains(&js.error_code())) => {}
                Err(error) => {
                    return Err(self.failed(
                        "remove letters from",
                        what(),
                        BoxedCause::Client(boxed(error)),
                    ));
                }
            }
        }
        Ok(removed)
    }
}
