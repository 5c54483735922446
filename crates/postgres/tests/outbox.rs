//! The outbox against a real PostgreSQL, published through the memory
//! broker's publisher: outputs commit with the handler's transaction, and
//! the relay publishes every row in id order, at least once, keeping the
//! rows until the broker confirmed them.

mod common;

use std::future::{Pending, pending};
use std::time::Duration;

use common::{Fixture, database, id_of, insert_effect, message, unique};
use intake_core::memory::{MemoryBroker, MemoryPublisher};
use intake_core::publish::{Confirmation, Output, PublishError, Publisher};
use intake_core::{Exponential, HandlerError, Message, Payload};
use intake_postgres::{OUTBOX_ID_HEADER, OutboxRelay, OutboxTable, RelaySettings, Tx};
use sqlx::PgPool;
use tower::{Service, ServiceExt};

/// A fresh, migrated outbox table.
async fn outbox_table(pool: &PgPool) -> OutboxTable {
    let table = OutboxTable::new(&unique("outbox")).expect("a valid table name");
    table.migrate(pool).await.expect("the outbox is created");
    // Idempotent: a second start-up finds it there.
    table
        .migrate(pool)
        .await
        .expect("migrating again is a no-op");
    table
}

/// A memory broker with one single-partition topic `audit`, so that the
/// order of the outputs is the order they were published in.
fn broker() -> MemoryBroker {
    let broker = MemoryBroker::new();
    broker.create_topic("audit", 1).expect("the topic is new");
    broker
}

/// Settings that keep a test short: small batches, fast polls and retries.
fn quick() -> RelaySettings {
    RelaySettings {
        batch_size: 4,
        poll_interval: Duration::from_millis(10),
        confirm_timeout: Duration::from_secs(5),
        backoff: Exponential::new(Duration::from_millis(5), Duration::from_millis(20)),
        ..RelaySettings::default()
    }
}

/// Writes outputs `ids` to `audit` outside any handler, each with key
/// `k<id>` and payload `<id>`.
async fn write_outputs(pool: &PgPool, outbox: &OutboxTable, ids: std::ops::Range<i64>) {
    let mut connection = pool.acquire().await.expect("a connection");
    let outputs: Vec<Output> = ids
        .map(|id| Output::new("audit", id.to_string()).with_key(format!("k{id}")))
        .collect();
    let count = outputs.len() as u64;
    let written = outbox.write(&mut connection, outputs).await.unwrap();
    assert_eq!(written, count);
}

/// The outbox row ids of what `audit` holds, in order.
fn published_ids(broker: &MemoryBroker) -> Vec<i64> {
    broker
        .messages("audit", 0, 0)
        .expect("the topic exists")
        .iter()
        .map(outbox_id)
        .collect()
}

fn outbox_id(message: &Message) -> i64 {
    message
        .headers()
        .get_str(OUTBOX_ID_HEADER)
        .and_then(|id| id.parse().ok())
        .expect("every output carries its outbox id")
}

fn payloads(broker: &MemoryBroker) -> Vec<String> {
    broker
        .messages("audit", 0, 0)
        .expect("the topic exists")
        .iter()
        .map(|message| String::from_utf8_lossy(message.payload()).into_owned())
        .collect()
}

async fn call<S>(service: &mut S, message: Message) -> Result<(), HandlerError>
where
    S: Service<Message, Response = (), Error = HandlerError>,
{
    service.ready().await?.call(message).await
}

/// Waits (bounded) until `done` holds.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("not within 5 s: {what}");
}

