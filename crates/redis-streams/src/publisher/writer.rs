//! The writer task: takes queued outputs in order, sends them as one
//! pipeline of `XADD`s, and answers each receipt from its own reply.

use std::sync::Arc;
use std::time::Duration;

use intake_core::publish::{Confirmation, Output, PublishError, PublishErrorKind};
use redis::{RedisError, Value};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};
use tokio::time::Instant;

use super::receipt::Answer;
use crate::TRANSIENT_CODES;
use crate::connection::SharedConnection;
use crate::error::{Error, server_code};
use crate::stream_id::StreamId;

/// Most bytes of payloads, keys and headers one pipeline carries (at least
/// one output): a pipeline is encoded whole before it is written, so this
/// bounds that copy however large the outputs are.
const MAX_PIPELINE_BYTES: usize = 4 << 20;

/// One output on its way: what to write, whom to answer, when it was
/// sent, and its room in the buffer, given back once answered.
pub(super) struct Queued {
    pub(super) output: Output,
    pub(super) reply: oneshot::Sender<Answer>,
    pub(super) sent_at: Instant,
    pub(super) room: OwnedSemaphorePermit,
}

/// How outputs become entries.
pub(super) struct EntryFormat {
    pub(super) payload_field: Arc<str>,
    pub(super) key_field: Arc<str>,
    /// `MAXLEN ~ n` on every `XADD`.
    pub(super) max_len: Option<u64>,
}

impl EntryFormat {
    /// Adds the `XADD` of `output` to `pipe`: payload field first, then
    /// the key field (unless the first header of that name carries the key
    /// already), then the headers in order, so that the source's decoder
    /// finds the payload and key where it looks first.
    fn add(&self, pipe: &mut redis::Pipeline, output: &Output) {
        let mut command = redis::cmd("XADD");
        command.arg(output.destination());
        if let Some(max_len) = self.max_len {
            command.arg("MAXLEN").arg("~").arg(max_len);
        }
        command.arg("*");
        let headers = output.headers();
        let key = output
            .key()
            .filter(|key| headers.get(&self.key_field) != Some(*key))
            .map(|key| (&*self.key_field, key.as_ref()));
        entry_fields(
            &mut command,
            &self.payload_field,
            output.payload(),
            key,
            headers,
        );
        pipe.add_command(command);
    }
}

/// Adds an entry's fields to an `XADD`: the payload field first, then the
/// key field if given, then the headers in order, so that the source's
/// decoder finds the payload and key where it looks first. The publisher
/// writes outputs this way, and the parking its copies.
pub(crate) fn entry_fields(
    command: &mut redis::Cmd,
    payload_field: &str,
    payload: &[u8],
    key: Option<(&str, &[u8])>,
    headers: &intake_core::Headers,
) {
    command.arg(payload_field).arg(payload);
    if let Some((field, key)) = key {
        command.arg(field).arg(key);
    }
    for header in headers {
        command.arg(&*header.name).arg(header.value.as_ref());
    }
}

/// Bytes an output adds to a pipeline, near enough for
/// [`MAX_PIPELINE_BYTES`].
fn size_of(output: &Output) -> usize {
    let headers: usize = output
        .headers()
        .iter()
        .map(|header| header.name.len() + header.value.len())
        .sum();
    output.destination().len()
        + output.payload().len()
        + output.key().map_or(0, |key| key.len())
        + headers
}

pub(super) struct Writer {
    pub(super) queue: mpsc::UnboundedReceiver<Queued>,
    pub(super) connection: SharedConnection,
    pub(super) format: EntryFormat,
    pub(super) max_pipeline: usize,
    pub(super) queue_timeout: Duration,
    pub(super) command_timeout: Duration,
    /// The buffer's permits: each answered output's is given back here,
    /// all of a pipeline's at once (one lock instead of one per output).
    pub(super) room: Arc<Semaphore>,
    pub(super) closing: Arc<Notify>,
    pub(super) stopped: watch::Sender<bool>,
}

