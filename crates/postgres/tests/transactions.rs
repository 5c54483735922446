//! The exactly-once service against a real PostgreSQL, called directly:
//! duplicates, rollbacks, and which database errors are retryable.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{database, effects_table, id_of, marker_table, message, rows, tagged_message};
use intake_core::{ErrorClass, HandlerError, Json, Message, Payload};
use intake_postgres::{ExactlyOnce, ExactlyOnceError, IsolationLevel, MessageId, Tx, exactly_once};
use sqlx::{AssertSqlSafe, PgPool};
use tokio::sync::Barrier;
use tower::{Service, ServiceExt};

/// Inserts `id` into the effects table `table`.
async fn insert_effect(tx: &mut Tx, table: &str, id: i64) -> Result<(), sqlx::Error> {
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} (id) VALUES ($1)"
    )))
    .bind(id)
    .execute(&mut **tx)
    .await
    .map(drop)
}

async fn call<S>(service: &mut S, message: Message) -> Result<(), HandlerError>
where
    S: Service<Message, Response = (), Error = HandlerError>,
{
    service.ready().await?.call(message).await
}

async fn markers(pool: &PgPool, table: &intake_postgres::MarkerTable, group: &str) -> u64 {
    table
        .count(pool, group)
        .await
        .expect("markers can be counted")
}

#[tokio::test]
async fn a_redelivered_message_runs_its_effects_once_and_is_counted_as_a_duplicate() {
    let Some(pool) = database("redelivered message", 4).await else {
        return;
    };
    let table = marker_table(&pool).await;
    let effects = effects_table(&pool).await;
    let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let handler_runs = Arc::clone(&runs);
    let mut service = ExactlyOnce::builder(pool.clone(), "billing")
        .table(table.clone())
        .handler(async move |mut tx: Tx, Payload(payload): Payload| {
            handler_runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            insert_effect(&mut tx, &effects, id_of(&payload)?).await?;
            Ok::<_, intake_core::BoxError>(())
        })
        .unwrap();

    call(&mut service, message("orders", 0, 7, 70))
        .await
        .unwrap();
    // The broker delivers it again: the commit happened, the ack did not.
    call(&mut service, message("orders", 0, 7, 70))
        .await
        .unwrap();

    assert_eq!(runs.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(service.stats().processed(), 1);
    assert_eq!(service.stats().duplicates(), 1);
    assert_eq!(markers(&pool, &table, "billing").await, 1);
}

#[tokio::test]
async fn the_same_position_in_another_group_or_partition_is_another_message() {
    let Some(pool) = database("identity", 4).await else {
        return;
    };
    let table = marker_table(&pool).await;
    let service = |group: &'static str| {
        ExactlyOnce::builder(pool.clone(), group)
            .table(table.clone())
            .handler(async |_tx: Tx| {})
            .unwrap()
    };
    let (mut billing, mut shipping) = (service("billing"), service("shipping"));
    call(&mut billing, message("orders", 0, 1, 1))
        .await
        .unwrap();
    call(&mut billing, message("orders", 1, 1, 1))
        .await
        .unwrap();
    call(&mut billing, message("returns", 0, 1, 1))
        .await
        .unwrap();
    call(&mut shipping, message("orders", 0, 1, 1))
        .await
        .unwrap();
    assert_eq!(billing.stats().processed(), 3);
    assert_eq!(shipping.stats().processed(), 1);
    assert_eq!(
        billing.stats().duplicates() + shipping.stats().duplicates(),
        0
    );
}

