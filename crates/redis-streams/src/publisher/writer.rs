//! The writer task: takes queued outputs in order, sends them as one
//! pipeline of `XADD`s, and answers each receipt from its own reply.

use std::sync::Arc;

use intake_core::publish::{Confirmation, Output, PublishError, PublishErrorKind};
use redis::{RedisError, Value};
use tokio::sync::{Notify, OwnedSemaphorePermit, mpsc, oneshot, watch};

use super::receipt::Answer;
use crate::TRANSIENT_CODES;
use crate::connection::SharedConnection;
use crate::error::{Error, server_code};
use crate::stream_id::StreamId;

/// Most bytes of payloads, keys and headers one pipeline carries (at least
/// one output): a pipeline is encoded whole before it is written, so this
/// bounds that copy however large the outputs are.
const MAX_PIPELINE_BYTES: usize = 4 << 20;

/// One output on its way: what to write, whom to answer, and its room in
/// the buffer, given back once answered.
pub(super) struct Queued {
    pub(super) output: Output,
    pub(super) reply: oneshot::Sender<Answer>,
    pub(super) _room: OwnedSemaphorePermit,
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
        let command = pipe.cmd("XADD").arg(output.destination());
        if let Some(max_len) = self.max_len {
            command.arg("MAXLEN").arg("~").arg(max_len);
        }
        command
            .arg("*")
            .arg(&*self.payload_field)
            .arg(output.payload().as_ref());
        let headers = output.headers();
        if let Some(key) = output.key()
            && headers.get(&self.key_field) != Some(key)
        {
            command.arg(&*self.key_field).arg(key.as_ref());
        }
        for header in headers {
            command.arg(&*header.name).arg(header.value.as_ref());
        }
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
            let mut bytes = size_of(&first.output);
            batch.push(first);
            while batch.len() < self.max_pipeline && bytes < MAX_PIPELINE_BYTES {
                let Ok(next) = self.queue.try_recv() else {
                    break;
                };
                bytes += size_of(&next.output);
                batch.push(next);
            }
            pipe.clear();
            pipe.ignore_errors();
            for queued in &batch {
                self.format.add(&mut pipe, &queued.output);
            }
            let mut connection = self.connection.get();
            let reply: Result<Vec<Value>, RedisError> = pipe.query_async(&mut connection).await;
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
                        let destination = queued.output.destination();
                        let failed = unconfirmed(destination).with_source(Error::UnexpectedReply {
                            command: "XADD",
                            detail: detail.clone(),
                        });
                        let _ = queued.reply.send(Err(failed));
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
                        let _ = queued.reply.send(Err(failed));
                    }
                }
            }
        }
        tracing::debug!(
            endpoint = %self.connection.connector().endpoint(),
            "Redis publisher stopped: every output sent was answered"
        );
        let _ = self.stopped.send(true);
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
            let _ = queued.reply.send(answer);
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
