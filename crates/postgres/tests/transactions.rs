//! The exactly-once service against a real PostgreSQL, called directly:
//! duplicates, rollbacks, and which database errors are retryable.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Fixture, id_of, insert_effect, message, tagged_message};
use intake_core::{ErrorClass, HandlerError, Json, Message, Payload};
use intake_postgres::{Error, IsolationLevel, MessageId, Tx, exactly_once};
use sqlx::AssertSqlSafe;
use tokio::sync::Barrier;
use tower::{Service, ServiceExt};

async fn call<S>(service: &mut S, message: Message) -> Result<(), HandlerError>
where
    S: Service<Message, Response = (), Error = HandlerError>,
{
    service.ready().await?.call(message).await
}

/// The handler error's cause and every error beneath it, as one text: a
/// failure at `COMMIT` names the server's error only in its source.
fn whole_chain(error: &HandlerError) -> String {
    let mut text = String::new();
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error.cause());
    while let Some(error) = next {
        text.push_str(&error.to_string());
        text.push_str(": ");
        next = error.source();
    }
    text
}

/// Runs the messages at offsets 1 and 2 at once, asserts that exactly one of
/// them failed, and returns its error.
async fn the_one_that_fails<S>(service: S, why: &str) -> HandlerError
where
    S: Service<Message, Response = (), Error = HandlerError> + Clone,
{
    let (first, second) = tokio::join!(
        service.clone().oneshot(message("orders", 0, 1, 1)),
        service.clone().oneshot(message("orders", 0, 2, 2)),
    );
    let mut failures: Vec<HandlerError> = [first, second]
        .into_iter()
        .filter_map(Result::err)
        .collect();
    assert_eq!(failures.len(), 1, "{why}: {failures:?}");
    failures.remove(0)
}

