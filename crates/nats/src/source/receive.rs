//! Asking the server for messages and taking what it sends: pull
//! requests, deliveries and status messages on the source's inbox, and
//! what a reconnect changes.

use async_nats::{StatusCode, Subject};
use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use tokio::time::Instant;

use super::convert::NotADelivery;
use super::pulls::PullRequest;
use super::{NatsSource, REQUEST_GRACE};
use crate::error::{Error, boxed};

impl NatsSource {
    /// The client connected anew. A connection can be lost to a delivery
    /// async-nats cannot parse (a header that is not UTF-8): the client
    /// drops the connection with everything after that delivery in its
    /// buffer, and after `ack_wait` the server delivers them all again,
    /// together, so the same delivery would take the same company down
    /// with it every time, a stall. For one `ack_wait` (and a little) after
    /// a reconnect, the source therefore pulls one message per request:
    /// each of them arrives on its own, and only the unreadable one costs
    /// a reconnect (`tests/hostile_records.rs`).
    pub(super) fn reconnected(&mut self, epoch: u64, now: Instant) {
        tracing::info!(
            epoch,
            "reconnected: pulling one message at a time for one ack_wait"
        );
        self.one_at_a_time_until = Some(now + self.ack_wait + 2 * REQUEST_GRACE);
        self.epoch_seen = epoch;
        self.pulls.forget();
    }

    /// Sends a pull request for `batch` messages.
    pub(super) async fn request(&mut self, batch: usize) -> Result<(), Error> {
        let batch = match self.one_at_a_time_until {
            Some(until) if Instant::now() < until => 1,
            Some(_) => {
                self.one_at_a_time_until = None;
                batch
            }
            None => batch,
        };
        self.requests_sent += 1;
        let reply = Subject::from(format!("{}.{}", self.inbox, self.requests_sent));
        let expires = self.fetch_wait.as_nanos();
        let body = Bytes::from(format!("{{\"batch\":{batch},\"expires\":{expires}}}"));
        self.connection
            .client
            .publish_with_reply(self.pull_subject.clone(), reply.clone(), body)
            .await
            .map_err(|error| Error::Disconnected {
                endpoint: self.endpoint(),
                source: boxed(error),
            })?;
        self.counters.add_pull_request();
        self.pulls.sent(PullRequest {
            reply,
            batch,
            deadline: Instant::now() + self.fetch_wait + REQUEST_GRACE,
            epoch: self.connection.events.epoch(),
        });
        Ok(())
    }

    /// Takes one message from the inbox subscription.
    pub(super) fn accept(&mut self, message: async_nats::Message) -> Result<(), Error> {
        if let Some(status) = message.status {
            return self.status(status, &message);
        }
        let delivery = match self.converter.convert(message) {
            Ok(delivery) => delivery,
            Err(NotADelivery::NoAckSubject) => {
                self.counters.add_not_delivery();
                tracing::warn!(
                    inbox = %self.inbox,
                    "a message without a JetStream ack subject arrived on the source's inbox; skipped (nothing can acknowledge it)"
                );
                return Ok(());
            }
            Err(NotADelivery::SequenceOutOfRange(sequence)) => {
                return Err(Error::JetStream {
                    endpoint: self.endpoint(),
                    operation: format!("deliver stream sequence {sequence}"),
                    transient: false,
                    source: "a stream sequence past 2^63 does not fit an intake position".into(),
                });
            }
        };
        self.pulls.delivered();
        self.hold
            .push((delivery.sequence, delivery.reply, delivery.delivered));
        // Only a redelivery can be of a message parked here (a first
        // delivery skips the check and its lock).
        if delivery.delivered > 1 && self.parked.is_waiting(delivery.sequence) {
            // The server gave up on this process's progress reports (a
            // connection lost for longer than `ack_wait`) and delivered a
            // message parked here again: it stays parked, now held under
            // the newer delivery.
            tracing::debug!(
                sequence = delivery.sequence,
                delivered = delivery.delivered,
                "a message parked here was delivered again; it stays parked"
            );
            return Ok(());
        }
        match self.max_deliveries {
            Some(cap) if delivery.delivered > cap => {
                self.poison
                    .push_back((delivery.message, delivery.sequence, delivery.delivered));
            }
            _ => self.ready.push_back(delivery.message),
        }
        Ok(())
    }

    /// A status message on the inbox: heartbeats, and the server ending a
    /// pull request.
    fn status(&mut self, status: StatusCode, message: &async_nats::Message) -> Result<(), Error> {
        let description = message.description.as_deref().unwrap_or("");
        match status {
            StatusCode::IDLE_HEARTBEAT => {}
            StatusCode::NOT_FOUND | StatusCode::TIMEOUT => {
                self.pulls.ended(&message.subject, unfilled(message));
            }
            StatusCode::NO_RESPONDERS => {
                // Nobody serves the consumer's API subject: JetStream is
                // not ready yet (a server starting), or the consumer is
                // gone. The runtime retries with backoff; a consumer that
                // is gone shows in the next request's 409.
                self.pulls.forget();
                return Err(Error::JetStream {
                    endpoint: self.endpoint(),
                    operation: format!(
                        "serve pull requests of consumer `{}` of stream `{}`",
                        self.consumer, self.stream
                    ),
                    transient: true,
                    source: "no responders (503): JetStream is not ready, or the consumer is gone"
                        .into(),
                });
            }
            _ if description.contains("Consumer Deleted") => {
                return Err(Error::ConsumerDeleted {
                    endpoint: self.endpoint(),
                    stream: self.stream.clone(),
                    consumer: self.consumer.clone(),
                });
            }
            _ => {
                self.pulls.ended(&message.subject, unfilled(message));
                tracing::debug!(%status, description, "the server ended a pull request");
            }
        }
        Ok(())
    }

    /// Moves every message waiting on the inbox into the buffers, without
    /// waiting.
    pub(super) fn drain_inbox(&mut self) -> Result<(), Error> {
        while let Some(Some(message)) = self.replies.next().now_or_never() {
            self.accept(message)?;
        }
        Ok(())
    }

    pub(super) fn hold_accepted(&mut self) {
        if !self.hold.is_empty() {
            self.deliveries.hold(self.hold.drain(..));
        }
    }
}

/// What a pull request's end says it left unfilled: nats-server writes
/// `Nats-Pending-Messages` on a `408` (and on the `409`s ending a request it
/// had been filling).
fn unfilled(status: &async_nats::Message) -> Option<usize> {
    status
        .headers
        .as_ref()?
        .get("Nats-Pending-Messages")?
        .as_str()
        .parse()
        .ok()
}
