//! [`AmqpParking`]: retry later without blocking, on RabbitMQ. A parked
//! message waits in a wait queue whose TTL hands it back to the queue it
//! came from.
//!
//! The docs of [`AmqpParking`] say how it parks, what it costs and its
//! limits.

mod builder;
mod relay;
mod shared;
#[cfg(test)]
mod tests;
mod tier;

pub use builder::AmqpParkingBuilder;
pub(crate) use tier::holding_queues;
use tier::{is_tier_name, relay_queue, return_exchange};

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use intake_core::Message;
use intake_core::parking::{ParkError, Parked, Parking};
use lapin::{Channel, Connection};
use tokio::sync::Mutex;
use tokio::time::Instant;

use self::relay::Relay;
use crate::publisher::AmqpPublisher;
use crate::tls::Tls;
use crate::topology::Topology;
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
    /// Bounds each connection attempt of the declarer and the relay.
    connect_timeout: Duration,
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
