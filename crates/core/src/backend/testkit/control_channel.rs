//! The scenarios every backend's group control channel passes unchanged:
//! its logs replay from their start in order, and a pause sent at one of
//! three instances holds on whichever instance runs the partition, through
//! a rebalance and for an instance that joins later.
//!
//! A backend crate implements [`ControlBackend`] on its conformance fixture
//! and lets [`control_suite!`](crate::control_suite) write the tests:
//!
//! ```ignore
//! intake_core::control_suite!(backend());
//! ```

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::harness::{PATIENCE, id_of, numbered, unique_group};
use super::{Backend, ConnectSettings, skip_or_fail};
use crate::app::{App, AppControl, AppReport};
use crate::consumer::Consumer;
use crate::error::{BoxError, HandlerError};
use crate::group_control::{ControlChannel, ControlFeed, ControlLog, GroupControl};
use crate::message::Message;

/// A backend whose group control channels the suite opens.
#[async_trait::async_trait]
pub trait ControlBackend: Backend {
    /// The backend's channel.
    type Channel: ControlChannel;

    /// Group `group`'s `log` on the broker under test (each call a new
    /// channel, as another instance would open).
    async fn control_channel(
        &self,
        group: &str,
        log: ControlLog,
    ) -> Result<Self::Channel, BoxError>;
}

/// Writes one `#[tokio::test]` per control scenario, like
/// [`conformance_suite!`](crate::conformance_suite).
#[macro_export]
macro_rules! control_suite {
    ($backend:expr) => {
        $crate::control_suite!(@scenarios $backend;
            a_control_log_replays_from_its_start_in_order,
            a_pause_sent_at_one_of_three_instances_holds_on_the_owner_through_a_rebalance,
        );
    };
    (@scenarios $backend:expr; $($scenario:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                let Some(backend) = $backend.await else {
                    return;
                };
                $crate::backend::testkit::control_channel::$scenario(&backend).await;
            }
        )*
    };
}

/// The next record of `feed`, within [`PATIENCE`].
async fn next_record(feed: &mut ControlFeed, what: &str) -> Bytes {
    match tokio::time::timeout(PATIENCE, feed.next()).await {
        Ok(Some(Ok(record))) => record,
        Ok(Some(Err(error))) => panic!("{what}: the feed failed: {error:?}"),
        Ok(None) => panic!("{what}: the feed ended"),
        Err(_) => panic!("{what}: no record within {PATIENCE:?}"),
    }
}

/// Both logs: a feed opened before the records and one opened after see
/// the same records in the order appended, and both see a later one.
pub async fn a_control_log_replays_from_its_start_in_order<B: ControlBackend>(backend: &B) {
    let group = unique_group("control-log");
    for log in [ControlLog::Commands, ControlLog::Status] {
        let writer = backend
            .control_channel(&group, log)
            .await
            .expect("open the control log");
        assert_eq!(writer.log(), log);
        let reader = backend
            .control_channel(&group, log)
            .await
            .expect("open the control log a second time");
        let mut early = reader.follow().await.expect("follow the log");
        let records: Vec<Bytes> = (0..3)
            .map(|n| Bytes::from(format!("{} record {n}", log.as_str())))
            .collect();
        for record in &records {
            writer.append(record.clone()).await.expect("append");
        }
        let mut late = reader.follow().await.expect("follow the log again");
        for record in &records {
            assert_eq!(&next_record(&mut early, "the early feed").await, record);
            assert_eq!(&next_record(&mut late, "the late feed").await, record);
        }
        let last = Bytes::from(format!("{} record 3", log.as_str()));
        writer.append(last.clone()).await.expect("append");
        assert_eq!(next_record(&mut early, "the early feed").await, last);
        assert_eq!(next_record(&mut late, "the late feed").await, last);
    }
}

/// What the instances handled: (id, partition, instance).
type Handled = Arc<Mutex<Vec<(u64, u32, usize)>>>;

/// One instance of the group: an app with one route and the group control.
struct Instance {
    group: GroupControl,
    /// The app's routes' controls: what the group's commands did here.
    routes: AppControl,
    stop: CancellationToken,
    task: JoinHandle<Result<AppReport, crate::app::AppError>>,
}

impl Instance {
    async fn start<B: ControlBackend>(
        backend: &B,
        source: &str,
        group: &str,
        number: usize,
        handled: &Handled,
    ) -> Self {
        let (source, acker) = backend
            .connect(source, group, ConnectSettings { max_in_flight: 16 })
            .await
            .expect("connect an instance");
        let handled = handled.clone();
        let handler = tower::service_fn(move |message: Message| {
            let handled = handled.clone();
            async move {
                let id = id_of(&message)?;
                handled
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((id, message.metadata().partition(), number));
                Ok::<_, HandlerError>(())
            }
        });
        let consumer = Consumer::builder()
            .max_in_flight(16)
            .build(source, acker, handler)
            .expect("build the consumer");
        let channel = backend
            .control_channel(group, ControlLog::Commands)
            .await
            .expect("open the commands log");
        let control = GroupControl::new(channel, format!("instance-{number}"));
        let app = App::new()
            .route("orders", consumer)
            .group_control(control.clone());
        let routes = app.control();
        let stop = CancellationToken::new();
        let task = tokio::spawn(app.run_until(stop.clone()));
        Self {
            group: control,
            routes,
            stop,
            task,
        }
    }

