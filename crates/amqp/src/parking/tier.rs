//! Wait tiers: their delays, the names of their wait, step and relay
//! queues, and what each declares.

use std::time::Duration;

use intake_core::ConfigError;
use lapin::types::AMQPValue;

use crate::error::Error;
use crate::topology::{Exchange, MAX_NAME_BYTES, Queue, QueueKind, Topology, check_name};

use super::{EXPIRY_MARGIN, MAX_TIER, Tier};

/// The tiers as given, checked, rounded up to whole milliseconds, sorted,
/// without repeats.
pub(super) fn tier_ttls(tiers: Vec<Duration>) -> Result<Vec<Duration>, ConfigError> {
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
pub(super) fn whole_millis(duration: Duration) -> u64 {
    let millis = duration.as_nanos().div_ceil(1_000_000);
    u64::try_from(millis).unwrap_or(u64::MAX)
}

/// The name of `queue`'s exchange that gives parked messages back to it.
pub(super) fn return_exchange(queue: &str) -> String {
    format!("{queue}.wait.return")
}

/// The name of `queue`'s relay queue (and of the exchange bound to it):
/// where a copy waiting in steps goes after each step.
pub(super) fn relay_queue(queue: &str) -> String {
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
pub(super) fn relay_topology(queue: &str, kind: QueueKind) -> Topology {
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
pub(super) fn is_tier_name(tier: &str) -> bool {
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
    pub(super) fn new(queue: &str, ttl: Duration, kind: QueueKind) -> Result<Self, Error> {
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
    pub(super) fn hop(queue: &str, ttl: Duration, kind: QueueKind) -> Result<Self, Error> {
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
