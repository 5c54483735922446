//! Acknowledgements the server confirms, one confirmation per batch.
//!
//! JetStream answers an ack (`+ACK`, `-NAK`, `+TERM`) that carries a reply
//! subject with an empty message once it has processed it; async-nats's
//! `double_ack` does that with a new subscription per message. Here a
//! batch's acks all go out as plain publishes except the last, which
//! carries the reply subject `<inbox>.<round>` (one subscription on
//! `<inbox>.*` serves every round), and that one reply confirms the whole
//! batch. Replies of an earlier round that gave up waiting are recognised
//! by their subject and ignored. Acks are idempotent, so a round that was
//! not confirmed is simply sent again by the runtime.
//!
//! # Why the last reply confirms the earlier acks
//!
//! nats-server applies the acks one client connection sends to one
//! consumer in the order they were sent, and answers an ack only after
//! applying it (read in nats-server v2.9.10, the version the project runs;
//! the same in nats-server's main branch, 2.15.0-dev):
//!
//! - `client.go`, `readLoop` → `parse` → `processInboundClientMsg`: one
//!   goroutine per client connection reads and routes its messages one
//!   after another; `deliverMsg` calls an internal subscription's callback
//!   (`sub.icb`) inline, before the next message is parsed.
//! - `consumer.go`, `setLeader`: the consumer subscribes internally to its
//!   ack subjects `$JS.ACK.<stream>.<consumer>.*.*.*.*.*` with `pushAck`,
//!   which only appends the ack to the consumer's `ackMsgs` queue
//!   (`ipqueue.go`, `push` appends, `pop` takes all in order), and starts
//!   one goroutine, `processInboundAcks`, that takes the queue in order and
//!   runs `processAck` on each.
//! - `processAck` applies the ack (`processAckMsg`: removes it from
//!   `pending`, moves the ack floor, updates the store; `processNak`,
//!   `processTerm` alike) and only then, when a reply subject is present,
//!   `sendAckReply`.
//!
//! So when the reply to the last ack arrives, every ack before it on the
//! same connection was applied. That holds per consumer only: acks of
//! another consumer go to another queue and goroutine. Every batch sent
//! here is one consumer's (a source's deliveries, its acker and its sink
//! all belong to one consumer). On a clustered consumer (R>1) the reply
//! means the same as a per-message reply: applied by the consumer's leader
//! (2.9 replicates after answering; later versions answer an ack once it
//! is replicated).
//!
//! The one gap is the connection: acks written to a connection that then
//! breaks are lost with it, while async-nats sends the rest of the batch
//! (still in its command channel) on the new connection, whose reply would
//! come back. So a round checks async-nats's connection count
//! (`Statistics::connects`, counted before the new connection reads
//! anything, hence before its reply can reach the subscription) before the
//! first publish and after the reply; if it moved, the round is not
//! confirmed. A dropped connection without a reconnect simply never
//! answers: the round times out. Either way nothing is reported done
//! without its confirmation, and the runtime sends the batch again
//! (at-least-once: a lost ack costs a redelivery, never a message).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::{StatusCode, Subject, Subscriber};
use bytes::Bytes;
use futures_util::StreamExt;

use crate::error::{Error, boxed};

/// Why a round was not confirmed.
#[derive(Debug)]
pub(crate) enum Unconfirmed {
    /// The reply did not come within the timeout.
    TimedOut { sent: usize },
    /// Nobody listens on an ack subject: the consumer is gone.
    NoResponders,
    /// The client connected anew while the round was under way: acks
    /// written to the old connection may be lost although the reply came.
    Reconnected { sent: usize },
    /// The client could not send or subscribe (connection lost).
    Client(async_nats::Error),
}

impl Unconfirmed {
    pub(crate) fn into_error(self, endpoint: &str, what: &str, waited: Duration) -> Error {
        match self {
            Unconfirmed::TimedOut { sent } => Error::Unconfirmed {
                endpoint: endpoint.to_owned(),
                what: format!("{what} ({sent} sent)"),
                waited,
            },
            Unconfirmed::NoResponders => Error::JetStream {
                endpoint: endpoint.to_owned(),
                operation: format!("accept {what}: nobody answers on the consumer's ack subjects"),
                transient: false,
                source: "no responders (503): the consumer was deleted".into(),
            },
            Unconfirmed::Reconnected { sent } => Error::Disconnected {
                endpoint: endpoint.to_owned(),
                source: format!(
                    "the client connected anew while {sent} {what} were sent: those written to the old connection may be lost"
                )
                .into(),
            },
            Unconfirmed::Client(error) => Error::Disconnected {
                endpoint: endpoint.to_owned(),
                source: error,
            },
        }
    }
}

/// Sends acknowledgements and waits for the server's confirmation.
#[derive(Debug)]
pub(crate) struct Confirmations {
    client: async_nats::Client,
    statistics: Arc<async_nats::Statistics>,
    inbox: String,
    replies: Option<Subscriber>,
    round: u64,
}

impl Confirmations {
    pub(crate) fn new(client: async_nats::Client) -> Self {
        let inbox = client.new_inbox();
        Self {
            statistics: client.statistics(),
            client,
            inbox,
            replies: None,
            round: 0,
        }
    }

    /// Connections the client made so far (see the module docs).
    fn connections(&self) -> u64 {
        self.statistics.connects.load(Ordering::Acquire)
    }

