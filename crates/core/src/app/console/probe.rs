//! A route's [`LagProbe`], asked once per sample: broker lag per partition
//! and the parked backlog, for the history and the partitions view.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

use crate::lag::{LagError, LagProbe, ParkedTier, PartitionLag};

/// A lag probe with its type erased (`LagProbe` returns `impl Future`).
pub(super) trait ErasedProbe: Send + Sync {
    fn lag(&self) -> BoxFuture<'_, Result<Vec<PartitionLag>, LagError>>;
    fn parked_tiers(&self) -> BoxFuture<'_, Result<Option<Vec<ParkedTier>>, LagError>>;
}

impl<P: LagProbe> ErasedProbe for P {
    fn lag(&self) -> BoxFuture<'_, Result<Vec<PartitionLag>, LagError>> {
        Box::pin(LagProbe::lag(self))
    }

    fn parked_tiers(&self) -> BoxFuture<'_, Result<Option<Vec<ParkedTier>>, LagError>> {
        Box::pin(LagProbe::parked_tiers(self))
    }
}

/// A route's probe and its last answer.
pub(super) struct RouteProbe {
    pub(super) route: String,
    pub(super) probe: Arc<dyn ErasedProbe>,
}

impl std::fmt::Debug for RouteProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteProbe")
            .field("route", &self.route)
            .finish_non_exhaustive()
    }
}

/// What a probe last answered.
#[derive(Clone, Debug)]
pub(super) struct LagReading {
    pub(super) at: Instant,
    pub(super) partitions: Vec<PartitionLag>,
    /// The parked backlog in all; `None` where the backend cannot count it.
    pub(super) parked: Option<u64>,
    /// The same per delay tier.
    pub(super) parked_tiers: Vec<ParkedTier>,
}

impl LagReading {
    /// The lag summed over partitions; `None` if any partition's is unknown.
    pub(super) fn total(&self) -> Option<u64> {
        self.partitions
            .iter()
            .try_fold(0u64, |sum, lag| lag.messages.map(|m| sum.saturating_add(m)))
    }
}

/// Asks `probe` for lag and parked backlog, each within `timeout`; `None`
/// when the lag query fails (logged at debug: the sample goes without).
pub(super) async fn read(
    route: &str,
    probe: &dyn ErasedProbe,
    timeout: Duration,
) -> Option<LagReading> {
    let lag = match tokio::time::timeout(timeout, probe.lag()).await {
        Ok(Ok(lag)) => lag,
        Ok(Err(error)) => {
            tracing::debug!(route, %error, "the console's lag query failed");
            return None;
        }
        Err(_) => {
            tracing::debug!(route, ?timeout, "the console's lag query timed out");
            return None;
        }
    };
    let tiers = match tokio::time::timeout(timeout, probe.parked_tiers()).await {
        Ok(Ok(tiers)) => tiers,
        Ok(Err(error)) => {
            tracing::debug!(route, %error, "the console's parked-backlog query failed");
            None
        }
        Err(_) => None,
    };
    let parked = tiers.as_deref().map(ParkedTier::total);
    Some(LagReading {
        at: Instant::now(),
        partitions: lag,
        parked,
        parked_tiers: tiers.unwrap_or_default(),
    })
}