    async fn stop(self) {
        self.stop.cancel();
        let report = tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("the instance stops within the patience")
            .expect("the instance's task");
        report.expect("the instance ran");
    }
}

fn handled_ids(handled: &Handled, ids: std::ops::Range<u64>) -> Vec<(u64, u32, usize)> {
    handled
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter(|(id, _, _)| ids.contains(id))
        .copied()
        .collect()
}

/// Waits until every instance in `instances` holds the pause (or, with
/// `paused` false, none), as its routes' controls say.
async fn wait_applied(instances: &[&Instance], source: &str, target: Option<u32>, paused: bool) {
    let holds = |instance: &Instance| {
        instance
            .routes
            .route("orders")
            .is_some_and(|control| match target {
                Some(partition) => control.is_paused(source, partition) == paused,
                None => control.all_paused() == paused,
            })
    };
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !instances.iter().all(|instance| holds(instance)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not every instance applied the group's command (pause: {paused})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The runtime takes a command at its next pass; a delivery it started
    // before then finishes.
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// How long a paused partition is watched for deliveries it must not make.
const WATCH: Duration = Duration::from_secs(3);

/// Three instances; a pause of one partition sent at instance 0 stops its
/// deliveries on whichever instance owns it while the other partitions
/// flow; the owner stops and a fourth instance joins (a rebalance, and an
/// instance that replays the log): still paused; a resume sent at the
/// newcomer delivers everything held.
pub async fn a_pause_sent_at_one_of_three_instances_holds_on_the_owner_through_a_rebalance<
    B: ControlBackend,
>(
    backend: &B,
) {
    let capabilities = backend.capabilities();
    if !capabilities.shared_groups {
        skip_or_fail(
            "a_pause_sent_at_one_of_three_instances_holds_on_the_owner_through_a_rebalance",
            "the backend has no shared groups",
        );
        return;
    }
    let partitions = if capabilities.partitions { 3 } else { 1 };
    let source = backend
        .create_source(partitions)
        .await
        .expect("create the source");
    let group = unique_group("group-pause");
    let handled: Handled = Arc::default();
    let mut instances = Vec::new();
    for number in 0..3 {
        instances.push(Instance::start(backend, &source, &group, number, &handled).await);
    }

    // Warm up: everything flows, and the paused partition is one that
    // really is delivered.
    backend
        .produce(&source, numbered(0, 30))
        .await
        .expect("produce the first messages");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while handled_ids(&handled, 0..30).len() < 30 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}: the first 30 were not handled",
            backend.name()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, paused, owner) = handled_ids(&handled, 0..30)[0];
    // Where the broker has partitions, one of them pauses; where it has
    // none (a queue or a stream shared by the group; the "partition" a
    // message names there is the consumer's channel, not the broker's),
    // the route does.
    let partitioned = partitions > 1;
    let held = |partition: u32| !partitioned || partition == paused;

    if partitioned {
        instances[0]
            .group
            .pause_partition("orders", &source, paused)
            .await
            .expect("send the pause");
    } else {
        instances[0]
            .group
            .pause_route("orders")
            .await
            .expect("send the pause");
    }
    let target = partitioned.then_some(paused);
    wait_applied(&instances.iter().collect::<Vec<_>>(), &source, target, true).await;

    backend
        .produce(&source, numbered(100, 60))
        .await
        .expect("produce while paused");
    tokio::time::sleep(WATCH).await;
    let during = handled_ids(&handled, 100..160);
    assert!(
        during.iter().all(|(_, partition, _)| !held(*partition)),
        "{}: partition {paused} delivered while paused: {during:?}",
        backend.name()
    );
    if partitioned {
        assert!(
            !during.is_empty(),
            "{}: the other partitions stopped too",
            backend.name()
        );
    }

    // A rebalance: the owner leaves, a fourth instance joins and replays
    // the log.
    let owner = instances.remove(owner);
    owner.stop().await;
    instances.push(Instance::start(backend, &source, &group, 3, &handled).await);
    let newcomer = instances.last().expect("the newcomer");
    wait_applied(&[newcomer], &source, target, true).await;
    backend
        .produce(&source, numbered(200, 30))
        .await
        .expect("produce after the rebalance");
    tokio::time::sleep(WATCH + capabilities.crash_redelivery_after.min(PATIENCE / 4)).await;
    let after = handled_ids(&handled, 100..230);
    assert!(
        after.iter().all(|(_, partition, _)| !held(*partition)),
        "{}: partition {paused} delivered after the rebalance though paused: {after:?}",
        backend.name()
    );

    if partitioned {
        newcomer
            .group
            .resume_partition("orders", &source, paused)
            .await
            .expect("send the resume");
    } else {
        newcomer
            .group
            .resume_route("orders")
            .await
            .expect("send the resume");
    }
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let mut seen: Vec<u64> = handled_ids(&handled, 100..230)
            .iter()
            .map(|(id, _, _)| *id)
            .collect();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() == 90 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}: after the resume only {} of the 90 held and later messages were handled",
            backend.name(),
            seen.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for instance in instances {
        instance.stop().await;
    }
}
