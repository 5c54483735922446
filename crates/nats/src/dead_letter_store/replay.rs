//! [`NatsReplayPublisher`]: a replayed letter published back to the
//! subject it was consumed from, or to the subject a replay names.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream::{self, ErrorCode, context::GetStreamErrorKind};
use intake_core::publish::{Output, PublishError, PublishErrorKind, Publisher};

use crate::publisher::{NatsPublisher, NatsReceipt};

/// Publishes a replayed letter's message through a [`NatsPublisher`],
/// to the subject it was consumed from.
///
/// A NATS letter's origin is a stream and its key the subject the message
/// was stored on ([`NatsSource`](crate::NatsSource) reads the key from the
/// subject), so a replay "to its origin" (an [`Output`] whose destination
/// names a stream) is published to the key as the subject, exactly; the
/// source then reads the same key again. An output to any other
/// destination (`Replay::to("SUBJECT")`) is published to that subject,
/// exactly: the original subject is no token of another.
///
/// Whether a destination names a stream is asked of the server once per
/// destination (a stream info request, bounded by the request timeout).
#[derive(Clone)]
pub struct NatsReplayPublisher {
    context: jetstream::Context,
    publisher: NatsPublisher,
    timeout: Duration,
    streams: Arc<Mutex<HashMap<Arc<str>, bool>>>,
}

impl fmt::Debug for NatsReplayPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsReplayPublisher")
            .field("publisher", &self.publisher)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl NatsReplayPublisher {
    pub(super) fn new(
        context: jetstream::Context,
        publisher: NatsPublisher,
        timeout: Duration,
    ) -> Self {
        Self {
            context,
            publisher,
            timeout,
            streams: Arc::default(),
        }
    }

    /// Whether `destination` is the name of a stream on the server.
    async fn is_stream(&self, destination: &Arc<str>) -> Result<bool, PublishError> {
        if let Some(known) = self
            .streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(destination)
        {
            return Ok(*known);
        }
        // A subject with dots or wildcards is never a stream's name.
        let is_stream = match destination.contains(['.', '*', '>', ' ']) {
            true => false,
            false => {
                let asked =
                    tokio::time::timeout(self.timeout, self.context.get_stream(&**destination))
                        .await
                        .map_err(|_| {
                            PublishError::new(
                                PublishErrorKind::Unavailable,
                                &**destination,
                                format!(
                                    "the server did not say within {:?} whether it is a stream",
                                    self.timeout
                                ),
                            )
                        })?;
                match asked {
                    Ok(_) => true,
                    Err(error)
                        if matches!(error.kind(), GetStreamErrorKind::JetStream(ref js)
                            if js.error_code() == ErrorCode::STREAM_NOT_FOUND) =>
                    {
                        false
                    }
                    Err(_) => {
                        return Err(PublishError::new(
                            PublishErrorKind::Unavailable,
                            &**destination,
                            "the server could not say whether it is a stream",
                        ));
                    }
                }
            }
        };
        self.streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(destination.clone(), is_stream);
        Ok(is_stream)
    }
}

impl Publisher for NatsReplayPublisher {
    type Receipt = NatsReceipt;

    async fn send(&self, output: Output) -> Result<NatsReceipt, PublishError> {
        let is_stream = self.is_stream(output.destination_shared()).await?;
        let (destination, payload, key, headers) = output.into_parts();
        let subject: Arc<str> = match (is_stream, key) {
            (false, _) => destination,
            (true, Some(key)) => match std::str::from_utf8(&key) {
                Ok(subject) => subject.into(),
                Err(_) => {
                    return Err(PublishError::new(
                        PublishErrorKind::Rejected,
                        &*destination,
                        "the letter's original subject is not UTF-8",
                    ));
                }
            },
            (true, None) => {
                return Err(PublishError::new(
                    PublishErrorKind::Rejected,
                    &*destination,
                    "the letter has no original subject to publish to; replay it to a subject",
                ));
            }
        };
        // Without a key the publisher sends to the subject as it is.
        self.publisher
            .send(Output::new(subject, payload).with_headers(headers))
            .await
    }
}