#[tokio::test]
async fn a_failed_handler_rolls_back_its_writes_and_the_marker_so_the_retry_runs() {
    let Some(pool) = database("rollback", 4).await else {
        return;
    };
    let table = marker_table(&pool).await;
    let effects = effects_table(&pool).await;
    let fail_first = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let handler_effects = effects.clone();
    let mut service = ExactlyOnce::builder(pool.clone(), "billing")
        .table(table.clone())
        .handler(async move |mut tx: Tx, Payload(payload): Payload| {
            insert_effect(&mut tx, &handler_effects, id_of(&payload)?)
                .await
                .map_err(intake_postgres::handler_error)?;
            if fail_first.swap(false, std::sync::atomic::Ordering::Relaxed) {
                return Err(HandlerError::retryable("inventory service down"));
            }
            Ok(())
        })
        .unwrap();

    let error = call(&mut service, message("orders", 0, 3, 30))
        .await
        .unwrap_err();
    assert!(error.is_retryable());
    assert_eq!(rows(&pool, &effects).await, 0);
    assert_eq!(markers(&pool, &table, "billing").await, 0);
    assert_eq!(service.stats().rolled_back(), 1);

    call(&mut service, message("orders", 0, 3, 30))
        .await
        .unwrap();
    assert_eq!(rows(&pool, &effects).await, 1);
    assert_eq!(markers(&pool, &table, "billing").await, 1);
}

#[tokio::test]
async fn a_constraint_violation_in_the_handlers_writes_is_permanent() {
    let Some(pool) = database("constraint violation", 4).await else {
        return;
    };
    let table = marker_table(&pool).await;
    let effects = effects_table(&pool).await;
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {effects} (id) VALUES (5)"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let mut service = ExactlyOnce::builder(pool.clone(), "billing")
        .table(table.clone())
        .handler(async move |mut tx: Tx, Payload(payload): Payload| {
            insert_effect(&mut tx, &effects, id_of(&payload)?).await?;
            Ok::<_, intake_core::BoxError>(())
        })
        .unwrap();

    let error = call(&mut service, message("orders", 0, 1, 5))
        .await
        .unwrap_err();
    assert_eq!(error.class(), ErrorClass::Permanent, "{error}");
    let database = error
        .cause()
        .downcast_ref::<sqlx::Error>()
        .and_then(|error| error.as_database_error())
        .and_then(|error| error.code())
        .map(|code| code.into_owned());
    assert_eq!(database.as_deref(), Some("23505"));
    assert_eq!(markers(&pool, &table, "billing").await, 0);
}

#[tokio::test]
async fn serialization_failures_are_retryable() {
    let Some(pool) = database("serialization failure", 4).await else {
        return;
    };
    let table = marker_table(&pool).await;
    let effects = effects_table(&pool).await;
    // Write skew: each transaction reads the count, then inserts. Under
    // SERIALIZABLE one of two that overlap must fail with 40001.
    let both_read = Arc::new(Barrier::new(2));
    let service = ExactlyOnce::builder(pool.clone(), "billing")
        .table(table.clone())
        .isolation(IsolationLevel::Serializable)
        .handler(async move |mut tx: Tx, Payload(payload): Payload| {
            let seen: i64 =
                sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {effects}")))
                    .fetch_one(&mut *tx)
                    .await?;
            both_read.wait().await;
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {effects} (id, note) VALUES ($1, $2)"
            )))
            .bind(id_of(&payload)?)
            .bind(seen.to_string())
            .execute(&mut *tx)
            .await?;
            Ok::<_, intake_core::BoxError>(())
        })
        .unwrap();

    let (first, second) = tokio::join!(
        service.clone().oneshot(message("orders", 0, 1, 1)),
        service.clone().oneshot(message("orders", 0, 2, 2)),
    );
    let failures: Vec<HandlerError> = [first, second]
        .into_iter()
        .filter_map(Result::err)
        .collect();
    assert_eq!(
        failures.len(),
        1,
        "exactly one of two skewed transactions fails"
    );
    assert!(failures[0].is_retryable(), "{}", failures[0]);
    assert!(
        failures[0].to_string().contains("40001") || failures[0].to_string().contains("serializ"),
        "{}",
        failures[0]
    );
    assert_eq!(markers(&pool, &table, "billing").await, 1);
}

