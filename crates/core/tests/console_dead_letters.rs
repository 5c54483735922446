//! The console's dead-letter explorer over real HTTP: an app on the memory
//! broker dead-letters hostile messages, and `/console/api/v1/routes/
//! orders/dead_letters...` lists, searches and shows them under the
//! redaction policy, replays exactly the set a dry run confirmed (handled
//! by the app once fixed), purges a confirmed set, and refuses what it
//! must; the audit log has each action and never the token.
#![cfg(all(feature = "console", feature = "health-server"))]

#[path = "support/console_http.rs"]
mod console_http;
#[path = "support/eventually.rs"]
mod eventually;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use console_http::{get_json as get, post_json, request};
use eventually::eventually;
use intake_core::app::{
    App, Console, ConsoleSettings, ConsoleToken, Health, HealthListener, HealthService, Redaction,
};
use intake_core::backend::DeadLetterSink;
use intake_core::consumer::{Consumer, DeliveryOrder};
use intake_core::dead_letter::DeadLetterLayer;
use intake_core::memory::{MemoryBroker, Record};
use intake_core::{DeadLetter, ErrorClass, HandlerError, Message, Metadata, Position};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;

const TOKEN: &str = "d1ead-l3tters-0123456789abcdef";
const PATIENCE: Duration = Duration::from_secs(10);
const HOSTILE_ERROR: &str = "cannot bill <script>alert(1)</script> \u{1b}[31mred\u{1b}[0m";
const BASE: &str = "/console/api/v1/routes/orders/dead_letters";

/// A POST with the token and a JSON body: the status and the JSON.
async fn post(address: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    post_json(address, path, TOKEN, body).await
}

fn ids(listing: &Value) -> Vec<String> {
    listing["letters"]
        .as_array()
        .expect("letters")
        .iter()
        .map(|letter| letter["id"].as_str().expect("id").to_owned())
        .collect()
}

