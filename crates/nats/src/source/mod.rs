//! [`NatsSource`]: a pull consumer of one stream, asking the server for no
//! more messages than the runtime has free slots.
//!
//! # Pulling
//!
//! The source speaks JetStream's pull protocol itself, on one subscription
//! of its own (`<inbox>.*`): pull requests `{"batch": n, "expires": …}` to
//! `$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`, reply `<inbox>.<k>`,
//! which together never ask for more than the free slots the runtime asked
//! for (`pulls.rs`). It counts what its requests still owe: a delivery pays
//! one, a request the server ended (`404`/`408`/`409` status on its reply
//! subject) its unfilled rest, and a request past its expiry plus a
//! second, or sent before the connection was made anew, is given up. A new
//! request asks for the free slots beyond what is owed, at once when
//! nothing is, otherwise once that gap is half the budget: the server has a
//! request to fill while the runtime keeps up, and what it sends ahead is
//! still bounded by the budget. A fetched message waits in the source's
//! buffer only while the runtime has no slot for it. (async-nats's own
//! pull stream refills on its own schedule, whatever the runtime can take.)
//!
//! # Holding
//!
//! Every delivery handed to the runtime is held (see `deliveries.rs`)
//! until the acker settled it: the source reports each one in progress
//! before half its `ack_wait` has passed, so a handler slower than
//! `ack_wait`, or a message queued behind it, is not delivered a second
//! time while it runs. A crashed process stops reporting, and the server
//! delivers its messages again after `ack_wait`.
//!
//! # Retry cap
//!
//! A delivery the server made more often than `max_deliveries` is written
//! to the dead-letter subject by the source and ended with `+TERM`,
//! without calling the handler: a message whose handler keeps failing, or
//! whose consumer keeps crashing, stops there. A park that waits in the
//! process (`parking/parked.rs`) is no delivery, and its message given back is not
//! checked again.
//!
//! # Closing
//!
//! `close` hands every delivery still held back with `-NAK` (no delay), so
//! another instance receives it at once instead of after `ack_wait`; a
//! parked one with what is left of its delay.

mod builder;
pub(crate) mod convert;
mod limits;
mod poison;
mod pulls;
mod receive;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use async_nats::{Subject, Subscriber};
use bytes::Bytes;
use futures_util::StreamExt;
use intake_core::{
    Message,
    backend::{Limits, Source, SourceError, SourceEvent},
};
use tokio::time::Instant;

pub use self::builder::NatsSourceBuilder;
use self::convert::Converter;
use self::pulls::Pulls;
use crate::acker::{NatsAcker, nak_with_delay};
use crate::confirm::Confirmations;
use crate::connection::Connection;
use crate::counters::NatsCounters;
use crate::dead_letter::{NatsDeadLetterSink, NatsDeadLetterSinkBuilder};
use crate::deliveries::{Deliveries, ProgressTask};
use crate::error::{Error, boxed};
use crate::parking::ParkedHere;

/// How long past its expiry a pull request is waited for before the
/// source assumes the server's `408` was lost and asks again.
const REQUEST_GRACE: Duration = Duration::from_secs(1);

/// A JetStream pull consumer as an intake [`Source`].
///
/// Build one with [`NatsSource::builder`]; acknowledge through
/// [`NatsSource::acker`]; dead-letter through
/// [`NatsSource::dead_letter_sink`]. See the [crate docs](crate) for the
/// mapping onto intake's model.
pub struct NatsSource {
    connection: Connection,
    stream: String,
    consumer: String,
    durable: bool,
    ack_wait: Duration,
    max_ack_pending: i64,
    explicit_max_ack_pending: Option<i64>,
    max_deliveries: Option<u32>,
    park_room: usize,
    fetch_wait: Duration,
    ack_timeout: Duration,
    dead_letter_subject: Option<String>,
    redelivery_backoff: Arc<dyn intake_core::BackoffPolicy>,
    pull_subject: Subject,
    inbox: String,
    replies: Subscriber,
    pulls: Pulls,
    requests_sent: u64,
    converter: Converter,
    ready: VecDeque<Message>,
    poison: VecDeque<(Message, u64, u32)>,
    own_sink: Option<NatsDeadLetterSink>,
    terms: Confirmations,
    deliveries: Arc<Deliveries>,
    /// Parked messages waiting here until due (see `parking/parked.rs`).
    parked: Arc<ParkedHere>,
    counters: Arc<NatsCounters>,
    limits: Option<Limits>,
    limits_applied: bool,
    progress: Option<ProgressTask>,
    hold: Vec<(u64, Subject, u32)>,
    /// The connection the source last saw.
    epoch_seen: u64,
    /// Until then, pull one message per request (see [`Self::reconnected`]).
    one_at_a_time_until: Option<Instant>,
}

impl std::fmt::Debug for NatsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsSource")
            .field("endpoint", &self.connection.endpoint)
            .field("stream", &self.stream)
            .field("consumer", &self.consumer)
            .field("ack_wait", &self.ack_wait)
            .field("held", &self.deliveries.len())
            .finish_non_exhaustive()
    }
}