impl Writer {
    /// Runs until the publisher is closed or dropped and every output sent
    /// before is answered.
    pub(super) async fn run(mut self) {
        let mut batch = Vec::new();
        let mut pipe = redis::pipe();
        let mut failing = false;
        let mut closed = false;
        loop {
            let first = tokio::select! {
                biased;
                () = self.closing.notified(), if !closed => {
                    // Sends fail from now on; what is queued is still sent.
                    self.queue.close();
                    closed = true;
                    continue;
                }
                first = self.queue.recv() => first,
            };
            let Some(first) = first else {
                break;
            };
            self.take(first, &mut batch);
            if batch.is_empty() {
                continue;
            }
            pipe.clear();
            pipe.ignore_errors();
            for queued in &batch {
                self.format.add(&mut pipe, &queued.output);
            }
            let mut connection = self.connection.get();
            // The connection's own response timeout does not cover waiting
            // for a reconnect; this bounds both.
            let reply = tokio::time::timeout(self.command_timeout, async {
                pipe.query_async::<Vec<Value>>(&mut connection).await
            })
            .await
            .unwrap_or_else(|_| {
                Err(RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no reply to the pipeline within the command timeout",
                )))
            });
            let answered = batch.len();
            match reply {
                Ok(replies) if replies.len() == batch.len() => {
                    if failing {
                        tracing::info!(
                            endpoint = %self.connection.connector().endpoint(),
                            "publishing to Redis works again"
                        );
                        failing = false;
                    }
                    self.answer(&mut batch, replies).await;
                }
                Ok(replies) => {
                    let detail = format!(
                        "{} replies to a pipeline of {} entries",
                        replies.len(),
                        batch.len()
                    );
                    tracing::warn!(%detail, "cannot tell which outputs Redis added");
                    for queued in batch.drain(..) {
                        let failed = unconfirmed(queued.output.destination()).with_source(
                            Error::UnexpectedReply {
                                command: "XADD",
                                detail: detail.clone(),
                            },
                        );
                        finish(queued, Err(failed));
                    }
                }
                Err(error) => {
                    let connector = self.connection.connector();
                    if failing {
                        tracing::debug!(
                            endpoint = %connector.endpoint(),
                            outputs = batch.len(),
                            %error,
                            "publishing to Redis still fails"
                        );
                    } else {
                        tracing::warn!(
                            endpoint = %connector.endpoint(),
                            outputs = batch.len(),
                            %error,
                            "publishing to Redis failed; the outputs are unconfirmed (they may or \
                             may not be stored) and the next ones are tried as they come"
                        );
                        failing = true;
                    }
                    self.connection.replace_if_replica(&error).await;
                    for queued in batch.drain(..) {
                        let destination = queued.output.destination();
                        let source = connector.key_error(error.clone(), "XADD", destination);
                        let failed = unconfirmed(destination).with_source(source);
                        finish(queued, Err(failed));
                    }
                }
            }
            self.room.add_permits(answered);
        }
        tracing::debug!(
            endpoint = %self.connection.connector().endpoint(),
            "Redis publisher stopped: every output sent was answered"
        );
        let _ = self.stopped.send(true);
    }

    /// Fills `batch` with `first` and what else is queued, up to a
    /// pipeline's worth; answers at once the outputs that waited longer
    /// than the queue timeout (not sent).
    fn take(&mut self, first: Queued, batch: &mut Vec<Queued>) {
        let now = Instant::now();
        let mut bytes = 0;
        let mut expired = 0;
        let mut next = Some(first);
        while let Some(queued) = next.take() {
            if now.duration_since(queued.sent_at) > self.queue_timeout {
                let destination = queued.output.destination();
                let failed = PublishError::new(
                    PublishErrorKind::Unavailable,
                    destination,
                    format!(
                        "not sent: it waited longer than {:?} for the outputs before it (Redis \
                         is slow or unreachable); publish again",
                        self.queue_timeout
                    ),
                );
                finish(queued, Err(failed));
                expired += 1;
            } else {
                bytes += size_of(&queued.output);
                batch.push(queued);
            }
            if batch.len() < self.max_pipeline && bytes < MAX_PIPELINE_BYTES {
                next = self.queue.try_recv().ok();
            }
        }
        if expired > 0 {
            tracing::warn!(
                endpoint = %self.connection.connector().endpoint(),
                expired,
                queue_timeout = ?self.queue_timeout,
                "outputs waited too long in the publisher's queue; failed without sending them"
            );
            self.room.add_permits(expired);
        }
    }

    /// Answers each output of `batch` from its reply.
    async fn answer(&self, batch: &mut Vec<Queued>, replies: Vec<Value>) {
        let mut replaced = false;
        for (queued, reply) in batch.drain(..).zip(replies) {
            let destination = queued.output.destination();
            let answer = match reply {
                Value::ServerError(error) => {
                    let error = RedisError::from(error);
                    if !replaced {
                        replaced = self.connection.replace_if_replica(&error).await;
                    }
                    Err(self.refused(destination, error))
                }
                reply => match entry_id(&reply) {
                    Some(id) => Ok(Confirmation::at(None, Some(id.position()))),
                    None => Err(
                        unconfirmed(destination).with_source(Error::UnexpectedReply {
                            command: "XADD",
                            detail: format!("{reply:?} is not an entry id"),
                        }),
                    ),
                },
            };
            finish(queued, answer);
        }
    }

    /// The error of an entry Redis refused.
    fn refused(&self, destination: &str, error: RedisError) -> PublishError {
        let code = server_code(&error).unwrap_or_default();
        let (kind, what) = match code.as_str() {
            "WRONGTYPE" => (
                PublishErrorKind::Rejected,
                "the key holds a value that is not a stream; publish to another key or \
                 remove that one"
                    .to_owned(),
            ),
            "NOPERM" => (
                PublishErrorKind::Rejected,
                "the Redis user may not XADD to this key; grant it `+xadd` on the key".to_owned(),
            ),
            "NOAUTH" | "WRONGPASS" => (
                PublishErrorKind::Unavailable,
                "Redis refused the credentials; publish again once they are fixed".to_owned(),
            ),
            transient if TRANSIENT_CODES.contains(&transient) => (
                PublishErrorKind::Unavailable,
                format!(
                    "Redis cannot take writes now ({transient}); nothing was added; publish \
                     again later"
                ),
            ),
            _ => (
                PublishErrorKind::Rejected,
                "Redis refused the entry; sending it again fails the same way".to_owned(),
            ),
        };
        let source = self
            .connection
            .connector()
            .key_error(error, "XADD", destination);
        tracing::debug!(destination, kind = %kind, error = %source, "Redis refused an output");
        PublishError::new(kind, destination, what).with_source(source)
    }
}

