//! The scenario of the console's Group section in a real browser, shared
//! by `tests/console_browser_group.rs` (the memory broker) and
//! `tests/console_browser_kafka.rs` (Apache Kafka): three instances of one
//! consumer group, each an app with its console on its own
//! `HealthListener`, a lag probe and the group's control and status logs,
//! all from the [`Cluster`]'s `Broker`. Instance 0's page lists every
//! instance with its partitions; a partition paused with its switch there
//! shows paused under its owner (whichever instance that is), holds its
//! messages while the others flow (its owner's page shows its broker lag),
//! and hands them over once resumed; a stopped instance shows stale.
//!
//! Every wait polls the page or the handled messages with a deadline;
//! nothing asserts a time (a Kafka group rebalances for seconds). Each step
//! leaves a screenshot `{Cluster::NAME}-*.png` in
//! `target/console-screenshots/`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::console_browser_support::{PATIENCE, click, eventually, screenshot, scroll_to, until};
use fantoccini::{Client, Locator};
use intake::app::{
    App, Console, ConsoleSettings, Health, HealthListener, HealthService, HealthSettings,
};
use intake::consumer::Consumer;
use intake::{HandlerError, Message};
use intake_core::app::ConsoleToken;
use intake_core::backend::{Broker, RouteAddress, RouteOptions};
use intake_core::group_control::{ControlLog, GroupControl};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The bearer token every instance's console takes.
const TOKEN: &str = "gr0up-br0wser-0123456789abcdef";

/// Partitions of the route's source: one for each instance.
pub const PARTITIONS: u32 = 3;

/// The partition the test pauses.
const HELD: u32 = 1;

/// What the instances handled: (partition, instance, payload), in order.
type Handled = Arc<Mutex<Vec<(u32, usize, String)>>>;

/// One instance: an app with the route `orders`, its console (sampling
/// every 200 ms) on its own listener, and the group's control.
struct Instance {
    name: String,
    address: SocketAddr,
    stop: CancellationToken,
    running: JoinHandle<Result<intake::AppReport, intake::AppError>>,
}

