//! [`AmqpParking`]: retry later without blocking, on RabbitMQ. A parked
//! message waits in a wait queue whose TTL hands it back to the queue it
//! came from.
//!
//! The docs of [`AmqpParking`] say how it parks, what it costs and its
//! limits.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use intake_core::parking::{ParkError, Parked, Parking};
use intake_core::publish::{Output, Publisher};
use intake_core::{BoxError, ConfigError, Headers, Message};
use lapin::types::AMQPValue;
use lapin::{Channel, Connection};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::connection::open_within;
use crate::error::{Error, Operation, classify};
use crate::publisher::AmqpPublisher;
use crate::tls::Tls;
use crate::topology::{Exchange, MAX_NAME_BYTES, Queue, QueueKind, Topology, check_name};
use crate::url::AmqpUrl;

/// How much longer than its TTL an idle wait queue lives.
const EXPIRY_MARGIN: Duration = Duration::from_secs(30 * 60);

/// How old a tier's last declaration may be before a park declares it
/// again; well below [`EXPIRY_MARGIN`], so a message published just before
/// the renewal is still due long before its queue may expire.
const RENEW_AFTER: Duration = Duration::from_secs(5 * 60);

/// The longest tier: RabbitMQ takes TTLs and expiries below 2^32 ms (49
/// days).
const MAX_TIER: Duration = Duration::from_secs(30 * 24 * 3600);

/// RabbitMQ's largest `max_message_size`: a message delivered by the broker
/// fits its own limit, so the publisher need not refuse it.
const MAX_PAYLOAD_BYTES: usize = 512 << 20;

/// RabbitMQ's bookkeeping of earlier dead-letterings and deliveries, left
/// out of a parked copy.
const BROKER_HEADERS: [&str; 7] = [
    "x-death",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-last-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
];

const fn seconds(seconds: u64) -> Duration {
    Duration::from_secs(seconds)
}

const fn minutes(minutes: u64) -> Duration {
    Duration::from_secs(minutes * 60)
}

const fn hours(hours: u64) -> Duration {
    Duration::from_secs(hours * 3600)
}