#[tokio::test]
async fn deadlocks_are_retryable_and_the_survivor_commits() {
    let Some(pool) = database("deadlock", 4).await else {
        return;
    };
    let table = marker_table(&pool).await;
    let effects = effects_table(&pool).await;
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {effects} (id, note) VALUES (1, ''), (2, '')"
    )))
    .execute(&pool)
    .await
    .unwrap();
    // Message 1 locks row 1 then row 2; message 2 locks row 2 then row 1.
    let both_locked = Arc::new(Barrier::new(2));
    let service = ExactlyOnce::builder(pool.clone(), "billing")
        .table(table.clone())
        .handler(async move |mut tx: Tx, Payload(payload): Payload| {
            let first = id_of(&payload)?;
            let update = format!("UPDATE {effects} SET note = note || 'x' WHERE id = $1");
            sqlx::query(AssertSqlSafe(update.clone()))
                .bind(first)
                .execute(&mut *tx)
                .await?;
            both_locked.wait().await;
            sqlx::query(AssertSqlSafe(update))
                .bind(3 - first)
                .execute(&mut *tx)
                .await?;
            Ok::<_, intake_core::BoxError>(())
        })
        .unwrap();

    let (first, second) = tokio::join!(
        service.clone().oneshot(message("orders", 0, 1, 1)),
        service.clone().oneshot(message("orders", 0, 2, 2)),
    );
    let failures: Vec<HandlerError> = [first, second]
        .into_iter()
        .filter_map(Result::err)
        .collect();
    assert_eq!(
        failures.len(),
        1,
        "the deadlock detector aborts one transaction"
    );
    assert!(failures[0].is_retryable(), "{}", failures[0]);
    assert!(
        failures[0].to_string().contains("deadlock"),
        "{}",
        failures[0]
    );
    assert_eq!(markers(&pool, &table, "billing").await, 1);
}

#[tokio::test]
async fn a_connection_lost_mid_transaction_is_retryable_and_leaves_no_marker() {
    let Some(pool) = database("lost connection", 4).await else {
        return;
    };
    let table = marker_table(&pool).await;
    let mut service = ExactlyOnce::builder(pool.clone(), "billing")
        .table(table.clone())
        .handler(async |mut tx: Tx| {
            sqlx::query("SELECT pg_terminate_backend(pg_backend_pid())")
                .execute(&mut *tx)
                .await?;
            Ok::<_, sqlx::Error>(())
        })
        .unwrap();
    let error = call(&mut service, message("orders", 0, 1, 1))
        .await
        .unwrap_err();
    assert!(error.is_retryable(), "{error}");
    assert_eq!(markers(&pool, &table, "billing").await, 0);
}

#[tokio::test]
async fn an_unreachable_database_is_retryable() {
    // No server listens on port 1; the pool is lazy, so the first message
    // finds out.
    let pool = intake_postgres::PoolConfig::new("postgres://app:secret@127.0.0.1:1/test")
        .unwrap()
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy()
        .unwrap();
    let mut service = exactly_once(pool, "billing", async |_tx: Tx| {}).unwrap();
    let error = call(&mut service, message("orders", 0, 1, 1))
        .await
        .unwrap_err();
    assert!(error.is_retryable(), "{error}");
    assert!(
        matches!(
            error.cause().downcast_ref::<ExactlyOnceError>(),
            Some(ExactlyOnceError::Begin(_))
        ),
        "{error:?}"
    );
    assert!(!format!("{error:?}").contains("secret"));
}

#[tokio::test]
async fn a_header_message_id_recognises_a_redelivery_under_a_new_delivery_tag() {
    let Some(pool) = database("header message id", 4).await else {
        return;
    };
    let table = marker_table(&pool).await;
    let mut service = ExactlyOnce::builder(pool.clone(), "billing")
        .table(table.clone())
        .message_id(MessageId::header("message-id"))
        .handler(async |_tx: Tx| {})
        .unwrap();
    call(&mut service, tagged_message("orders", 1, "order-1"))
        .await
        .unwrap();
    // AMQP redelivers with a new tag on a new channel.
    call(&mut service, tagged_message("orders", 9, "order-1"))
        .await
        .unwrap();
    call(&mut service, tagged_message("orders", 10, "order-2"))
        .await
        .unwrap();
    assert_eq!(service.stats().processed(), 2);
    assert_eq!(service.stats().duplicates(), 1);

    let missing = call(&mut service, message("orders", 0, 1, 1))
        .await
        .unwrap_err();
    assert!(missing.is_permanent(), "{missing}");
}