#[tokio::test]
async fn a_redelivered_message_runs_its_effects_once_and_is_counted_as_a_duplicate() {
    let Some(db) = Fixture::new("redelivered message").await else {
        return;
    };
    let runs = Arc::new(AtomicU32::new(0));
    let (handler_runs, effects) = (Arc::clone(&runs), db.effects.clone());
    let mut service = db
        .billing()
        .handler(async move |mut tx: Tx, Payload(payload): Payload| {
            handler_runs.fetch_add(1, Ordering::Relaxed);
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

    assert_eq!(runs.load(Ordering::Relaxed), 1);
    assert_eq!(service.counters().processed(), 1);
    assert_eq!(service.counters().duplicates(), 1);
    assert_eq!((db.effects().await, db.markers().await), (1, 1));
}

#[tokio::test]
async fn the_same_position_in_another_group_or_partition_is_another_message() {
    let Some(db) = Fixture::new("identity").await else {
        return;
    };
    let service = |group: &'static str| {
        intake_postgres::ExactlyOnce::builder(db.pool.clone(), group)
            .table(db.markers.clone())
            .handler(async |_tx: Tx| {})
            .unwrap()
    };
    let (mut billing, mut shipping) = (service("billing"), service("shipping"));
    for message in [
        message("orders", 0, 1, 1),
        message("orders", 1, 1, 1),
        message("returns", 0, 1, 1),
    ] {
        call(&mut billing, message).await.unwrap();
    }
    call(&mut shipping, message("orders", 0, 1, 1))
        .await
        .unwrap();
    assert_eq!(billing.counters().processed(), 3);
    assert_eq!(shipping.counters().processed(), 1);
    assert_eq!(
        billing.counters().duplicates() + shipping.counters().duplicates(),
        0
    );
}

#[tokio::test]
async fn a_failed_handler_rolls_back_its_writes_and_the_marker_so_the_retry_runs() {
    let Some(db) = Fixture::new("rollback").await else {
        return;
    };
    let fail_first = Arc::new(AtomicBool::new(true));
    let effects = db.effects.clone();
    let mut service = db
        .billing()
        .handler(async move |mut tx: Tx, Payload(payload): Payload| {
            insert_effect(&mut tx, &effects, id_of(&payload)?)
                .await
                .map_err(intake_postgres::handler_error)?;
            if fail_first.swap(false, Ordering::Relaxed) {
                return Err(HandlerError::retryable("inventory service down"));
            }
            Ok(())
        })
        .unwrap();

    let error = call(&mut service, message("orders", 0, 3, 30))
        .await
        .unwrap_err();
    assert!(error.is_retryable());
    assert_eq!((db.effects().await, db.markers().await), (0, 0));
    assert_eq!(service.counters().rolled_back(), 1);

    call(&mut service, message("orders", 0, 3, 30))
        .await
        .unwrap();
    assert_eq!((db.effects().await, db.markers().await), (1, 1));
}

#[tokio::test]
async fn a_constraint_violation_in_the_handlers_writes_is_permanent() {
    let Some(db) = Fixture::new("constraint violation").await else {
        return;
    };
    db.insert_effect(5).await;
    let effects = db.effects.clone();
    let mut service = db
        .billing()
        .handler(async move |mut tx: Tx, Payload(payload): Payload| {
            insert_effect(&mut tx, &effects, id_of(&payload)?).await?;
            Ok::<_, intake_core::BoxError>(())
        })
        .unwrap();

    let error = call(&mut service, message("orders", 0, 1, 5))
        .await
        .unwrap_err();
    assert_eq!(error.class(), ErrorClass::Permanent, "{error}");
    let code = error
        .cause()
        .downcast_ref::<sqlx::Error>()
        .and_then(|error| error.as_database_error())
        .and_then(|error| error.code())
        .map(|code| code.into_owned());
    assert_eq!(code.as_deref(), Some("23505"));
    assert_eq!(db.markers().await, 0);
}

#[tokio::test]
async fn serialization_failures_are_retryable() {
    let Some(db) = Fixture::new("serialization failure").await else {
        return;
    };
    // Write skew: each transaction reads the count, then inserts. Under
    // SERIALIZABLE one of two that overlap must fail with 40001.
    let both_read = Arc::new(Barrier::new(2));
    let effects = db.effects.clone();
    let service = db
        .billing()
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

    let failure = the_one_that_fails(service, "one of two skewed transactions fails").await;
    assert!(failure.is_retryable(), "{failure}");
    let text = whole_chain(&failure);
    assert!(
        text.contains("40001") || text.contains("serializ"),
        "{text}"
    );
    assert_eq!(db.markers().await, 1);
}

#[tokio::test]
async fn deadlocks_are_retryable_and_the_survivor_commits() {
    let Some(db) = Fixture::new("deadlock").await else {
        return;
    };
    db.insert_effect(1).await;
    db.insert_effect(2).await;
    // Message 1 locks row 1 then row 2; message 2 locks row 2 then row 1.
    let both_locked = Arc::new(Barrier::new(2));
    let update = format!("UPDATE {} SET note = 'touched' WHERE id = $1", db.effects);
    let service = db
        .billing()
        .handler(async move |mut tx: Tx, Payload(payload): Payload| {
            let first = id_of(&payload)?;
            for (step, row) in [first, 3 - first].into_iter().enumerate() {
                if step == 1 {
                    both_locked.wait().await;
                }
                sqlx::query(AssertSqlSafe(update.clone()))
                    .bind(row)
                    .execute(&mut *tx)
                    .await?;
            }
            Ok::<_, intake_core::BoxError>(())
        })
        .unwrap();

    let failure = the_one_that_fails(service, "the deadlock detector aborts one").await;
    assert!(failure.is_retryable(), "{failure}");
    let text = whole_chain(&failure);
    assert!(text.contains("deadlock"), "{text}");
    assert_eq!(db.markers().await, 1);
}

#[tokio::test]
async fn a_connection_lost_mid_transaction_is_retryable_and_leaves_no_marker() {
    let Some(db) = Fixture::new("lost connection").await else {
        return;
    };
    let mut service = db
        .billing()
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
    assert_eq!(db.markers().await, 0);
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
        matches!(error.cause().downcast_ref::<Error>(), Some(Error::Begin(_))),
        "{error:?}"
    );
    assert!(!format!("{error:?}").contains("secret"));
}

#[tokio::test]
async fn a_header_message_id_recognises_a_redelivery_under_a_new_delivery_tag() {
    let Some(db) = Fixture::new("header message id").await else {
        return;
    };
    let mut service = db
        .billing()
        .message_id(MessageId::header("message-id"))
        .handler(async |_tx: Tx| {})
        .unwrap();
    // AMQP redelivers with a new tag on a new channel.
    for (tag, id) in [(1, "order-1"), (9, "order-1"), (10, "order-2")] {
        call(&mut service, tagged_message("orders", tag, id))
            .await
            .unwrap();
    }
    assert_eq!(service.counters().processed(), 2);
    assert_eq!(service.counters().duplicates(), 1);

    let missing = call(&mut service, message("orders", 0, 1, 1))
        .await
        .unwrap_err();
    assert!(missing.is_permanent(), "{missing}");
}

