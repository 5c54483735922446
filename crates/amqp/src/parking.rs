//! [`AmqpParking`]: retry later without blocking, on RabbitMQ. A parked
//! message waits in a wait queue whose TTL hands it back to the queue it
//! came from.
//!
//! The docs of [`AmqpParking`] say how it parks, what it costs and its
//! limits.

mod relay;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use intake_core::parking::{ParkError, Parked, Parking};
use intake_core::publish::{Output, Publisher};
use intake_core::{BoxError, ConfigError, Headers, Message};
use lapin::types::AMQPValue;
use lapin::{Channel, Connection};
use tokio::sync::Mutex;
use tokio::time::Instant;

use self::relay::Relay;
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
/// time.
///
/// # Delays beyond the longest tier: steps and the relay
///
/// A delay longer than the longest tier `L` waits in steps of `L`: the copy
/// goes to the step queue `Q.wait.hop.{L}ms` (like a tier's wait queue, but
/// it dead-letters into the durable fanout exchange `Q.wait.relay` and its
/// queue of the same name instead of `Q`). Every parking runs a **relay**,
/// a consumer of `Q.wait.relay` on a connection of its own (like Kafka's
/// mover): it reads the due time the copy carries (`intake.park.due`) and
/// parks the copy on, for another step while the rest is still longer than
/// `L`, else in the tier of the rest, from which it comes back to `Q` on
/// time like any other copy. It acknowledges the copy only after the
/// broker confirmed the next wait, so a relay that dies mid-way leaves a
/// duplicate, never a loss; a failed round is tried again after a wait
/// that doubles from 100 ms to 10 s. A step neither counts as a park nor
/// runs the handler: the message is handled once, when due, and
/// `max_parks` counts the park the handler asked for. Its copy's rest is
/// reckoned by the relay host's clock against the parking host's due time;
/// clocks that disagree move the return by as much.
///
/// The relay queue never expires: copies between two steps wait there
/// (durably, quorum unless
/// [`classic_wait_queues`](AmqpParkingBuilder::classic_wait_queues)) for as
/// long as no parking of `Q` runs, and any parking of `Q` (of any process,
/// with any tiers) takes them on. The step queue's name carries `L`, so
/// changing the tiers declares another one, which leads to the same relay.
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
/// exchange, until it expires. The relay is a third connection with one
/// consumer (prefetch 16) and one more quorum queue, `Q.wait.relay`, which
/// stays; it moves a copy once per step of a long delay (once a day with
/// the default tiers), one copy at a time.
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
/// # Which messages are taken for copies
///
/// The [`ParkingLayer`](intake_core::parking::ParkingLayer) believes the
/// park headers (`intake.park.*`, `intake.parks`, `intake.attempts`) only on
/// a message [`is_returned_copy`](Parking::is_returned_copy) takes for a
/// copy: one of `Q` that RabbitMQ dead-lettered on expiry from one of `Q`'s
/// wait queues (`x-first-death-reason: expired`, `x-first-death-queue:
/// Q.wait.{ms}ms`). On any other message the layer drops those headers, so
/// a producer cannot hold messages back with a due time, use up their
/// parks, or steer the order per key.
///
/// **Residual risk**: RabbitMQ 3.10 delivers `x-death` and
/// `x-first-death-*` headers that a producer published as written (checked
/// on 3.10.8, `tests/parking.rs`), so a producer that writes them together
/// with park headers is believed: it can hold each of its own messages up
/// to the layer's `max_early_wait` (1 s), have them fail for good at their
/// first `retry_later` (`intake.parks` at `max_parks`), or name another
/// origin for their key order and dead letters. It needs no more than
/// publish access to `Q`: keep that to producers you trust as much as the
/// consumer's code, or reject such headers where producers come in.
///
/// # Clones
///
/// Clones share the connections, the counters and the relay: the relay
/// runs until [`close`](Self::close) is called on any of them, or the last
/// one is dropped.
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
#[derive(Clone)]
pub struct AmqpParking {
    shared: Arc<Shared>,
    relay: Arc<Relay>,
}