/// Parks messages of one queue in wait queues that RabbitMQ dead-letters
/// back into it once due.
///
/// # How it parks
///
/// For a consumed queue `Q` and each wait **tier** `T` (a delay, in
/// milliseconds) in use:
///
/// - a wait queue `Q.wait.{T}ms` with `x-message-ttl = T` (RabbitMQ's
///   expiry can give a copy back a few milliseconds early; the
///   [`ParkingLayer`](intake_core::parking::ParkingLayer) holds it until
///   due) and
///   `x-dead-letter-exchange = Q.wait.return`, and a fanout exchange of the
///   same name bound to it (auto-delete: it goes with the queue);
/// - once per queue, the durable fanout exchange `Q.wait.return`, bound to
///   `Q`.
///
/// A park publishes a copy of the message to the tier's exchange with the
/// message's key as its routing key, persistent and `mandatory`, and
/// resolves once the broker confirmed it (the runtime acknowledges the
/// original only then). After `T`, RabbitMQ dead-letters the copy to
/// `Q.wait.return`, which puts it back into `Q` with its routing key
/// unchanged: the [`AmqpSource`](crate::AmqpSource) reads that as the key,
/// so the copy comes back with the original's key, payload and headers.
/// The default exchange cannot carry the copy either way (it routes by
/// queue name, so the routing key would have to be the wait queue's, and
/// `x-dead-letter-routing-key` would replace the key with `Q`): hence the
/// two fanout exchanges, which route whatever the routing key.
///
/// The TTL is the queue's, not the message's: all messages of a wait queue
/// wait equally long, so they expire in the order they came and none waits
/// behind a longer one at the head (RabbitMQ expires per-message TTLs only
/// at the head of a queue).
///
/// # At least once
///
/// Wait queues are quorum queues with `x-dead-letter-strategy:
/// at-least-once` (and `x-overflow: reject-publish`, which that strategy
/// requires): the wait queue keeps an expired message until `Q` confirmed
/// it, so a broker crash or a missing route delays its return instead of
/// losing it. A classic queue dead-letters at most once: what is in flight
/// when the broker fails, or finds no route, is dropped. Quorum queues have
/// message TTL and at-least-once dead-lettering from RabbitMQ 3.10 (checked
/// on 3.10.8); on an older broker the wait queue's declaration is refused
/// when the parking is built, and
/// [`classic_wait_queues`](AmqpParkingBuilder::classic_wait_queues) opts into
/// at-most-once instead. The origin queue may be of either kind.
///
/// A process that stops after the confirm and before the acknowledgement
/// leaves both the parked copy and the original, which is delivered again
/// and may be parked again: a duplicate, never a loss.
///
/// # Tiers: how late a message comes back
///
/// A delay waits in the shortest tier at least as long, so a message never
/// comes back before it is due, and the number of wait queues stays
/// bounded. The [default tiers](AmqpParking::DEFAULT_TIERS) run from 1 s
/// to 24 h, each at most 5/3 of the one before: a delay of a second or
/// more comes back at most 2/3 of itself late (31 min waits 45 min). The
/// [`ParkingLayer`](intake_core::parking::ParkingLayer) keeps a key's
/// order only while its parked message is less than
/// [`overdue_after`](intake_core::parking::ParkingLayer::overdue_after) (10
/// min by default) overdue, which the default tiers reach for delays above
/// 20 minutes: raise `overdue_after`, or give the delays the handler asks
/// for as [`tiers`](AmqpParkingBuilder::tiers), which then come back on
/// time. A delay longer than the longest tier is refused (the layer retries
/// the message the ordinary way and logs why).
///
/// # Idle wait queues delete themselves
///
/// A wait queue has `x-expires` of its TTL plus 30 minutes: unused that
/// long, RabbitMQ deletes it. Publishing does not count as use, and a queue
/// that expires takes the messages in it along, so the parking declares a
/// tier again (a declaration renews the lease) before it publishes to it
/// whenever its last declaration is 5 minutes old or more. Every message
/// published is then due at least 25 minutes before its queue can expire.
///
/// # Costs
///
/// A park is one publish and its confirm (a quorum queue writes it to disk
/// before confirming), on the parking's publisher connection; the first
/// park of a tier in 5 minutes also declares it (five round trips on a
/// second connection, used for nothing else: redeclaring on every park
/// would queue every concurrent park behind one channel's declarations).
/// Each tier in use is a quorum queue (a Raft group on each replica) and an
/// exchange, until it expires.
///
/// # Limits
///
/// - What comes back is what the source shows of a message: payload,
///   routing key, headers (their values as text, as the source renders
///   them), and the `message-id`, `correlation-id` and `content-type`
///   properties. Other properties (timestamp, priority, reply-to, ...) are
///   not carried. RabbitMQ's own bookkeeping headers (`x-death`,
///   `x-first-death-*`, `x-last-death-*`, `x-delivery-count`) are dropped
///   from the copy: as text they are no longer RabbitMQ's, and the copy that
///   comes back carries the ones of its own wait.
/// - It parks messages of its one queue; a broadcast source's queues are
///   exclusive to their connection and cannot be parked into.
/// - `Q` is bound to `Q.wait.return`: deleting `Q` unbinds it, and the
///   parked messages wait (up to their queue's expiry) for a route back.
/// - A wait queue deleted by hand takes its messages along; the next park
///   to it fails (and is retried the ordinary way), the one after declares
///   it again.
/// - The delayed-message exchange plugin is not used: wait queues work on
///   every RabbitMQ from 3.10 without plugins.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use intake_amqp::AmqpParking;
/// use intake_core::parking::ParkingLayer;
///
/// # async fn run() -> Result<(), intake_amqp::Error> {
/// let parking = AmqpParking::builder("amqp://guest:guest@127.0.0.1:5672/%2f")
///     .queue("orders")
///     // The delays the handler asks for come back on time.
///     .tiers([Duration::from_secs(30), Duration::from_secs(300)])
///     .build()
///     .await?;
/// let layer = ParkingLayer::new(parking);
/// # drop(layer);
/// # Ok(())
/// # }
/// ```
pub struct AmqpParking {
    url: AmqpUrl,
    tls: Tls,
    connection_name: Option<String>,
    queue: String,
    tiers: Vec<Tier>,
    timeout: Duration,
    publisher: AmqpPublisher,
    declarer: Mutex<Declarer>,
    parked: AtomicU64,
}

