//! The console of a group of three instances on the memory broker, each an
//! app with its console on its own `HealthListener` and the group's control
//! logs: any instance's `GET /console/api/v1/group` shows every instance's
//! partitions, and a pause posted at one instance's console stops the
//! partition on the instance that owns it, and shows there as paused.
#![cfg(all(feature = "console", feature = "health-server"))]

#[path = "support/console_http.rs"]
mod console_http;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use console_http::{get_json, post_json};
use intake_core::app::{
    App, Console, ConsoleSettings, ConsoleToken, Health, HealthListener, HealthService,
};
use intake_core::consumer::Consumer;
use intake_core::group_control::{ControlLog, GroupControl};
use intake_core::memory::{MemoryBroker, Record};
use intake_core::{HandlerError, Message};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "gr0up-c0ns0le-0123456789abcdef";
const PATIENCE: Duration = Duration::from_secs(20);
const PARTITIONS: u32 = 3;

/// What each instance handled: (partition, instance).
type Handled = Arc<Mutex<Vec<(u32, usize)>>>;

struct Instance {
    address: SocketAddr,
    stop: CancellationToken,
}

async fn start(broker: &MemoryBroker, number: usize, handled: &Handled) -> Instance {
    let (source, acker) = broker
        .consumer("orders", "billing")
        .expect("join the group");
    let handled = handled.clone();
    let handler = tower::service_fn(move |message: Message| {
        let handled = handled.clone();
        async move {
            handled
                .lock()
                .expect("handled")
                .push((message.metadata().partition(), number));
            Ok::<_, HandlerError>(())
        }
    });
    let consumer = Consumer::builder()
        .build(source, acker, handler)
        .expect("consumer");
    let settings = ConsoleSettings::default()
        .instance(format!("instance-{number}"))
        .sample_interval(Duration::from_millis(100))
        .token(ConsoleToken::new(TOKEN).expect("token"));
    let console = Console::new(Health::new(Default::default()), settings);
    let group = GroupControl::new(
        broker.group_control_channel("billing", ControlLog::Commands),
        format!("instance-{number}"),
    )
    .with_status(broker.group_control_channel("billing", ControlLog::Status));
    let app = App::new()
        .route("orders", consumer)
        .console(console.clone())
        .group_control(group);
    let stop = CancellationToken::new();
    let listener = HealthListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let service = HealthService::new(console.health().clone()).with_console(console.clone());
    tokio::spawn(listener.serve(service, stop.clone()));
    tokio::spawn(app.run_until(stop.clone()));
    Instance { address, stop }
}

/// Each instance's partitions in a group answer: (instance, partition, liveness).
fn owners(group: &Value) -> Vec<(String, u64, String)> {
    let mut owners = Vec::new();
    for instance in group["instances"].as_array().expect("instances") {
        let name = instance["instance"].as_str().expect("name").to_owned();
        for route in instance["routes"].as_array().expect("routes") {
            for partition in route["partition_list"].as_array().expect("partition_list") {
                owners.push((
                    name.clone(),
                    partition["partition"].as_u64().expect("partition"),
                    partition["liveness"].as_str().expect("liveness").to_owned(),
                ));
            }
        }
    }
    owners
}

async fn until_group(address: SocketAddr, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let group = get_json(address, "/console/api/v1/group").await;
        if check(&group) {
            return group;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}: {group:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_instance_shows_the_group_and_a_pause_posted_anywhere_stops_the_owner() {
    let broker = MemoryBroker::new();
    broker.create_topic("orders", PARTITIONS).expect("topic");
    let handled: Handled = Arc::default();
    let mut instances = Vec::new();
    for number in 0..3 {
        instances.push(start(&broker, number, &handled).await);
    }
    for n in 0..30_u32 {
        broker
            .send(
                "orders",
                Record::new(n.to_string()).to_partition(n % PARTITIONS),
            )
            .expect("send");
    }

    // Instance 2's console shows all three instances and every partition once.
    let group = until_group(
        instances[2].address,
        "every partition shows once",
        |group| {
            let owners = owners(group);
            let partitions: BTreeSet<u64> =
                owners.iter().map(|(_, partition, _)| *partition).collect();
            group["instances"]
                .as_array()
                .is_some_and(|all| all.len() == 3)
                && owners.len() == PARTITIONS as usize
                && partitions.len() == PARTITIONS as usize
        },
    )
    .await;
    assert_eq!(group["shared"], json!(true));
    assert_eq!(group["instance"], json!("instance-2"));
    let (owner, _, _) = owners(&group)
        .into_iter()
        .find(|(_, partition, _)| *partition == 1)
        .expect("partition 1 has an owner");

    // Paused through instance 0's console; it shows paused on its owner,
    // as instance 1's console sees it.
    let (status, answer) = post_json(
        instances[0].address,
        "/console/api/v1/routes/orders/pause?source=orders&partition=1",
        TOKEN,
        &json!({}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["scope"], json!("group"));
    until_group(instances[1].address, "partition 1 shows paused", |group| {
        owners(group).iter().any(|(name, partition, liveness)| {
            *name == owner && *partition == 1 && liveness == "paused"
        })
    })
    .await;

    let before = handled.lock().expect("handled").len();
    for n in 0..30_u32 {
        broker
            .send(
                "orders",
                Record::new(n.to_string()).to_partition(n % PARTITIONS),
            )
            .expect("send");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after: Vec<(u32, usize)> = handled.lock().expect("handled")[before..].to_vec();
    assert!(
        after.iter().all(|(partition, _)| *partition != 1),
        "partition 1 delivered while paused: {after:?}"
    );
    assert_eq!(after.len(), 20, "the other partitions flow: {after:?}");

    // The audit of instance 0 has the action, with the peer.
    let audit = get_json(instances[0].address, "/console/api/v1/audit").await;
    let entry = &audit["entries"][0];
    assert_eq!(entry["action"], json!("pause"), "{audit:#}");
    assert!(
        entry["actor"]
            .as_str()
            .expect("actor")
            .starts_with("token from 127.0.0.1:"),
        "{audit:#}"
    );

    // Resumed through instance 2: everything held is handled.
    let (status, answer) = post_json(
        instances[2].address,
        "/console/api/v1/routes/orders/resume?source=orders&partition=1",
        TOKEN,
        &json!({}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while handled.lock().expect("handled").len() < 60 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the held messages were not handled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for instance in instances {
        instance.stop.cancel();
    }
}
