//! [`AmqpSource`]: consumes a queue on one channel and reconnects when the
//! connection or the channel is lost.
//!
//! The channel is the partition. Its deliveries carry
//! `PartitionKey { source: queue, partition: epoch }`, where the epoch counts
//! the channels this source has opened. When a channel is lost the source
//! reports its partition revoked: the runtime stops dispatching what it still
//! holds of it, and the acker refuses its tags, because the broker has
//! already put those deliveries back in the queue. The next channel is a new
//! partition, reported assigned; it is opened only once the revocation
//! completed, because the broker hands the lost channel's messages out again
//! at once and they must not run beside their first copies.

mod builder;
pub(crate) mod convert;
mod recovery;
mod session;

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::{FutureExt, Stream, StreamExt};
use intake_core::backend::{RevocationError, RevocationOutcome};
use intake_core::{
    Message, PartitionKey,
    backend::{Limits, Reachability, Source, SourceError, SourceEvent},
};
use lapin::options::BasicQosOptions;
use lapin::{Channel, Connection};
use tokio::time::Instant;

pub use builder::AmqpSourceBuilder;
pub(crate) use builder::{Settings, Target};
use convert::DeliveryReader;
use session::{close_session, open_session_within, start_consuming};

use crate::acker::AmqpAcker;
use crate::counters::AmqpCounters;
use crate::dead_letter::{AmqpDeadLetterSinkBuilder, BrokerDeadLetterSink};
use crate::error::Error;
use crate::live_channel::ChannelSlot;
use crate::prefetch::Prefetch;
use crate::topology::short;

/// A source of deliveries from a RabbitMQ queue (or a fanout exchange, in
/// broadcast mode). See the [crate docs](crate) for an example.
pub struct AmqpSource {
    settings: Arc<Settings>,
    slot: Arc<ChannelSlot>,
    reader: DeliveryReader,
    state: State,
    pending: VecDeque<SourceEvent>,
    /// Reported once the pending events are out: the reconnect backoff gave
    /// up.
    failure: Option<Error>,
    /// Failed attempts in a row: reconnects that failed, sessions lost to
    /// a delivery lapin could not parse (that delivery comes back on the
    /// next session, so such a session is no sign of health), and sessions
    /// lost before they delivered anything or lasted a connect timeout. A
    /// session lost after that starts a fresh series.
    failures: u32,
    /// After a channel died on a delivery lapin could not parse: how many
    /// deliveries the next channel takes one at a time (see
    /// [`AmqpSource::poisoned`]).
    quarantine: Option<u64>,
    /// The consumer's limits and the recent delivery sizes: the prefetch
    /// of the next consumer started.
    prefetch: Prefetch,
    counters: AmqpCounters,
    next_epoch: u32,
    /// Unreachable from a failed reconnect until one succeeds, for
    /// readiness: the source reconnects on its own, so the runtime sees no
    /// error meanwhile.
    reachability: Reachability,
}

enum State {
    /// Boxed: a session is large and the other states are small.
    Live(Box<Session>),
    /// Waiting to reconnect.
    Down {
        retry_at: Instant,
        /// Resolves when the runtime completed (or dropped) the lost
        /// channel's revocation; see [`AmqpSource::reconnect`].
        drained: Option<Drained>,
    },
    Closed,
}

/// The wait for a revocation, kept across calls so that a dropped
/// [`Source::next`] future resumes it instead of skipping it.
type Drained = Pin<Box<dyn Future<Output = Result<RevocationOutcome, RevocationError>> + Send>>;

/// One connection and the channel consuming on it.
struct Session {
    epoch: u32,
    connection: Connection,
    channel: Channel,
    consumer: Consuming,
    /// The connection's lifecycle events; an error on the connection or the
    /// channel shows here without taking a delivery from the consumer.
    events: Pin<Box<dyn Stream<Item = lapin::Event> + Send>>,
    queue: String,
    /// The highest delivery tag read from the channel. RabbitMQ numbers a
    /// channel's deliveries 1, 2, 3, … and lapin hands them over in order,
    /// so a delivery lapin fails to parse is the one after it.
    last_tag: u64,
    /// Deliveries still to take at a prefetch of 1 before the full prefetch
    /// is set; `Some(0)` once it is due.
    quarantine: Option<u64>,
    /// The prefetch the consumer was started with.
    prefetch: u16,
    /// When the session started consuming, and whether it delivered
    /// anything: a session lost young and empty was no success.
    opened_at: Instant,
    delivered: bool,
}

