//! Acknowledgements the server confirms, batched and pipelined.
//!
//! JetStream answers an ack (`+ACK`, `-NAK`, `+TERM`) that carries a reply
//! subject with an empty message once it has processed it; async-nats's
//! `double_ack` does that with a new subscription per message. Here one
//! subscription on `<inbox>.*` serves every batch: a batch's acks are all
//! published at once with the reply subject `<inbox>.<round>`, then the
//! replies are counted. Replies of an earlier round that gave up waiting
//! are recognised by their subject and ignored. Acks are idempotent, so a
//! round that timed out is simply sent again by the runtime.

use std::time::Duration;

use async_nats::{StatusCode, Subject, Subscriber};
use bytes::Bytes;
use futures_util::StreamExt;

use crate::error::{Error, boxed};

/// Why a round was not confirmed.
#[derive(Debug)]
pub(crate) enum Unconfirmed {
    /// Not every reply came within the timeout.
    TimedOut { confirmed: usize, sent: usize },
    /// Nobody listens on an ack subject: the consumer is gone.
    NoResponders,
    /// The client could not send or subscribe (connection lost).
    Client(async_nats::Error),
}

impl Unconfirmed {
    pub(crate) fn into_error(self, endpoint: &str, what: &str, waited: Duration) -> Error {
        match self {
            Unconfirmed::TimedOut { confirmed, sent } => Error::Unconfirmed {
                endpoint: endpoint.to_owned(),
                what: format!("{what} ({confirmed} of {sent} confirmed)"),
                waited,
            },
            Unconfirmed::NoResponders => Error::JetStream {
                endpoint: endpoint.to_owned(),
                operation: format!("accept {what}: nobody answers on the consumer's ack subjects"),
                transient: false,
                source: "no responders (503): the consumer was deleted".into(),
            },
            Unconfirmed::Client(error) => Error::Disconnected {
                endpoint: endpoint.to_owned(),
                source: error,
            },
        }
    }
}

/// Sends acknowledgements and waits for the server's confirmations.
#[derive(Debug)]
pub(crate) struct Confirmations {
    client: async_nats::Client,
    inbox: String,
    replies: Option<Subscriber>,
    round: u64,
}

impl Confirmations {
    pub(crate) fn new(client: async_nats::Client) -> Self {
        let inbox = client.new_inbox();
        Self {
            client,
            inbox,
            replies: None,
            round: 0,
        }
    }

    /// Publishes each `(ack subject, body)` with this round's reply subject
    /// and waits until the server confirmed all of them, at most `timeout`.
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
        self.round += 1;
        let reply = Subject::from(format!("{}.{}", self.inbox, self.round));
        let mut sent = 0;
        for (subject, body) in acks {
            self.client
                .publish_with_reply(subject, reply.clone(), body)
                .await
                .map_err(|error| Unconfirmed::Client(boxed(error)))?;
            sent += 1;
        }
        if sent == 0 {
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut confirmed = 0;
        let Some(replies) = self.replies.as_mut() else {
            return Err(Unconfirmed::TimedOut { confirmed, sent });
        };
        while confirmed < sent {
            match tokio::time::timeout_at(deadline, replies.next()).await {
                Err(_) => return Err(Unconfirmed::TimedOut { confirmed, sent }),
                // The client closed the subscription (the client is gone).
                Ok(None) => {
                    self.replies = None;
                    return Err(Unconfirmed::TimedOut { confirmed, sent });
                }
                Ok(Some(answer)) if answer.subject != reply => {}
                Ok(Some(answer)) if answer.status == Some(StatusCode::NO_RESPONDERS) => {
                    return Err(Unconfirmed::NoResponders);
                }
                Ok(Some(_)) => confirmed += 1,
            }
        }
        Ok(())
    }
}