/// One wait tier: its TTL, the name of its wait queue and exchange, and
/// what to declare for it.
struct Tier {
    ttl: Duration,
    wait: String,
    topology: Topology,
}

/// The declaring connection and when each tier was last declared.
struct Declarer {
    link: Option<Link>,
    /// By tier index: the moment before the last declaration the broker
    /// confirmed, so the broker's lease began no earlier.
    declared: Vec<Option<Instant>>,
}

struct Link {
    /// Kept so the connection lives as long as the channel is used.
    connection: Connection,
    channel: Channel,
}

impl fmt::Debug for AmqpParking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpParking")
            .field("endpoint", &self.url.endpoint())
            .field("queue", &self.queue)
            .field("tiers", &self.tiers())
            .field("parked", &self.parked())
            .finish_non_exhaustive()
    }
}

/// Builds an [`AmqpParking`]; see [`AmqpParking::builder`].
#[must_use = "a builder does nothing until `.build().await`"]
pub struct AmqpParkingBuilder {
    /// As given: the publisher parses it again. Never printed.
    raw_url: String,
    /// Parsed when the builder is made; a bad URL is reported by `build`.
    url: Result<AmqpUrl, Error>,
    queue: Option<String>,
    tiers: Vec<Duration>,
    kind: QueueKind,
    connection_name: Option<String>,
    tls: Tls,
    timeout: Duration,
}

impl fmt::Debug for AmqpParkingBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpParkingBuilder")
            .field("endpoint", &self.url.as_ref().map(AmqpUrl::endpoint).ok())
            .field("queue", &self.queue)
            .field("tiers", &self.tiers)
            .field("wait_queues", &self.kind)
            .finish_non_exhaustive()
    }
}

impl AmqpParkingBuilder {
    /// Parks the messages of `queue` (the queue the source consumes), and
    /// gives them back to it. Required.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// The wait tiers (default [`AmqpParking::DEFAULT_TIERS`]): a delay
    /// waits in the shortest tier at least as long, and each tier in use is
    /// a wait queue. Rounded up to whole milliseconds; from 1 ms to 30 days.
    pub fn tiers(mut self, tiers: impl IntoIterator<Item = Duration>) -> Self {
        self.tiers = tiers.into_iter().collect();
        self
    }

    /// Classic wait queues instead of quorum ones: RabbitMQ dead-letters
    /// their messages back at most once (one in flight when the broker
    /// fails, or that finds no route, is lost). For brokers older than
    /// 3.10, which have no message TTL or at-least-once dead-lettering on
    /// quorum queues.
    pub fn classic_wait_queues(mut self) -> Self {
        self.kind = QueueKind::Classic;
        self
    }

