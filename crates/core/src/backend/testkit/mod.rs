//! The backend conformance suite: one set of scenarios, written once against
//! the [`Source`], [`Acker`] and [`DeadLetterSink`] traits, that every backend
//! runs unchanged.
//!
//! A backend crate's test file implements [`Backend`] (a fixture that
//! creates sources, produces, connects consumers and reads dead letters back)
//! and hands it to [`conformance_suite!`](crate::conformance_suite), which
//! writes one test per scenario:
//!
//! ```ignore
//! async fn backend() -> Option<MyBackend> { /* None: broker absent, skipped */ }
//! intake_core::conformance_suite!(backend());
//! ```
//!
//! Tests of a consumer or an app on the memory broker wait for its commits
//! and read its dead letters with [`wait_until_committed`],
//! [`assert_committed`] and [`dead_letters`].

pub mod broker;
pub mod control_channel;
pub mod dead_letter_store;
pub mod harness;
pub mod hostile_server;
mod lag_probe;
pub mod memory_backend;
pub mod memory_broker;
pub mod ordering;
pub mod publishing;
pub mod scenarios;

pub use broker::BrokerBackend;
pub use control_channel::ControlBackend;
pub use lag_probe::assert_unreachable_lag_probe;
pub use memory_broker::{
    CommitWaitError, Uncommitted, assert_committed, dead_letters, wait_until_committed,
};
pub use publishing::PublishingBackend;

use std::time::Duration;

use bytes::Bytes;

use crate::acker::Acker;
use crate::dead_letter::{DeadLetter, DeadLetterSink};
use crate::error::BoxError;
use crate::message::Headers;
use crate::source::Source;

/// A message to produce in a scenario.
#[derive(Clone, Debug)]
pub struct TestMessage {
    /// Routing or partitioning key.
    pub key: Option<Bytes>,
    /// Payload.
    pub payload: Bytes,
    /// Headers.
    pub headers: Headers,
}

/// Whether a test that cannot reach what it needs from outside (a broker, a
/// database, a fault tool) fails instead of skipping:
/// `INTAKE_REQUIRE_BROKERS=1`, which `.ci/run` sets.
pub fn brokers_required() -> bool {
    std::env::var("INTAKE_REQUIRE_BROKERS").is_ok_and(|value| value == "1")
}

/// Says why `test` cannot run: a `skipped: TEST: WHY` line on stdout, or,
/// when [`brokers_required`], a panic with the same reason.
pub fn skip_or_fail(test: &str, why: &str) {
    if brokers_required() {
        panic!("{test}: required (INTAKE_REQUIRE_BROKERS=1) but {why}");
    }
    println!("skipped: {test}: {why}");
}

/// A local port nothing listens on (bound, then released), for a fixture's
/// [`Backend::connect_unreachable`].
pub fn closed_port() -> std::io::Result<u16> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
}

/// A fixture's answer from a source's build: the source with the acker it
/// hands out (`acker`, usually `|source| source.acker()`), or the build's
/// error.
pub fn with_acker<S, A, E>(
    built: Result<S, E>,
    acker: impl FnOnce(&S) -> A,
) -> Option<Result<(S, A), BoxError>>
where
    E: Into<BoxError>,
{
    Some(
        built
            .map(|source| {
                let acker = acker(&source);
                (source, acker)
            })
            .map_err(Into::into),
    )
}

impl TestMessage {
    /// A message with `payload` and `key`, no headers.
    pub fn new(key: impl Into<Bytes>, payload: impl Into<Bytes>) -> Self {
        Self {
            key: Some(key.into()),
            payload: payload.into(),
            headers: Headers::new(),
        }
    }
}

/// What a backend can do, so scenarios that need more are skipped with a
/// reason.
#[derive(Clone, Copy, Debug)]
pub struct Capabilities {
    /// The broker, as dead letters name their origin's.
    pub broker: crate::dead_letter::Broker,
    /// Sources can have more than one partition.
    pub partitions: bool,
    /// A second consumer in the group takes over partitions (Kafka, memory)
    /// or shares the work (Redis, AMQP).
    pub shared_groups: bool,
    /// How long after a consumer is dropped without shutdown its unfinished
    /// messages become deliverable to another consumer (Redis: the claim
    /// idle time; AMQP: at once; Kafka: the session timeout).
    pub crash_redelivery_after: Duration,
    /// Whether each key's messages are first handled in their order through
    /// a consumer's crash (docs/CONTRACT.md §11): the crashed consumer's
    /// unfinished messages before newer ones of their keys.
    pub key_order_through_crashes: bool,
}

