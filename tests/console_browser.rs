//! The console's web page in a real browser: headless chromium driven
//! through chromedriver (`.ci/services/chromium.sh`, WebDriver on
//! 127.0.0.1:9515, or `INTAKE_WEBDRIVER_PORT`) by fantoccini, against an
//! app on the memory broker served by a `HealthListener` on loopback.
//!
//! Without chromedriver the browser test is skipped, or fails under
//! `INTAKE_REQUIRE_BROKERS=1`. Every wait polls the page with a deadline;
//! nothing asserts a time. Each step leaves a screenshot in
//! `target/console-screenshots/`.
//!
//! `what_one_page_load_costs` needs no browser: it prints the bytes one
//! page load and one refresh move and the CPU time the service spends on a
//! refresh (`cargo test --test console_browser --all-features --
//! --nocapture what_one_page_load_costs`).

mod console_browser_support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use console_browser_support::{
    PATIENCE, browser, click, eventually, raw, screenshot, scroll_to, until,
};
use fantoccini::{Client, Locator};
use intake::app::{
    App, Console, ConsoleSettings, Health, HealthListener, HealthService, HealthSettings,
};
use intake::backend::{Broker, RouteAddress};
use intake::consumer::{Consumer, DeliveryOrder};
use intake::memory::{MemoryBroker, Record};
use intake::{HandlerError, Message};
use intake_core::app::{ConsoleToken, Redaction};
use intake_core::dead_letter::DeadLetterLayer;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;

/// A route name a hostile broker could hand the page.
const HOSTILE: &str = "payments<img src=x onerror=alert(1)>";

/// An app of two routes on the memory broker, its console sampling every
/// `sample`, served on 127.0.0.1: `orders` (2 partitions, partition 0
/// stuck until `release` fires) and [`HOSTILE`] (2 partitions, flowing).
struct Service {
    broker: MemoryBroker,
    console: Console,
    address: SocketAddr,
    release: CancellationToken,
    stop: CancellationToken,
    serving: CancellationToken,
    running: JoinHandle<Result<intake::AppReport, intake::AppError>>,
}

impl Service {
    async fn start(sample: Duration, partitions: u32) -> Self {
        let broker = MemoryBroker::new();
        broker.create_topic("orders", partitions).expect("topic");
        broker.create_topic("payments", partitions).expect("topic");
        let health = Health::new(HealthSettings {
            stall_window: Duration::from_millis(300),
            rebalance_grace: Duration::ZERO,
            assignment_grace: Duration::from_secs(3_600),
            ..HealthSettings::default()
        });
        let mut console = Console::new(
            health,
            ConsoleSettings::default()
                .sample_interval(sample)
                .instance("browser-test"),
        );
        for (route, topic) in [("orders", "orders"), (HOSTILE, "payments")] {
            let probe = broker
                .lag_probe(&RouteAddress::new(topic, "billing"))
                .await
                .expect("probe");
            console = console.lag_probe(route, probe);
        }
        let release = CancellationToken::new();
        let stuck = tower::service_fn({
            let release = release.clone();
            move |message: Message| {
                let release = release.clone();
                async move {
                    if message.metadata().partition() == 0 {
                        release.cancelled().await;
                    }
                    Ok::<_, HandlerError>(())
                }
            }
        });
        let flowing = tower::service_fn(|_: Message| async { Ok::<_, HandlerError>(()) });
        let consumer = |topic: &str| broker.consumer(topic, "billing").expect("consumer");
        let (orders, orders_acker) = consumer("orders");
        let (payments, payments_acker) = consumer("payments");
        let builder = || {
            Consumer::builder()
                .ordering(DeliveryOrder::Unordered)
                .commit_interval(Duration::from_millis(10))
        };
        let app = App::new()
            .console(console.clone())
            .route(
                "orders",
                builder()
                    .build(orders, orders_acker, stuck)
                    .expect("settings"),
            )
            .route(
                HOSTILE,
                builder()
                    .build(payments, payments_acker, flowing)
                    .expect("settings"),
            );
        let listener = HealthListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let serving = CancellationToken::new();
        let service = HealthService::new(console.health().clone()).with_console(console.clone());
        tokio::spawn(listener.serve(service, serving.clone()));
        let stop = CancellationToken::new();
        let running = tokio::spawn(app.run_until(stop.clone()));
        Self {
            broker,
            console,
            address,
            release,
            stop,
            serving,
            running,
        }
    }