    /// Names the parking's connections (with ` (parking)` and ` (parking
    /// declarations)` appended).
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = Some(name.into());
        self
    }

    /// TLS beyond the defaults for an `amqps://` URL (see [`Tls`]).
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = tls;
        self
    }

    /// How long each step of a park may take: connecting, declaring its
    /// wait queue, publishing, the broker's confirm (default 30 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Checks the settings, connects, and declares the return route and
    /// the shortest tier's wait queue (which, unused, deletes itself after
    /// its TTL and 30 minutes), so that a wrong password, a missing queue or
    /// a broker without quorum-queue TTLs shows here.
    ///
    /// # Errors
    ///
    /// [`Error`] for a bad URL or setting, a connection the broker refuses,
    /// or a declaration it refuses.
    pub async fn build(self) -> Result<AmqpParking, Error> {
        let url = self.url?;
        let queue = self.queue.ok_or_else(|| {
            ConfigError::new(
                "queue",
                "is not set; call .queue(\"orders\") with the queue the source consumes",
            )
        })?;
        if queue.is_empty() {
            return Err(ConfigError::new(
                "queue",
                "is empty; a server-named queue is exclusive to its connection and cannot take \
                 parked messages back",
            )
            .into());
        }
        let tiers = tier_ttls(self.tiers)?;
        if self.timeout.is_zero() {
            return Err(ConfigError::new("timeout", "is zero; give the broker time").into());
        }
        self.tls.check_for(&url)?;
        let tiers = tiers
            .into_iter()
            .map(|ttl| Tier::new(&queue, ttl, self.kind))
            .collect::<Result<Vec<_>, _>>()?;
        let mut publisher = AmqpPublisher::builder(self.raw_url)
            .route_by_key()
            .tls(self.tls.clone())
            .send_timeout(self.timeout)
            .confirm_timeout(self.timeout)
            .max_payload_bytes(MAX_PAYLOAD_BYTES);
        if let Some(name) = &self.connection_name {
            publisher = publisher.connection_name(format!("{name} (parking)"));
        }
        let publisher = publisher.build().await?;
        let parking = AmqpParking {
            url,
            tls: self.tls,
            connection_name: self.connection_name,
            queue,
            declarer: Mutex::new(Declarer {
                link: None,
                declared: vec![None; tiers.len()],
            }),
            tiers,
            timeout: self.timeout,
            publisher,
            parked: AtomicU64::new(0),
        };
        parking.declare(0).await?;
        Ok(parking)
    }
}

/// The tiers as given, checked, rounded up to whole milliseconds, sorted,
/// without repeats.
fn tier_ttls(tiers: Vec<Duration>) -> Result<Vec<Duration>, ConfigError> {
    if tiers.is_empty() {
        return Err(ConfigError::new(
            "tiers",
            "is empty; give at least one delay to wait for",
        ));
    }
    let mut ttls = Vec::with_capacity(tiers.len());
    for tier in tiers {
        if tier.is_zero() || tier > MAX_TIER {
            return Err(ConfigError::new(
                "tiers",
                format!("holds {tier:?}; a tier is from 1 ms to 30 days"),
            ));
        }
        ttls.push(Duration::from_millis(whole_millis(tier)));
    }
    ttls.sort_unstable();
    ttls.dedup();
    Ok(ttls)
}

/// `duration` in milliseconds, rounded up.
fn whole_millis(duration: Duration) -> u64 {
    let millis = duration.as_nanos().div_ceil(1_000_000);
    u64::try_from(millis).unwrap_or(u64::MAX)
}

/// The name of `queue`'s exchange that gives parked messages back to it.
fn return_exchange(queue: &str) -> String {
    format!("{queue}.wait.return")
}