/// A session's consumer. RabbitMQ applies `basic.qos` only to the
/// consumers started after it, never to one already consuming
/// (`rabbitmq_gives_a_new_prefetch_only_to_consumers_started_after_it`), so
/// the prefetch is set once per consumer, when it starts: the first
/// session's on the first [`Source::next`], after the runtime told its
/// limits ([`Source::set_limits`]); a reopened session's as it opens.
///
/// A new prefetch on a running session would take a second consumer on
/// the channel, and that was tried and left: what the first one holds
/// unacknowledged counts against neither prefetch (so the budget is passed
/// by that much), a broadcast source's auto-delete queue is deleted when
/// its last consumer is cancelled, and a quorum queue counted an extra
/// delivery attempt.
enum Consuming {
    /// The source was built and `next` not called yet.
    NotStarted,
    /// `basic.qos` and `basic.consume` sent; kept across calls so that a
    /// dropped `next` resumes the start instead of leaving a consumer
    /// nobody reads. Bounded by the connection's heartbeat: lapin fails the
    /// pending calls when the connection is lost.
    Starting(Pin<Box<dyn Future<Output = Result<lapin::Consumer, lapin::Error>> + Send>>),
    Started(lapin::Consumer),
}

impl fmt::Debug for AmqpSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (state, epoch) = match &self.state {
            State::Live(session) => ("live", Some(session.epoch)),
            State::Down { .. } => ("reconnecting", None),
            State::Closed => ("closed", None),
        };
        f.debug_struct("AmqpSource")
            .field("endpoint", &self.settings.url.endpoint())
            .field("source", &self.settings.source_name())
            .field("state", &state)
            .field("epoch", &epoch)
            .finish()
    }
}

impl AmqpSource {
    /// Starts building a source for the broker `settings` describe (its
    /// URL, TLS, connection name and connect timeout; a URL alone converts
    /// into [`AmqpSettings`](crate::AmqpSettings)).
    pub fn builder(settings: impl Into<crate::AmqpSettings>) -> AmqpSourceBuilder {
        AmqpSourceBuilder::new(settings)
    }

    async fn open(settings: Settings) -> Result<Self, Error> {
        let settings = Arc::new(settings);
        // Consuming starts on the first `next`, with the consumer's limits.
        let session = open_session_within(&settings, 1, None, None).await?;
        let slot = Arc::new(ChannelSlot::default());
        slot.install(session.epoch, session.channel.clone());
        let reader = DeliveryReader::new(settings.source_name().into());
        let mut source = Self {
            settings,
            slot,
            reader,
            state: State::Live(Box::new(session)),
            pending: VecDeque::new(),
            failure: None,
            failures: 0,
            quarantine: None,
            prefetch: Prefetch::default(),
            counters: AmqpCounters::default(),
            next_epoch: 2,
            reachability: Reachability::new(),
        };
        source
            .pending
            .push_back(SourceEvent::Assigned(vec![source.partition(1)]));
        Ok(source)
    }

    /// The acker for this source's deliveries. It acknowledges on the
    /// source's current channel and refuses tags of earlier ones.
    pub fn acker(&self) -> AmqpAcker {
        AmqpAcker::new(self.slot.clone(), self.settings.url.endpoint().to_owned())
    }

    /// A builder for the sink that publishes this source's dead letters
    /// with publisher confirms ([`AmqpDeadLetterSink`](crate::AmqpDeadLetterSink)), filled in from the
    /// source: its [`AmqpSettings`](crate::AmqpSettings) (the broker and its
    /// credentials, TLS, the connection name with ` (dead letters)`
    /// appended, the connect timeout), and
    /// what the source consumes. Name the destination with
    /// [`exchange`](AmqpDeadLetterSinkBuilder::exchange) (and
    /// [`routing_key`](AmqpDeadLetterSinkBuilder::routing_key)) and
    /// [`build`](AmqpDeadLetterSinkBuilder::build) it. A destination that
    /// routes back into the consumed queue, through the default exchange or
    /// through what the sink or the source [declares](AmqpSourceBuilder::declare),
    /// or that is a broadcast source's own fanout exchange, is refused there:
    /// its dead letters would be consumed again.
    ///
    /// ```no_run
    /// # async fn run(source: &intake_amqp::AmqpSource) -> Result<(), intake_amqp::Error> {
    /// let sink = source
    ///     .dead_letter_sink()
    ///     .exchange("")
    ///     .routing_key("orders.dlq")
    ///     .build()
    ///     .await?;
    /// # drop(sink);
    /// # Ok(())
    /// # }
    /// ```
    pub fn dead_letter_sink(&self) -> AmqpDeadLetterSinkBuilder {
        let settings = &self.settings;
        let builder = AmqpDeadLetterSinkBuilder::for_source(
            settings.amqp.clone().for_part("dead letters"),
            settings.topology.clone(),
        );
        match &settings.target {
            Target::Queue(queue) => builder.consumed_queue(queue.as_str()),
            Target::Broadcast { exchange } => builder.consumed_exchange(exchange.clone()),
        }
    }