impl Instance {
    async fn start<B: Broker>(
        broker: B,
        address: &RouteAddress,
        number: usize,
        handled: &Handled,
    ) -> Self {
        let parts = Broker::route(&broker, address, &RouteOptions::new())
            .await
            .expect("join the group");
        let handled = handled.clone();
        let handler = tower::service_fn(move |message: Message| {
            let handled = handled.clone();
            async move {
                let payload = String::from_utf8_lossy(message.payload()).into_owned();
                handled.lock().expect("handled").push((
                    message.metadata().partition(),
                    number,
                    payload,
                ));
                Ok::<_, HandlerError>(())
            }
        });
        let consumer = Consumer::builder()
            .commit_interval(Duration::from_millis(10))
            .build(parts.source, parts.acker, handler)
            .expect("consumer");
        let name = format!("instance-{number}");
        let settings = ConsoleSettings::default()
            .instance(name.clone())
            .sample_interval(Duration::from_millis(200))
            .token(ConsoleToken::new(TOKEN).expect("token"));
        // No rebalance grace: the page shows each partition's liveness (idle,
        // ok, paused) rather than `settling` for its first minute.
        let health = Health::new(HealthSettings {
            rebalance_grace: Duration::ZERO,
            ..HealthSettings::default()
        });
        let probe = broker.lag_probe(address).await.expect("a lag probe");
        let console = Console::new(health, settings).lag_probe("orders", probe);
        let log = |log| broker.control_channel(address.group(), log);
        let commands = log(ControlLog::Commands).await.expect("the commands");
        let status = log(ControlLog::Status).await.expect("the status log");
        let group = GroupControl::new(commands, name.clone()).with_status(status);
        let app = App::new()
            .route("orders", consumer)
            .console(console.clone())
            .group_control(group);
        let stop = CancellationToken::new();
        let listener = HealthListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let service = HealthService::new(console.health().clone()).with_console(console);
        tokio::spawn(listener.serve(service, stop.clone()));
        let running = tokio::spawn(app.run_until(stop.clone()));
        Self {
            name,
            address,
            stop,
            running,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/console/", self.address)
    }

    async fn stop(self) {
        self.stop.cancel();
        let report = tokio::time::timeout(PATIENCE, self.running)
            .await
            .expect("the app stops in time")
            .expect("the app task");
        report.expect("the app ran");
    }
}

/// Where the scenario runs: the broker each instance is made from, and how
/// its messages are sent.
pub trait Cluster: Send + Sync + 'static {
    type Broker: Broker;
    /// The screenshots' prefix: `group`, `group-kafka`.
    const NAME: &'static str;
    /// A broker value for one instance.
    fn broker(&self) -> Self::Broker;
    /// What the route `orders` reads, as which group.
    fn address(&self) -> &RouteAddress;
    /// Sends `payload` to `partition`; returns once the broker has it.
    fn send(&self, partition: u32, payload: String) -> impl Future<Output = ()> + Send;
    /// Removes what the run made on the broker.
    fn clean_up(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// Three instances of the group on the route `orders`.
pub struct Group<C> {
    cluster: C,
    handled: Handled,
    instances: Vec<Instance>,
}

impl<C: Cluster> Group<C> {
    async fn start(cluster: C) -> Self {
        let handled: Handled = Arc::default();
        let mut instances = Vec::new();
        for number in 0..3 {
            let broker = cluster.broker();
            instances.push(Instance::start(broker, cluster.address(), number, &handled).await);
        }
        Self {
            cluster,
            handled,
            instances,
        }
    }

    /// Sends `round-{n}` to every partition, `per_partition` times.
    async fn send_round(&self, round: &str, per_partition: u32) {
        for n in 0..per_partition * PARTITIONS {
            self.cluster
                .send(n % PARTITIONS, format!("{round}-{n}"))
                .await;
        }
    }

    /// The payloads of `round` handled on `partition`, in order, each once
    /// (Kafka may hand a message to the next owner again).
    fn handled_of(&self, round: &str, partition: u32) -> Vec<String> {
        let prefix = format!("{round}-");
        let mut payloads: Vec<String> = Vec::new();
        for (on, _, payload) in self.handled.lock().expect("handled").iter() {
            if *on == partition && payload.starts_with(&prefix) && !payloads.contains(payload) {
                payloads.push(payload.clone());
            }
        }
        payloads
    }

    async fn stop(self) {
        for instance in self.instances {
            instance.stop().await;
        }
        self.cluster.clean_up().await;
    }
}

/// Three instances on `cluster`, and the steps in `client`.
pub async fn run<C: Cluster>(client: Client, cluster: C) {
    let group = Arc::new(Group::start(cluster).await);
    // A panic in the steps still closes the browser session.
    let steps = tokio::spawn(group_steps(client.clone(), group.clone()));
    let outcome = steps.await;
    let _ = client.close().await;
    if let Ok(group) = Arc::try_unwrap(group) {
        group.stop().await;
    }
    if let Err(error) = outcome {
        std::panic::resume_unwind(error.into_panic());
    }
}

/// The group section's row of `partition` (a CSS selector), under
/// `instance` if given.
fn row(instance: Option<&str>, partition: u32) -> String {
    let card = instance.map_or_else(
        || "article.instance".to_owned(),
        |name| format!("article.instance[data-instance=\"{name}\"]"),
    );
    format!(
        "#group {card} tr.group-partition[data-route=\"orders\"][data-partition=\"{partition}\"]"
    )
}

/// What the page's group section shows: each instance's name, whether it
/// is stale, and its partitions (partition, liveness badge, handled, paused).
const READ_GROUP: &str = "\
    const section = document.getElementById('group-section'); \
    if (!section || section.hidden) return null; \
    return [...section.querySelectorAll('article.instance')].map((card) => ({ \
      instance: card.getAttribute('data-instance'), \
      name: card.querySelector('.instance-name').textContent, \
      heard: card.querySelector('.heard').textContent, \
      stale: card.classList.contains('stale'), \
      partitions: [...card.querySelectorAll('tr.group-partition')].map((row) => ({ \
        route: row.getAttribute('data-route'), \
        partition: Number(row.getAttribute('data-partition')), \
        liveness: row.querySelector('td.liveness .badge').textContent, \
        handled: row.querySelector('.handled').textContent, \
        paused: row.classList.contains('partition-paused'), \
        switched: row.querySelector('.switch input').checked })) }));";

/// Waits until the page's group section satisfies `check`; what it showed.
async fn until_group(client: &Client, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let script = format!("const group = (() => {{ {READ_GROUP} }})(); return group;",);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let shown = client
            .execute(&script, vec![])
            .await
            .expect("the script runs");
        if !shown.is_null() && check(&shown) {
            return shown;
        }
        if tokio::time::Instant::now() >= deadline {
            screenshot(client, &format!("timeout-{}", what.replace(' ', "-"))).await;
            panic!("timed out waiting until {what}; the group section shows {shown:#}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every (instance, partition) the section shows.
fn owners(shown: &Value) -> Vec<(String, u64)> {
    let mut owners = Vec::new();
    for card in shown.as_array().into_iter().flatten() {
        let name = card["instance"].as_str().unwrap_or_default().to_owned();
        for partition in card["partitions"].as_array().into_iter().flatten() {
            owners.push((
                name.clone(),
                partition["partition"].as_u64().unwrap_or(u64::MAX),
            ));
        }
    }
    owners
}

/// The partition `partition` as the section shows it under `owner`.
fn shown_partition<'a>(shown: &'a Value, owner: &str, partition: u32) -> Option<&'a Value> {
    shown
        .as_array()?
        .iter()
        .find(|card| card["instance"] == owner)?["partitions"]
        .as_array()?
        .iter()
        .find(|p| p["partition"] == partition)
}

async fn group_steps<C: Cluster>(client: Client, group: Arc<Group<C>>) {
    let shot = |step: &str| format!("{}-{step}", C::NAME);
    let source = group.cluster.address().source().to_owned();
    // Every partition assigned and flowing before the page opens.
    group.send_round("warm", 2).await;
    eventually("the first messages are handled", || async {
        (0..PARTITIONS).all(|partition| group.handled_of("warm", partition).len() == 2)
    })
    .await;
    open(&client, &group.instances[0]).await;

    // 1. All three instances, each partition once, none stale; this one
    // first. The route's own switch says a pause is the group's.
    let shown = until_group(
        &client,
        "three instances show every partition once",
        |shown| {
            let owners = owners(shown);
            let mut partitions: Vec<u64> = owners.iter().map(|(_, p)| *p).collect();
            partitions.sort_unstable();
            // One partition each: the group's rebalances are over.
            shown.as_array().is_some_and(|cards| {
                cards.len() == 3
                    && cards.iter().all(|card| {
                        card["stale"] == false
                            && card["partitions"].as_array().map(Vec::len) == Some(1)
                    })
            }) && partitions == (0..u64::from(PARTITIONS)).collect::<Vec<_>>()
        },
    )
    .await;
    let names: Vec<&str> = shown
        .as_array()
        .expect("cards")
        .iter()
        .map(|card| card["name"].as_str().expect("a name"))
        .collect();
    assert_eq!(names[0], "instance-0", "this instance first: {shown:#}");
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        ["instance-0", "instance-1", "instance-2"],
        "{shown:#}"
    );
    assert_eq!(shown[0]["heard"], "heard now", "{shown:#}");
    let (owner, _) = owners(&shown)
        .into_iter()
        .find(|(_, partition)| *partition == u64::from(HELD))
        .expect("partition 1 has an owner");
    println!("partition {HELD} is owned by {owner}");
    let scope = until(
        &client,
        "the route's switch says it pauses the whole group",
        "const scope = document.querySelector('section.route[data-route=\"orders\"] header \
           .switch .scope'); \
         const summary = document.getElementById('group-summary').textContent; \
         return scope ? { scope: scope.textContent, title: scope.parentElement.title, summary } : null;",
    )
    .await;
    assert_eq!(scope["scope"], "whole group", "{scope}");
    assert!(
        scope["title"]
            .as_str()
            .is_some_and(|t| t.ends_with("on every instance of the group")),
        "{scope}"
    );
    assert!(
        scope["summary"]
            .as_str()
            .is_some_and(|s| s.starts_with("3 instances · 3 partitions · 0 paused")),
        "{scope}"
    );
    scroll_to(&client, "#group-section").await;
    screenshot(&client, &shot("01-three-instances")).await;

    // 2. Paused with its switch on instance 0's page: the answer's scope
    // shows, and the owner's card shows it paused.
    click(&client, &format!("{} .switch input", row(None, HELD))).await;
    let notice = until(
        &client,
        "the page says where the pause went",
        "const n = document.getElementById('notice'); \
         return n.hidden ? null : { text: n.textContent, scope: n.getAttribute('data-scope') };",
    )
    .await;
    assert_eq!(notice["scope"], "group", "{notice}");
    assert_eq!(
        notice["text"],
        format!("pause of {source}/{HELD} (route orders) sent to every instance of the group"),
    );
    let shown = until_group(&client, "the owner shows partition 1 paused", |shown| {
        shown_partition(shown, &owner, HELD).is_some_and(|p| {
            p["paused"] == true && p["liveness"] == "paused" && p["switched"] == true
        })
    })
    .await;
    let others_paused = shown
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|card| card["partitions"].as_array().into_iter().flatten())
        .filter(|p| p["paused"] == true)
        .count();
    assert_eq!(others_paused, 1, "only partition 1 is paused: {shown:#}");
    let badge = client
        .find(Locator::Css(&format!(
            "{} .badge.warn",
            row(Some(&owner), HELD)
        )))
        .await
        .expect("the paused badge");
    assert_eq!(badge.text().await.expect("its text"), "paused");
    assert!(badge.is_displayed().await.expect("displayed or not"));
    scroll_to(&client, &row(Some(&owner), HELD)).await;
    screenshot(&client, &shot("02-partition-paused-on-its-owner")).await;

    // 3. While it is paused the other partitions handle a new round and
    // another after it; partition 1 handles none of its share.
    let handled_before: Vec<Value> = (0..PARTITIONS)
        .map(|p| shown_partition_anywhere(&shown, p)["handled"].clone())
        .collect();
    group.send_round("held", 3).await;
    eventually("the other partitions handle the round", || async {
        [0, 2]
            .iter()
            .all(|p| group.handled_of("held", *p).len() == 3)
    })
    .await;
    group.cluster.send(0, "after-0".to_owned()).await;
    group.cluster.send(2, "after-2".to_owned()).await;
    eventually(
        "the next round on partitions 0 and 2 is handled",
        || async {
            [0, 2]
                .iter()
                .all(|p| group.handled_of("after", *p).len() == 1)
        },
    )
    .await;
    assert_eq!(group.handled_of("held", HELD), Vec::<String>::new());
    // The page: partitions 0 and 2 moved on, partition 1 did not.
    let shown = until_group(&client, "partitions 0 and 2 moved on", |shown| {
        [0, 2]
            .iter()
            .all(|p| shown_partition_anywhere(shown, *p)["handled"] != handled_before[*p as usize])
    })
    .await;
    assert_eq!(
        shown_partition_anywhere(&shown, HELD)["handled"],
        handled_before[HELD as usize],
        "{shown:#}"
    );
    assert_eq!(group.handled_of("held", HELD), Vec::<String>::new());
    scroll_to(&client, "#group-section").await;
    screenshot(&client, &shot("03-others-flow-partition-1-holds")).await;

    // The owner's page: its partitions table shows the held messages as
    // partition 1's broker lag while it stays paused.
    let owner_at = group
        .instances
        .iter()
        .find(|instance| instance.name == owner)
        .expect("the owner runs");
    open(&client, owner_at).await;
    let held_row =
        format!("section.route[data-route=\"orders\"] tr.partition[data-partition=\"{HELD}\"]");
    let lag = until(
        &client,
        "the owner's page shows partition 1's lag",
        &format!(
            "const row = document.querySelector({held_row:?}); \
             if (!row) return null; \
             const lag = Number(row.querySelector('td[data-label=\"Lag\"]').textContent); \
             const paused = row.querySelector('.badge.warn'); \
             return lag > 0 && paused ? {{ lag, paused: paused.textContent }} : null;"
        ),
    )
    .await;
    assert_eq!(lag["paused"], "paused", "{lag}");
    println!("partition {HELD} held on {owner}: lag {}", lag["lag"]);
    scroll_to(&client, &held_row).await;
    screenshot(&client, &shot("03b-owner-shows-the-held-lag")).await;
    open(&client, &group.instances[0]).await;

    // 4. Resumed with the same switch: the held messages are handled, in
    // order, and the owner shows it running.
    click(&client, &format!("{} .switch input", row(None, HELD))).await;
    eventually("the held messages are handled", || async {
        group.handled_of("held", HELD).len() == 3
    })
    .await;
    assert_eq!(
        group.handled_of("held", HELD),
        (0..3)
            .map(|n| format!("held-{}", n * PARTITIONS + HELD))
            .collect::<Vec<_>>()
    );
    until_group(&client, "the owner shows partition 1 running", |shown| {
        shown_partition(shown, &owner, HELD).is_some_and(|p| {
            p["paused"] == false && p["liveness"] != "paused" && p["switched"] == false
        })
    })
    .await;
    let notice = until(
        &client,
        "the page says where the resume went",
        "const n = document.getElementById('notice'); \
         return !n.hidden && n.textContent.startsWith('resume') ? n.textContent : null;",
    )
    .await;
    assert_eq!(
        notice,
        json!(format!(
            "resume of {source}/{HELD} (route orders) sent to every instance of the group"
        ))
    );
    scroll_to(&client, &row(Some(&owner), HELD)).await;
    screenshot(&client, &shot("04-resumed")).await;

    // 5. Instance 2 stops: its last record stays, marked stale once three
    // sample intervals pass unheard; its partition moves to another.
    group.instances[2].stop.cancel();
    let shown = until_group(&client, "instance 2 shows stale", |shown| {
        shown.as_array().is_some_and(|cards| {
            cards
                .iter()
                .any(|card| card["instance"] == "instance-2" && card["stale"] == true)
                && cards
                    .iter()
                    .filter(|card| card["instance"] != "instance-2")
                    .all(|card| card["stale"] == false)
        })
    })
    .await;
    let summary = until(
        &client,
        "the summary counts the stale instance",
        "const s = document.getElementById('group-summary').textContent; \
         const badge = document.querySelector('#group article.instance.stale .badge.no'); \
         return s.includes('1 stale') && badge ? { summary: s, badge: badge.textContent } : null;",
    )
    .await;
    assert_eq!(summary["badge"], "stale", "{summary} {shown:#}");
    scroll_to(&client, "#group article.instance.stale").await;
    screenshot(&client, &shot("05-stopped-instance-stale")).await;

    // 6. On a phone the group section reads as one card per instance,
    // every partition a wrapped line, and the body does not scroll sideways.
    client
        .set_window_size(390, 844)
        .await
        .expect("a phone's window");
    let fits = until(
        &client,
        "the group fits a phone's width",
        "const root = document.documentElement; \
         const cards = [...document.querySelectorAll('#group article.instance')]; \
         const rows = [...document.querySelectorAll('#group tr.group-partition')]; \
         const inside = (e) => { const r = e.getBoundingClientRect(); \
           return r.width > 0 && r.left >= 0 && r.right <= root.clientWidth + 1; }; \
         return window.innerWidth <= 500 && cards.length === 3 && rows.length >= 3 \
           && cards.every(inside) && rows.every(inside) \
           && root.scrollWidth <= root.clientWidth \
           && document.body.scrollWidth <= root.clientWidth \
           ? { width: root.clientWidth, scroll: root.scrollWidth } : null;",
    )
    .await;
    println!("phone: {fits}");
    scroll_to(&client, "#group-section").await;
    screenshot(&client, &shot("06-phone")).await;
}

/// Opens `instance`'s page and gives it the token.
async fn open(client: &Client, instance: &Instance) {
    client.goto(&instance.url()).await.expect("the page opens");
    let field = client.find(Locator::Id("token")).await.expect("the field");
    field.send_keys(TOKEN).await.expect("typed");
    let button = client.find(Locator::Id("token-use")).await;
    button.expect("the button").click().await.expect("clicked");
}

/// The partition `partition` as the section shows it, under any instance.
fn shown_partition_anywhere(shown: &Value, partition: u32) -> &Value {
    shown
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|card| card["partitions"].as_array().into_iter().flatten())
        .find(|p| p["partition"] == partition)
        .unwrap_or(&Value::Null)
}