impl Tier {
    fn new(queue: &str, ttl: Duration, kind: QueueKind) -> Result<Self, Error> {
        let millis = whole_millis(ttl);
        let wait = format!("{queue}.wait.{millis}ms");
        let back = return_exchange(queue);
        for name in [&wait, &back] {
            check_name("queue", name).map_err(|_| {
                ConfigError::new(
                    "queue",
                    format!(
                        "is too long for its wait queues: `{}…` would be longer than the \
                         {MAX_NAME_BYTES} bytes AMQP allows",
                        name.chars().take(32).collect::<String>()
                    ),
                )
            })?;
        }
        let expires =
            i64::try_from(millis.saturating_add(whole_millis(EXPIRY_MARGIN))).unwrap_or(i64::MAX);
        let wait_queue = match kind {
            QueueKind::Quorum => Queue::quorum(wait.as_str()).at_least_once_dead_lettering(),
            QueueKind::Classic => Queue::classic(wait.as_str()),
        }
        .message_ttl(ttl)
        .dead_letter_exchange(back.as_str())
        .argument("x-expires", AMQPValue::LongLongInt(expires));
        // Declared with every tier: a queue deleted and declared again (by
        // its source, after a broker restart) has lost its bindings.
        let topology = Topology::new()
            .exchange(Exchange::fanout(back.as_str()))
            .bind(queue, back.as_str(), "")
            .queue(wait_queue)
            .exchange(Exchange::fanout(wait.as_str()).auto_delete())
            .bind(wait.as_str(), wait.as_str(), "");
        topology.validate()?;
        Ok(Self {
            ttl,
            wait,
            topology,
        })
    }
}

impl AmqpParking {
    /// The default wait tiers: 1 s to 24 h, each at most 5/3 of the one
    /// before (1, 1.5, 2, 3, 5, 7, 10, 15, 20, 30, 45 s; the same in
    /// minutes; 1, 1.5, 2, 3, 4, 6, 8, 12, 18, 24 h).
    pub const DEFAULT_TIERS: [Duration; 32] = [
        seconds(1),
        Duration::from_millis(1_500),
        seconds(2),
        seconds(3),
        seconds(5),
        seconds(7),
        seconds(10),
        seconds(15),
        seconds(20),
        seconds(30),
        seconds(45),
        minutes(1),
        seconds(90),
        minutes(2),
        minutes(3),
        minutes(5),
        minutes(7),
        minutes(10),
        minutes(15),
        minutes(20),
        minutes(30),
        minutes(45),
        hours(1),
        minutes(90),
        hours(2),
        hours(3),
        hours(4),
        hours(6),
        hours(8),
        hours(12),
        hours(18),
        hours(24),
    ];

    /// The default wait for each step of a park.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

    /// Starts building a parking for the broker at `url`; name the queue
    /// with [`queue`](AmqpParkingBuilder::queue).
    pub fn builder(url: impl Into<String>) -> AmqpParkingBuilder {
        let raw_url = url.into();
        AmqpParkingBuilder {
            url: AmqpUrl::parse(&raw_url),
            raw_url,
            queue: None,
            tiers: Self::DEFAULT_TIERS.to_vec(),
            kind: QueueKind::Quorum,
            connection_name: None,
            tls: Tls::new(),
            timeout: Self::DEFAULT_TIMEOUT,
        }
    }

    /// The queue whose messages this parks.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The exchange that gives parked messages back to the queue
    /// (`{queue}.wait.return`, bound to it).
    pub fn return_exchange(&self) -> String {
        return_exchange(&self.queue)
    }

    /// The wait tiers, shortest first.
    pub fn tiers(&self) -> Vec<Duration> {
        self.tiers.iter().map(|tier| tier.ttl).collect()
    }

    /// The wait queue a park for `delay` goes to (`None` beyond the longest
    /// tier).
    pub fn wait_queue(&self, delay: Duration) -> Option<&str> {
        self.tier_for(delay)
            .map(|index| self.tiers[index].wait.as_str())
    }

    /// Messages parked so far (confirmed by the broker).
    pub fn parked(&self) -> u64 {
        self.parked.load(Ordering::Relaxed)
    }

    /// Closes the parking's connections, after waiting (up to the timeout)
    /// for parks in flight. What is parked stays parked.
    pub async fn close(&self) {
        self.publisher.close().await;
        if let Some(link) = self.declarer.lock().await.link.take() {
            let _ = tokio::time::timeout(
                self.timeout,
                link.connection.close(200, "parking closed".into()),
            )
            .await;
        }
    }

