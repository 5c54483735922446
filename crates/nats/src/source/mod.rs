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
//! process (`parked.rs`) is no delivery, and its message given back is not
//! checked again.
//!
//! # Closing
//!
//! `close` hands every delivery still held back with `-NAK` (no delay), so
//! another instance receives it at once instead of after `ack_wait`; a
//! parked one with what is left of its delay.

mod builder;
pub(crate) mod convert;
mod pulls;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::{StatusCode, Subject, Subscriber};
use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use intake_core::{
    DeadLetter, ErrorClass, Message,
    backend::{DeadLetterSink, Limits, Source, SourceError, SourceEvent},
};
use tokio::time::Instant;

pub use self::builder::NatsSourceBuilder;
use self::convert::{Converter, NotADelivery};
use self::pulls::{PullRequest, Pulls};
use crate::acker::{NatsAcker, nak_with_delay};
use crate::confirm::Confirmations;
use crate::connection::Connection;
use crate::counters::Counters;
use crate::dead_letter::{NatsDeadLetterSink, NatsDeadLetterSinkBuilder};
use crate::deliveries::{Deliveries, ProgressTask};
use crate::error::{Error, boxed};
use crate::parked::ParkedHere;

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
    /// Parked messages waiting here until due (see `parked.rs`).
    parked: Arc<ParkedHere>,
    counters: Arc<Counters>,
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
    /// A builder for a source on the server(s) at `url`:
    /// `nats://[user:password@|token@]host[:port]`, `tls://…` for TLS,
    /// several separated by commas.
    pub fn builder(url: impl Into<String>) -> NatsSourceBuilder {
        NatsSourceBuilder::new(url.into())
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
        let counters = Arc::new(Counters::default());
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
    pub fn counters(&self) -> Arc<Counters> {
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

    /// Raises the consumer's `max_ack_pending` to twice the budget plus the
    /// room for parked messages once the runtime told it (never lowers it:
    /// other instances share it).
    ///
    /// Twice, because the server counts a delivery as pending until its ack
    /// arrives, and acks travel in batches: at the budget alone the server
    /// stops sending while a batch of acks is on its way, and the consumer
    /// idles a round trip per batch (0.90 × the raw loop's throughput
    /// against 0.99 × at twice, BENCHMARKS.md). The budget still bounds
    /// memory: pull requests never ask for more than the free slots.
    ///
    /// Plus the room, because a parked message is pending until it is due:
    /// sized for the budget alone, `max_ack_pending` parked messages stop
    /// every new one for their whole delay (review R26,
    /// `tests/parking.rs`: 1,040 parked for 20 s held a new message back
    /// 19.9 s).
    async fn apply_limits(&mut self) {
        self.limits_applied = true;
        let Some(limits) = self.limits else {
            return;
        };
        let for_budget = i64::try_from(limits.max_in_flight.saturating_mul(2)).unwrap_or(i64::MAX);
        let wanted = self.explicit_max_ack_pending.unwrap_or_else(|| {
            for_budget.saturating_add(i64::try_from(self.park_room).unwrap_or(i64::MAX))
        });
        self.update_max_ack_pending(wanted).await;
        // What is left for parks once the budget's deliveries and their
        // acks are counted.
        let room = usize::try_from(self.max_ack_pending.saturating_sub(for_budget)).unwrap_or(0);
        self.parked.set_room(room);
    }

    /// Sets the consumer's `max_ack_pending` to `wanted`, unless it allows
    /// more already (and was not set explicitly).
    async fn update_max_ack_pending(&mut self, wanted: i64) {
        if self.max_ack_pending >= wanted && self.explicit_max_ack_pending.is_none() {
            return;
        }
        if self.max_ack_pending == wanted {
            return;
        }
        let context = jetstream::new(self.connection.client.clone());
        let updated = async {
            let stream = context.get_stream(&self.stream).await.map_err(boxed)?;
            let info = stream.consumer_info(&self.consumer).await.map_err(boxed)?;
            let mut config: jetstream::consumer::pull::Config =
                pull_config(info.config).ok_or("a push consumer")?;
            config.max_ack_pending = wanted;
            // nats-server 2.9 updates a consumer that a create request
            // names with changed settings.
            stream
                .create_consumer::<jetstream::consumer::pull::Config>(config)
                .await
                .map_err(boxed)?;
            Ok::<(), intake_core::BoxError>(())
        }
        .await;
        match updated {
            Ok(()) => {
                tracing::info!(
                    consumer = %self.consumer,
                    from = self.max_ack_pending,
                    to = wanted,
                    "set the consumer's max_ack_pending from the budget and the room for parked messages"
                );
                self.max_ack_pending = wanted;
            }
            Err(error) => tracing::warn!(
                consumer = %self.consumer,
                %error,
                max_ack_pending = self.max_ack_pending,
                wanted,
                "could not change the consumer's max_ack_pending; the server may send less than the budget allows"
            ),
        }
    }

    /// The client connected anew. A connection can be lost to a delivery
    /// async-nats cannot parse (a header that is not UTF-8): the client
    /// drops the connection with everything after that delivery in its
    /// buffer, and after `ack_wait` the server delivers them all again,
    /// together, so the same delivery would take the same company down
    /// with it every time, a stall. For one `ack_wait` (and a little) after
    /// a reconnect, the source therefore pulls one message per request:
    /// each of them arrives on its own, and only the unreadable one costs
    /// a reconnect (`tests/hostile_records.rs`).
    fn reconnected(&mut self, epoch: u64, now: Instant) {
        tracing::info!(
            epoch,
            "reconnected: pulling one message at a time for one ack_wait"
        );
        self.one_at_a_time_until = Some(now + self.ack_wait + 2 * REQUEST_GRACE);
        self.epoch_seen = epoch;
        self.pulls.forget();
    }

    /// Sends a pull request for `batch` messages.
    async fn request(&mut self, batch: usize) -> Result<(), Error> {
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
    fn accept(&mut self, message: async_nats::Message) -> Result<(), Error> {
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

    /// Dead-letters the deliveries past the retry cap, one at a time,
    /// each removed only once written and terminated (so a call dropped
    /// half-way writes it again, never loses it).
    async fn dead_letter_poison(&mut self) {
        while let Some((message, sequence, delivered)) = self.poison.front().cloned() {
            let attempts = message.metadata().attempt().saturating_sub(1);
            let cap = self.max_deliveries.unwrap_or(u32::MAX);
            let letter = DeadLetter::new(
                message,
                format!(
                    "delivered {attempts} times without being acknowledged (max_deliveries = {cap})"
                ),
                attempts,
            )
            .with_class(ErrorClass::Retryable);
            if self.own_sink.is_none() {
                let mut builder = NatsDeadLetterSinkBuilder::new(
                    self.connection.clone(),
                    self.stream.clone(),
                    self.durable.then(|| self.consumer.clone()),
                    self.deliveries.clone(),
                    self.counters.clone(),
                    self.ack_timeout,
                );
                if let Some(subject) = &self.dead_letter_subject {
                    builder = builder.subject(subject.clone());
                }
                match builder.build().await {
                    Ok(sink) => self.own_sink = Some(sink),
                    Err(error) => {
                        self.give_back_poison(sequence, delivered, &error);
                        return;
                    }
                }
            }
            let Some(sink) = &self.own_sink else {
                return;
            };
            // The sink terms the original once the letter is confirmed. A
            // letter the destination cannot take as it is (over
            // `max_payload`) becomes a reference, as under the dead-letter
            // layer; the sink refuses that too where the stream would
            // delete the original.
            let written = match sink.write(&letter).await {
                Err(error) if error.is_rejected() => {
                    tracing::warn!(
                        sequence,
                        %error,
                        "a message past max_deliveries does not fit the dead-letter subject; writing a reference to it"
                    );
                    sink.write(&letter.to_reference()).await
                }
                written => written,
            };
            match written {
                Ok(()) => {
                    self.counters.add_source_dead_letter();
                    tracing::warn!(
                        sequence,
                        attempts,
                        subject = sink.subject(),
                        "dead-lettered a message delivered more often than max_deliveries"
                    );
                    self.deliveries.release([(sequence, delivered)]);
                    self.poison.pop_front();
                }
                Err(error) => {
                    self.give_back_poison(sequence, delivered, &error);
                    return;
                }
            }
        }
    }

    /// A poison delivery whose letter could not be written goes back with
    /// a delay; it comes back past the cap again and is tried again.
    fn give_back_poison(&mut self, sequence: u64, delivered: u32, error: &dyn std::fmt::Display) {
        tracing::error!(
            sequence,
            %error,
            "could not dead-letter a message past max_deliveries; it is handed back and tried again later"
        );
        if let Some(held) = self.deliveries.get(sequence) {
            let client = self.connection.client.clone();
            let body = nak_with_delay(self.ack_wait);
            tokio::spawn(async move {
                let _ = client.publish(held.reply, body).await;
            });
        }
        self.deliveries.release([(sequence, delivered)]);
        self.poison.pop_front();
    }

    /// Moves every message waiting on the inbox into the buffers, without
    /// waiting.
    fn drain_inbox(&mut self) -> Result<(), Error> {
        while let Some(Some(message)) = self.replies.next().now_or_never() {
            self.accept(message)?;
        }
        Ok(())
    }

    fn hold_accepted(&mut self) {
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

/// The pull form of a consumer's configuration (`None` for a push one).
fn pull_config(config: jetstream::consumer::Config) -> Option<jetstream::consumer::pull::Config> {
    if config.deliver_subject.is_some() {
        return None;
    }
    Some(jetstream::consumer::pull::Config {
        durable_name: config.durable_name,
        name: config.name,
        description: config.description,
        deliver_policy: config.deliver_policy,
        ack_policy: config.ack_policy,
        ack_wait: config.ack_wait,
        max_deliver: config.max_deliver,
        filter_subject: config.filter_subject,
        replay_policy: config.replay_policy,
        rate_limit: config.rate_limit,
        sample_frequency: config.sample_frequency,
        max_waiting: config.max_waiting,
        max_ack_pending: config.max_ack_pending,
        headers_only: config.headers_only,
        max_batch: config.max_batch,
        max_bytes: config.max_bytes,
        max_expires: config.max_expires,
        inactive_threshold: config.inactive_threshold,
        num_replicas: config.num_replicas,
        memory_storage: config.memory_storage,
        backoff: config.backoff,
    })
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
mod tests {
    //! On the shared nats-server (`.ci/services/nats.sh`).

    use std::time::Duration;

    use intake_core::Message;
    use intake_core::backend::{AckBatch, Acker, PartitionAck};

    use super::*;

    const BUDGET: usize = 100;
    const MESSAGES: usize = 600;

    fn url() -> String {
        std::env::var("INTAKE_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
    }

    /// The batch the commit engine would send for `messages`, completed.
    fn completed(messages: &[Message]) -> AckBatch {
        let mut ack = PartitionAck::new(messages[0].metadata().partition_key());
        ack.completed
            .extend(messages.iter().map(|message| message.metadata().position()));
        AckBatch {
            partitions: vec![ack],
            sync: false,
        }
    }

    /// The runtime's side of the budget, acted out: it asks for its free
    /// slots, holds what comes, and finishes 60 at a time. With several
    /// pull requests out, the server must still never have sent more than
    /// the budget beyond what was acknowledged.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_server_never_holds_more_deliveries_than_the_budget() {
        let client = match async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(2))
            .connect(url())
            .await
        {
            Ok(client) => client,
            Err(error) => {
                intake_core::backend::testkit::skip_or_fail(
                    "pulls within the budget",
                    &format!("no NATS server at {} ({error})", url()),
                );
                return;
            }
        };
        let context = jetstream::new(client.clone());
        let token = client.new_inbox().replace("_INBOX.", "");
        let name = format!("intake_pulls_{token}");
        let stream = context
            .create_stream(jetstream::stream::Config {
                name: name.clone(),
                subjects: vec![format!("pulls.{token}")],
                ..Default::default()
            })
            .await
            .expect("stream");
        let mut acks = Vec::with_capacity(MESSAGES);
        for _ in 0..MESSAGES {
            acks.push(
                context
                    .publish(format!("pulls.{token}"), Bytes::from_static(b"x"))
                    .await
                    .expect("publish"),
            );
        }
        for ack in acks {
            ack.await.expect("stored");
        }
        let mut source = NatsSource::builder(url())
            .stream(&name)
            .consumer("budget")
            .ack_wait(Duration::from_secs(60))
            .build()
            .await
            .expect("source");
        source.set_limits(Limits::new(BUDGET, usize::MAX, Duration::from_secs(5)));
        let mut acker = source.acker();
        let mut held: Vec<Message> = Vec::new();
        let mut received = 0;
        while received < MESSAGES {
            let before = held.len();
            let free = BUDGET - before;
            tokio::time::timeout(Duration::from_secs(10), source.next(&mut held, free))
                .await
                .expect("deliveries within 10 s")
                .expect("next");
            received += held.len() - before;
            assert!(held.len() <= BUDGET, "{} handed over", held.len());
            let info = stream.consumer_info("budget").await.expect("info");
            assert!(
                info.num_ack_pending <= BUDGET,
                "the server sent {} beyond the acknowledged ones, over a budget of {BUDGET}",
                info.num_ack_pending
            );
            if held.len() >= 60 {
                let finished: Vec<Message> = held.drain(..60).collect();
                acker.ack(&completed(&finished)).await.expect("confirmed");
            }
        }
        assert_eq!(received, MESSAGES);
        source.close().await.expect("close");
        context.delete_stream(&name).await.expect("delete");
    }

    /// A message parked here that the server delivers again (the progress
    /// reports were lost for longer than `ack_wait`; acted out here with a
    /// `-NAK` on its reply subject) stays parked: it is not handed to the
    /// runtime a second time, and once due it comes back once, held under
    /// the newer delivery.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_redelivery_of_a_message_parked_here_stays_parked() {
        use intake_core::parking::Parking;

        let client = match async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(2))
            .connect(url())
            .await
        {
            Ok(client) => client,
            Err(error) => {
                intake_core::backend::testkit::skip_or_fail(
                    "a redelivery of a parked message",
                    &format!("no NATS server at {} ({error})", url()),
                );
                return;
            }
        };
        let context = jetstream::new(client.clone());
        let token = client.new_inbox().replace("_INBOX.", "");
        let name = format!("intake_parkedredelivery_{token}");
        context
            .create_stream(jetstream::stream::Config {
                name: name.clone(),
                subjects: vec![format!("parked.{token}")],
                ..Default::default()
            })
            .await
            .expect("stream");
        context
            .publish(format!("parked.{token}"), Bytes::from_static(b"m"))
            .await
            .expect("publish")
            .await
            .expect("stored");
        let mut source = NatsSource::builder(url())
            .stream(&name)
            .consumer("parked")
            .build()
            .await
            .expect("source");
        let mut acker = source.acker();
        let mut held = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), source.next(&mut held, 1))
            .await
            .expect("a delivery within 10 s")
            .expect("next");
        let message = held.pop().expect("one");
        let delay = Duration::from_secs(2);
        source
            .parking()
            .park(&message, delay)
            .await
            .expect("parked");
        let mut ack = PartitionAck::new(message.metadata().partition_key());
        ack.requeue_after
            .push((message.metadata().position(), delay));
        acker
            .ack(&AckBatch {
                partitions: vec![ack],
                sync: true,
            })
            .await
            .expect("confirmed");
        assert_eq!(source.parked_waiting(), 1);
        let sequence = 1;
        let reply = source.deliveries.get(sequence).expect("held").reply;
        client
            .publish(reply, Bytes::from_static(b"-NAK"))
            .await
            .expect("nak");
        let parked_at = Instant::now();
        tokio::time::timeout(Duration::from_secs(10), source.next(&mut held, 1))
            .await
            .expect("given back within 10 s")
            .expect("next");
        assert!(
            parked_at.elapsed() >= delay - Duration::from_millis(100),
            "not handed over before it was due: {:?}",
            parked_at.elapsed()
        );
        assert_eq!(held.len(), 1, "{held:?}");
        assert_eq!(
            source.deliveries.get(sequence).map(|held| held.delivered),
            Some(2),
            "held under the newer delivery"
        );
        acker.ack(&completed(&held)).await.expect("confirmed");
        source.close().await.expect("close");
        let info = context
            .get_stream(&name)
            .await
            .expect("stream")
            .consumer_info("parked")
            .await
            .expect("info");
        assert_eq!(info.num_ack_pending, 0);
        context.delete_stream(&name).await.expect("delete");
    }
}