#[tokio::test]
async fn outputs_are_in_the_outbox_only_when_the_handler_commits() {
    let Some(db) = Fixture::new("outbox commits with the handler").await else {
        return;
    };
    let outbox = outbox_table(&db.pool).await;
    let effects = db.effects.clone();
    let writes = outbox.clone();
    let mut service = db
        .billing()
        .handler(
            async move |mut tx: Tx, Payload(body): Payload| -> Result<(), HandlerError> {
                let id = id_of(&body)?;
                insert_effect(&mut tx, &effects, id.abs())
                    .await
                    .map_err(intake_postgres::handler_error)?;
                let outputs = vec![
                    Output::new("audit", format!("{id}.a")),
                    Output::new("audit", format!("{id}.b")),
                ];
                writes
                    .write(&mut tx, outputs)
                    .await
                    .map_err(intake_postgres::handler_error)?;
                // A negative id fails after writing: nothing may stay.
                if id < 0 {
                    return Err(HandlerError::retryable("refused after writing outputs"));
                }
                Ok(())
            },
        )
        .unwrap();

    call(&mut service, message("orders", 0, 1, 1))
        .await
        .unwrap();
    assert!(
        call(&mut service, message("orders", 0, 2, -2))
            .await
            .is_err()
    );
    // Offset 1 again: a redelivery, skipped by its marker.
    call(&mut service, message("orders", 0, 1, 1))
        .await
        .unwrap();

    assert_eq!(outbox.count(&db.pool).await.unwrap(), 2);
    assert_eq!(db.effects().await, 1);
    assert_eq!(service.counters().duplicates(), 1);
    let broker = broker();
    let relay =
        OutboxRelay::new(db.pool.clone(), outbox, broker.memory_publisher(), quick()).unwrap();
    assert_eq!(relay.relay_batch().await.unwrap().published, 2);
    assert_eq!(payloads(&broker), ["1.a", "1.b"]);
}

#[tokio::test]
async fn the_relay_publishes_every_row_in_id_order_with_its_id_and_empties_the_outbox() {
    let Some(pool) = database("outbox relay order", 4).await else {
        return;
    };
    let outbox = outbox_table(&pool).await;
    // Headers keep their order, repeated names and bytes that are not
    // UTF-8; a key is kept, and its absence too.
    let mut connection = pool.acquire().await.expect("a connection");
    let first = Output::new("audit", vec![0u8, 0xff])
        .with_header("b", vec![0xc3u8, 0x28])
        .with_header("a", "1")
        .with_header("b", Vec::<u8>::new());
    outbox.write(&mut connection, first).await.unwrap();
    drop(connection);
    write_outputs(&pool, &outbox, 1..11).await;

    let broker = broker();
    let relay = OutboxRelay::spawn(
        pool.clone(),
        outbox.clone(),
        broker.memory_publisher(),
        quick(),
    )
    .unwrap();
    eventually("11 rows published", || relay.published() == 11).await;
    relay.stop().await;

    let published = broker.messages("audit", 0, 0).unwrap();
    let ids: Vec<i64> = published.iter().map(outbox_id).collect();
    assert_eq!(ids.len(), 11);
    assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "{ids:?}");
    assert_eq!(outbox.count(&pool).await.unwrap(), 0);

    let headers: Vec<(&str, &[u8])> = published[0]
        .headers()
        .iter()
        .map(|header| (&*header.name, &*header.value))
        .collect();
    let first_id = ids[0].to_string();
    assert_eq!(
        headers,
        [
            ("b", &[0xc3, 0x28][..]),
            ("a", b"1"),
            ("b", b""),
            (OUTBOX_ID_HEADER, first_id.as_bytes()),
        ]
    );
    assert_eq!(&published[0].payload()[..], [0, 0xff]);
    assert_eq!(published[0].key(), None);
    assert_eq!(
        published[1..]
            .iter()
            .map(|message| message.key().map(|key| key.to_vec()))
            .collect::<Vec<_>>(),
        (1..11)
            .map(|id| Some(format!("k{id}").into_bytes()))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        payloads(&broker)[1..],
        (1..11).map(|id| id.to_string()).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn rows_not_confirmed_stay_and_only_they_are_published_again() {
    let Some(pool) = database("outbox relay failures", 4).await else {
        return;
    };
    let outbox = outbox_table(&pool).await;
    write_outputs(&pool, &outbox, 0..6).await;
    let broker = broker();
    let publisher = broker.memory_publisher();

    // The first output is not stored. The three after it (other keys)
    // were sent with it and are confirmed: they are deleted, not sent
    // again.
    publisher.fail_next(1);
    let once = OutboxRelay::new(pool.clone(), outbox.clone(), publisher.clone(), quick()).unwrap();
    let error = once.relay_batch().await.unwrap_err();
    assert!(error.is_transient(), "{error}");
    assert_eq!(outbox.count(&pool).await.unwrap(), 3);
    assert_eq!(payloads(&broker), ["1", "2", "3"]);

    // The running relay retries after its backoff until the broker takes
    // them.
    publisher.fail_next(2);
    let relay = once.start();
    eventually("the 3 others published", || relay.published() == 3).await;
    assert_eq!(relay.failed_batches(), 1);
    assert_eq!(relay.consecutive_failed_batches(), 0);
    relay.stop().await;

    assert_eq!(outbox.count(&pool).await.unwrap(), 0);
    assert_eq!(payloads(&broker), ["1", "2", "3", "5", "0", "4"]);
    let mut ids = published_ids(&broker);
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 6, "each row once");
}

