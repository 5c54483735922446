//! The batch form against a real PostgreSQL: one transaction per batch, a
//! marker per message, and an outcome per message.

mod common;

use std::convert::Infallible;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use common::{Fixture, message, tagged_message};
use intake_core::{HandlerError, Json, Message};
use intake_postgres::{ExactlyOnceCounters, MessageId, Tx};
use sqlx::AssertSqlSafe;
use tower::ServiceExt;

type Outcomes = Vec<Result<(), HandlerError>>;

/// The ids each call of a batch handler received.
type Calls = Arc<Mutex<Vec<Vec<i64>>>>;

/// An exactly-once batch service.
trait BatchService:
    tower::Service<Vec<Message>, Response = Outcomes, Error = Infallible, Future: Send> + Clone
{
}

impl<S> BatchService for S where
    S: tower::Service<Vec<Message>, Response = Outcomes, Error = Infallible, Future: Send> + Clone
{
}

/// A batch handler inserting every id of the batch with one statement, and
/// recording the ids each call received.
fn inserting(
    db: &Fixture,
    message_id: MessageId,
) -> (impl BatchService, Calls, Arc<ExactlyOnceCounters>) {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&calls);
    let insert = format!(
        "INSERT INTO {} (id) SELECT * FROM UNNEST($1::int8[])",
        db.effects
    );
    let service = db
        .billing()
        .message_id(message_id)
        .batch_handler(async move |mut tx: Tx, ids: Vec<Json<i64>>| {
            let ids: Vec<i64> = ids.into_iter().map(|Json(id)| id).collect();
            seen.lock().unwrap().push(ids.clone());
            sqlx::query(AssertSqlSafe(insert))
                .bind(&ids)
                .execute(&mut *tx)
                .await?;
            Ok::<_, sqlx::Error>(())
        })
        .unwrap();
    let counters = Arc::clone(service.counters());
    (service, calls, counters)
}

/// Messages at `offsets` of partition 0, each carrying its offset as id.
fn batch(offsets: Range<i64>) -> Vec<Message> {
    offsets
        .map(|offset| message("orders", 0, offset, offset))
        .collect()
}

fn classes(outcomes: &Outcomes) -> Vec<&'static str> {
    outcomes
        .iter()
        .map(|outcome| match outcome {
            Ok(()) => "ok",
            Err(error) => error.class().as_str(),
        })
        .collect()
}

#[tokio::test]
async fn a_batch_commits_its_new_messages_and_skips_processed_ones() {
    let Some(db) = Fixture::new("batch duplicates").await else {
        return;
    };
    let (service, calls, counters) = inserting(&db, MessageId::Position);

    let outcomes = service.clone().oneshot(batch(0..5)).await.unwrap();
    assert_eq!(classes(&outcomes), vec!["ok"; 5]);
    // Offsets 3 and 4 come again (redelivered after a crash), with 5 to 7.
    let outcomes = service.oneshot(batch(3..8)).await.unwrap();
    assert_eq!(classes(&outcomes), vec!["ok"; 5]);

    assert_eq!(
        *calls.lock().unwrap(),
        vec![vec![0, 1, 2, 3, 4], vec![5, 6, 7]]
    );
    assert_eq!((db.effects().await, db.markers().await), (8, 8));
    assert_eq!((counters.processed(), counters.duplicates()), (8, 2));
}

#[tokio::test]
async fn a_batch_of_only_processed_messages_does_not_call_the_handler() {
    let Some(db) = Fixture::new("batch all duplicates").await else {
        return;
    };
    let (service, calls, counters) = inserting(&db, MessageId::Position);
    service.clone().oneshot(batch(0..3)).await.unwrap();
    let outcomes = service.oneshot(batch(0..3)).await.unwrap();
    assert_eq!(classes(&outcomes), vec!["ok"; 3]);
    assert_eq!(calls.lock().unwrap().len(), 1);
    assert_eq!(counters.duplicates(), 3);
}