/// What the parking and its relay share.
struct Shared {
    url: AmqpUrl,
    tls: Tls,
    connection_name: Option<String>,
    queue: String,
    tiers: Vec<Tier>,
    /// The longest tier's relay wait queue: a delay beyond every tier
    /// waits there, and the relay takes it on.
    hop: Tier,
    /// Declared by the relay on each connection: where the hop wait queue
    /// dead-letters its copies.
    relay_topology: Topology,
    timeout: Duration,
    publisher: AmqpPublisher,
    declarer: Mutex<Declarer>,
    parked: AtomicU64,
    relayed: AtomicU64,
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
    /// By tier index (the hop wait queue last): the moment before the last
    /// declaration the broker confirmed, so the broker's lease began no
    /// earlier.
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
            .field("endpoint", &self.shared.url.endpoint())
            .field("queue", &self.shared.queue)
            .field("tiers", &self.tiers())
            .field("parked", &self.parked())
            .field("relayed", &self.relayed())
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
    /// a wait queue; a longer delay waits in steps of the longest tier (see
    /// the [type docs](AmqpParking)). Rounded up to whole milliseconds;
    /// from 1 ms to 30 days.
    pub fn tiers(mut self, tiers: impl IntoIterator<Item = Duration>) -> Self {
        self.tiers = tiers.into_iter().collect();
        self
    }

    /// Classic wait queues instead of quorum ones: RabbitMQ dead-letters
    /// their messages back at most once (one in flight when the broker
    /// fails, or that finds no route, is lost). For brokers older than
    /// 3.10, which have no message TTL or at-least-once dead-lettering on
    /// quorum queues. The relay queue is classic too.
    pub fn classic_wait_queues(mut self) -> Self {
        self.kind = QueueKind::Classic;
        self
    }

    /// Names the parking's connections (with ` (parking)`, ` (parking
    /// declarations)` and ` (parking relay)` appended).
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

    /// Checks the settings, connects, declares the return route, the
    /// shortest tier's wait queue (which, unused, deletes itself after its
    /// TTL and 30 minutes) and the relay queue, and starts the relay, so
    /// that a wrong password, a missing queue or a broker without
    /// quorum-queue TTLs shows here.
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
        let longest = tiers.last().copied().unwrap_or(MAX_TIER);
        let tiers = tiers
            .into_iter()
            .map(|ttl| Tier::new(&queue, ttl, self.kind))
            .collect::<Result<Vec<_>, _>>()?;
        let hop = Tier::hop(&queue, longest, self.kind)?;
        let relay_topology = relay_topology(&queue, self.kind);
        relay_topology.validate()?;
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
        let shared = Arc::new(Shared {
            url,
            tls: self.tls,
            connection_name: self.connection_name,
            queue,
            declarer: Mutex::new(Declarer {
                link: None,
                declared: vec![None; tiers.len() + 1],
            }),
            tiers,
            hop,
            relay_topology,
            timeout: self.timeout,
            publisher,
            parked: AtomicU64::new(0),
            relayed: AtomicU64::new(0),
        });
        shared.declare(0).await?;
        shared
            .declare_on_declarer(&shared.relay_topology, &relay_queue(&shared.queue))
            .await?;
        let relay = Arc::new(Relay::start(Arc::clone(&shared)));
        Ok(AmqpParking { shared, relay })
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

/// The name of `queue`'s relay queue (and of the exchange bound to it):
/// where a copy waiting in steps goes after each step.
fn relay_queue(queue: &str) -> String {
    format!("{queue}.wait.relay")
}

/// The name of `queue`'s wait queue for the tier `ttl`.
fn wait_queue_name(queue: &str, ttl: Duration) -> String {
    format!("{queue}.wait.{}ms", whole_millis(ttl))
}

/// The name of `queue`'s step queue when its longest tier is `ttl`.
fn hop_queue_name(queue: &str, ttl: Duration) -> String {
    format!("{queue}.wait.hop.{}ms", whole_millis(ttl))
}

/// The queues where a parking of `queue` with `tiers` holds parked copies:
/// a wait queue per tier, the step queue of the longest and the relay
/// queue. Tiers no parking can have (zero, beyond 30 days) are left out,
/// as they have no wait queue.
pub(crate) fn holding_queues(queue: &str, tiers: &[Duration]) -> Vec<String> {
    let mut ttls: Vec<Duration> = tiers
        .iter()
        .filter(|tier| !tier.is_zero() && **tier <= MAX_TIER)
        .map(|tier| Duration::from_millis(whole_millis(*tier)))
        .collect();
    ttls.sort_unstable();
    ttls.dedup();
    let mut names: Vec<String> = ttls
        .iter()
        .map(|ttl| wait_queue_name(queue, *ttl))
        .collect();
    if let Some(longest) = ttls.last() {
        names.push(hop_queue_name(queue, *longest));
    }
    names.push(relay_queue(queue));
    names
}

/// What the relay consumes: its durable exchange and queue, bound. The
/// queue never expires: it holds copies between two steps of their wait,
/// however long no relay runs.
fn relay_topology(queue: &str, kind: QueueKind) -> Topology {
    let relay = relay_queue(queue);
    let relay_queue = match kind {
        QueueKind::Quorum => Queue::quorum(relay.as_str()),
        QueueKind::Classic => Queue::classic(relay.as_str()),
    };
    Topology::new()
        .exchange(Exchange::fanout(relay.as_str()))
        .queue(relay_queue)
        .bind(relay.as_str(), relay.as_str(), "")
}

/// Whether `tier` (what follows `{queue}.wait.` in a wait queue's name)
/// names a tier: decimal milliseconds and `ms`.
fn is_tier_name(tier: &str) -> bool {
    tier.strip_suffix("ms")
        .is_some_and(|millis| !millis.is_empty() && millis.bytes().all(|b| b.is_ascii_digit()))
}

/// `name`, checked against AMQP's limit on names for `queue`'s wait
/// queues.
fn check_wait_name(name: &str) -> Result<(), Error> {
    check_name("queue", name).map_err(|_| {
        ConfigError::new(
            "queue",
            format!(
                "is too long for its wait queues: `{}…` would be longer than the \
                 {MAX_NAME_BYTES} bytes AMQP allows",
                name.chars().take(32).collect::<String>()
            ),
        )
        .into()
    })
}

impl Tier {
    /// The tier of `ttl`: its wait queue `{queue}.wait.{ms}ms` gives its
    /// copies back to `queue`.
    fn new(queue: &str, ttl: Duration, kind: QueueKind) -> Result<Self, Error> {
        let wait = wait_queue_name(queue, ttl);
        let back = return_exchange(queue);
        check_wait_name(&back)?;
        // Declared with every tier: a queue deleted and declared again (by
        // its source, after a broker restart) has lost its bindings.
        let route = Topology::new()
            .exchange(Exchange::fanout(back.as_str()))
            .bind(queue, back.as_str(), "");
        Self::waiting(wait, ttl, kind, &back, route)
    }