/// Writes outputs `ids` to `audit`, all with key `k`.
async fn write_one_key(pool: &PgPool, outbox: &OutboxTable, ids: std::ops::Range<i64>) {
    let mut connection = pool.acquire().await.expect("a connection");
    let outputs: Vec<Output> = ids
        .map(|id| Output::new("audit", id.to_string()).with_key("k"))
        .collect();
    outbox.write(&mut connection, outputs).await.unwrap();
}

#[tokio::test]
async fn after_a_failed_output_the_rows_of_its_key_reach_the_broker_in_id_order_once() {
    let Some(pool) = database("outbox key order after a failure", 4).await else {
        return;
    };
    let outbox = outbox_table(&pool).await;
    write_one_key(&pool, &outbox, 0..8).await;
    let broker = broker();
    let publisher = broker.memory_publisher();

    // The first row is not stored: nothing of its key is sent after it
    // until it is confirmed.
    publisher.fail_next(1);
    let relay =
        OutboxRelay::spawn(pool.clone(), outbox.clone(), publisher.clone(), quick()).unwrap();
    eventually("8 rows published", || relay.published() == 8).await;
    assert_eq!(relay.failed_batches(), 1);
    relay.stop().await;
    assert_eq!(payloads(&broker), ["0", "1", "2", "3", "4", "5", "6", "7"]);
}

#[tokio::test]
async fn without_key_order_the_rows_after_a_failed_one_of_its_key_go_again_after_it() {
    let Some(pool) = database("outbox without key order", 4).await else {
        return;
    };
    let outbox = outbox_table(&pool).await;
    write_one_key(&pool, &outbox, 0..8).await;
    let broker = broker();
    let publisher = broker.memory_publisher();

    // All four are sent at once; the first is not stored, the three
    // after it are. They stay and go out again after it, so that the
    // last copy of each row is in id order; the first copies are not.
    publisher.fail_next(1);
    let pipelined = RelaySettings {
        key_order: false,
        ..quick()
    };
    let relay =
        OutboxRelay::spawn(pool.clone(), outbox.clone(), publisher.clone(), pipelined).unwrap();
    eventually("8 rows published", || relay.published() == 8).await;
    relay.stop().await;
    assert_eq!(
        payloads(&broker),
        ["1", "2", "3", "0", "1", "2", "3", "4", "5", "6", "7"]
    );
}

/// The ids and error kinds of the failed table, in id order.
async fn failed(pool: &PgPool, outbox: &OutboxTable) -> Vec<(i64, String, String, i32)> {
    let sql = format!(
        "SELECT id, error_kind, error, attempts FROM \"{}\" ORDER BY id",
        outbox.failed_name()
    );
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .fetch_all(pool)
        .await
        .expect("the failed table can be read")
}

#[tokio::test]
async fn a_row_the_broker_refuses_is_moved_to_the_failed_table_and_the_others_go_on() {
    let Some(pool) = database("outbox refused row", 4).await else {
        return;
    };
    let outbox = outbox_table(&pool).await;
    let mut connection = pool.acquire().await.expect("a connection");
    // The second row is for a topic the broker does not have: refused.
    let outputs = vec![
        Output::new("audit", "0").with_key("a"),
        Output::new("nowhere", "1").with_key("b"),
        Output::new("audit", "2").with_key("b"),
        Output::new("audit", "3").with_key("c"),
    ];
    outbox.write(&mut connection, outputs).await.unwrap();
    drop(connection);
    let broker = broker();
    let publisher = broker.memory_publisher();

    // The first two fail once (not stored); the others, of other
    // destinations and keys, are published.
    publisher.fail_next(2);
    let relay = OutboxRelay::new(pool.clone(), outbox.clone(), publisher, quick()).unwrap();
    assert!(relay.relay_batch().await.is_err());
    assert_eq!(outbox.count(&pool).await.unwrap(), 2);
    // Then the refused one leaves the outbox, after two attempts.
    let batch = relay.relay_batch().await.unwrap();
    assert_eq!((batch.published, batch.failed), (1, 1));
    assert_eq!(outbox.count(&pool).await.unwrap(), 0);
    assert_eq!(outbox.failed_count(&pool).await.unwrap(), 1);
    assert_eq!(payloads(&broker), ["2", "3", "0"]);
    let failed = failed(&pool, &outbox).await;
    let (id, kind, error, attempts) = &failed[0];
    assert_eq!((kind.as_str(), *attempts), ("rejected", 2), "{failed:?}");
    assert!(error.contains("nowhere"), "{error}");
    assert_eq!(*id, published_ids(&broker)[2] + 1);
}