#[tokio::test]
async fn a_permanent_failure_fails_only_the_message_at_fault_and_the_rest_commit() {
    let Some(db) = Fixture::new("batch poison").await else {
        return;
    };
    // Id 2 is already in the effects table: inserting it again violates the
    // primary key, which fails the whole batch's statement.
    db.insert_effect(2).await;
    let (service, calls, counters) = inserting(&db, MessageId::Position);

    let outcomes = service.oneshot(batch(0..4)).await.unwrap();

    assert_eq!(classes(&outcomes), vec!["ok", "ok", "permanent", "ok"]);
    // The batch, then each message alone.
    assert_eq!(
        *calls.lock().unwrap(),
        vec![vec![0, 1, 2, 3], vec![0], vec![1], vec![2], vec![3]]
    );
    assert_eq!((db.effects().await, db.markers().await), (4, 3));
    assert_eq!((counters.processed(), counters.rolled_back()), (3, 1));
}

#[tokio::test]
async fn a_retryable_failure_rolls_back_the_whole_batch() {
    let Some(db) = Fixture::new("batch retryable").await else {
        return;
    };
    let effects = db.effects.clone();
    let service = db
        .billing()
        .batch_handler(async move |mut tx: Tx, ids: Vec<Json<i64>>| {
            for Json(id) in ids {
                common::insert_effect(&mut tx, &effects, id)
                    .await
                    .map_err(intake_postgres::handler_error)?;
            }
            Err(HandlerError::retryable("the ledger service is down"))
        })
        .unwrap();

    let outcomes = service.clone().oneshot(batch(0..3)).await.unwrap();

    assert_eq!(classes(&outcomes), vec!["retryable"; 3]);
    for outcome in &outcomes {
        let error = outcome.as_ref().unwrap_err();
        assert_eq!(error.cause().to_string(), "the ledger service is down");
    }
    assert_eq!((db.effects().await, db.markers().await), (0, 0));
    assert_eq!(service.counters().rolled_back(), 3);
}

#[tokio::test]
async fn a_message_twice_in_one_batch_runs_once_and_its_copy_is_retried() {
    let Some(db) = Fixture::new("batch repeated id").await else {
        return;
    };
    let (service, calls, _stats) = inserting(&db, MessageId::header("message-id"));

    // A producer sent order-1 twice; the payloads are the ids.
    let copies = vec![
        tagged_message("orders", 1, "1"),
        tagged_message("orders", 2, "2"),
        tagged_message("orders", 3, "1"),
    ];
    let outcomes = service.clone().oneshot(copies).await.unwrap();
    assert_eq!(classes(&outcomes), vec!["ok", "ok", "retryable"]);
    assert!(!outcomes[2].as_ref().unwrap_err().affects_backoff());

    // The retry of the copy finds the marker.
    let outcomes = service
        .oneshot(vec![tagged_message("orders", 3, "1")])
        .await
        .unwrap();
    assert_eq!(classes(&outcomes), vec!["ok"]);
    assert_eq!(*calls.lock().unwrap(), vec![vec![1, 2]]);
    assert_eq!(db.effects().await, 2);
}

#[tokio::test]
async fn a_message_that_does_not_decode_fails_alone_before_the_transaction() {
    let Some(db) = Fixture::new("batch undecodable").await else {
        return;
    };
    let (service, calls, _stats) = inserting(&db, MessageId::Position);

    let mut messages = batch(0..3);
    messages[1] = Message::new(
        bytes::Bytes::from_static(b"not json"),
        messages[1].metadata().clone(),
    );
    let outcomes = service.oneshot(messages).await.unwrap();

    assert_eq!(classes(&outcomes), vec!["ok", "permanent", "ok"]);
    assert_eq!(*calls.lock().unwrap(), vec![vec![0, 2]]);
    assert_eq!(db.markers().await, 2);
}