    /// The relay's step of `ttl` (the longest tier): its wait queue
    /// `{queue}.wait.hop.{ms}ms` hands its copies to the relay queue. Its
    /// name carries the TTL, so a change of tiers declares another queue
    /// rather than one the broker refuses; every such queue leads to the
    /// same relay queue.
    fn hop(queue: &str, ttl: Duration, kind: QueueKind) -> Result<Self, Error> {
        let wait = hop_queue_name(queue, ttl);
        let relay = relay_queue(queue);
        check_wait_name(&relay)?;
        Self::waiting(wait, ttl, kind, &relay, relay_topology(queue, kind))
    }

    /// A wait queue `wait` of `ttl` that dead-letters to `then`, declared
    /// after `route`, with its own fanout exchange.
    fn waiting(
        wait: String,
        ttl: Duration,
        kind: QueueKind,
        then: &str,
        route: Topology,
    ) -> Result<Self, Error> {
        check_wait_name(&wait)?;
        let expires = i64::try_from(whole_millis(ttl).saturating_add(whole_millis(EXPIRY_MARGIN)))
            .unwrap_or(i64::MAX);
        let wait_queue = match kind {
            QueueKind::Quorum => Queue::quorum(wait.as_str()).at_least_once_dead_lettering(),
            QueueKind::Classic => Queue::classic(wait.as_str()),
        }
        .message_ttl(ttl)
        .dead_letter_exchange(then)
        .argument("x-expires", AMQPValue::LongLongInt(expires));
        let topology = route
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
        &self.shared.queue
    }

    /// The exchange that gives parked messages back to the queue
    /// (`{queue}.wait.return`, bound to it).
    pub fn return_exchange(&self) -> String {
        return_exchange(&self.shared.queue)
    }

    /// The queue the relay consumes (`{queue}.wait.relay`, with an exchange
    /// of the same name bound to it): copies parked beyond the longest tier
    /// wait there between two steps.
    pub fn relay_queue(&self) -> String {
        relay_queue(&self.shared.queue)
    }