#[tokio::test]
async fn a_tx_that_outlives_its_handler_fails_the_message_permanently() {
    let Some(db) = Fixture::new("escaped tx").await else {
        return;
    };
    let (keep, kept) = tokio::sync::oneshot::channel::<Tx>();
    let keep = Arc::new(Mutex::new(Some(keep)));
    let mut service = db
        .billing()
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
    assert_eq!(db.markers().await, 0);
}

#[tokio::test]
async fn a_payload_that_does_not_decode_fails_before_any_database_work() {
    #[derive(serde::Deserialize)]
    struct Order {
        #[allow(dead_code)]
        id: i64,
    }
    let Some(db) = Fixture::new("undecodable payload").await else {
        return;
    };
    let mut service = db
        .billing()
        .handler(async |_tx: Tx, Json(_order): Json<Order>| {})
        .unwrap();
    let error = call(&mut service, message("orders", 0, 1, 1))
        .await
        .unwrap_err();
    assert!(error.is_permanent(), "{error}");
    assert_eq!(db.markers().await, 0);
}

#[tokio::test]
async fn two_copies_running_at_once_commit_their_effects_once() {
    let Some(db) = Fixture::new("concurrent copies").await else {
        return;
    };
    let effects = db.effects.clone();
    let service = db
        .billing()
        .handler(async move |mut tx: Tx, Payload(payload): Payload| {
            // Hold the transaction open, so that the copy arrives while the
            // first has inserted its marker but not committed.
            tokio::time::sleep(Duration::from_millis(100)).await;
            insert_effect(&mut tx, &effects, id_of(&payload)?).await?;
            Ok::<_, intake_core::BoxError>(())
        })
        .unwrap();
    let (first, second) = tokio::join!(
        service.clone().oneshot(message("orders", 0, 4, 40)),
        service.clone().oneshot(message("orders", 0, 4, 40)),
    );
    first.unwrap();
    second.unwrap();
    assert_eq!(db.effects().await, 1);
    assert_eq!(service.counters().processed(), 1);
    assert_eq!(service.counters().duplicates(), 1);
}

#[tokio::test]
async fn a_handler_that_ignores_a_database_error_is_not_acknowledged() {
    let Some(db) = Fixture::new("ignored database error").await else {
        return;
    };
    let mut service = db
        .billing()
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
            error.cause().downcast_ref::<Error>(),
            Some(Error::Aborted(_))
        ),
        "{error:?}"
    );
    assert_eq!(db.markers().await, 0);
}

#[tokio::test]
async fn a_handler_that_ends_the_transaction_itself_is_not_acknowledged() {
    let Some(db) = Fixture::new("handler commits").await else {
        return;
    };
    let mut service = db
        .billing()
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
    assert_eq!(db.markers().await, 0);
}

#[tokio::test]
async fn a_savepoint_lets_the_handler_recover_from_a_failed_statement() {
    let Some(db) = Fixture::new("savepoint").await else {
        return;
    };
    db.insert_effect(1).await;
    let effects = db.effects.clone();
    let mut service = db
        .billing()
        .handler(async move |mut tx: Tx| {
            // Try to claim id 1; it is taken, so fall back to id 2.
            let mut attempt = sqlx::Connection::begin(&mut *tx).await?;
            if insert_effect(&mut attempt, &effects, 1).await.is_ok() {
                attempt.commit().await?;
            } else {
                attempt.rollback().await?;
                insert_effect(&mut tx, &effects, 2).await?;
            }
            Ok::<_, sqlx::Error>(())
        })
        .unwrap();
    call(&mut service, message("orders", 0, 1, 1))
        .await
        .unwrap();
    assert_eq!((db.effects().await, db.markers().await), (2, 1));
}

#[tokio::test]
async fn migrating_twice_and_from_many_tasks_at_once_is_safe() {
    let Some(pool) = common::database("concurrent migration", 8).await else {
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
    let Some(db) = Fixture::new("prometheus counters").await else {
        return;
    };
    let mut service = db.billing().handler(async |_tx: Tx| {}).unwrap();
    let registry = prometheus::Registry::new();
    service.counters().register(&registry, "billing").unwrap();
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
