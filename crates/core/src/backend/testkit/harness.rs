//! Running consumers inside scenarios: spawn, watch, stop, crash.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower::Service;

use super::{Backend, ConnectSettings, TestMessage};
use crate::acker::Acker;
use crate::consumer::{Consumer, ConsumerBuilder, RunError, RunReport};
use crate::error::{BoxError, HandlerError};
use crate::message::Message;
use crate::source::Source;

/// How long a scenario waits for a condition before it fails. Generous: real
/// brokers rebalance and redeliver on their own schedules.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// What handlers saw, shared between a scenario and its consumers.
#[derive(Clone, Default)]
pub struct Ledger {
    seen: Arc<Mutex<BTreeMap<u64, u32>>>,
}

impl Ledger {
    /// Records one handling of message `id`.
    pub fn record(&self, id: u64) {
        if let Ok(mut seen) = self.seen.lock() {
            *seen.entry(id).or_default() += 1;
        }
    }

    /// Distinct ids seen.
    pub fn distinct(&self) -> usize {
        self.seen.lock().map(|seen| seen.len()).unwrap_or_default()
    }

    /// Handlings in total (duplicates included).
    pub fn total(&self) -> u64 {
        self.seen
            .lock()
            .map(|seen| seen.values().map(|&count| u64::from(count)).sum())
            .unwrap_or_default()
    }

    /// Ids in `0..count` never seen.
    pub fn missing(&self, count: u64) -> Vec<u64> {
        let seen: BTreeSet<u64> = self
            .seen
            .lock()
            .map(|seen| seen.keys().copied().collect())
            .unwrap_or_default();
        (0..count).filter(|id| !seen.contains(id)).collect()
    }

    /// How often `id` was handled.
    pub fn count(&self, id: u64) -> u32 {
        self.seen
            .lock()
            .map(|seen| seen.get(&id).copied().unwrap_or_default())
            .unwrap_or_default()
    }

    /// Waits until every id in `0..count` was seen, or fails after
    /// [`PATIENCE`].
    pub async fn wait_for_all(&self, count: u64, what: &str) {
        self.wait_until(what, || self.missing(count).is_empty())
            .await;
    }

    /// Waits until `condition` holds, or panics after [`PATIENCE`] naming
    /// `what` was awaited.
    pub async fn wait_until(&self, what: &str, condition: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while !condition() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what} (distinct ids seen: {})",
                self.distinct()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Waits until `group` has acknowledged everything in `source`, or fails
/// after [`PATIENCE`] saying how many `what` were not.
pub async fn wait_until_acknowledged<B: Backend>(
    backend: &B,
    source: &str,
    group: &str,
    what: &str,
) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let left = backend
            .unacknowledged(source, group)
            .await
            .expect("inspect the acknowledgements");
        if left == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}: {left} {what} were never acknowledged",
            backend.name()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The id a scenario message carries as its payload.
pub fn id_of(message: &Message) -> Result<u64, HandlerError> {
    std::str::from_utf8(message.payload())
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .ok_or_else(|| HandlerError::permanent("payload is not a scenario id"))
}

/// Messages with payloads `first..first+count` and 16 keys.
pub fn numbered(first: u64, count: u64) -> Vec<TestMessage> {
    (first..first + count)
        .map(|id| TestMessage::new(format!("k{}", id % 16), id.to_string()))
        .collect()
}

/// A unique group name for a scenario.
pub fn unique_group(scenario: &str) -> String {
    format!("{scenario}-{}", uuid_like())
}

fn uuid_like() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// A consumer running in its own task.
pub struct Running {
    shutdown: CancellationToken,
    task: JoinHandle<Result<RunReport, RunError>>,
}

impl Running {
    /// Starts a consumer of `group` on `source` with `handler`.
    pub async fn start<B, H>(
        backend: &B,
        source: &str,
        group: &str,
        builder: ConsumerBuilder,
        max_in_flight: usize,
        handler: H,
    ) -> Result<Self, BoxError>
    where
        B: Backend,
        H: Service<Message, Response = ()> + Send + 'static,
        H::Error: Into<HandlerError> + Send + 'static,
        H::Future: Send + 'static,
    {
        let (source, acker) = backend
            .connect(source, group, ConnectSettings { max_in_flight })
            .await?;
        Self::run(source, acker, builder, max_in_flight, handler)
    }

    /// Starts a consumer of a source and acker already connected.
    pub fn run<S, A, H>(
        source: S,
        acker: A,
        builder: ConsumerBuilder,
        max_in_flight: usize,
        handler: H,
    ) -> Result<Self, BoxError>
    where
        S: Source,
        A: Acker,
        H: Service<Message, Response = ()> + Send + 'static,
        H::Error: Into<HandlerError> + Send + 'static,
        H::Future: Send + 'static,
    {
        let consumer: Consumer<S, A, H> = builder
            .max_in_flight(max_in_flight)
            .build(source, acker, handler)?;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(consumer.run(shutdown.clone()));
        Ok(Self { shutdown, task })
    }

    /// Shuts the consumer down gracefully and returns its report.
    pub async fn stop(self) -> RunReport {
        self.shutdown.cancel();
        match self.task.await {
            Ok(Ok(report)) => report,
            Ok(Err(error)) => panic!("the consumer failed: {error}"),
            Err(error) => panic!("the consumer task failed: {error}"),
        }
    }

    /// Kills the consumer without shutdown, like SIGKILL: nothing more is
    /// acknowledged, the source is dropped without being closed.
    pub async fn crash(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}