/// Consumer settings a scenario asks a fixture for.
#[derive(Clone, Copy, Debug)]
pub struct ConnectSettings {
    /// The runtime's in-flight budget; fixtures size prefetch to it.
    pub max_in_flight: usize,
}

/// A backend under test. Every method creates or touches only what its
/// arguments name, so scenarios can run side by side with unique names.
#[async_trait::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// The backend's source.
    type Source: Source;
    /// The backend's acker.
    type Acker: Acker;
    /// The backend's dead-letter sink.
    type Sink: DeadLetterSink;

    /// A short name for messages ("memory", "kafka").
    fn name(&self) -> &'static str;

    /// What the backend can do.
    fn capabilities(&self) -> Capabilities;

    /// Creates an empty source with a fresh unique name (with `partitions`
    /// partitions where the backend has partitions) and returns its name.
    async fn create_source(&self, partitions: u32) -> Result<String, BoxError>;

    /// Produces `messages` to `source` and returns once the broker has
    /// confirmed all of them.
    async fn produce(&self, source: &str, messages: Vec<TestMessage>) -> Result<(), BoxError>;

    /// Connects a consumer of `group` to `source`.
    async fn connect(
        &self,
        source: &str,
        group: &str,
        settings: ConnectSettings,
    ) -> Result<(Self::Source, Self::Acker), BoxError>;

    /// The dead-letter sink for `source` consumed by `group`.
    async fn dead_letter_sink(&self, source: &str, group: &str) -> Result<Self::Sink, BoxError>;

    /// Everything the sink wrote for `source` and `group`, oldest first,
    /// read back from the dead-letter destination with
    /// [`DeadLetter::read`] (so the suite checks the same envelope on every
    /// backend).
    async fn dead_letters(&self, source: &str, group: &str) -> Result<Vec<DeadLetter>, BoxError>;

    /// Messages of `source` that `group` has not acknowledged or committed
    /// (0 when everything produced was acknowledged).
    async fn unacknowledged(&self, source: &str, group: &str) -> Result<u64, BoxError>;

    /// Connects an instance of a broadcast consumer of `source`: every
    /// instance receives every message produced after it started. `None`
    /// when the backend has no broadcast mode.
    async fn connect_broadcast(
        &self,
        source: &str,
        settings: ConnectSettings,
    ) -> Option<Result<(Self::Source, Self::Acker), BoxError>> {
        let _ = (source, settings);
        None
    }

    /// Builds a source of `group` on `source` at an address where no broker
    /// answers (a closed local port), with `password` as the credentials
    /// the address or settings carry. `None` when the backend has no
    /// address (the memory broker). A backend with an address implements
    /// it: the suite checks that the answer is an error, in bounded time,
    /// without the password.
    async fn connect_unreachable(
        &self,
        source: &str,
        group: &str,
        password: &str,
    ) -> Option<Result<(Self::Source, Self::Acker), BoxError>> {
        let _ = (source, group, password);
        None
    }
}

/// Writes one `#[tokio::test]` per conformance scenario. `$backend` is an
/// expression evaluating to a future of `Option<impl Backend>`; `None` means
/// the broker is absent and the fixture already said why the test skips.
#[macro_export]
macro_rules! conformance_suite {
    ($backend:expr) => {
        $crate::conformance_suite!(@scenarios $backend;
            delivers_every_message,
            commit_never_passes_an_unfinished_message,
            retries_then_succeeds,
            redelivers_after_a_crash,
            rebalances_between_two_consumers,
            graceful_shutdown_commits_finished_work,
            in_flight_stays_within_its_bound,
            malformed_payloads_do_not_stop_the_consumer,
            poison_messages_reach_the_dead_letter_destination,
            a_full_budget_still_sees_assignment_changes,
            an_unreachable_broker_is_an_error_without_its_password,
            broadcast_delivers_to_every_instance,
            an_app_runs_two_routes_under_one_budget,
            a_failed_startup_consumes_nothing,
        );
        $crate::conformance_suite!(@ordering $backend;
            keeps_each_keys_order,
            keeps_each_keys_order_through_a_crash,
        );
    };
    (@scenarios $backend:expr; $($scenario:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                let Some(backend) = $backend.await else {
                    return;
                };
                $crate::backend::testkit::scenarios::$scenario(&backend).await;
            }
        )*
    };
    (@ordering $backend:expr; $($scenario:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                let Some(backend) = $backend.await else {
                    return;
                };
                $crate::backend::testkit::ordering::$scenario(&backend).await;
            }
        )*
    };
}