/// What [`NatsSourceBuilder::build`] found or made.
pub(crate) struct Started {
    connection: Connection,
    stream: String,
    consumer: String,
    durable: bool,
    ack_wait: Duration,
    max_ack_pending: i64,
    explicit_max_ack_pending: Option<i64>,
    max_deliveries: Option<u32>,
    builder: NatsSourceBuilder,
}

impl NatsSource {
    /// A builder for a source connecting with `settings`
    /// ([`NatsSettings`](crate::NatsSettings)), or to the server(s) at a
    /// URL: `nats://[user:password@|token@]host[:port]`, `tls://…` for TLS,
    /// several separated by commas.
    pub fn builder(settings: impl Into<crate::NatsSettings>) -> NatsSourceBuilder {
        NatsSourceBuilder::new(settings.into())
    }

    async fn start(started: Started) -> Result<Self, Error> {
        let Started {
            connection,
            stream,
            consumer,
            durable,
            ack_wait,
            max_ack_pending,
            explicit_max_ack_pending,
            max_deliveries,
            builder,
        } = started;
        let inbox = connection.client.new_inbox();
        let replies = connection
            .client
            .subscribe(format!("{inbox}.*"))
            .await
            .map_err(|error| Error::Disconnected {
                endpoint: connection.endpoint.to_string(),
                source: boxed(error),
            })?;
        let deliveries = Arc::new(Deliveries::default());
        let counters = Arc::new(NatsCounters::default());
        let progress = ProgressTask::start(
            connection.client.clone(),
            deliveries.clone(),
            ack_wait,
            counters.clone(),
        );
        Ok(Self {
            pull_subject: Subject::from(format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}")),
            converter: Converter::new(&stream, builder.partition_token),
            terms: Confirmations::new(connection.client.clone()),
            connection,
            stream,
            consumer,
            durable,
            ack_wait,
            max_ack_pending,
            explicit_max_ack_pending,
            max_deliveries,
            park_room: builder.park_room,
            fetch_wait: builder.fetch_wait,
            ack_timeout: builder.ack_timeout,
            dead_letter_subject: builder.dead_letter_subject,
            redelivery_backoff: builder.redelivery_backoff,
            inbox,
            replies,
            pulls: Pulls::default(),
            requests_sent: 0,
            ready: VecDeque::new(),
            poison: VecDeque::new(),
            own_sink: None,
            deliveries,
            parked: Arc::new(ParkedHere::new(
                intake_core::consumer::DEFAULT_MAX_IN_FLIGHT_BYTES,
            )),
            counters,
            limits: None,
            limits_applied: false,
            progress: Some(progress),
            hold: Vec::new(),
            epoch_seen: 0,
            one_at_a_time_until: None,
        })
    }

    /// The acker for this source's deliveries.
    pub fn acker(&self) -> NatsAcker {
        NatsAcker::new(
            self.connection.client.clone(),
            self.deliveries.clone(),
            self.parked.clone(),
            self.redelivery_backoff.clone(),
            self.ack_wait,
            self.ack_timeout,
            self.connection.endpoint.clone(),
            self.counters.clone(),
        )
    }

    /// A dead-letter sink builder, prefilled with this source's connection,
    /// stream and consumer (default subject `<stream>.<consumer>.dlq`).
    pub fn dead_letter_sink(&self) -> NatsDeadLetterSinkBuilder {
        NatsDeadLetterSinkBuilder::new(
            self.connection.clone(),
            self.stream.clone(),
            self.durable.then(|| self.consumer.clone()),
            self.deliveries.clone(),
            self.counters.clone(),
            self.ack_timeout,
        )
    }

    /// A probe of the consumer's broker-side lag (see [`NatsLagProbe`](crate::NatsLagProbe)),
    /// on the source's client.
    pub fn lag_probe(&self) -> crate::NatsLagProbe {
        crate::NatsLagProbe::of_source(
            self.connection.client.clone(),
            self.connection.endpoint.clone(),
            &self.stream,
            &self.consumer,
        )
    }

    /// What the source, its acker and sinks counted.
    pub fn counters(&self) -> Arc<NatsCounters> {
        self.counters.clone()
    }

    /// The consumer's name (the durable name, or the server's name for a
    /// broadcast consumer).
    pub fn consumer_name(&self) -> &str {
        &self.consumer
    }

    /// The `ack_wait` the server applies to this consumer.
    pub fn ack_wait(&self) -> Duration {
        self.ack_wait
    }

    /// The stream consumed.
    pub(crate) fn stream_name(&self) -> &str {
        &self.stream
    }

    /// Where this source's parks wait.
    pub(crate) fn parked_here(&self) -> Arc<ParkedHere> {
        self.parked.clone()
    }

    /// Parked messages waiting in this process until due.
    pub fn parked_waiting(&self) -> usize {
        self.parked.waiting()
    }