    /// A probe of the consumed queue's depth (see [`AmqpLagProbe`](crate::AmqpLagProbe) for
    /// what it counts), on a connection of its own with the source's URL,
    /// credentials and TLS; `None` for a broadcast source, whose queue is
    /// exclusive to its own connection.
    pub fn lag_probe(&self) -> Option<crate::AmqpLagProbe> {
        let settings = &self.settings;
        let Target::Queue(queue) = &settings.target else {
            return None;
        };
        Some(crate::AmqpLagProbe::with_settings(
            settings.url.clone(),
            settings.tls.clone(),
            settings.connection_name.clone(),
            queue,
        ))
    }

    /// A dead-letter sink that rejects a message without requeue
    /// (`basic.reject(requeue=false)`), so that the broker moves it to the
    /// queue's own dead-letter exchange. See [`BrokerDeadLetterSink`]; for
    /// a sink that publishes a copy with the error, see
    /// [`dead_letter_sink`](Self::dead_letter_sink).
    pub fn broker_dead_letter_sink(&self) -> BrokerDeadLetterSink {
        BrokerDeadLetterSink::new(self.slot.clone(), self.reader.source().clone())
    }

    /// Counts of connection trouble (lost channels, failed reconnects,
    /// deliveries lapin could not parse), for metrics.
    pub fn counters(&self) -> AmqpCounters {
        self.counters.clone()
    }

    /// The broker this source talks to (without password).
    pub fn endpoint(&self) -> &str {
        self.settings.url.endpoint()
    }

    /// The name deliveries carry as their source: the queue, or the exchange
    /// of a broadcast source.
    pub fn source_name(&self) -> &str {
        self.settings.source_name()
    }

    /// The queue being consumed right now (for a broadcast source, the
    /// server-named queue of the current connection).
    pub fn current_queue(&self) -> Option<&str> {
        match &self.state {
            State::Live(session) => Some(&session.queue),
            _ => None,
        }
    }

    fn partition(&self, epoch: u32) -> PartitionKey {
        PartitionKey {
            source: self.reader.source().clone(),
            partition: epoch,
        }
    }
}

/// What one poll of the consumer produced.
enum Polled {
    Delivered,
    Lost(Loss),
}

/// Why a channel is considered gone.
enum Loss {
    /// lapin reported an error (connection closed, heartbeat missed, …).
    Error(lapin::Error),
    /// The consumer stream ended: the broker cancelled the consumer.
    Cancelled,
    /// The channel is no longer open, with no error seen yet.
    Closed,
}

impl Source for AmqpSource {
    /// Takes the consumer's budget for the prefetch (`basic.qos`) of every
    /// consumer the source starts from now on: the first on the first
    /// [`next`](Source::next), and one on every reopened channel. The
    /// prefetch is `max_in_flight` (AMQP allows 1 to 65,535), and no more
    /// than fit in half of `max_in_flight_bytes` at the average size of the
    /// recent deliveries, once there were some: RabbitMQ bounds a prefetch
    /// by count only, and applies `basic.qos` only to consumers started
    /// after it. Until it is called, the runtime's defaults apply (256
    /// deliveries, 64 MiB).
    fn set_limits(&mut self, limits: Limits) {
        self.prefetch.set_limits(limits);
    }