    /// The wait queue of a step of a delay beyond the longest tier
    /// (`{queue}.wait.hop.{ms}ms`, the longest tier's TTL).
    pub fn hop_queue(&self) -> &str {
        &self.shared.hop.wait
    }

    /// The wait tiers, shortest first.
    pub fn tiers(&self) -> Vec<Duration> {
        self.shared.tiers.iter().map(|tier| tier.ttl).collect()
    }

    /// The wait queue a park for `delay` goes to; for a delay beyond the
    /// longest tier, `None`: it waits in steps in the
    /// [hop queue](Self::hop_queue) first.
    pub fn wait_queue(&self, delay: Duration) -> Option<&str> {
        self.shared
            .tier_for(delay)
            .map(|index| self.shared.tiers[index].wait.as_str())
    }

    /// The queues where this parking's copies wait: its tiers' wait
    /// queues, its step queue and the relay queue.
    pub(crate) fn holding_queues(&self) -> Vec<String> {
        holding_queues(&self.shared.queue, &self.tiers())
    }

    /// Messages parked so far (confirmed by the broker).
    pub fn parked(&self) -> u64 {
        self.shared.parked.load(Ordering::Relaxed)
    }

    /// Copies this parking's relay moved on to their next wait (confirmed
    /// by the broker): one per step of a delay beyond the longest tier.
    pub fn relayed(&self) -> u64 {
        self.shared.relayed.load(Ordering::Relaxed)
    }

    /// Stops the relay (after the copy it is moving, if any) and closes the
    /// parking's connections, after waiting (up to the timeout) for parks
    /// in flight. What is parked stays parked.
    pub async fn close(&self) {
        let shared = &self.shared;
        self.relay.stop(shared.timeout).await;
        shared.publisher.close().await;
        if let Some(link) = shared.declarer.lock().await.link.take() {
            let _ = tokio::time::timeout(
                shared.timeout,
                link.connection.close(200, "parking closed".into()),
            )
            .await;
        }
    }
}

impl Shared {
    /// The index of the shortest tier at least `delay` long.
    fn tier_for(&self, delay: Duration) -> Option<usize> {
        let millis = whole_millis(delay);
        self.tiers
            .iter()
            .position(|tier| whole_millis(tier.ttl) >= millis)
    }

    /// Tier `index`, or the hop wait queue at the index after the last
    /// tier.
    fn tier(&self, index: usize) -> Option<&Tier> {
        match self.tiers.get(index) {
            Some(tier) => Some(tier),
            None if index == self.tiers.len() => Some(&self.hop),
            None => None,
        }
    }

    /// The index of where a copy due in `delay` waits: its tier, or the hop
    /// wait queue beyond the longest.
    fn wait_for(&self, delay: Duration) -> usize {
        self.tier_for(delay).unwrap_or(self.tiers.len())
    }

    /// Declares tier `index` unless its last declaration is recent enough
    /// (see the module docs), connecting first if need be. Bounded by the
    /// timeout for each step.
    async fn declare(&self, index: usize) -> Result<(), Error> {
        let Some(tier) = self.tier(index) else {
            return Ok(());
        };
        let mut declarer = self.declarer.lock().await;
        let fresh = declarer
            .declared
            .get(index)
            .copied()
            .flatten()
            .is_some_and(|at| at.elapsed() < RENEW_AFTER);
        if fresh {
            return Ok(());
        }
        let started = Instant::now();
        self.declare_locked(&mut declarer, &tier.topology, &tier.wait)
            .await?;
        if let Some(slot) = declarer.declared.get_mut(index) {
            *slot = Some(started);
        }
        Ok(())
    }

    /// Declares `topology` (whose main queue is `what`) on the declaring
    /// channel.
    async fn declare_on_declarer(&self, topology: &Topology, what: &str) -> Result<(), Error> {
        let mut declarer = self.declarer.lock().await;
        self.declare_locked(&mut declarer, topology, what).await
    }

