//! [`AmqpParkingBuilder`]: a parking's settings, checked, and the wait
//! queues and relay it starts with.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use intake_core::ConfigError;
use tokio::sync::Mutex;

use crate::error::Error;
use crate::publisher::AmqpPublisher;
use crate::settings::AmqpSettings;
use crate::topology::QueueKind;

use super::relay::Relay;
use super::tier::{relay_queue, relay_topology, tier_ttls};
use super::{AmqpParking, Declarer, MAX_PAYLOAD_BYTES, MAX_TIER, Shared, Tier};

/// Builds an [`AmqpParking`]; see [`AmqpParking::builder`].
#[must_use = "a builder does nothing until `.build().await`"]
pub struct AmqpParkingBuilder {
    settings: AmqpSettings,
    queue: Option<String>,
    tiers: Vec<Duration>,
    kind: QueueKind,
    timeout: Duration,
}

impl fmt::Debug for AmqpParkingBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpParkingBuilder")
            .field("settings", &self.settings)
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

    /// How long each step of a park may take: connecting (unless the
    /// settings give a [`connect_timeout`](AmqpSettings::connect_timeout)),
    /// declaring its wait queue, publishing, the broker's confirm (default
    /// 30 s). The parking's connections are named after the settings'
    /// connection name, with ` (parking)`, ` (parking declarations)` and
    /// ` (parking relay)` appended.
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
        let checked = self.settings.check()?;
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
        let longest = tiers.last().copied().unwrap_or(MAX_TIER);
        let tiers = tiers
            .into_iter()
            .map(|ttl| Tier::new(&queue, ttl, self.kind))
            .collect::<Result<Vec<_>, _>>()?;
        let hop = Tier::hop(&queue, longest, self.kind)?;
        let relay_topology = relay_topology(&queue, self.kind);
        relay_topology.validate()?;
        let publisher = AmqpPublisher::builder(self.settings.for_part("parking"))
            .route_by_key()
            .send_timeout(self.timeout)
            .confirm_timeout(self.timeout)
            .max_payload_bytes(MAX_PAYLOAD_BYTES)
            .build()
            .await?;
        let shared = Arc::new(Shared {
            connect_timeout: checked.connect_timeout_or(self.timeout),
            url: checked.url,
            tls: checked.tls,
            connection_name: checked.connection_name,
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

impl AmqpParking {
    /// Starts building a parking for the broker `settings` describe (a URL
    /// alone converts into [`AmqpSettings`]); name the queue with
    /// [`queue`](AmqpParkingBuilder::queue).
    pub fn builder(settings: impl Into<AmqpSettings>) -> AmqpParkingBuilder {
        AmqpParkingBuilder {
            settings: settings.into(),
            queue: None,
            tiers: Self::DEFAULT_TIERS.to_vec(),
            kind: QueueKind::Quorum,
            timeout: Self::DEFAULT_TIMEOUT,
        }
    }
}