#[tokio::test]
async fn a_tx_that_outlives_its_handler_fails_the_message_permanently() {
    let Some(pool) = database("escaped tx", 4).await else {
        return;
    };
    let table = marker_table(&pool).await;
    let (keep, kept) = tokio::sync::oneshot::channel::<Tx>();
    let keep = Arc::new(std::sync::Mutex::new(Some(keep)));
    let mut service = ExactlyOnce::builder(pool.clone(), "billing")
        .table(table.clone())
        .handler(async move |tx: Tx| {
            if let Some(keep) = keep.lock().unwrap().take() {
                let _ = keep.send(tx);
            }
        })
        .unwrap();
    let error = call(&mut service, message("orders", 0, 1, 1))
        .await
        .unwrap_err();
    assert!(error.is_permanent(), "{error}");
    assert!(error.to_string().contains("outlived"), "{error}");
    drop(kept);
    assert_eq!(markers(&pool, &table, "billing").await, 0);
}

#[tokio::test]
async fn a_payload_that_does_not_decode_fails_before_any_database_work() {
    #[derive(serde::Deserialize)]
    struct Order {
        #[allow(dead_code)]
        id: i64,
    }
    let Some(pool) = database("undecodable payload", 4).await else {
        return;
    };
    let table = marker_table(&pool).await;
    let mut service = ExactlyOnce::builder(pool.clone(), "billing")
        .table(table.clone())
        .handler(async |_tx: Tx, Json(_order): Json<Order>| {})
        .unwrap();
    let error = call(&mut service, message("orders", 0, 1, 1))
        .await
        .unwrap_err();
    assert!(error.is_permanent(), "{error}");
    assert_eq!(markers(&pool, &table, "billing").await, 0);
}

#[tokio::test]
async fn two_copies_running_at_once_commit_their_effects_once() {
    let Some(pool) = database("concurrent copies", 4).await else {
        return;
    };
    let table = marker_table(&pool).await;
    let effects = effects_table(&pool).await;
    let handler_effects = effects.clone();
    let service = ExactlyOnce::builder(pool.clone(), "billing")
        .table(table.clone())
        .handler(async move |mut tx: Tx, Payload(payload): Payload| {
            // Hold the transaction open, so that the copy arrives while the
            // first has inserted its marker but not committed.
            tokio::time::sleep(Duration::from_millis(100)).await;
            insert_effect(&mut tx, &handler_effects, id_of(&payload)?).await?;
            Ok::<_, intake_core::BoxError>(())
        })
        .unwrap();
    let (first, second) = tokio::join!(
        service.clone().oneshot(message("orders", 0, 4, 40)),
        service.clone().oneshot(message("orders", 0, 4, 40)),
    );
    first.unwrap();
    second.unwrap();
    assert_eq!(rows(&pool, &effects).await, 1);
    assert_eq!(service.stats().processed(), 1);
    assert_eq!(service.stats().duplicates(), 1);
}

#[tokio::test]
async fn migrating_twice_and_from_many_tasks_at_once_is_safe() {
    let Some(pool) = database("concurrent migration", 8).await else {
        return;
    };
    let table = intake_postgres::MarkerTable::new(&common::unique("markers")).unwrap();
    let migrations: Vec<_> = (0..6)
        .map(|_| {
            let (pool, table) = (pool.clone(), table.clone());
            tokio::spawn(async move { table.migrate(&pool).await })
        })
        .collect();
    for migration in migrations {
        migration.await.unwrap().unwrap();
    }
    table.migrate(&pool).await.unwrap();
    assert_eq!(table.count(&pool, "any").await.unwrap(), 0);
}