    /// The index of the shortest tier at least `delay` long.
    fn tier_for(&self, delay: Duration) -> Option<usize> {
        let millis = whole_millis(delay);
        self.tiers
            .iter()
            .position(|tier| whole_millis(tier.ttl) >= millis)
    }

    /// Declares tier `index` unless its last declaration is recent enough
    /// (see the module docs), connecting first if need be. Bounded by the
    /// timeout for each step.
    async fn declare(&self, index: usize) -> Result<(), Error> {
        let mut declarer = self.declarer.lock().await;
        let fresh = declarer
            .declared
            .get(index)
            .copied()
            .flatten()
            .is_some_and(|at| at.elapsed() < RENEW_AFTER);
        let Some(tier) = self.tiers.get(index) else {
            return Ok(());
        };
        if fresh {
            return Ok(());
        }
        let url = &self.url;
        let channel = match declarer
            .link
            .as_ref()
            .filter(|link| link.channel.status().connected())
        {
            Some(link) => link.channel.clone(),
            None => {
                declarer.link = None;
                let link = self.connect().await?;
                let channel = link.channel.clone();
                declarer.link = Some(link);
                channel
            }
        };
        let started = Instant::now();
        let declared = tokio::time::timeout(self.timeout, tier.topology.declare_on(&channel, url))
            .await
            .unwrap_or_else(|_| {
                Err(Error::Unreachable {
                    endpoint: url.endpoint().to_owned(),
                    source: format!(
                        "the declarations of wait queue `{}` got no answer within {:?}",
                        tier.wait, self.timeout
                    )
                    .into(),
                })
            });
        match declared {
            Ok(()) => {
                if let Some(slot) = declarer.declared.get_mut(index) {
                    *slot = Some(started);
                }
                Ok(())
            }
            Err(error) => {
                // A refused declaration closes the channel; an unanswered
                // one leaves it in an unknown state.
                declarer.link = None;
                Err(error)
            }
        }
    }

    async fn connect(&self) -> Result<Link, Error> {
        let url = &self.url;
        let name = self
            .connection_name
            .as_ref()
            .map(|name| format!("{name} (parking declarations)"));
        let connection = open_within(url, name.as_deref(), &self.tls, self.timeout).await?;
        let channel = tokio::time::timeout(self.timeout, connection.create_channel())
            .await
            .map_err(|_| Error::Unreachable {
                endpoint: url.endpoint().to_owned(),
                source: format!("no channel within {:?}", self.timeout).into(),
            })?
            .map_err(|error| classify(error, url.endpoint(), url.vhost(), Operation::Other))?;
        Ok(Link {
            connection,
            channel,
        })
    }

    /// Forgets that tier `index` is declared, so the next park declares it
    /// again: a publish to it failed, perhaps because it is gone.
    async fn forget(&self, index: usize) {
        if let Some(slot) = self.declarer.lock().await.declared.get_mut(index) {
            *slot = None;
        }
    }

    async fn park_copy(&self, message: &Message, delay: Duration) -> Result<(), BoxError> {
        let source = message.metadata().source();
        if **source != *self.queue {
            return Err(Error::from(ConfigError::new(
                "queue",
                format!(
                    "is `{}`, and the message came from `{source}`: it would come back to the \
                     wrong queue; make a parking for each queue",
                    self.queue
                ),
            ))
            .into());
        }
        let index = self.tier_for(delay).ok_or_else(|| {
            let longest = self.tiers.last().map_or(Duration::ZERO, |tier| tier.ttl);
            Error::from(ConfigError::new(
                "tiers",
                format!(
                    "end at {longest:?}, shorter than the {delay:?} asked for: the message would \
                     come back early; add a longer tier"
                ),
            ))
        })?;
        self.declare(index).await?;
        let tier = &self.tiers[index];
        let copy = Output::forward(message, tier.wait.as_str()).with_headers(
            message
                .headers()
                .iter()
                .filter(|header| !BROKER_HEADERS.contains(&&*header.name))
                .map(|header| (header.name.clone(), header.value.clone()))
                .collect::<Headers>(),
        );
        let confirmed = async { self.publisher.send(copy).await?.await }.await;
        if let Err(error) = confirmed {
            self.forget(index).await;
            return Err(error.into());
        }
        self.parked.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            queue = self.queue,
            wait_queue = tier.wait,
            ?delay,
            "message parked"
        );
        Ok(())
    }
}