#[tokio::test]
async fn a_row_the_relay_cannot_read_is_moved_to_the_failed_table() {
    let Some(pool) = database("outbox unreadable row", 4).await else {
        return;
    };
    let outbox = outbox_table(&pool).await;
    write_outputs(&pool, &outbox, 0..1).await;
    // Written by hand: a NULL header name, which no output can carry.
    let sql = format!(
        "INSERT INTO \"{}\" (destination, payload, header_names, header_values) \
         VALUES ('audit', 'x', ARRAY[NULL]::text[], ARRAY['v']::bytea[])",
        outbox.name()
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(&pool)
        .await
        .unwrap();
    write_outputs(&pool, &outbox, 2..3).await;
    let broker = broker();

    let relay = OutboxRelay::spawn(
        pool.clone(),
        outbox.clone(),
        broker.memory_publisher(),
        quick(),
    )
    .unwrap();
    eventually("2 rows published, 1 moved", || {
        relay.published() == 2 && relay.failed_rows() == 1
    })
    .await;
    assert_eq!(relay.failed_batches(), 0);
    relay.stop().await;
    assert_eq!(payloads(&broker), ["0", "2"]);
    let failed = failed(&pool, &outbox).await;
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!((failed[0].1.as_str(), failed[0].3), ("unreadable", 1));
}

#[tokio::test]
async fn without_its_failed_table_a_refused_row_stays_and_the_confirmed_ones_are_not_sent_again() {
    let Some(pool) = database("outbox without its failed table", 4).await else {
        return;
    };
    let outbox = outbox_table(&pool).await;
    // An outbox made before the failed table existed.
    let sql = format!("DROP TABLE \"{}\"", outbox.failed_name());
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(&pool)
        .await
        .unwrap();
    let mut connection = pool.acquire().await.expect("a connection");
    let outputs = vec![
        Output::new("audit", "0"),
        Output::new("nowhere", "1"),
        Output::new("audit", "2"),
    ];
    outbox.write(&mut connection, outputs).await.unwrap();
    drop(connection);
    let broker = broker();
    let relay = OutboxRelay::new(
        pool.clone(),
        outbox.clone(),
        broker.memory_publisher(),
        quick(),
    )
    .unwrap();

    let error = relay.relay_batch().await.unwrap_err();
    assert!(!error.is_transient(), "{error}");
    assert!(
        error.to_string().contains("OutboxTable::migrate"),
        "{error}"
    );
    assert_eq!(outbox.count(&pool).await.unwrap(), 1);
    // Migrated (as at the next start): the row moves.
    outbox.migrate(&pool).await.unwrap();
    let batch = relay.relay_batch().await.unwrap();
    assert_eq!((batch.published, batch.failed), (0, 1));
    assert_eq!(payloads(&broker), ["0", "2"]);
    assert_eq!(outbox.failed_count(&pool).await.unwrap(), 1);
}

#[tokio::test]
async fn the_longest_table_name_gets_its_failed_table() {
    let Some(pool) = database("outbox longest name", 4).await else {
        return;
    };
    let name = unique("outbox");
    let name = format!("{name}{}", "x".repeat(49 - name.len()));
    let outbox = OutboxTable::new(&name).unwrap();
    assert!(OutboxTable::new(&format!("{name}x")).is_err());
    outbox.migrate(&pool).await.unwrap();
    assert_eq!(outbox.failed_name(), format!("{name}_failed"));
    assert_eq!(outbox.failed_count(&pool).await.unwrap(), 0);
}

/// Publishes through the memory broker, then never confirms: the broker
/// has the output, the relay does not know it.
struct ConfirmsNever(MemoryPublisher);

impl Publisher for ConfirmsNever {
    type Receipt = Pending<Result<Confirmation, PublishError>>;

    async fn send(&self, output: Output) -> Result<Self::Receipt, PublishError> {
        self.0.publish(output).await?;
        Ok(pending())
    }
}

#[tokio::test]
async fn a_relay_killed_before_its_commit_publishes_the_rows_again_with_the_same_ids() {
    let Some(pool) = database("outbox relay killed", 4).await else {
        return;
    };
    let outbox = outbox_table(&pool).await;
    write_outputs(&pool, &outbox, 0..3).await;
    let broker = broker();

    // Killed (its task aborted) while it waits for the confirmations of a
    // batch the broker already has.
    let hanging = OutboxRelay::new(
        pool.clone(),
        outbox.clone(),
        ConfirmsNever(broker.memory_publisher()),
        quick(),
    )
    .unwrap();
    let killed = tokio::spawn(async move { hanging.relay_batch().await });
    eventually("the batch reached the broker", || {
        published_ids(&broker).len() == 3
    })
    .await;
    killed.abort();
    assert!(killed.await.unwrap_err().is_cancelled());

    // Stopped gracefully while waiting: the batch ends at its confirm
    // timeout and rolls back.
    let impatient = RelaySettings {
        confirm_timeout: Duration::from_millis(50),
        ..quick()
    };
    let stopped = OutboxRelay::spawn(
        pool.clone(),
        outbox.clone(),
        ConfirmsNever(broker.memory_publisher()),
        impatient,
    )
    .unwrap();
    eventually("the batch reached the broker again", || {
        published_ids(&broker).len() == 6
    })
    .await;
    stopped.stop().await;
    assert_eq!(outbox.count(&pool).await.unwrap(), 3);

    // Restarted with a publisher that confirms: the rows go out once more
    // and only then leave the outbox.
    let relay = OutboxRelay::spawn(
        pool.clone(),
        outbox.clone(),
        broker.memory_publisher(),
        quick(),
    )
    .unwrap();
    eventually("3 rows published", || relay.published() == 3).await;
    relay.stop().await;
    assert_eq!(outbox.count(&pool).await.unwrap(), 0);

    let ids = published_ids(&broker);
    assert_eq!(ids.len(), 9, "{ids:?}");
    assert_eq!(ids[0..3], ids[3..6]);
    assert_eq!(ids[0..3], ids[6..9]);
    assert_eq!(payloads(&broker)[6..], ["0", "1", "2"]);
}

/// Publishes through the memory broker and confirms 50 ms later.
struct ConfirmsSlowly(MemoryPublisher);

impl Publisher for ConfirmsSlowly {
    type Receipt = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Confirmation, PublishError>> + Send>,
    >;

    async fn send(&self, output: Output) -> Result<Self::Receipt, PublishError> {
        let confirmation = self.0.publish(output).await;
        Ok(Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            confirmation
        }))
    }
}

#[tokio::test]
async fn a_batch_of_one_key_ends_at_its_deadline_and_the_next_one_goes_on() {
    let Some(pool) = database("outbox batch deadline", 4).await else {
        return;
    };
    let outbox = outbox_table(&pool).await;
    write_one_key(&pool, &outbox, 0..20).await;
    let broker = broker();
    // One confirmation at a time, each 50 ms at least: at most 10 rows
    // are sent within the batch's 500 ms.
    let settings = RelaySettings {
        batch_size: 20,
        confirm_timeout: Duration::from_millis(500),
        ..quick()
    };
    let relay = OutboxRelay::new(
        pool.clone(),
        outbox.clone(),
        ConfirmsSlowly(broker.memory_publisher()),
        settings,
    )
    .unwrap();
    let first = relay.relay_batch().await.unwrap().published;
    assert!((1..=10).contains(&first), "{first}");
    let mut published = first;
    for _ in 0..20 {
        if published == 20 {
            break;
        }
        published += relay.relay_batch().await.unwrap().published;
    }
    assert_eq!(published, 20);
    assert_eq!(
        payloads(&broker),
        (0..20).map(|n| n.to_string()).collect::<Vec<_>>()
    );
}