    /// Publishes each `(ack subject, body)`, the last with this round's
    /// reply subject, and waits until the server confirmed the last, at
    /// most `timeout`. All must be acks of one consumer (see the module
    /// docs).
    pub(crate) async fn send(
        &mut self,
        acks: impl IntoIterator<Item = (Subject, Bytes)>,
        timeout: Duration,
    ) -> Result<(), Unconfirmed> {
        if self.replies.is_none() {
            let subscription = self
                .client
                .subscribe(format!("{}.*", self.inbox))
                .await
                .map_err(|error| Unconfirmed::Client(boxed(error)))?;
            self.replies = Some(subscription);
        }
        let connections = self.connections();
        let mut acks = acks.into_iter();
        let Some(mut last) = acks.next() else {
            return Ok(());
        };
        let mut sent = 1;
        for next in acks {
            let (subject, body) = std::mem::replace(&mut last, next);
            self.client
                .publish(subject, body)
                .await
                .map_err(|error| Unconfirmed::Client(boxed(error)))?;
            sent += 1;
        }
        self.round += 1;
        let reply = Subject::from(format!("{}.{}", self.inbox, self.round));
        let (subject, body) = last;
        self.client
            .publish_with_reply(subject, reply.clone(), body)
            .await
            .map_err(|error| Unconfirmed::Client(boxed(error)))?;
        let deadline = tokio::time::Instant::now() + timeout;
        let Some(replies) = self.replies.as_mut() else {
            return Err(Unconfirmed::TimedOut { sent });
        };
        loop {
            match tokio::time::timeout_at(deadline, replies.next()).await {
                Err(_) => return Err(Unconfirmed::TimedOut { sent }),
                // The client closed the subscription (the client is gone).
                Ok(None) => {
                    self.replies = None;
                    return Err(Unconfirmed::TimedOut { sent });
                }
                Ok(Some(answer)) if answer.subject != reply => {}
                Ok(Some(answer)) if answer.status == Some(StatusCode::NO_RESPONDERS) => {
                    return Err(Unconfirmed::NoResponders);
                }
                Ok(Some(_)) => break,
            }
        }
        if self.connections() != connections {
            return Err(Unconfirmed::Reconnected { sent });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! On the shared nats-server: a responder of the test's own stands in
    //! for the consumer that answers acks.

    use super::*;

    fn url() -> String {
        std::env::var("INTAKE_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
    }

    /// Two clients (the confirmations', the responder's), or `None` after
    /// saying why when no server runs and none is required.
    async fn clients(test: &str) -> Option<(async_nats::Client, async_nats::Client)> {
        let connect = || {
            async_nats::ConnectOptions::new()
                .connection_timeout(Duration::from_secs(2))
                .connect(url())
        };
        match (connect().await, connect().await) {
            (Ok(ours), Ok(responder)) => Some((ours, responder)),
            (Err(error), _) | (_, Err(error)) => {
                intake_core::backend::testkit::skip_or_fail(
                    test,
                    &format!("no NATS server at {} ({error})", url()),
                );
                None
            }
        }
    }

    /// Starts a round of three "acks" on a fresh subject and returns it
    /// with what the responder received (all three, in order).
    async fn round_under_way(
        ours: &async_nats::Client,
        responder: &async_nats::Client,
    ) -> (
        tokio::task::JoinHandle<Result<(), Unconfirmed>>,
        Vec<async_nats::Message>,
    ) {
        let subject = Subject::from(format!("intake.confirm.{}", ours.new_inbox()));
        let mut requests = responder
            .subscribe(subject.clone())
            .await
            .expect("subscribe");
        // `flush` only writes the socket; a request the server answers on
        // the same connection proves it registered the subscription (it
        // reads a connection's commands in order).
        responder
            .request("$JS.API.INFO", Bytes::new())
            .await
            .expect("a round trip to the server");
        let mut confirmations = Confirmations::new(ours.clone());
        let round = tokio::spawn(async move {
            let acks = (0..3).map(|_| (subject.clone(), Bytes::from_static(b"+ACK")));
            confirmations.send(acks, Duration::from_secs(20)).await
        });
        let mut received = Vec::new();
        while received.len() < 3 {
            let message = tokio::time::timeout(Duration::from_secs(10), requests.next())
                .await
                .expect("the acks within 10 s")
                .expect("the subscription open");
            received.push(message);
        }
        (round, received)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_the_last_ack_asks_for_a_reply_and_that_reply_confirms_the_round() {
        let Some((ours, responder)) = clients("confirmed round").await else {
            return;
        };
        let (round, received) = round_under_way(&ours, &responder).await;
        let replies: Vec<_> = received
            .iter()
            .map(|message| message.reply.clone())
            .collect();
        assert!(replies[0].is_none() && replies[1].is_none(), "{replies:?}");
        let reply = replies[2]
            .clone()
            .expect("the last carries the reply subject");
        responder.publish(reply, Bytes::new()).await.expect("reply");
        responder.flush().await.expect("flush");
        let confirmed = round.await.expect("the round's task");
        assert!(confirmed.is_ok(), "{confirmed:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reconnect_during_the_round_leaves_it_unconfirmed_though_the_reply_comes() {
        let Some((ours, responder)) = clients("reconnect during a round").await else {
            return;
        };
        let (round, received) = round_under_way(&ours, &responder).await;
        let reply = received[2].reply.clone().expect("the reply subject");
        // Acks written to the connection that went away could have been
        // lost with it; the reply comes on the new one.
        let connects = ours.statistics().connects.load(Ordering::Acquire);
        ours.force_reconnect().await.expect("reconnect");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while ours.statistics().connects.load(Ordering::Acquire) == connects {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no reconnect in 10 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The reply subscription is renewed before anything later goes out.
        ours.flush().await.expect("flush on the new connection");
        responder.publish(reply, Bytes::new()).await.expect("reply");
        responder.flush().await.expect("flush");
        let confirmed = round.await.expect("the round's task");
        assert!(
            matches!(confirmed, Err(Unconfirmed::Reconnected { sent: 3 })),
            "{confirmed:?}"
        );
    }
}