/// The listing at `query` until it has `count` letters (bounded).
async fn until_letters(address: SocketAddr, query: &str, count: usize) -> Value {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let listing = get(address, &format!("{BASE}?{query}")).await;
        if ids(&listing).len() == count {
            return listing;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {count} letters: {listing:#}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A letter written straight to the dead-letter topic.
async fn write_letter(
    broker: &MemoryBroker,
    payload: &'static str,
    class: ErrorClass,
    error: &str,
) {
    let message = Message::new(
        payload,
        Metadata::new("orders".into(), 0, Position::Offset(999)),
    )
    .with_key("k9");
    broker
        .dead_letter_sink("orders", "billing")
        .expect("sink")
        .write(&DeadLetter::new(message, error, 3).with_class(class))
        .await
        .expect("write a letter");
}

async fn serve(console: &Console, stop: &CancellationToken) -> SocketAddr {
    let listener = HealthListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let service = HealthService::new(console.health().clone()).with_console(console.clone());
    tokio::spawn(listener.serve(service, stop.clone()));
    address
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_explorer_lists_shows_replays_and_purges_exactly_the_confirmed_letters() {
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 1).expect("topic");
    let fixed = Arc::new(AtomicBool::new(false));
    let handled = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
    let handler = tower::service_fn({
        let fixed = fixed.clone();
        let handled = handled.clone();
        move |message: Message| {
            let fixed = fixed.clone();
            let handled = handled.clone();
            async move {
                if message.payload().starts_with(b"poison") && !fixed.load(Ordering::SeqCst) {
                    return Err(HandlerError::permanent(HOSTILE_ERROR));
                }
                handled
                    .lock()
                    .expect("handled")
                    .push(message.payload().to_vec());
                Ok::<_, HandlerError>(())
            }
        }
    });
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(
            broker.dead_letter_sink("orders", "billing").expect("sink"),
        ))
        .service(handler);
    let settings = || {
        ConsoleSettings::default()
            .instance("instance-a")
            .token(ConsoleToken::new(TOKEN).expect("token"))
    };
    let health = Health::default();
    // The default policy (payloads hashed), and one that shows them.
    let console = Console::new(health.clone(), settings()).dead_letters(
        "orders",
        broker
            .dead_letter_store("orders", "billing")
            .expect("store"),
    );
    let shown = Console::new(health, settings().redaction(Redaction::Off)).dead_letters(
        "orders",
        broker
            .dead_letter_store("orders", "billing")
            .expect("store"),
    );
    let serving = CancellationToken::new();
    let address = serve(&console, &serving).await;
    let shown_at = serve(&shown, &serving).await;

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

    let huge = vec![b'<'; 20_000];
    for record in [
        Record::new("poison-1 alice@example.com")
            .with_key("k1")
            .with_header("Authorization", "Bearer s3cret-header")
            .with_header("x-trace", "t-1")
            .with_header("x-huge", huge),
        Record::new(&b"poison-2 \xff\xfe<html>\x1b[2J"[..]).with_key("k2"),
        Record::new("poison-3 needle-in-payload").with_key("k1"),
        Record::new("order-ok"),
    ] {
        broker.send("orders", record).expect("send");
    }
    until_letters(address, "", 3).await;
    write_letter(
        &broker,
        "slow-1",
        ErrorClass::Retryable,
        "TIMEOUT talking to the ledger",
    )
    .await;

    // Listing, summary, filters.
    let all = until_letters(address, "", 4).await;
    assert_eq!(all["redaction"], "hash");
    assert_eq!(all["summary"]["total"], 4);
    assert_eq!(all["summary"]["by_class"]["permanent"], 3);
    assert_eq!(all["summary"]["by_class"]["retryable"], 1);
    let first = &all["letters"][0];
    assert_eq!(first["class"], "permanent");
    assert_eq!(first["error"], format!("permanent error: {HOSTILE_ERROR}"));
    assert_eq!(first["key"], "k1");
    assert_eq!(first["origin"]["source"], "orders");
    assert_eq!(first["origin"]["partition"], 0);
    assert_eq!(first["origin"]["position"], "0");
    assert_eq!(first["attempts"], 1);
    assert_eq!(first["replays"], 0);
    assert!(first["failed_at_unix_ms"].as_u64().is_some_and(|ms| ms > 0));
    assert_eq!(first["payload"]["shown"], "hash");
    assert_eq!(first["payload"]["bytes"], 26);
    assert!(first["payload"]["fingerprint"].as_str().is_some());
    assert_eq!(first["payload"]["preview"], Value::Null);
    assert!(!all.to_string().contains("alice@"), "{all}");
    assert_eq!(
        ids(&get(address, &format!("{BASE}?class=retryable")).await).len(),
        1
    );
    assert_eq!(ids(&get(address, &format!("{BASE}?key=k1")).await).len(), 2);
    assert_eq!(ids(&get(address, &format!("{BASE}?from=0")).await).len(), 4);
    assert_eq!(
        ids(&get(address, &format!("{BASE}?until=1")).await).len(),
        0
    );
    let (status, _) = request(address, "GET", &format!("{BASE}?class=nope"), &[], b"").await;
    assert_eq!(status, 400);
    let index = get(address, "/console/api/v1").await;
    assert_eq!(index["dead_letters"], json!(["orders"]));
    let (status, _) = request(
        address,
        "GET",
        "/console/api/v1/routes/other/dead_letters",
        &[],
        b"",
    )
    .await;
    assert_eq!(status, 404);
    // The synchronous entry cannot read a store: it says where to go.
    let sync = console.respond(&http::Request::get(BASE).body(()).expect("request"));
    assert_eq!(sync.status(), 501);

    // The cursor walks every letter once.
    let mut walked = Vec::new();
    let mut cursor = String::new();
    for _ in 0..10 {
        let page = get(address, &format!("{BASE}?limit=1&cursor={cursor}")).await;
        walked.extend(ids(&page));
        match page["next"].as_str() {
            Some(next) => cursor = next.to_owned(),
            None => break,
        }
    }
    assert_eq!(walked, ids(&all));

    // Text search: error and key; the payload only where the policy shows it.
    assert_eq!(
        ids(&get(address, &format!("{BASE}?q=timeout")).await).len(),
        1
    );
    assert_eq!(
        ids(&get(address, &format!("{BASE}?q=%3Cscript%3E")).await).len(),
        3
    );
    assert_eq!(
        ids(&get(address, &format!("{BASE}?q=needle")).await).len(),
        0
    );
    assert_eq!(
        ids(&get(shown_at, &format!("{BASE}?q=NEEDLE")).await).len(),
        1
    );
    assert_eq!(
        ids(&get(shown_at, &format!("{BASE}?q=s3cret")).await).len(),
        0
    );

    // One letter in full: redacted by default, shown under `Off`; secret
    // headers never; a huge header cut with its size said.
    let id = first["id"].as_str().expect("id");
    let full = get(address, &format!("{BASE}/{id}")).await;
    assert_eq!(full["payload"]["preview"], Value::Null);
    assert!(!full.to_string().contains("s3cret"), "{full}");
    let header = |full: &Value, name: &str| {
        full["headers"]
            .as_array()
            .and_then(|all| all.iter().find(|h| h["name"] == name).cloned())
            .unwrap_or_else(|| panic!("header {name} in {full:#}"))
    };
    assert_eq!(header(&full, "Authorization")["value"], "***");
    assert_eq!(header(&full, "Authorization")["redacted"], true);
    assert_eq!(header(&full, "x-trace")["value"], "t-1");
    let big = header(&full, "x-huge");
    assert_eq!(
        (big["bytes"].as_u64(), big["truncated"].as_bool()),
        (Some(20_000), Some(true))
    );
    assert!(
        big["value"]
            .as_str()
            .is_some_and(|value| value.len() < 1_200)
    );
    let open = get(shown_at, &format!("{BASE}/{id}")).await;
    assert_eq!(open["payload"]["preview"], "poison-1 alice@example.com");
    assert_eq!(header(&open, "Authorization")["value"], "***");
    let hostile = get(shown_at, &format!("{BASE}/{}", ids(&all)[1])).await;
    let preview = hostile["payload"]["preview"].as_str().expect("preview");
    assert!(preview.contains("\\xff\\xfe<html>\\x1b[2J"), "{preview}");
    let (status, _) = request(address, "GET", &format!("{BASE}/424242"), &[], b"").await;
    assert_eq!(status, 404);

    // Refusals: no token, another site, a body too big, a bad confirm.
    let dry = json!({"filter": {"class": "permanent"}, "dry_run": true, "target": "origin"});
    let (status, _) = request(
        address,
        "POST",
        &format!("{BASE}/replay"),
        &[],
        dry.to_string().as_bytes(),
    )
    .await;
    assert_eq!(status, 401);
    let bearer = format!("Bearer {TOKEN}");
    let (status, _) = request(
        address,
        "POST",
        &format!("{BASE}/replay"),
        &[("Authorization", &bearer), ("Sec-Fetch-Site", "cross-site")],
        dry.to_string().as_bytes(),
    )
    .await;
    assert_eq!(status, 403);
    let (status, _) = request(
        address,
        "POST",
        &format!("{BASE}/replay"),
        &[("Authorization", &bearer)],
        &vec![b' '; 70 * 1024],
    )
    .await;
    assert_eq!(status, 413);
    let (status, _) = post(
        address,
        &format!("{BASE}/replay"),
        &json!({"dry_run": false, "confirm": "00ff"}),
    )
    .await;
    assert_eq!(status, 409);
    let (status, _) = post(
        address,
        &format!("{BASE}/replay"),
        &json!({"dry_run": "yes"}),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        !handled
            .lock()
            .expect("handled")
            .iter()
            .any(|payload| payload.starts_with(b"poison")),
        "nothing replayed yet"
    );

    // Dry run, a letter written meanwhile, the confirmed run.
    fixed.store(true, Ordering::SeqCst);
    let (status, dry_answer) = post(address, &format!("{BASE}/replay"), &dry).await;
    assert_eq!(status, 200, "{dry_answer}");
    assert_eq!(dry_answer["dry_run"], true);
    assert_eq!(dry_answer["letters"], 3);
    assert_eq!(dry_answer["done"], 3);
    assert_eq!(dry_answer["skipped_total"], 0);
    let confirm = dry_answer["confirm"].as_str().expect("confirm").to_owned();
    assert_eq!(
        ids(&get(address, BASE).await).len(),
        4,
        "a dry run moves nothing"
    );
    write_letter(&broker, "poison-late", ErrorClass::Permanent, "late").await;
    let run = json!({"dry_run": false, "confirm": confirm});
    let (status, done) = post(address, &format!("{BASE}/replay"), &run).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(
        (done["dry_run"].as_bool(), done["done"].as_u64()),
        (Some(false), Some(3))
    );
    let left = get(address, BASE).await;
    let left_errors: BTreeSet<&str> = left["letters"]
        .as_array()
        .expect("letters")
        .iter()
        .filter_map(|letter| letter["error"].as_str())
        .collect();
    assert_eq!(
        left_errors,
        BTreeSet::from(["TIMEOUT talking to the ledger", "late"]),
        "the letter written after the dry run stays"
    );
    eventually("the replayed messages are handled", || {
        let handled = handled.lock().expect("handled");
        handled
            .iter()
            .filter(|payload| payload.starts_with(b"poison"))
            .count()
            == 3
    })
    .await;
    let (status, _) = post(address, &format!("{BASE}/replay"), &run).await;
    assert_eq!(status, 409, "a confirm value is used once");

    // Purge of exactly the confirmed set.
    let (status, dry_purge) =
        post(address, &format!("{BASE}/purge"), &json!({"dry_run": true})).await;
    assert_eq!(
        (status, dry_purge["letters"].as_u64()),
        (200, Some(2)),
        "{dry_purge}"
    );
    write_letter(
        &broker,
        "after-purge-dry-run",
        ErrorClass::Permanent,
        "kept",
    )
    .await;
    let confirm = dry_purge["confirm"].as_str().expect("confirm");
    let (status, wrong) = post(
        address,
        &format!("{BASE}/replay"),
        &json!({"dry_run": false, "confirm": confirm}),
    )
    .await;
    assert_eq!(status, 409, "a purge's confirm does not replay: {wrong}");
    let (status, purged) = post(
        address,
        &format!("{BASE}/purge"),
        &json!({"dry_run": false, "confirm": confirm}),
    )
    .await;
    assert_eq!(
        (status, purged["done"].as_u64()),
        (200, Some(2)),
        "{purged}"
    );
    let left = until_letters(address, "", 1).await;
    assert_eq!(left["letters"][0]["error"], "kept");

    // The audit log: each action, who and from where, never the token.
    let audit = get(address, "/console/api/v1/audit").await;
    assert!(!audit.to_string().contains(TOKEN), "{audit}");
    let entries = audit["entries"].as_array().expect("entries");
    let find = |action: &str, dry_run: bool, count: u64| {
        entries.iter().any(|entry| {
            entry["action"] == action
                && entry["dry_run"] == dry_run
                && entry["count"] == count
                && entry["outcome"] == "done"
                && entry["actor"]
                    .as_str()
                    .is_some_and(|actor| actor.starts_with("token from 127.0.0.1:"))
        })
    };
    assert!(find("dead_letters.replay", true, 3), "{audit:#}");
    assert!(find("dead_letters.replay", false, 3), "{audit:#}");
    assert!(find("dead_letters.purge", true, 2), "{audit:#}");
    assert!(find("dead_letters.purge", false, 2), "{audit:#}");
    let refused = entries
        .iter()
        .filter(|entry| {
            entry["outcome"]
                .as_str()
                .is_some_and(|outcome| outcome.starts_with("refused"))
        })
        .count();
    assert!(refused >= 3, "{audit:#}");

    stop.cancel();
    tokio::time::timeout(PATIENCE, running)
        .await
        .expect("the app stops")
        .expect("join")
        .expect("run");
    serving.cancel();
}

/// This process's CPU time (user + system) from `/proc/self/stat`, if
/// readable (Linux).
fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on every Linux this runs on.
    Some(Duration::from_millis(ticks * 10))
}

/// The figure for issue 28: what a dry run and a replay of 10,000 letters
/// cost through the API on the memory broker, at the default rate and
/// unpaced. Prints; asserts only the counts. Run with
/// `cargo test -p intake-core --all-features --test console_dead_letters -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: prints what a replay of 10,000 letters costs"]
async fn a_replay_of_ten_thousand_letters_costs() {
    const LETTERS: usize = 10_000;
    for rate in [intake_core::app::DEFAULT_REPLAY_RATE, u32::MAX] {
        let broker = MemoryBroker::new();
        broker.create_topic("orders", 1).expect("topic");
        let sink = broker.dead_letter_sink("orders", "billing").expect("sink");
        for index in 0..LETTERS {
            let message = Message::new(
                format!("order {index} {}", "x".repeat(100)),
                Metadata::new("orders".into(), 0, Position::Offset(index as i64)),
            )
            .with_key(format!("k{}", index % 100));
            sink.write(&DeadLetter::new(message, "cannot bill", 1))
                .await
                .expect("write");
        }
        let console = Console::new(
            Health::default(),
            ConsoleSettings::default()
                .token(ConsoleToken::new(TOKEN).expect("token"))
                .replay_rate(rate),
        )
        .dead_letters(
            "orders",
            broker
                .dead_letter_store("orders", "billing")
                .expect("store"),
        );
        let listener = HealthListener::bind("127.0.0.1:0")
            .await
            .expect("bind")
            .request_timeout(Duration::from_secs(120));
        let address = listener.local_addr().expect("address");
        let serving = CancellationToken::new();
        let service = HealthService::new(console.health().clone()).with_console(console.clone());
        tokio::spawn(listener.serve(service, serving.clone()));

        let (wall, cpu) = (std::time::Instant::now(), cpu_time());
        let (status, dry) = post(
            address,
            &format!("{BASE}/replay"),
            &json!({"dry_run": true, "target": "origin"}),
        )
        .await;
        let (dry_wall, dry_cpu) = (wall.elapsed(), cpu.zip(cpu_time()).map(|(a, b)| b - a));
        assert_eq!(status, 200, "{dry}");
        assert_eq!(dry["letters"], LETTERS);
        let confirm = dry["confirm"].as_str().expect("confirm").to_owned();
        let (wall, cpu) = (std::time::Instant::now(), cpu_time());
        let (status, run) = post(
            address,
            &format!("{BASE}/replay"),
            &json!({"dry_run": false, "confirm": confirm}),
        )
        .await;
        let answered = wall.elapsed();
        if status == 202 {
            // A long run is answered at once and ends in the audit log.
            assert_eq!(run["running"], true, "{run}");
            let deadline = tokio::time::Instant::now() + PATIENCE * 12;
            while !console.audit_log().iter().any(|entry| {
                entry.action == "dead_letters.replay" && !entry.dry_run && entry.count.is_some()
            }) {
                assert!(tokio::time::Instant::now() < deadline, "the replay ends");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        } else {
            assert_eq!(
                (status, run["done"].as_u64()),
                (200, Some(LETTERS as u64)),
                "{run}"
            );
        }
        let (wall, cpu) = (wall.elapsed(), cpu.zip(cpu_time()).map(|(a, b)| b - a));
        let ended = console
            .audit_log()
            .into_iter()
            .find(|entry| entry.action == "dead_letters.replay" && !entry.dry_run)
            .expect("the run's entry");
        assert_eq!(
            (ended.count, ended.outcome.as_str()),
            (Some(LETTERS as u64), "done")
        );
        assert_eq!(
            broker.messages("orders", 0, 0).expect("messages").len(),
            LETTERS
        );
        let rate = if rate == u32::MAX {
            "unpaced".to_owned()
        } else {
            format!("{rate}/s")
        };
        println!(
            "10,000 letters, memory broker, rate {rate}: dry run {dry_wall:?} (CPU {dry_cpu:?}), \
             replay {wall:?} (CPU {cpu:?}, the process's user+system; answered {status} \
             after {answered:?})"
        );
        serving.cancel();
    }
}
