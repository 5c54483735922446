//! [`PartHealth`]: what a part of a service besides its routes says of
//! itself, for [`Health::add_check`](super::Health::add_check).
//!
//! Some parts run beside the consumers and can fail on their own: a Kafka
//! parking's mover (parked messages stop coming back), an outbox relay
//! (rows stop reaching the broker). Their health counts with the routes':
//!
//! ```
//! use intake_core::app::{Health, HealthSettings, PartHealth};
//!
//! let health = Health::new(HealthSettings::default());
//! // A part that reports how long its loop has not turned.
//! let idle_for = std::time::Duration::from_secs(3);
//! health.add_check("mover", move || {
//!     if idle_for > std::time::Duration::from_secs(60) {
//!         PartHealth::NotLive(format!("no round for {idle_for:?}"))
//!     } else {
//!         PartHealth::Healthy
//!     }
//! });
//! assert!(health.liveness().routes.iter().any(|(name, problems)| name == "mover" && problems.is_empty()));
//! ```

use std::sync::Arc;

/// What a part says of itself when asked.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PartHealth {
    /// It works.
    Healthy,
    /// It works, but the instance should get no traffic for now (a
    /// readiness problem), with why: a relay whose broker refuses rows, say.
    NotReady(String),
    /// It is broken in a way a restart clears (a liveness problem, and so a
    /// readiness one too), with why: a mover that stopped turning.
    NotLive(String),
}

/// A part's check, as [`Health`](super::Health) keeps it.
pub(super) type Check = Arc<dyn Fn() -> PartHealth + Send + Sync>;