#[async_trait::async_trait]
impl Parking for AmqpParking {
    async fn park(&self, message: &Message, delay: Duration) -> Result<Parked, ParkError> {
        self.park_copy(message, delay)
            .await
            .map(|()| Parked::Moved)
            .map_err(ParkError::new)
    }

    /// A message of the parked queue that RabbitMQ itself dead-lettered
    /// from one of its wait queues on expiry (`x-first-death-queue`,
    /// `x-first-death-reason`). A producer that publishes those headers by
    /// hand is believed too: RabbitMQ 3.x does not strip them.
    fn is_returned_copy(&self, message: &Message) -> bool {
        let headers = message.headers();
        **message.metadata().source() == *self.queue
            && headers.get_str("x-first-death-reason") == Some("expired")
            && headers
                .get_str("x-first-death-queue")
                .and_then(|queue| queue.strip_prefix(self.queue.as_str()))
                .and_then(|rest| rest.strip_prefix(".wait."))
                .is_some_and(|tier| tier.ends_with("ms"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_tiers_are_sorted_and_each_at_most_five_thirds_of_the_one_before() {
        let tiers = AmqpParking::DEFAULT_TIERS;
        assert_eq!(tier_ttls(tiers.to_vec()).ok(), Some(tiers.to_vec()));
        for pair in tiers.windows(2) {
            let ratio = pair[1].as_secs_f64() / pair[0].as_secs_f64();
            assert!(ratio <= 5.0 / 3.0 + 1e-9, "{:?} -> {:?}", pair[0], pair[1]);
        }
    }

    #[test]
    fn tiers_are_whole_milliseconds_rounded_up_sorted_once_each() {
        let ttls = tier_ttls(vec![
            Duration::from_secs(5),
            Duration::from_micros(1_500),
            Duration::from_millis(2),
            Duration::from_secs(5),
        ]);
        assert_eq!(
            ttls.ok(),
            Some(vec![Duration::from_millis(2), Duration::from_secs(5)])
        );
        for refused in [vec![], vec![Duration::ZERO], vec![MAX_TIER * 2]] {
            assert!(tier_ttls(refused).is_err());
        }
    }

    #[test]
    fn a_wait_queue_outlives_every_message_published_before_its_lease_is_renewed() {
        // A message published just before the renewal waits its TTL; the
        // queue lives its TTL plus the margin from the last declaration.
        assert!(RENEW_AFTER * 4 < EXPIRY_MARGIN);
        let tier = Tier::new("orders", Duration::from_secs(30), QueueKind::Quorum);
        let tier = tier.expect("a valid tier");
        assert_eq!(tier.wait, "orders.wait.30000ms");
        let queue = &tier.topology.queues()[0];
        assert_eq!(queue.name(), "orders.wait.30000ms");
        assert_eq!(queue.kind(), QueueKind::Quorum);
        let declared = format!("{queue:?}");
        assert!(
            declared.contains(r#"("x-expires", LongLongInt(1830000))"#),
            "{declared}"
        );
    }

    #[test]
    fn a_queue_name_too_long_for_its_wait_queues_is_refused() {
        let queue = "q".repeat(MAX_NAME_BYTES - 5);
        assert!(Tier::new(&queue, Duration::from_secs(1), QueueKind::Quorum).is_err());
    }
}