    /// The async-nats client, for producing alongside the source.
    pub fn client(&self) -> async_nats::Client {
        self.connection.client.clone()
    }

    fn endpoint(&self) -> String {
        self.connection.endpoint.to_string()
    }
}

/// What ended the source's wait.
enum Waited {
    Message(Option<async_nats::Message>),
    Reconnection,
    Deadline,
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

impl Source for NatsSource {
    fn set_limits(&mut self, limits: Limits) {
        self.parked.set_max_bytes(limits.max_in_flight_bytes);
        self.limits = Some(limits);
    }

    async fn next(
        &mut self,
        deliveries: &mut Vec<Message>,
        max: usize,
    ) -> Result<SourceEvent, SourceError> {
        if !self.limits_applied {
            self.apply_limits().await;
        }
        loop {
            // Checked on every turn: while the server is away, the loop
            // below only waits on pull requests that expire, and never
            // returns to the runtime by itself.
            if let Some(attempts) = self.connection.events.gave_up() {
                return Err(Error::GaveUp {
                    endpoint: self.endpoint(),
                    attempts,
                }
                .into());
            }
            if !self.poison.is_empty() {
                self.dead_letter_poison().await;
            }
            let next_park =
                self.parked
                    .give_back_due(Instant::now(), &self.deliveries, &mut self.ready);
            if max > 0 && !self.ready.is_empty() {
                let take = max.min(self.ready.len());
                deliveries.extend(self.ready.drain(..take));
                return Ok(SourceEvent::Delivered);
            }
            let epoch = self.connection.events.epoch();
            let now = Instant::now();
            if epoch != self.epoch_seen {
                self.reconnected(epoch, now);
            }
            // The server answers an expired request with a 408; one that
            // did not come within a second more was lost.
            self.pulls.expire(now, epoch);
            let budget = self.limits.map_or(max, |limits| limits.max_in_flight);
            let single = self.one_at_a_time_until.is_some_and(|until| now < until);
            if let Some(batch) = self.pulls.due(max, budget, single) {
                self.request(batch).await?;
            }
            let events = self.connection.events.clone();
            let reconnection = events.reconnection();
            let deadline = self.pulls.deadline();
            // Without a request (the budget is full) the wait is for what an
            // earlier request still brings, until the runtime asks again.
            let parked = &self.parked;
            let waited = tokio::select! {
                message = self.replies.next() => Waited::Message(message),
                () = reconnection => Waited::Reconnection,
                () = sleep_until(deadline) => Waited::Deadline,
                // A park due, or a new one that may be due sooner.
                () = sleep_until(next_park) => Waited::Deadline,
                () = parked.started() => Waited::Deadline,
            };
            match waited {
                // The next turn ends what expired.
                Waited::Deadline => {}
                // Whatever the epoch says yet: the requests' connection may
                // be gone.
                Waited::Reconnection => self.pulls.forget(),
                Waited::Message(None) => {
                    return Err(Error::Disconnected {
                        endpoint: self.endpoint(),
                        source: "the client closed the source's subscription".into(),
                    }
                    .into());
                }
                Waited::Message(Some(message)) => {
                    let accepted = self.accept(message).and_then(|()| self.drain_inbox());
                    self.hold_accepted();
                    accepted?;
                }
            }
        }
    }

    /// Unreachable from a lost connection until the client connects again
    /// (it reconnects on its own, with the reconnect backoff).
    fn reachability(&self) -> Option<intake_core::backend::Reachability> {
        Some(self.connection.events.reachability.clone())
    }

    async fn close(&mut self) -> Result<(), SourceError> {
        // Stop reporting progress: what is still held goes back now.
        self.progress = None;
        let _ = self.replies.unsubscribe().await;
        self.drain_inbox().ok();
        self.hold_accepted();
        let held = self.deliveries.take_all();
        if held.is_empty() {
            return Ok(());
        }
        let count = held.len();
        let now = Instant::now();
        let parked = &self.parked;
        // A message parked here goes back with what is left of its delay:
        // the server holds it until then, as for a park sent to it.
        let naks = held.into_iter().map(|(sequence, held)| {
            let body = match parked.remaining(sequence, now) {
                Some(left) => nak_with_delay(left.max(Duration::from_millis(1))),
                None => Bytes::from_static(b"-NAK"),
            };
            (held.reply, body)
        });
        let timeout = self.ack_timeout;
        let sent = self.terms.send(naks, timeout).await;
        self.parked.clear();
        match sent {
            Ok(()) => {
                self.counters.add_naks(count);
                tracing::info!(count, "handed unfinished deliveries back to the server");
                Ok(())
            }
            Err(unconfirmed) => {
                let error = unconfirmed.into_error(&self.endpoint(), "the close's naks", timeout);
                tracing::warn!(
                    %error,
                    count,
                    "unfinished deliveries were not handed back; the server delivers them again after ack_wait"
                );
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests;