    async fn declare_locked(
        &self,
        declarer: &mut Declarer,
        topology: &Topology,
        what: &str,
    ) -> Result<(), Error> {
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
        let declared = tokio::time::timeout(self.timeout, topology.declare_on(&channel, url))
            .await
            .unwrap_or_else(|_| {
                Err(Error::Unreachable {
                    endpoint: url.endpoint().to_owned(),
                    source: format!(
                        "the declarations of `{what}` got no answer within {:?}",
                        self.timeout
                    )
                    .into(),
                })
            });
        if declared.is_err() {
            // A refused declaration closes the channel; an unanswered one
            // leaves it in an unknown state.
            declarer.link = None;
        }
        declared
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
        let index = self.wait_for(delay);
        self.publish_copy(message, index).await?;
        self.parked.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            queue = self.queue,
            wait_queue = self.tier(index).map(|tier| tier.wait.as_str()),
            ?delay,
            "message parked"
        );
        Ok(())
    }

    /// Publishes a copy of `message` (without RabbitMQ's bookkeeping
    /// headers) to the wait queue of `index`, declared first if need be,
    /// and waits for the broker's confirm.
    async fn publish_copy(&self, message: &Message, index: usize) -> Result<(), BoxError> {
        let Some(tier) = self.tier(index) else {
            return Err("no such wait tier".into());
        };
        self.declare(index).await?;
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
        Ok(())
    }
}

#[async_trait::async_trait]
impl Parking for AmqpParking {
    async fn park(&self, message: &Message, delay: Duration) -> Result<Parked, ParkError> {
        self.shared
            .park_copy(message, delay)
            .await
            .map(|()| Parked::Moved)
            .map_err(ParkError::new)
    }

    /// A message of the parked queue that RabbitMQ dead-lettered from one
    /// of its wait queues on expiry (`x-first-death-reason: expired`,
    /// `x-first-death-queue: {queue}.wait.{ms}ms`). A producer that
    /// publishes those headers itself is believed too: RabbitMQ 3.10 (and
    /// 3.x generally) delivers them as written (see the type docs).
    fn is_returned_copy(&self, message: &Message) -> bool {
        let headers = message.headers();
        let queue = self.shared.queue.as_str();
        **message.metadata().source() == *queue
            && headers.get_str("x-first-death-reason") == Some("expired")
            && headers
                .get_str("x-first-death-queue")
                .and_then(|wait| wait.strip_prefix(queue))
                .and_then(|rest| rest.strip_prefix(".wait."))
                .is_some_and(is_tier_name)
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
    fn only_a_tiers_wait_queue_names_a_tier() {
        for tier in ["1000ms", "1ms", "86400000ms"] {
            assert!(is_tier_name(tier), "{tier}");
        }
        for other in [
            "ms",
            "hop.1000ms",
            "relay",
            "1000",
            "10s",
            "1000ms.x",
            "-1ms",
        ] {
            assert!(!is_tier_name(other), "{other}");
        }
        let hop = Tier::hop("orders", Duration::from_secs(60), QueueKind::Quorum);
        let hop = hop.expect("a valid step queue");
        assert_eq!(hop.wait, "orders.wait.hop.60000ms");
        let declared = format!("{:?}", hop.topology.queues());
        assert!(declared.contains("orders.wait.relay"), "{declared}");
    }

    #[test]
    fn the_holding_queues_are_the_tiers_wait_queues_the_longest_step_and_the_relay() {
        let tiers = [
            Duration::from_secs(60),
            Duration::from_micros(1_500),
            Duration::ZERO,
            MAX_TIER * 2,
            Duration::from_secs(60),
        ];
        assert_eq!(
            holding_queues("orders", &tiers),
            [
                "orders.wait.2ms",
                "orders.wait.60000ms",
                "orders.wait.hop.60000ms",
                "orders.wait.relay",
            ]
        );
        assert_eq!(holding_queues("orders", &[]), ["orders.wait.relay"]);
        let tier = Tier::new("orders", Duration::from_secs(60), QueueKind::Quorum);
        let hop = Tier::hop("orders", Duration::from_secs(60), QueueKind::Quorum);
        assert_eq!(tier.expect("a valid tier").wait, "orders.wait.60000ms");
        assert_eq!(hop.expect("a valid step").wait, "orders.wait.hop.60000ms");
    }

    #[test]
    fn a_queue_name_too_long_for_its_wait_queues_is_refused() {
        let queue = "q".repeat(MAX_NAME_BYTES - 5);
        assert!(Tier::new(&queue, Duration::from_secs(1), QueueKind::Quorum).is_err());
    }
}
