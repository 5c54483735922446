//! What each `MessageId` mode makes one message, against the real
//! PostgreSQL (review L11 and C6; R5's parked copies).
//!
//! - A parked copy that came back through another source (a Kafka return
//!   topic, a Redis return stream) is its first delivery, under either mode.
//! - A header id is the producer's word: any producer that writes to the
//!   same source can make another message be skipped by reusing its id;
//!   the scope (consumer group and source, not partition) bounds who can.
//! - A header id that would write control characters into logs is refused.

mod common;

use bytes::Bytes;
use intake_core::{FirstDelivery, HandlerError, Headers, Message, Metadata, Position};
use intake_postgres::{ExactlyOnce, MessageId, Tx};
use sqlx::AssertSqlSafe;
use sqlx::PgPool;
use tower::{Service, ServiceExt};

const ID_HEADER: &str = "message-id";

/// A message of `source`/`partition` at `offset` whose payload is `payload`
/// and whose id header is `id` (none when `None`).
fn message(source: &str, partition: u32, offset: i64, payload: i64, id: Option<&str>) -> Message {
    let mut headers = Headers::new();
    if let Some(id) = id {
        headers.insert(ID_HEADER, Bytes::from(id.to_owned()));
    }
    Message::new(
        Bytes::from(payload.to_string()),
        Metadata::new(source.into(), partition, Position::Offset(offset)),
    )
    .with_headers(headers)
}

/// `original` as the parking layer hands back its copy: read from the
/// group's return topic at `offset`, first delivered where `original` was.
fn returned_copy(original: &Message, offset: i64) -> Message {
    let first = original.metadata();
    let mut copy = Message::new(
        original.payload().clone(),
        Metadata::new(
            format!("{}.billing.returned", first.source())
                .as_str()
                .into(),
            first.partition(),
            Position::Offset(offset),
        ),
    )
    .with_headers(original.headers().clone());
    copy.metadata_mut().set_parked_from(Some(FirstDelivery {
        source: first.source().clone(),
        partition: first.partition(),
        position: first.position(),
    }));
    copy
}

/// An exactly-once service of group `billing` that writes each message's
/// payload into a fresh ledger (no uniqueness: an effect run twice shows
/// as two rows), and that ledger's name.
async fn ledger_service(
    pool: &PgPool,
    id: MessageId,
) -> (
    impl Service<Message, Response = (), Error = HandlerError> + Clone,
    String,
) {
    let markers = common::marker_table(pool).await;
    let ledger = common::ledger_table(pool).await;
    let insert = format!("INSERT INTO {ledger} (id) VALUES ($1)");
    let service = ExactlyOnce::builder(pool.clone(), "billing")
        .table(markers)
        .message_id(id)
        .handler(async move |mut tx: Tx, message: Message| {
            let id = common::id_of(message.payload())?;
            sqlx::query(AssertSqlSafe(insert))
                .bind(id)
                .execute(&mut *tx)
                .await?;
            Ok::<_, intake_core::BoxError>(())
        })
        .expect("a handler");
    (service, ledger)
}

/// The ids in `ledger`, in the order written.
async fn written(pool: &PgPool, ledger: &str) -> Vec<i64> {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT id FROM {ledger} ORDER BY entry"
    )))
    .fetch_all(pool)
    .await
    .expect("the ledger")
}

#[tokio::test]
async fn a_returned_copy_is_its_first_delivery_under_a_header_id() {
    let Some(pool) = common::database("returned copy, header id", 2).await else {
        return;
    };
    let (service, ledger) = ledger_service(&pool, MessageId::header(ID_HEADER)).await;
    // The first delivery was parked, and the process died before it was
    // acknowledged: the broker delivers the original again (it succeeds
    // now), and the copy comes back through the return topic as well.
    let original = message("orders", 2, 5, 7, Some("order-7"));
    let copy = returned_copy(&original, 0);
    service
        .clone()
        .oneshot(original)
        .await
        .expect("the original");
    service.clone().oneshot(copy).await.expect("the copy");
    assert_eq!(
        written(&pool, &ledger).await,
        [7],
        "the copy's effects ran again"
    );
}

#[tokio::test]
async fn a_returned_copy_is_its_first_delivery_under_position_ids() {
    let Some(pool) = common::database("returned copy, position", 2).await else {
        return;
    };
    let (service, ledger) = ledger_service(&pool, MessageId::Position).await;
    let original = message("orders", 2, 5, 7, None);
    let (copy, second_copy) = (returned_copy(&original, 0), returned_copy(&original, 1));
    for message in [original, copy, second_copy] {
        service.clone().oneshot(message).await.expect("handled");
    }
    assert_eq!(written(&pool, &ledger).await, [7]);
}

#[tokio::test]
async fn any_producer_of_the_same_source_can_make_a_message_be_skipped_by_reusing_its_header_id() {
    let Some(pool) = common::database("forged header id", 2).await else {
        return;
    };
    let (service, ledger) = ledger_service(&pool, MessageId::header(ID_HEADER)).await;
    // Another producer of `orders` sends payload 666 with the id that the
    // order producer is about to use, on another partition (the partition
    // is not part of a header id): it is processed first...
    let forged = message("orders", 3, 0, 666, Some("order-7"));
    // ...and one with the same id on another source changes nothing here.
    let elsewhere = message("audit", 0, 0, 555, Some("order-8"));
    let real = message("orders", 0, 0, 7, Some("order-7"));
    let untouched = message("orders", 0, 1, 8, Some("order-8"));
    for message in [forged, elsewhere, real, untouched] {
        service.clone().oneshot(message).await.expect("handled");
    }
    // The real order 7 was skipped as a duplicate: its effects are lost.
    // Order 8 is scoped to `orders`, and `audit`'s order-8 did not touch it.
    assert_eq!(written(&pool, &ledger).await, [666, 555, 8]);
}

#[tokio::test]
async fn a_header_id_with_control_characters_is_refused_before_any_database_work() {
    let Some(pool) = common::database("header id with control characters", 2).await else {
        return;
    };
    let (service, ledger) = ledger_service(&pool, MessageId::header(ID_HEADER)).await;
    for (offset, id) in [
        "order-1\nINFO forged log line",
        "order-2\u{1b}[2J",
        "order-3\r",
        "order-4\u{85}",
        "order-5\u{7f}",
    ]
    .into_iter()
    .enumerate()
    {
        let error = service
            .clone()
            .oneshot(message("orders", 0, offset as i64, 1, Some(id)))
            .await
            .expect_err("an id with a control character");
        assert!(error.is_permanent(), "{error}");
        let text = error.to_string();
        assert!(text.contains("control character"), "{text}");
        assert!(!text.contains(id), "the id is not repeated: {text}");
    }
    // Printable ids of any script are ids.
    service
        .clone()
        .oneshot(message("orders", 0, 9, 9, Some("bestellung-ä-9 ✓")))
        .await
        .expect("a printable id");
    assert_eq!(written(&pool, &ledger).await, [9]);
}