/// Answers `queued`; its permit is given back by the caller, with the
/// others of its pipeline.
fn finish(queued: Queued, answer: Answer) {
    let Queued { reply, room, .. } = queued;
    room.forget();
    let _ = reply.send(answer);
}

/// An output whose pipeline got no usable reply.
fn unconfirmed(destination: &str) -> PublishError {
    PublishError::new(
        PublishErrorKind::Unavailable,
        destination,
        "no reply from Redis (connection lost or timed out); the entry may or may not have been \
         added; publish again",
    )
}

/// The entry id in an `XADD` reply.
fn entry_id(reply: &Value) -> Option<StreamId> {
    match reply {
        Value::BulkString(id) => StreamId::parse(id),
        Value::SimpleString(id) => StreamId::parse(id.as_bytes()),
        Value::VerbatimString { text, .. } => StreamId::parse(text.as_bytes()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arguments(format: &EntryFormat, output: &Output) -> Vec<String> {
        let mut pipe = redis::pipe();
        format.add(&mut pipe, output);
        let packed = pipe.get_packed_pipeline();
        // RESP: `*<n>`, then `$<len>` and the argument, each on its line.
        let text = String::from_utf8_lossy(&packed).into_owned();
        text.split("\r\n")
            .skip(1)
            .collect::<Vec<_>>()
            .chunks(2)
            .filter_map(|pair| pair.get(1).map(|argument| (*argument).to_owned()))
            .collect()
    }

    fn format(max_len: Option<u64>) -> EntryFormat {
        EntryFormat {
            payload_field: "payload".into(),
            key_field: "key".into(),
            max_len,
        }
    }

    #[test]
    fn the_payload_comes_first_then_the_key_then_the_headers_in_order() {
        let output = Output::new("orders", "body")
            .with_key("k1")
            .with_header("trace", "t")
            .with_header("payload", "a header named like the payload field");
        assert_eq!(
            arguments(&format(Some(1000)), &output),
            [
                "XADD",
                "orders",
                "MAXLEN",
                "~",
                "1000",
                "*",
                "payload",
                "body",
                "key",
                "k1",
                "trace",
                "t",
                "payload",
                "a header named like the payload field",
            ]
        );
    }

    #[test]
    fn a_key_its_first_header_already_carries_is_written_once() {
        // What `Output::forward` makes of a message the source decoded with
        // `key_field("key")`: the key field is among its headers too.
        let forwarded = Output::new("copy", "body")
            .with_key("k1")
            .with_header("key", "k1")
            .with_header("h", "v");
        assert_eq!(
            arguments(&format(None), &forwarded),
            [
                "XADD", "copy", "*", "payload", "body", "key", "k1", "h", "v"
            ]
        );
        let other = Output::new("copy", "body")
            .with_key("k2")
            .with_header("key", "k1");
        assert_eq!(
            arguments(&format(None), &other),
            [
                "XADD", "copy", "*", "payload", "body", "key", "k2", "key", "k1"
            ]
        );
    }
}