    async fn next(
        &mut self,
        deliveries: &mut Vec<Message>,
        max: usize,
    ) -> Result<SourceEvent, SourceError> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Ok(event);
            }
            if let Some(error) = self.failure.take() {
                return Err(error.into());
            }
            let session = match &mut self.state {
                State::Live(session) => session,
                State::Down { .. } => {
                    self.reconnect().await?;
                    continue;
                }
                State::Closed => return Ok(SourceEvent::Exhausted),
            };
            if let Consuming::NotStarted = session.consumer {
                // The first session, now that the runtime told its limits.
                session.prefetch = self.prefetch.count();
                session.consumer = Consuming::Starting(Box::pin(start_consuming(
                    session.channel.clone(),
                    short(&session.queue),
                    session.prefetch,
                )));
            }
            if let Consuming::Starting(started) = &mut session.consumer {
                // Cancel-safe: the start is kept in the session.
                match started.as_mut().await {
                    Ok(consumer) => session.consumer = Consuming::Started(consumer),
                    Err(error) => self.lose(Loss::Error(error)),
                }
                continue;
            }
            if session.quarantine == Some(0) {
                // Past what came back with an unreadable delivery: the full
                // prefetch again. Cancel-safe: sent again if interrupted.
                // RabbitMQ gives it only to consumers started after it (see
                // `Consuming`), so this consumer keeps taking one at a time
                // until its channel is reopened.
                let prefetch = self.prefetch.count();
                let raised = session
                    .channel
                    .basic_qos(prefetch, BasicQosOptions { global: false })
                    .await;
                match raised {
                    Ok(()) => {
                        session.quarantine = None;
                        tracing::info!(
                            endpoint = self.settings.url.endpoint(),
                            queue = session.queue,
                            epoch = session.epoch,
                            prefetch,
                            "AMQP consumer past the deliveries returned with an unreadable one; full prefetch again"
                        );
                    }
                    Err(error) => {
                        self.lose(Loss::Error(error));
                        continue;
                    }
                }
            }
            if max == 0 {
                // The budget is full: deliver nothing, but notice a lost
                // channel, whose revocation frees the slots its deliveries
                // hold. Cancel-safe: an event is handled in the poll that
                // returns it.
                let loss = loop {
                    if !session.channel.status().connected() {
                        break Loss::Closed;
                    }
                    match session.events.next().await {
                        Some(lapin::Event::Error(error)) => break Loss::Error(error),
                        Some(_) => continue,
                        None => break Loss::Closed,
                    }
                };
                self.lose(loss);
                continue;
            }
            // Cancel-safe: a delivery leaves lapin's buffer only when this
            // poll returns it, and from then on nothing awaits.
            let already = deliveries.len();
            let Consuming::Started(consumer) = &mut session.consumer else {
                continue; // Started just above.
            };
            let first = consumer.next().await;
            let polled = match first {
                Some(Ok(delivery)) => {
                    session.took(delivery.delivery_tag);
                    deliveries.push(self.reader.read(delivery, session.epoch));
                    let mut polled = Polled::Delivered;
                    while deliveries.len() < max {
                        let Consuming::Started(consumer) = &mut session.consumer else {
                            break;
                        };
                        let ready = consumer.next().now_or_never();
                        match ready {
                            Some(Some(Ok(delivery))) => {
                                session.took(delivery.delivery_tag);
                                deliveries.push(self.reader.read(delivery, session.epoch));
                            }
                            Some(Some(Err(error))) => {
                                polled = Polled::Lost(Loss::Error(error));
                                break;
                            }
                            Some(None) => {
                                polled = Polled::Lost(Loss::Cancelled);
                                break;
                            }
                            None => break,
                        }
                    }
                    let taken = &deliveries[already..];
                    self.prefetch
                        .observe(taken.iter().map(Message::byte_size).sum(), taken.len());
                    if !session.channel.status().connected() {
                        // The channel died while these sat in lapin's
                        // buffer: the broker has requeued them already, and
                        // no ack for them could be sent.
                        tracing::debug!(
                            dropped = deliveries.len() - already,
                            epoch = session.epoch,
                            "deliveries of a lost channel left to the broker"
                        );
                        deliveries.truncate(already);
                        if matches!(polled, Polled::Delivered) {
                            polled = Polled::Lost(Loss::Closed);
                        }
                    }
                    if let Polled::Lost(error) = polled {
                        self.lose(error);
                    }
                    if deliveries.len() == already {
                        continue;
                    }
                    return Ok(SourceEvent::Delivered);
                }
                Some(Err(error)) => Polled::Lost(Loss::Error(error)),
                None => Polled::Lost(Loss::Cancelled),
            };
            if let Polled::Lost(error) = polled {
                self.lose(error);
            }
        }
    }

    /// Stops consuming and hands back, with one `basic.nack(requeue)`,
    /// everything delivered and not acknowledged ("not now": RabbitMQ 4.3
    /// and later do not count it as a failed delivery), then closes the
    /// channel and the connection, within the
    /// [close timeout](AmqpSourceBuilder::close_timeout).
    /// Unreachable from a failed reconnect until one succeeds.
    fn reachability(&self) -> Option<Reachability> {
        Some(self.reachability.clone())
    }

    async fn close(&mut self) -> Result<(), SourceError> {
        self.slot.clear();
        let State::Live(session) = std::mem::replace(&mut self.state, State::Closed) else {
            return Ok(());
        };
        let timeout = self.settings.close_timeout;
        let url = &self.settings.url;
        match tokio::time::timeout(timeout, close_session(*session, url)).await {
            Ok(closed) => closed.map_err(SourceError::from),
            Err(_elapsed) => {
                tracing::warn!(
                    endpoint = url.endpoint(),
                    ?timeout,
                    "the AMQP broker did not answer the close in time; the connection is dropped, \
                     and the broker requeues the unacknowledged deliveries once it notices"
                );
                Err(Error::Unreachable {
                    endpoint: url.endpoint().to_owned(),
                    source: format!("no answer to the close within {timeout:?}").into(),
                }
                .into())
            }
        }
    }
}
