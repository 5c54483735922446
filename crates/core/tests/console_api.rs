//! The console's admin API over real HTTP: an app on the memory broker with
//! a partition stuck, letters dead-lettered, the console on a
//! `HealthListener` on 127.0.0.1, and what `/console/api/v1/...` answers.

#[path = "support/console_http.rs"]
mod console_http;
#[path = "support/eventually.rs"]
mod eventually;

use std::net::SocketAddr;
use std::time::Duration;

use console_http::get_json;
use eventually::eventually;
use intake_core::app::{
    App, AuditEntry, Console, ConsoleSettings, ConsoleToken, Health, HealthListener, HealthService,
    HealthSettings,
};
use intake_core::backend::{Broker, RouteAddress};
use intake_core::consumer::{Consumer, DeliveryOrder};
use intake_core::dead_letter::DeadLetterLayer;
use intake_core::memory::{MemoryBroker, Record};
use intake_core::metrics::Metrics;
use intake_core::{HandlerError, Message};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;

const TOKEN: &str = "c0n5o1e-t0ken-0123456789abcdef";
const PATIENCE: Duration = Duration::from_secs(10);

/// One request without a body: the status and the body as text.
async fn request(
    address: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let (status, body) = console_http::request(address, method, path, headers, b"").await;
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Polls `path` until `check` holds of its JSON (bounded); the last answer.
async fn until(
    address: SocketAddr,
    path: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let answer = get_json(address, path).await;
        if check(&answer) {
            return answer;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}: {answer:#}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn partition(page: &Value, number: u64) -> &Value {
    page["partitions"]
        .as_array()
        .and_then(|list| list.iter().find(|p| p["partition"] == number))
        .unwrap_or_else(|| panic!("partition {number} in {page:#}"))
}

fn samples(history: &Value) -> &Vec<Value> {
    history["routes"][0]["samples"].as_array().expect("samples")
}

fn sum(samples: &[Value], field: &str) -> u64 {
    samples.iter().filter_map(|s| s[field].as_u64()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_partitions_a_stalled_one_dead_letters_and_history_over_http() {
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 3).expect("topic");
    let registry = prometheus::Registry::new();
    let metrics = Metrics::register(&registry).expect("metrics");
    let release = CancellationToken::new();
    let handler = tower::service_fn({
        let release = release.clone();
        move |message: Message| {
            let release = release.clone();
            async move {
                if message.metadata().partition() == 0 {
                    // Stuck until the test lets it go.
                    release.cancelled().await;
                }
                if message.payload().as_ref() == b"poison" {
                    return Err(HandlerError::permanent("cannot bill a poison order"));
                }
                Ok::<_, HandlerError>(())
            }
        }
    });
    let stack = ServiceBuilder::new()
        .layer(metrics.layer("orders"))
        .layer(DeadLetterLayer::new(
            broker.dead_letter_sink("orders", "billing").expect("sink"),
        ))
        .service(handler);

    let health = Health::new(HealthSettings {
        stall_window: Duration::from_millis(300),
        rebalance_grace: Duration::ZERO,
        assignment_grace: Duration::from_secs(3_600),
        ..HealthSettings::default()
    });
    let probe = broker
        .lag_probe(&RouteAddress::new("orders", "billing"))
        .await
        .expect("probe");
    let console = Console::new(
        health,
        ConsoleSettings::default()
            .sample_interval(Duration::from_millis(50))
            .instance("instance-a")
            .token(ConsoleToken::new(TOKEN).expect("token")),
    )
    .lag_probe("orders", probe)
    .metrics(registry);

    let listener = HealthListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let serving = CancellationToken::new();
    let service = HealthService::new(console.health().clone()).with_console(console.clone());
    let server = tokio::spawn(listener.serve(service, serving.clone()));

    let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
    let stop = CancellationToken::new();
    let app = App::new().console(console.clone()).route(
        "orders",
        Consumer::builder()
            .ordering(DeliveryOrder::Unordered)
            .commit_interval(Duration::from_millis(10))
            .build(source, acker, stack)
            .expect("settings"),
    );
    let running = tokio::spawn(app.run_until(stop.clone()));

    let index = get_json(address, "/console/api/v1").await;
    assert_eq!(index["api"], "v1");
    assert_eq!(index["instance"], "instance-a");
    assert_eq!(index["mutations"], "token");
    assert!(!index.to_string().contains(TOKEN), "{index}");

    broker
        .send("orders", Record::new("stuck").to_partition(0))
        .expect("send");
    // A first message each, committed before the rest: a partition's first
    // commit by watermark counts one message, whatever it carried.
    for partition in [1, 2] {
        broker
            .send("orders", Record::new("order").to_partition(partition))
            .expect("send");
    }
    until(
        address,
        "/console/api/v1/routes/orders/partitions",
        "the first messages are committed",
        |page| {
            page["total"] == 3
                && [1, 2]
                    .iter()
                    .all(|p| partition(page, *p)["committed"] == "0")
        },
    )
    .await;
    for round in 2..40u32 {
        let payload = if round % 10 == 3 { "poison" } else { "order" };
        broker
            .send("orders", Record::new(payload).to_partition(1 + round % 2))
            .expect("send");
    }

    // The stuck partition stalls; the others commit everything.
    let page = until(
        address,
        "/console/api/v1/routes/orders/partitions",
        "partition 0 stalls and the others commit all they got",
        |page| {
            page["total"] == 3
                && partition(page, 0)["liveness"] == "stalled"
                && [1, 2]
                    .iter()
                    .all(|p| partition(page, *p)["committed"] == "19")
        },
    )
    .await;
    let stuck = partition(&page, 0);
    assert_eq!(stuck["owner"], "instance-a");
    assert_eq!(stuck["in_flight"], 1);
    assert_eq!(stuck["uncommitted"], 1);
    assert_eq!(stuck["oldest_unfinished"], "0");
    assert_eq!(stuck["handled"], Value::Null);
    assert!(stuck["stalled_for_ms"].as_u64().is_some(), "{stuck}");
    assert!(
        stuck["oldest_unfinished_age_ms"].as_u64().is_some(),
        "{stuck}"
    );
    assert_eq!(stuck["paused"], false);
    let flowing = partition(&page, 1);
    assert_eq!(flowing["handled"], "19");
    assert_eq!(flowing["in_flight"], 0);
    assert!(
        matches!(flowing["liveness"].as_str(), Some("idle" | "ok")),
        "{flowing}"
    );
    assert!(flowing["since_last_commit_ms"].as_u64().is_some());
    assert!(
        flowing["assigned_at_unix_ms"]
            .as_u64()
            .is_some_and(|ms| ms > 0)
    );

    let routes = until(
        address,
        "/console/api/v1/routes",
        "the probe answered",
        |routes| routes["routes"][0]["broker_lag"].as_u64().is_some(),
    )
    .await;
    let route = &routes["routes"][0];
    assert_eq!(route["name"], "orders");
    assert_eq!(route["state"], "running");
    assert_eq!(route["live"], false, "{route}");
    assert_eq!(route["ready"], true, "{route}");
    assert_eq!(route["partitions"], 3);
    assert_eq!(route["stalled_partitions"], 1);
    assert!(
        route["problems"].as_array().is_some_and(|problems| problems
            .iter()
            .any(|p| p.as_str().is_some_and(|p| p.contains("orders/0 stalled")))),
        "{route}"
    );
    assert!(
        route["broker_lag"].as_u64().is_some_and(|lag| lag >= 1),
        "{route}"
    );
    // The memory broker counts its parked backlog as one tier, `all`.
    assert_eq!(route["parked_tiers"][0]["tier"], "all", "{route}");
    assert_eq!(
        route["parked_tiers"][0]["messages"].as_u64(),
        route["parked_backlog"].as_u64(),
        "{route}"
    );
    assert_eq!(route["paused"], false);
    let one = get_json(address, "/console/api/v1/routes/orders").await;
    assert_eq!(
        (&one["name"], &one["partitions"]),
        (&route["name"], &route["partitions"])
    );

    // History accumulates: commits, the dead letters (from the metrics
    // layer) and the lag.
    let history = until(
        address,
        "/console/api/v1/history?route=orders",
        "the history holds the commits and the dead letters",
        |history| {
            let samples = samples(history);
            samples.len() >= 3
                && sum(samples, "dead_lettered") == 4
                && sum(samples, "handled") == 41
                && sum(samples, "committed") == 40
                && samples.iter().any(|s| s["stalled_partitions"] == 1)
        },
    )
    .await;
    assert_eq!(history["sample_interval_ms"], 50);
    let all = samples(&history);
    assert!(
        all.iter().any(|s| s["broker_lag"].as_u64().is_some()),
        "{history:#}"
    );
    // The metrics layer counts a final failure as failed, dead-lettered
    // or not.
    assert_eq!(sum(all, "failed"), 4, "{history:#}");
    assert!(
        all.iter()
            .any(|s| s["handled_per_s"].as_f64().is_some_and(|rate| rate > 0.0))
    );
    assert!(
        all.windows(2)
            .all(|pair| pair[0]["at_unix_ms"].as_u64() <= pair[1]["at_unix_ms"].as_u64())
    );
    let last = all
        .last()
        .and_then(|s| s["at_unix_ms"].as_u64())
        .expect("a time");
    let later = get_json(
        address,
        &format!("/console/api/v1/history?route=orders&since={last}"),
    )
    .await;
    assert!(
        samples(&later)
            .iter()
            .all(|s| s["at_unix_ms"].as_u64() > Some(last)),
        "{later:#}"
    );
    assert_eq!(
        broker
            .dead_letters("orders", "billing")
            .expect("letters")
            .len(),
        4
    );

    // A page is bounded, and says where the next starts.
    let first = get_json(address, "/console/api/v1/routes/orders/partitions?limit=1").await;
    assert_eq!(first["partitions"].as_array().map(Vec::len), Some(1));
    assert_eq!(first["next_offset"], 1);
    let last_page = get_json(
        address,
        "/console/api/v1/routes/orders/partitions?offset=2&limit=5",
    )
    .await;
    assert_eq!(last_page["partitions"][0]["partition"], 2);
    assert_eq!(last_page["next_offset"], Value::Null);
    let past = get_json(
        address,
        "/console/api/v1/routes/orders/partitions?offset=99",
    )
    .await;
    assert_eq!(past["partitions"].as_array().map(Vec::len), Some(0));

    // Outside input is refused, never a panic.
    for (path, status) in [
        ("/console/api/v1/routes/nope", 404),
        ("/console/api/v1/routes/nope/partitions", 404),
        ("/console/api/v1/history?route=nope", 404),
        ("/console/api/v1/routes/%FF%FE", 400),
        ("/console/api/v1/routes/orders/partitions?limit=-1", 400),
        ("/console/api/v1/history?since=%zz", 400),
        ("/console/api/v2/routes", 404),
    ] {
        let (got, body) = request(address, "GET", path, &[]).await;
        assert_eq!(got, status, "{path}: {body}");
        assert!(
            serde_json::from_str::<Value>(&body).is_ok_and(|v| v["error"].is_string()),
            "{body}"
        );
    }
    let long = format!("/console/api/v1/routes/{}", "a".repeat(3_000));
    assert_eq!(request(address, "GET", &long, &[]).await.0, 414);

    // No route mutates yet: each mutation passes the guard first.
    let bearer = format!("Bearer {TOKEN}");
    let path = "/console/api/v1/routes/orders";
    assert_eq!(request(address, "POST", path, &[]).await.0, 401);
    assert_eq!(
        request(
            address,
            "POST",
            path,
            &[("Cookie", &format!("token={TOKEN}"))]
        )
        .await
        .0,
        401
    );
    assert_eq!(
        request(
            address,
            "POST",
            path,
            &[("Authorization", "Bearer wrong-token-0123456789")]
        )
        .await
        .0,
        401
    );
    assert_eq!(
        request(
            address,
            "POST",
            path,
            &[
                ("Authorization", &bearer),
                ("Origin", "https://evil.example")
            ]
        )
        .await
        .0,
        403
    );
    assert_eq!(
        request(
            address,
            "DELETE",
            path,
            &[("Authorization", &bearer), ("Sec-Fetch-Site", "cross-site")]
        )
        .await
        .0,
        403
    );
    assert_eq!(
        request(address, "POST", path, &[("Authorization", &bearer)])
            .await
            .0,
        405
    );
    let audit = get_json(address, "/console/api/v1/audit").await;
    let entries = audit["entries"].as_array().expect("entries");
    assert_eq!(entries.len(), 5, "{audit:#}");
    assert!(entries.iter().all(|e| {
        e["outcome"]
            .as_str()
            .is_some_and(|o| o.starts_with("refused"))
    }));
    assert!(!audit.to_string().contains(TOKEN), "{audit}");
    console.audit(AuditEntry::new(0, "token", "pause", "orders/0", "done").dry_run(true));
    assert_eq!(console.audit_log().len(), 6);

    // The health probes still answer beside the console.
    let (status, _) = request(address, "GET", "/health/live", &[]).await;
    assert_eq!(status, 503, "partition 0 stalls");

    release.cancel();
    until(
        address,
        "/console/api/v1/routes/orders/partitions",
        "partition 0 commits once released",
        |page| partition(page, 0)["committed"] == "0",
    )
    .await;
    eventually("live again", || console.health().is_live()).await;
    stop.cancel();
    running.await.expect("join").expect("app");
    let ended = get_json(address, "/console/api/v1/routes").await;
    assert_eq!(ended["routes"][0]["state"], "ended");
    serving.cancel();
    server.await.expect("listener");
}

#[tokio::test]
async fn without_a_token_every_mutation_is_refused_and_reads_still_answer() {
    let console = Console::new(Health::default(), ConsoleSettings::default());
    let listener = HealthListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let serving = CancellationToken::new();
    let service = HealthService::new(console.health().clone()).with_console(console.clone());
    let server = tokio::spawn(listener.serve(service, serving.clone()));

    let index = get_json(address, "/console/api/v1/").await;
    assert_eq!(index["mutations"], "off");
    assert_eq!(index["routes"], Value::Array(Vec::new()));
    let (status, body) = request(
        address,
        "PUT",
        "/console/api/v1/routes",
        &[("Authorization", &format!("Bearer {TOKEN}"))],
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("no console token"), "{body}");
    let history = get_json(address, "/console/api/v1/history").await;
    assert_eq!(history["routes"], Value::Array(Vec::new()));
    serving.cancel();
    server.await.expect("listener");
}