    /// Keeps messages flowing on both routes (and one stuck on partition 0
    /// of `orders`) until the service stops.
    fn feed(&self) {
        self.broker
            .send("orders", Record::new("stuck").to_partition(0))
            .expect("send");
        let broker = self.broker.clone();
        let stop = self.stop.clone();
        tokio::spawn(async move {
            let mut round = 0u32;
            while !stop.is_cancelled() {
                round = round.wrapping_add(1);
                let _ = broker.send("payments", Record::new("paid").to_partition(round % 2));
                if round.is_multiple_of(4) {
                    let _ = broker.send("orders", Record::new("order").to_partition(1));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
    }

    fn url(&self) -> String {
        format!("http://{}/console/", self.address)
    }

    async fn stop(self) {
        self.release.cancel();
        self.stop.cancel();
        let report = tokio::time::timeout(PATIENCE, self.running)
            .await
            .expect("the app stops in time")
            .expect("the app task");
        report.expect("the app ran");
        self.serving.cancel();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_routes_a_stalled_partition_charts_and_hostile_names_as_text() {
    let Some(client) =
        browser("the_page_shows_routes_a_stalled_partition_charts_and_hostile_names_as_text").await
    else {
        return;
    };
    let service = Service::start(Duration::from_millis(200), 2).await;
    service.feed();
    // A panic in the steps still closes the browser session.
    let steps = tokio::spawn(steps(client.clone(), service.url(), service.address));
    let outcome = steps.await;
    let _ = client.close().await;
    service.stop().await;
    if let Err(error) = outcome {
        std::panic::resume_unwind(error.into_panic());
    }
}

async fn steps(client: Client, url: String, address: SocketAddr) {
    // A bare `/console` redirects to the page.
    let bare = url.trim_end_matches('/');
    client.goto(bare).await.expect("the page opens");
    let landed = client.current_url().await.expect("a URL");
    assert_eq!(landed.as_str(), url, "redirected from {bare}");
    // Counts what the page's policy refuses from here on (an inline
    // handler a hostile name smuggled in would be one).
    client
        .execute(
            "window.refused = []; document.addEventListener('securitypolicyviolation', \
             (e) => window.refused.push(e.violatedDirective));",
            vec![],
        )
        .await
        .expect("the listener");
    assert_eq!(client.title().await.expect("a title"), "intake console");

    // 1. Both routes are listed.
    let names = until(
        &client,
        "both routes show",
        "const names = [...document.querySelectorAll('#routes tbody .route-name')] \
           .map((e) => e.textContent); return names.length === 2 ? names : null;",
    )
    .await;
    assert_eq!(names, json!(["orders", HOSTILE]));
    screenshot(&client, "01-routes").await;

    // 2. The stuck partition is marked stalled, in its route's table.
    let badge = until(
        &client,
        "partition 0 of orders shows stalled",
        "const badge = document.querySelector('section.route[data-route=\"orders\"] \
           tr.partition.stalled[data-partition=\"0\"] .badge.stalled'); \
         return badge ? badge.textContent : null;",
    )
    .await;
    assert!(
        badge
            .as_str()
            .is_some_and(|text| text.starts_with("stalled")),
        "{badge}"
    );
    let shown = client
        .find(Locator::Css(
            "section.route[data-route=\"orders\"] tr.stalled .badge.stalled",
        ))
        .await
        .expect("the badge")
        .is_displayed()
        .await
        .expect("displayed or not");
    assert!(shown, "the stalled badge is visible");
    let flowing = until(
        &client,
        "partition 1 of orders is not stalled",
        "const row = document.querySelector('section.route[data-route=\"orders\"] \
           tr.partition[data-partition=\"1\"]'); \
         return row ? row.querySelector('.badge').textContent : null;",
    )
    .await;
    assert_ne!(flowing, json!("stalled"), "only partition 0 stalls");
    screenshot(&client, "02-stalled-partition").await;

    // 3. The charts have points: the flowing route's throughput and the
    // stuck route's lag (its stuck message stays unacknowledged).
    let chart = |name: &str, chart: &str| {
        format!(
            "const section = [...document.querySelectorAll('section.route')] \
               .find((s) => s.getAttribute('data-route') === {name}); \
             const path = section && section.querySelector('svg[data-chart={chart}] path.series'); \
             const d = path ? path.getAttribute('d') : ''; \
             return (d.match(/L/g) || []).length >= 2 ? d : null;",
            name = json!(name),
        )
    };
    until(
        &client,
        "the throughput chart has points",
        &chart(HOSTILE, "throughput"),
    )
    .await;
    until(&client, "the lag chart has points", &chart("orders", "lag")).await;
    screenshot(&client, "03-charts").await;

    // 4. The hostile name is text: no element made of it, no alert, no
    // refused inline handler.
    let hostile = client
        .execute(
            "const cells = [...document.querySelectorAll('.route-name')] \
               .filter((e) => e.textContent.includes('<img')); \
             return { texts: cells.map((e) => e.textContent), \
                      images: document.querySelectorAll('img').length, \
                      refused: window.refused };",
            vec![],
        )
        .await
        .expect("the script runs");
    assert_eq!(hostile["images"], 0, "{hostile}");
    assert_eq!(hostile["refused"], json!([]), "{hostile}");
    let texts = hostile["texts"].as_array().expect("texts");
    assert!(texts.len() >= 2, "in the table and its section: {hostile}");
    assert!(texts.iter().all(|text| text == HOSTILE), "{hostile}");
    assert!(client.get_alert_text().await.is_err(), "no alert is open");
    let error = client
        .execute(
            "const e = document.getElementById('error'); return e.hidden ? null : e.textContent;",
            vec![],
        )
        .await
        .expect("the script runs");
    assert_eq!(error, Value::Null, "the page read every API answer");
    screenshot(&client, "04-hostile-name-as-text").await;

    // 5. A refused mutation shows in the audit log.
    let refused = raw(address, "POST", "/console/api/v1/routes").await;
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    until(
        &client,
        "the audit log shows the refusal",
        "const rows = [...document.querySelectorAll('#audit tbody tr')]; \
         return rows.some((r) => r.textContent.includes('refused')) ? rows.length : null;",
    )
    .await;
    client
        .execute("document.getElementById('audit').scrollIntoView()", vec![])
        .await
        .expect("scrolls");
    screenshot(&client, "05-audit-log").await;

    // 6. On a phone the routes still show, and the body does not scroll
    // sideways (the partition tables scroll inside their boxes).
    client
        .set_window_size(390, 844)
        .await
        .expect("a phone's window");
    client
        .execute("window.scrollTo(0, 0)", vec![])
        .await
        .expect("scrolls");
    let fits = until(
        &client,
        "the page fits a phone's width",
        "const root = document.documentElement; \
         const cards = [...document.querySelectorAll('#routes tbody tr')]; \
         const inside = cards.every((c) => { const r = c.getBoundingClientRect(); \
           return r.width > 0 && r.left >= 0 && r.right <= root.clientWidth + 1; }); \
         return window.innerWidth <= 500 && cards.length === 2 && inside \
           && root.scrollWidth <= root.clientWidth \
           && document.body.scrollWidth <= root.clientWidth \
           ? { width: root.clientWidth, scroll: root.scrollWidth } : null;",
    )
    .await;
    println!("phone: {fits}");
    let name = client
        .find(Locator::Css("#routes tbody .route-name"))
        .await
        .expect("a route name");
    assert!(name.is_displayed().await.expect("displayed or not"));
    screenshot(&client, "06-phone").await;
}

/// Thread CPU time in nanoseconds (Linux's schedstat), for the cost
/// figures; `None` elsewhere.
fn thread_cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

#[test]
fn what_one_page_load_costs() {
    const PARTITIONS: u32 = 16;
    const ROUNDS: u32 = 1_000;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    // The default interval (5 s, 180 samples in 15 minutes), the history
    // filled by hand below.
    let service = runtime.block_on(Service::start(Duration::from_secs(5), PARTITIONS));
    let (console, address) = (service.console.clone(), service.address);
    runtime.block_on(async {
        for partition in 0..PARTITIONS {
            for topic in ["orders", "payments"] {
                service
                    .broker
                    .send(topic, Record::new("m").to_partition(partition))
                    .expect("send");
            }
        }
        let deadline = tokio::time::Instant::now() + PATIENCE;
        // Both routes registered and every partition assigned.
        while !(console.routes().len() == 2
            && console
                .routes()
                .iter()
                .all(|route| route.partitions == PARTITIONS as usize))
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "partitions assigned"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for _ in 0..console.settings().samples() {
            console.sample().await;
        }
    });
    let encoded = |name: &str| {
        name.replace('<', "%3C")
            .replace('>', "%3E")
            .replace(' ', "%20")
    };
    let mut refresh = vec![
        "/console/api/v1/routes".to_owned(),
        "/console/api/v1/audit".to_owned(),
    ];
    for route in ["orders", HOSTILE] {
        refresh.push(format!(
            "/console/api/v1/routes/{}/partitions?offset=0&limit=100",
            encoded(route)
        ));
    }
    let mut first = vec![
        "/console/".to_owned(),
        "/console/assets/console.js".to_owned(),
        "/console/assets/console.css".to_owned(),
        "/console/api/v1".to_owned(),
        "/console/api/v1/history?since=0".to_owned(),
    ];
    first.extend(refresh.iter().cloned());
    let last = console
        .history("orders", 0)
        .last()
        .map_or(0, |sample| sample.at_unix_ms);
    // A refresh asks for the samples since the last it has: one per route.
    runtime.block_on(async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        console.sample().await;
    });
    refresh.push(format!("/console/api/v1/history?since={last}"));
    let bytes = |paths: &[String]| -> usize {
        paths
            .iter()
            .map(|path| {
                let answer = runtime.block_on(raw(address, "GET", path));
                assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
                answer.len()
            })
            .sum()
    };
    let page = runtime.block_on(raw(address, "GET", "/console/"));
    for header in [
        "content-security-policy: default-src 'self'; script-src 'self'; style-src 'self';",
        "frame-ancestors 'none'",
        "x-content-type-options: nosniff",
        "content-type: text/html; charset=utf-8",
    ] {
        assert!(
            page.to_ascii_lowercase().contains(header),
            "{header}: {page}"
        );
    }
    let (page_bytes, load_bytes, refresh_bytes) =
        (bytes(&first[..3]), bytes(&first), bytes(&refresh));

    // The service's side of a refresh, in process: the handler's work
    // without the network.
    let http = HealthService::new(console.health().clone()).with_console(console.clone());
    let requests: Vec<http::Request<()>> = refresh
        .iter()
        .map(|path| {
            http::Request::get(path.as_str())
                .body(())
                .expect("a request")
        })
        .collect();
    let (cpu_before, wall_before) = (thread_cpu_ns(), std::time::Instant::now());
    let mut answered = 0;
    for _ in 0..ROUNDS {
        for request in &requests {
            answered += http.respond_to(request).body().len();
        }
    }
    let wall = wall_before.elapsed() / ROUNDS;
    let cpu = thread_cpu_ns()
        .zip(cpu_before)
        .map(|(after, before)| Duration::from_nanos((after - before) / u64::from(ROUNDS)));
    assert!(answered > 0);
    println!(
        "console cost, 2 routes x {PARTITIONS} partitions, {} samples each: \
         page and assets {page_bytes} B; first load (page, assets, index, full history, \
         routes, audit, partitions) {load_bytes} B on the wire; one refresh ({} requests) \
         {refresh_bytes} B; service time per refresh {wall:?} wall, {cpu:?} CPU \
         (in process, {ROUNDS} rounds)",
        console.settings().samples(),
        refresh.len(),
    );
    runtime.block_on(service.stop());
}

/// The bearer token the controls' test gives the console.
const TOKEN: &str = "br0wser-c0ntrols-0123456789abcdef";

/// The marker of the letter the controls' test finds and replays.
const MARKER: &str = "poison-42";

/// An app of one route, `orders` (2 partitions) on the memory broker,
/// whose handler fails a `poison-*` payload permanently (into the dead-letter
/// topic) until `fixed` flips, and records every payload it handles.
struct Controlled {
    broker: MemoryBroker,
    address: SocketAddr,
    fixed: Arc<AtomicBool>,
    handled: Arc<Mutex<Vec<(u32, String)>>>,
    stop: CancellationToken,
    serving: CancellationToken,
    running: JoinHandle<Result<intake::AppReport, intake::AppError>>,
}

impl Controlled {
    async fn start() -> Self {
        let broker = MemoryBroker::new();
        broker.create_topic("orders", 2).expect("topic");
        let health = Health::new(HealthSettings {
            rebalance_grace: Duration::ZERO,
            assignment_grace: Duration::from_secs(3_600),
            ..HealthSettings::default()
        });
        let console = Console::new(
            health,
            ConsoleSettings::default()
                .sample_interval(Duration::from_millis(200))
                .instance("browser-controls")
                .token(ConsoleToken::new(TOKEN).expect("a token"))
                .redaction(Redaction::Off),
        )
        .dead_letters(
            "orders",
            broker
                .dead_letter_store("orders", "billing")
                .expect("store"),
        );
        let fixed = Arc::new(AtomicBool::new(false));
        let handled = Arc::new(Mutex::new(Vec::new()));
        let handler = tower::service_fn({
            let (fixed, handled) = (fixed.clone(), handled.clone());
            move |message: Message| {
                let (fixed, handled) = (fixed.clone(), handled.clone());
                async move {
                    let text = String::from_utf8_lossy(message.payload()).into_owned();
                    if text.starts_with("poison") && !fixed.load(Ordering::SeqCst) {
                        return Err(HandlerError::permanent(format!("cannot bill {text}")));
                    }
                    let partition = message.metadata().partition();
                    handled.lock().expect("handled").push((partition, text));
                    Ok::<_, HandlerError>(())
                }
            }
        });
        let stack = ServiceBuilder::new()
            .layer(DeadLetterLayer::new(
                broker.dead_letter_sink("orders", "billing").expect("sink"),
            ))
            .service(handler);
        let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
        let consumer = Consumer::builder()
            .ordering(DeliveryOrder::Unordered)
            .commit_interval(Duration::from_millis(10))
            .build(source, acker, stack)
            .expect("settings");
        let app = App::new()
            .console(console.clone())
            .route("orders", consumer);
        let listener = HealthListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let serving = CancellationToken::new();
        let service = HealthService::new(console.health().clone()).with_console(console);
        tokio::spawn(listener.serve(service, serving.clone()));
        let stop = CancellationToken::new();
        let running = tokio::spawn(app.run_until(stop.clone()));
        Self {
            broker,
            address,
            fixed,
            handled,
            stop,
            serving,
            running,
        }
    }

    fn send(&self, payload: &str, partition: u32) {
        self.broker
            .send(
                "orders",
                Record::new(payload.to_owned())
                    .with_key(format!("key-{payload}"))
                    .to_partition(partition),
            )
            .expect("send");
    }

    /// The payloads handled on `partition`, in order.
    fn handled_on(&self, partition: u32) -> Vec<String> {
        let handled = self.handled.lock().expect("handled");
        handled
            .iter()
            .filter(|(on, _)| *on == partition)
            .map(|(_, text)| text.clone())
            .collect()
    }

    /// A console API answer's JSON.
    async fn api(&self, path: &str) -> Value {
        let answer = raw(self.address, "GET", &format!("/console/api/v1/{path}")).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
        serde_json::from_str(body).unwrap_or_else(|error| panic!("{path}: {error}: {body}"))
    }

    /// Whether the API says partition `partition` of `orders` is paused.
    async fn paused(&self, partition: u32) -> Option<bool> {
        let page = self.api("routes/orders/partitions").await;
        page["partitions"]
            .as_array()?
            .iter()
            .find(|p| p["partition"] == partition)
            .and_then(|p| p["paused"].as_bool())
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
        self.serving.cancel();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_replays_a_dead_letter_and_pauses_a_partition_with_the_token() {
    let Some(client) =
        browser("the_page_replays_a_dead_letter_and_pauses_a_partition_with_the_token").await
    else {
        return;
    };
    let service = Arc::new(Controlled::start().await);
    let steps = tokio::spawn(control_steps(client.clone(), service.clone()));
    let outcome = steps.await;
    let _ = client.close().await;
    if let Ok(service) = Arc::try_unwrap(service) {
        service.stop().await;
    }
    if let Err(error) = outcome {
        std::panic::resume_unwind(error.into_panic());
    }
}

async fn control_steps(client: Client, service: Arc<Controlled>) {
    const EXPLORER: &str = "section.route[data-route=\"orders\"] .explorer";
    const ROWS: &str = "section.route[data-route=\"orders\"] .explorer tr.dead-letter";
    // Two poison messages are dead-lettered, one of them the marker's.
    service.send(MARKER, 0);
    service.send("poison-7", 1);
    service.send("fine-1", 1);
    eventually("both letters are in the store", || async {
        service.api("routes/orders/dead_letters").await["letters"]
            .as_array()
            .is_some_and(|letters| letters.len() == 2)
    })
    .await;
    client.goto(&service.url()).await.expect("the page opens");

    // 7. Without a token every control is there but disabled.
    let read_only = until(
        &client,
        "the controls show, disabled",
        &format!(
            "const controls = [...document.querySelectorAll('.needs-token')]; \
             const note = document.getElementById('token-note').textContent; \
             const switches = document.querySelectorAll('tr.partition .switch input').length; \
             return document.querySelector('{EXPLORER} button.replay') && switches === 2 \
               ? {{ controls: controls.length, enabled: controls.filter((c) => !c.disabled).length, \
                    note, switches }} : null;"
        ),
    )
    .await;
    assert_eq!(read_only["enabled"], 0, "{read_only}");
    assert_eq!(
        read_only["note"], "read-only without a token",
        "{read_only}"
    );
    scroll_to(&client, &format!("{EXPLORER} button.replay")).await;
    screenshot(&client, "07-read-only-without-a-token").await;
    client
        .execute("window.scrollTo(0, 0)", vec![])
        .await
        .expect("scrolls");

    // 8. The token: typed in, kept in sessionStorage, never in the URL.
    let field = client.find(Locator::Id("token")).await.expect("the field");
    field.send_keys(TOKEN).await.expect("typed");
    client
        .find(Locator::Id("token-use"))
        .await
        .expect("the button")
        .click()
        .await
        .expect("clicked");
    let enabled = until(
        &client,
        "the controls are enabled",
        "const controls = [...document.querySelectorAll('.needs-token')]; \
         return controls.length > 0 && controls.every((c) => !c.disabled) \
           ? { note: document.getElementById('token-note').textContent, \
               kept: sessionStorage.getItem('intake-console-token'), \
               field: document.getElementById('token').value, url: location.href } : null;",
    )
    .await;
    assert_eq!(enabled["kept"], TOKEN, "{enabled}");
    assert_eq!(enabled["field"], "", "the field is emptied: {enabled}");
    assert!(
        !enabled["url"].as_str().unwrap_or("").contains(TOKEN),
        "{enabled}"
    );
    screenshot(&client, "08-token-in-use").await;

    // 9. A search finds the marker's letter; a click shows it in full.
    let search = client
        .find(Locator::Css(&format!("{EXPLORER} input.q")))
        .await
        .expect("the search box");
    search.send_keys(MARKER).await.expect("typed");
    // A refresh of the page keeps the cursor in the box being typed in
    // (it once re-inserted every route's section, which took the focus
    // away and lost what was typed after it).
    let updated = client
        .execute(
            "return document.getElementById('status').textContent",
            vec![],
        )
        .await
        .expect("the status line");
    until(
        &client,
        "the page refreshed with the search box focused",
        &format!(
            "return document.getElementById('status').textContent !== {updated} \
               && document.activeElement === document.querySelector('{EXPLORER} input.q');"
        ),
    )
    .await;
    click(&client, &format!("{EXPLORER} button.search")).await;
    let found = until(
        &client,
        "the search shows the marker's letter only",
        &format!(
            "const rows = [...document.querySelectorAll('{ROWS}')]; \
             return rows.length === 1 && rows[0].textContent.includes('{MARKER}') \
               ? rows[0].textContent : null;"
        ),
    )
    .await;
    println!("found: {found}");
    click(&client, ROWS).await;
    until(
        &client,
        "the letter shows in full",
        &format!(
            "const letter = document.querySelector('{EXPLORER} .letter'); \
             return letter && !letter.hidden && letter.textContent.includes('cannot bill {MARKER}') \
               && letter.textContent.includes('key-{MARKER}');"
        ),
    )
    .await;
    scroll_to(&client, &format!("{EXPLORER} .letter")).await;
    screenshot(&client, "09-letter-found").await;

    // 10. Replay: the dry run's count shows before the confirm button, and
    // nothing is replayed yet. (The memory broker's store has no way back
    // for the group alone: back to the origin.)
    client
        .execute(
            &format!("document.querySelector('{EXPLORER} select.target').value = 'origin';"),
            vec![],
        )
        .await
        .expect("the target");
    click(&client, &format!("{EXPLORER} button.replay")).await;
    let dry = until(
        &client,
        "the dry run's count and the confirm button show",
        &format!(
            "const dry = document.querySelector('{EXPLORER} .result .dry-run'); \
             const confirm = document.querySelector('{EXPLORER} .result button.confirm.replay'); \
             return dry && confirm ? {{ done: dry.getAttribute('data-done'), \
               text: dry.textContent, confirm: confirm.textContent, disabled: confirm.disabled }} : null;"
        ),
    )
    .await;
    assert_eq!(dry["done"], "1", "{dry}");
    assert_eq!(dry["confirm"], "Confirm replay (1 letter)", "{dry}");
    assert_eq!(dry["disabled"], false, "{dry}");
    assert!(
        !service.handled_on(0).contains(&MARKER.to_owned()),
        "a dry run replays nothing"
    );
    scroll_to(&client, &format!("{EXPLORER} .result")).await;
    screenshot(&client, "10-replay-dry-run").await;

    // 11. The handler is fixed, the replay confirmed: the marker is
    // handled and its letter leaves the list; the other letter stays.
    service.fixed.store(true, Ordering::SeqCst);
    click(
        &client,
        &format!("{EXPLORER} .result button.confirm.replay"),
    )
    .await;
    let outcome = until(
        &client,
        "the replay's outcome shows",
        &format!(
            "const o = document.querySelector('{EXPLORER} .result .outcome'); \
             return o ? o.textContent : null;"
        ),
    )
    .await;
    assert_eq!(outcome, "Done: 1 letter replayed, 0 skipped.");
    eventually("the replayed letter is handled", || async {
        service.handled_on(0).contains(&MARKER.to_owned())
    })
    .await;
    until(
        &client,
        "the letter is gone from the list",
        &format!("return document.querySelectorAll('{ROWS}').length === 0;"),
    )
    .await;
    let left = service.api("routes/orders/dead_letters").await;
    let left: Vec<&Value> = left["letters"]
        .as_array()
        .expect("letters")
        .iter()
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(
        left[0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("poison-7"))
    );
    scroll_to(&client, &format!("{EXPLORER} .result")).await;
    screenshot(&client, "11-replayed").await;

    // 12. Partition 1 paused through its switch: the API says so, and its
    // deliveries stop while partition 0 flows.
    let switch = |partition: u32| {
        format!(
            "section.route[data-route=\"orders\"] tr.partition[data-partition=\"{partition}\"] \
             .switch input"
        )
    };
    click(&client, &switch(1)).await;
    eventually("the API says partition 1 is paused", || async {
        service.paused(1).await == Some(true)
    })
    .await;
    assert_eq!(service.paused(0).await, Some(false));
    let before = service.handled_on(1).len();
    for round in 0..5 {
        service.send(&format!("p1-{round}"), 1);
        service.send(&format!("p0-{round}"), 0);
    }
    eventually("partition 0 flows", || async {
        service
            .handled_on(0)
            .iter()
            .filter(|p| p.starts_with("p0-"))
            .count()
            == 5
    })
    .await;
    // Another round on partition 0 through: partition 1 still holds.
    service.send("p0-5", 0);
    eventually("partition 0 flows again", || async {
        service.handled_on(0).contains(&"p0-5".to_owned())
    })
    .await;
    assert_eq!(
        service.handled_on(1).len(),
        before,
        "{:?}",
        service.handled_on(1)
    );
    until(
        &client,
        "the page shows partition 1 paused",
        "const row = document.querySelector('section.route[data-route=\"orders\"] \
           tr.partition[data-partition=\"1\"]'); \
         const input = row && row.querySelector('.switch input'); \
         return row && row.querySelector('.badge.warn') && input.checked;",
    )
    .await;
    scroll_to(
        &client,
        "section.route[data-route=\"orders\"] table.partitions",
    )
    .await;
    screenshot(&client, "12-partition-paused").await;

    // 13. Resumed through the same switch: the held messages are handled,
    // in order.
    click(&client, &switch(1)).await;
    eventually("the held messages are handled", || async {
        service.handled_on(1).len() == before + 5
    })
    .await;
    let resumed: Vec<String> = service.handled_on(1).split_off(before);
    assert_eq!(
        resumed,
        (0..5).map(|r| format!("p1-{r}")).collect::<Vec<_>>()
    );
    eventually("the API says partition 1 runs", || async {
        service.paused(1).await == Some(false)
    })
    .await;
    until(
        &client,
        "the page shows partition 1 running",
        &format!("return !document.querySelector('{}').checked;", switch(1)),
    )
    .await;
    scroll_to(
        &client,
        "section.route[data-route=\"orders\"] table.partitions",
    )
    .await;
    screenshot(&client, "13-partition-resumed").await;

    // 14. Purge the other letter: a dry run, a first and a second confirm.
    client
        .execute(
            &format!("document.querySelector('{EXPLORER} input.q').value = '';"),
            vec![],
        )
        .await
        .expect("the search is cleared");
    click(&client, &format!("{EXPLORER} button.search")).await;
    until(
        &client,
        "the list shows the other letter",
        &format!(
            "const rows = [...document.querySelectorAll('{ROWS}')]; \
             return rows.length === 1 && rows[0].textContent.includes('poison-7');"
        ),
    )
    .await;
    click(&client, &format!("{EXPLORER} button.purge")).await;
    let first = until(
        &client,
        "the purge's dry run and its first confirm show",
        &format!(
            "const dry = document.querySelector('{EXPLORER} .result .dry-run'); \
             const confirm = document.querySelector('{EXPLORER} .result button.confirm.purge'); \
             return dry && confirm ? {{ done: dry.getAttribute('data-done'), \
               confirm: confirm.textContent }} : null;"
        ),
    )
    .await;
    assert_eq!(first["done"], "1", "{first}");
    assert_eq!(first["confirm"], "Purge 1 letter…", "{first}");
    click(&client, &format!("{EXPLORER} .result button.confirm.purge")).await;
    until(
        &client,
        "the second confirm shows",
        &format!(
            "const confirm = document.querySelector('{EXPLORER} .result button.confirm.purge.armed'); \
             return confirm ? confirm.textContent : null;"
        ),
    )
    .await;
    let kept = service.api("routes/orders/dead_letters").await;
    assert_eq!(
        kept["letters"].as_array().map(Vec::len),
        Some(1),
        "one confirm purges nothing"
    );
    scroll_to(&client, &format!("{EXPLORER} .result")).await;
    screenshot(&client, "14-purge-second-confirm").await;
    click(
        &client,
        &format!("{EXPLORER} .result button.confirm.purge.armed"),
    )
    .await;
    let outcome = until(
        &client,
        "the purge's outcome shows",
        &format!(
            "const o = document.querySelector('{EXPLORER} .result .outcome'); \
             return o && document.querySelectorAll('{ROWS}').length === 0 ? o.textContent : null;"
        ),
    )
    .await;
    assert_eq!(outcome, "Done: 1 letter purged, 0 skipped.");
    let left = service.api("routes/orders/dead_letters").await;
    assert_eq!(left["letters"].as_array().map(Vec::len), Some(0), "{left}");
    screenshot(&client, "15-purged").await;

    // 16. On a phone the controls fit: the body does not scroll sideways.
    client
        .set_window_size(390, 844)
        .await
        .expect("a phone's window");
    let fits = until(
        &client,
        "the controls fit a phone's width",
        &format!(
            "const root = document.documentElement; \
             const box = document.querySelector('{EXPLORER}').getBoundingClientRect(); \
             return window.innerWidth <= 500 && box.width > 0 && box.right <= root.clientWidth + 1 \
               && root.scrollWidth <= root.clientWidth \
               && document.body.scrollWidth <= root.clientWidth \
               ? {{ width: root.clientWidth, scroll: root.scrollWidth }} : null;"
        ),
    )
    .await;
    println!("phone: {fits}");
    scroll_to(&client, &format!("{EXPLORER} .bar")).await;
    screenshot(&client, "16-controls-on-a-phone").await;
}