#[tokio::test]
async fn the_counters_are_exported_to_prometheus() {
    let Some(pool) = database("prometheus counters", 4).await else {
        return;
    };
    let table = marker_table(&pool).await;
    let mut service = ExactlyOnce::builder(pool.clone(), "billing")
        .table(table)
        .handler(async |_tx: Tx| {})
        .unwrap();
    let registry = prometheus::Registry::new();
    service.stats().register(&registry, "billing").unwrap();
    call(&mut service, message("orders", 0, 1, 1))
        .await
        .unwrap();
    call(&mut service, message("orders", 0, 1, 1))
        .await
        .unwrap();

    let families = registry.gather();
    let family = families
        .iter()
        .find(|family| family.name() == "intake_exactly_once_messages_total")
        .expect("the family is registered");
    let value = |outcome: &str| {
        family
            .get_metric()
            .iter()
            .find(|metric| {
                metric
                    .get_label()
                    .iter()
                    .any(|label| label.name() == "outcome" && label.value() == outcome)
            })
            .map(|metric| metric.get_counter().get_value())
    };
    assert_eq!(value("processed"), Some(1.0));
    assert_eq!(value("duplicate"), Some(1.0));
    assert_eq!(value("rolled_back"), Some(0.0));
}

#[tokio::test]
async fn a_handler_that_ignores_a_database_error_is_not_acknowledged() {
    let Some(pool) = database("ignored database error", 4).await else {
        return;
    };
    let table = marker_table(&pool).await;
    let mut service = ExactlyOnce::builder(pool.clone(), "billing")
        .table(table.clone())
        .handler(async |mut tx: Tx| {
            // PostgreSQL has aborted the transaction; a plain COMMIT would
            // now roll back silently.
            let _ignored = sqlx::query("SELECT 1/0").execute(&mut *tx).await;
        })
        .unwrap();
    let error = call(&mut service, message("orders", 0, 1, 1))
        .await
        .unwrap_err();
    assert!(error.is_retryable(), "{error}");
    assert!(
        matches!(
            error.cause().downcast_ref::<ExactlyOnceError>(),
            Some(ExactlyOnceError::Aborted(_))
        ),
        "{error:?}"
    );
    assert_eq!(markers(&pool, &table, "billing").await, 0);
}

#[tokio::test]
async fn a_handler_that_ends_the_transaction_itself_is_not_acknowledged() {
    let Some(pool) = database("handler commits", 4).await else {
        return;
    };
    let table = marker_table(&pool).await;
    let mut service = ExactlyOnce::builder(pool.clone(), "billing")
        .table(table.clone())
        .handler(async |mut tx: Tx| {
            sqlx::raw_sql("ROLLBACK").execute(&mut *tx).await?;
            Ok::<_, sqlx::Error>(())
        })
        .unwrap();
    let error = call(&mut service, message("orders", 0, 1, 1))
        .await
        .unwrap_err();
    assert!(error.is_retryable(), "{error}");
    assert!(error.to_string().contains("ended"), "{error}");
    assert_eq!(markers(&pool, &table, "billing").await, 0);
}

#[tokio::test]
async fn a_savepoint_lets_the_handler_recover_from_a_failed_statement() {
    let Some(pool) = database("savepoint", 4).await else {
        return;
    };
    let table = marker_table(&pool).await;
    let effects = effects_table(&pool).await;
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {effects} (id) VALUES (1)"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let handler_effects = effects.clone();
    let mut service = ExactlyOnce::builder(pool.clone(), "billing")
        .table(table.clone())
        .handler(async move |mut tx: Tx| {
            // Try to claim id 1; it is taken, so fall back to id 2.
            let mut attempt = sqlx::Connection::begin(&mut *tx).await?;
            let claimed = insert_effect_on(&mut attempt, &handler_effects, 1).await;
            if claimed.is_err() {
                attempt.rollback().await?;
                insert_effect(&mut tx, &handler_effects, 2).await?;
            } else {
                attempt.commit().await?;
            }
            Ok::<_, sqlx::Error>(())
        })
        .unwrap();
    call(&mut service, message("orders", 0, 1, 1))
        .await
        .unwrap();
    assert_eq!(rows(&pool, &effects).await, 2);
    assert_eq!(markers(&pool, &table, "billing").await, 1);
}

async fn insert_effect_on(
    connection: &mut sqlx::PgConnection,
    table: &str,
    id: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} (id) VALUES ($1)"
    )))
    .bind(id)
    .execute(connection)
    .await
    .map(drop)
}
