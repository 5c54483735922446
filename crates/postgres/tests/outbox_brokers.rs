//! The outbox relay against real brokers: a row the broker refuses (Redis
//! `WRONGTYPE`, a Kafka record over `message.max.bytes`) is moved out of
//! the way and everything else is published once; and after a failed
//! output, the rows of its key still reach the broker in id order.

mod common;

#[path = "../../kafka/tests/support/mod.rs"]
mod kafka_support;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use common::{database, unique};
use intake_core::Exponential;
use intake_core::publish::{Confirmation, Output, PublishError, PublishErrorKind, Publisher};
use intake_kafka::KafkaPublisher;
use intake_postgres::{OUTBOX_ID_HEADER, OutboxRelay, OutboxTable, RelaySettings};
use intake_redis_streams::RedisStreamsPublisher;
use kafka_support::KafkaBackend;
use redis::aio::MultiplexedConnection;
use sqlx::{AssertSqlSafe, PgPool, Row};

fn redis_url() -> String {
    std::env::var("INTAKE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A connection to Redis, or `None` after printing why the test is skipped
/// (a failure with `INTAKE_REQUIRE_BROKERS=1`).
async fn redis(test: &str) -> Option<MultiplexedConnection> {
    let connected = async {
        let client = redis::Client::open(redis_url())?;
        client.get_multiplexed_async_connection().await
    }
    .await;
    match connected {
        Ok(connection) => Some(connection),
        Err(error) => {
            let why = format!("Redis is not reachable at {}: {error}", redis_url());
            intake_core::backend::testkit::skip_or_fail(test, &why);
            None
        }
    }
}

async fn redis_publisher() -> RedisStreamsPublisher {
    RedisStreamsPublisher::builder(redis_url())
        .build()
        .await
        .expect("a Redis publisher")
}

/// A fresh, migrated outbox table.
async fn outbox_table(pool: &PgPool) -> OutboxTable {
    let table = OutboxTable::new(&unique("outbox")).expect("a valid table name");
    table.migrate(pool).await.expect("the outbox is created");
    table
}

/// Small batches, so that a refused row has batch-mates before and after
/// it; fast polls and retries.
fn quick() -> RelaySettings {
    RelaySettings {
        batch_size: 4,
        poll_interval: Duration::from_millis(10),
        confirm_timeout: Duration::from_secs(10),
        backoff: Exponential::new(Duration::from_millis(5), Duration::from_millis(50)),
        ..RelaySettings::default()
    }
}

/// Writes `outputs` to the outbox, outside any handler.
async fn write(pool: &PgPool, outbox: &OutboxTable, outputs: Vec<Output>) {
    let mut connection = pool.acquire().await.expect("a connection");
    outbox
        .write(&mut connection, outputs)
        .await
        .expect("the outputs are written");
}

/// Waits (at most 20 s) until the outbox is empty; whether it emptied.
async fn emptied(pool: &PgPool, outbox: &OutboxTable) -> bool {
    for _ in 0..400 {
        if outbox.count(pool).await.unwrap() == 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// One entry of a Redis stream: its outbox id and payload.
async fn stream_entries(redis: &mut MultiplexedConnection, stream: &str) -> Vec<(i64, String)> {
    let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query_async(redis)
        .await
        .expect("XRANGE");
    reply
        .ids
        .iter()
        .map(|entry| {
            let field = |name: &str| -> String {
                match entry.map.get(name) {
                    Some(redis::Value::BulkString(bytes)) => {
                        String::from_utf8_lossy(bytes).into_owned()
                    }
                    other => panic!("field {name} of {entry:?} is {other:?}"),
                }
            };
            let id = field(OUTBOX_ID_HEADER).parse().expect("a decimal id");
            (id, field("payload"))
        })
        .collect()
}

/// The rows of the failed table next to `outbox`: id, destination,
/// payload, error kind, error text, attempts.
async fn failed_rows(
    pool: &PgPool,
    outbox: &OutboxTable,
) -> Vec<(i64, String, Vec<u8>, String, String, i32)> {
    let sql = format!(
        "SELECT id, destination, payload, error_kind, error, attempts, failed_at <= now() AS failed_before_now \
         FROM \"{}_failed\" ORDER BY id",
        outbox.name()
    );
    sqlx::query(AssertSqlSafe(sql))
        .fetch_all(pool)
        .await
        .expect("the failed table can be read")
        .iter()
        .map(|row| {
            let failed_before_now: bool = row.get("failed_before_now");
            assert!(failed_before_now);
            (
                row.get("id"),
                row.get("destination"),
                row.get("payload"),
                row.get("error_kind"),
                row.get("error"),
                row.get("attempts"),
            )
        })
        .collect()
}

/// The outbox's row ids, in order.
async fn outbox_ids(pool: &PgPool, outbox: &OutboxTable) -> Vec<i64> {
    let sql = format!("SELECT id FROM \"{}\" ORDER BY id", outbox.name());
    sqlx::query_scalar(AssertSqlSafe(sql))
        .fetch_all(pool)
        .await
        .expect("the outbox can be read")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_redis_refuses_is_moved_to_the_failed_table_and_the_rest_is_published_once() {
    let test = "outbox: a row Redis refuses (WRONGTYPE)";
    let Some(pool) = database(test, 4).await else {
        return;
    };
    let Some(mut redis) = redis(test).await else {
        return;
    };
    let stream = unique("outbox-out");
    // A key that holds a string: every XADD to it is refused (WRONGTYPE).
    let wrong = unique("outbox-wrong");
    redis::cmd("SET")
        .arg(&wrong)
        .arg("not a stream")
        .query_async::<()>(&mut redis)
        .await
        .unwrap();
    let outbox = outbox_table(&pool).await;
    // Twelve rows of one key; the sixth goes to the string key. With
    // batches of 4 it has batch-mates before and after it.
    let outputs = (0..12)
        .map(|n| {
            let destination = if n == 5 { &wrong } else { &stream };
            Output::new(destination.as_str(), n.to_string()).with_key("k")
        })
        .collect();
    write(&pool, &outbox, outputs).await;
    let ids = outbox_ids(&pool, &outbox).await;

    let relay = OutboxRelay::spawn(
        pool.clone(),
        outbox.clone(),
        redis_publisher().await,
        quick(),
    )
    .unwrap();
    if !emptied(&pool, &outbox).await {
        panic!(
            "the outbox did not empty within 20 s: rows {:?} left; the stream holds {} \
             entries for 11 rows; {} failed batches",
            outbox_ids(&pool, &outbox).await,
            stream_entries(&mut redis, &stream).await.len(),
            relay.failed_batches(),
        );
    }
    // A few more polls: nothing may be published again.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(relay.failed_rows(), 1);
    assert_eq!(relay.published(), 11);
    relay.stop().await;

    let entries = stream_entries(&mut redis, &stream).await;
    let expected: Vec<(i64, String)> = ids
        .iter()
        .zip(0..)
        .filter(|(_, n)| *n != 5)
        .map(|(&id, n)| (id, n.to_string()))
        .collect();
    assert_eq!(entries, expected, "each row once, in id order");

    let failed = failed_rows(&pool, &outbox).await;
    assert_eq!(failed.len(), 1, "{failed:?}");
    let (id, destination, payload, kind, error, attempts) = &failed[0];
    assert_eq!(
        (*id, destination, &payload[..]),
        (ids[5], &wrong, &b"5"[..])
    );
    assert_eq!((kind.as_str(), *attempts), ("rejected", 1));
    assert!(error.contains("WRONGTYPE"), "{error}");

    // The operator's way back, as the docs give it: fix the destination,
    // then move the row back (same id) for the relay to publish.
    redis::cmd("DEL")
        .arg(&wrong)
        .query_async::<()>(&mut redis)
        .await
        .unwrap();
    let requeued = sqlx::query(AssertSqlSafe(outbox.requeue_sql()))
        .bind(ids[5])
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(requeued.rows_affected(), 1);
    assert_eq!(outbox_ids(&pool, &outbox).await, [ids[5]]);
    let relay = OutboxRelay::spawn(
        pool.clone(),
        outbox.clone(),
        redis_publisher().await,
        quick(),
    )
    .unwrap();
    assert!(
        emptied(&pool, &outbox).await,
        "the re-queued row was published"
    );
    relay.stop().await;
    assert_eq!(
        stream_entries(&mut redis, &wrong).await,
        [(ids[5], "5".to_owned())]
    );
    assert!(failed_rows(&pool, &outbox).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_kafka_refuses_as_too_large_is_moved_to_the_failed_table() {
    let test = "outbox: a record Kafka refuses (too large)";
    let Some(kafka) = KafkaBackend::real(test) else {
        return;
    };
    let Some(pool) = database(test, 4).await else {
        return;
    };
    let topic = unique("outbox-out");
    kafka.create_topic(&topic, 1).await.unwrap();
    let outbox = outbox_table(&pool).await;
    // Row 3 is 2 MiB, over the client's `message.max.bytes` (1,000,000):
    // refused when it is handed over, before any receipt.
    let outputs = (0..8)
        .map(|n| {
            let payload = if n == 3 {
                format!("3{}", " ".repeat(2 << 20))
            } else {
                n.to_string()
            };
            Output::new(topic.as_str(), payload).with_key("k")
        })
        .collect();
    write(&pool, &outbox, outputs).await;
    let ids = outbox_ids(&pool, &outbox).await;

    let publisher = KafkaPublisher::builder(kafka.settings())
        .build()
        .expect("a Kafka publisher");
    let relay = OutboxRelay::spawn(pool.clone(), outbox.clone(), publisher, quick()).unwrap();
    if !emptied(&pool, &outbox).await {
        panic!(
            "the outbox did not empty within 20 s: rows {:?} left; {} failed batches",
            outbox_ids(&pool, &outbox).await,
            relay.failed_batches(),
        );
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!((relay.published(), relay.failed_rows()), (7, 1));
    relay.stop().await;

    let records = kafka.read_all(&topic).await.unwrap();
    let read: Vec<(i64, String)> = records
        .iter()
        .map(|record| {
            let id = record
                .header(OUTBOX_ID_HEADER)
                .and_then(|id| id.parse().ok())
                .expect("an outbox id");
            (id, String::from_utf8_lossy(&record.payload).into_owned())
        })
        .collect();
    let expected: Vec<(i64, String)> = ids
        .iter()
        .zip(0..)
        .filter(|(_, n)| *n != 3)
        .map(|(&id, n)| (id, n.to_string()))
        .collect();
    assert_eq!(read, expected, "each row once, in id order");

    let failed = failed_rows(&pool, &outbox).await;
    assert_eq!(failed.len(), 1, "{failed:?}");
    let (id, destination, payload, kind, error, attempts) = &failed[0];
    assert_eq!(
        (*id, destination, payload.len()),
        (ids[3], &topic, 1 + (2 << 20))
    );
    assert_eq!((kind.as_str(), *attempts), ("rejected", 1));
    assert!(error.contains("too large"), "{error}");
}

/// A publisher that passes everything to Redis except the first send of
/// each chosen outbox row, which it answers as an unreachable broker would
/// (not sent, `Unavailable`), as a pipeline lost with its connection is.
struct FailsOnce {
    inner: RedisStreamsPublisher,
    failing: Mutex<Vec<i64>>,
}

type BoxedReceipt = Pin<Box<dyn Future<Output = Result<Confirmation, PublishError>> + Send>>;

impl Publisher for FailsOnce {
    type Receipt = BoxedReceipt;

    async fn send(&self, output: Output) -> Result<BoxedReceipt, PublishError> {
        let id: i64 = output
            .headers()
            .get_str(OUTBOX_ID_HEADER)
            .and_then(|id| id.parse().ok())
            .expect("an outbox id");
        let fail = {
            let mut failing = self.failing.lock().unwrap();
            let found = failing.iter().position(|&failing| failing == id);
            found.map(|at| failing.remove(at)).is_some()
        };
        if fail {
            let error = PublishError::new(
                PublishErrorKind::Unavailable,
                output.destination(),
                "injected: the connection was lost; publish again",
            );
            return Ok(Box::pin(async move { Err(error) }));
        }
        let receipt = self.inner.send(output).await?;
        Ok(Box::pin(receipt))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failed_output_its_key_reaches_redis_in_id_order_and_nothing_else_twice() {
    let test = "outbox: order after a failed output (Redis)";
    let Some(pool) = database(test, 4).await else {
        return;
    };
    let Some(mut redis) = redis(test).await else {
        return;
    };
    let stream = unique("outbox-order");
    let outbox = outbox_table(&pool).await;
    // Keys a and b alternate: a0 b1 a2 b3 ...
    let outputs = (0..16)
        .map(|n| {
            let key = if n % 2 == 0 { "a" } else { "b" };
            Output::new(stream.as_str(), format!("{key}{n}")).with_key(key)
        })
        .collect();
    write(&pool, &outbox, outputs).await;
    let ids = outbox_ids(&pool, &outbox).await;

    // The second row of the first batch (b1) and the first of the third
    // (a8) fail once.
    let publisher = FailsOnce {
        inner: redis_publisher().await,
        failing: Mutex::new(vec![ids[1], ids[8]]),
    };
    let relay = OutboxRelay::spawn(pool.clone(), outbox.clone(), publisher, quick()).unwrap();
    assert!(emptied(&pool, &outbox).await, "the outbox emptied");
    relay.stop().await;

    let entries = stream_entries(&mut redis, &stream).await;
    let mut per_key: HashMap<char, Vec<i64>> = HashMap::new();
    for (id, payload) in &entries {
        let key = payload.chars().next().unwrap();
        per_key.entry(key).or_default().push(*id);
    }
    for (key, seen) in &per_key {
        let mut sorted = seen.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(
            seen, &sorted,
            "key {key}: each row once, in id order (stream: {entries:?})"
        );
    }
    assert_eq!(entries.len(), 16, "{entries:?}");
}

/// Relays `rows` rows to `destination` (`keys` keys, or none) and prints
/// the rate.
async fn relay_rate<P: Publisher + Clone>(
    broker: &str,
    publisher: &P,
    destination: &str,
    rows: usize,
    keys: Option<usize>,
    key_order: bool,
) {
    let pool = database("outbox relay rate", 4).await.expect("PostgreSQL");
    let outbox = outbox_table(&pool).await;
    let outputs = (0..rows)
        .map(|n| {
            let output = Output::new(destination.to_owned(), n.to_string());
            match keys {
                Some(keys) => output.with_key(format!("k{}", n % keys)),
                None => output,
            }
        })
        .collect();
    write(&pool, &outbox, outputs).await;
    let settings = RelaySettings {
        poll_interval: Duration::from_millis(5),
        key_order,
        ..RelaySettings::default()
    };
    let started = std::time::Instant::now();
    let relay = OutboxRelay::spawn(pool, outbox, publisher.clone(), settings).unwrap();
    while relay.published() < rows as u64 {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "not within 300 s"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    relay.stop().await;
    println!(
        "{broker}: {rows} rows, keys {keys:?}, key_order {key_order}: {:.0} rows/s",
        rows as f64 / elapsed.as_secs_f64()
    );
}

/// What key order costs the relay, by key spread. A measurement, not a
/// check: `cargo test -p intake-postgres --all-features --test
/// outbox_brokers -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run it with --ignored --nocapture"]
async fn relay_rate_with_and_without_key_order() {
    let redis = redis_publisher().await;
    let stream = unique("outbox-rate");
    let kafka = KafkaBackend::real("outbox relay rate").expect("Kafka");
    let topic = unique("outbox-rate");
    kafka.create_topic(&topic, 4).await.unwrap();
    let kafka_publisher = KafkaPublisher::builder(kafka.settings()).build().unwrap();
    for keys in [Some(1), Some(64), None] {
        for key_order in [false, true] {
            relay_rate("redis", &redis, &stream, 5000, keys, key_order).await;
            // One key in key order waits for each confirmation (and
            // Kafka's linger.ms): fewer rows.
            let rows = if keys == Some(1) && key_order {
                500
            } else {
                5000
            };
            relay_rate("kafka", &kafka_publisher, &topic, rows, keys, key_order).await;
        }
    }
}
