//! Crashes and rebalances: a killed consumer loses nothing, two consumers
//! share a group, a full budget still sees assignment changes.

use super::handlers::recording;
use crate::backend::testkit::Backend;
use crate::backend::testkit::harness::{
    Ledger, Running, id_of, numbered, unique_group, wait_until_acknowledged,
};
use crate::consumer::{Consumer, DeliveryOrder};
use crate::error::HandlerError;
use crate::message::Message;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A consumer killed mid-run acknowledges nothing more; the next consumer
/// of the group receives everything it had not finished.
pub async fn redelivers_after_a_crash<B: Backend>(backend: &B) {
    let source = backend.create_source(1).await.expect("create the source");
    let group = unique_group("crash");
    backend
        .produce(&source, numbered(0, 200))
        .await
        .expect("produce");
    let ledger = Ledger::default();
    let handler = {
        let ledger = ledger.clone();
        tower::service_fn(move |message: Message| {
            let ledger = ledger.clone();
            async move {
                let id = id_of(&message)?;
                if id >= 100 {
                    // Hang, so the crash finds messages in flight.
                    std::future::pending::<()>().await;
                }
                ledger.record(id);
                Ok::<_, HandlerError>(())
            }
        })
    };
    let first = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder().ordering(DeliveryOrder::Unordered),
        32,
        handler,
    )
    .await
    .expect("connect");
    ledger.wait_for_all(100, "the first 100 messages").await;
    first.crash().await;
    tokio::time::sleep(backend.capabilities().crash_redelivery_after).await;

    let second = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder().ordering(DeliveryOrder::Unordered),
        32,
        recording(&ledger),
    )
    .await
    .expect("connect");
    ledger
        .wait_for_all(200, "every message after the crash")
        .await;
    second.stop().await;
    assert_eq!(
        backend
            .unacknowledged(&source, &group)
            .await
            .expect("inspect"),
        0
    );
}

/// Two consumers of one group share the work; one leaving mid-run loses
/// nothing.
pub async fn rebalances_between_two_consumers<B: Backend>(backend: &B) {
    if !backend.capabilities().shared_groups {
        eprintln!("skipped: {} has no shared consumer groups", backend.name());
        return;
    }
    let partitions = if backend.capabilities().partitions {
        4
    } else {
        1
    };
    let source = backend
        .create_source(partitions)
        .await
        .expect("create the source");
    let group = unique_group("rebalance");
    let ledger = Ledger::default();
    let slow = |ledger: &Ledger| {
        let ledger = ledger.clone();
        tower::service_fn(move |message: Message| {
            let ledger = ledger.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(2)).await;
                ledger.record(id_of(&message)?);
                Ok::<_, HandlerError>(())
            }
        })
    };
    let first = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder().ordering(DeliveryOrder::Partition),
        16,
        slow(&ledger),
    )
    .await
    .expect("connect");
    backend
        .produce(&source, numbered(0, 400))
        .await
        .expect("produce");
    ledger
        .wait_until("the first consumer to start", || ledger.distinct() >= 20)
        .await;
    let second = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder().ordering(DeliveryOrder::Partition),
        16,
        slow(&ledger),
    )
    .await
    .expect("connect");
    backend
        .produce(&source, numbered(400, 400))
        .await
        .expect("produce");
    ledger
        .wait_until("half of the messages", || ledger.distinct() >= 400)
        .await;
    // The first consumer leaves gracefully mid-run: its partitions move.
    first.stop().await;
    ledger
        .wait_for_all(800, "every message after the first consumer left")
        .await;
    second.stop().await;
    assert_eq!(
        backend
            .unacknowledged(&source, &group)
            .await
            .expect("inspect"),
        0
    );
}

/// A consumer whose whole budget is held by handlers that do not finish
/// still takes part in its group: a member that joins gets work while the
/// first one's handlers are blocked (on Kafka the first one must serve the
/// rebalance with no room for a delivery), and once they are released
/// nothing is lost.
pub async fn a_full_budget_still_sees_assignment_changes<B: Backend>(backend: &B) {
    if !backend.capabilities().shared_groups {
        eprintln!("skipped: {} has no shared consumer groups", backend.name());
        return;
    }
    let partitions = if backend.capabilities().partitions {
        2
    } else {
        1
    };
    let source = backend
        .create_source(partitions)
        .await
        .expect("create the source");
    let group = unique_group("full-budget");
    backend
        .produce(&source, numbered(0, 40))
        .await
        .expect("produce");
    let ledger = Ledger::default();
    let release = CancellationToken::new();
    let blocked = {
        let (ledger, release) = (ledger.clone(), release.clone());
        tower::service_fn(move |message: Message| {
            let (ledger, release) = (ledger.clone(), release.clone());
            async move {
                ledger.record(id_of(&message)?);
                release.cancelled().await;
                Ok::<_, HandlerError>(())
            }
        })
    };
    let first = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder().ordering(DeliveryOrder::Unordered),
        4,
        blocked,
    )
    .await
    .expect("connect the first member");
    ledger
        .wait_until("the first member's budget of 4 to fill", || {
            ledger.distinct() >= 4
        })
        .await;
    let joined = Ledger::default();
    let second = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder().ordering(DeliveryOrder::Unordered),
        4,
        {
            let (ledger, joined) = (ledger.clone(), joined.clone());
            tower::service_fn(move |message: Message| {
                let (ledger, joined) = (ledger.clone(), joined.clone());
                async move {
                    let id = id_of(&message)?;
                    ledger.record(id);
                    joined.record(id);
                    Ok::<_, HandlerError>(())
                }
            })
        },
    )
    .await
    .expect("connect the second member");
    joined
        .wait_until(
            "the member that joined to get work while the first one's budget is full",
            || joined.distinct() > 0,
        )
        .await;
    release.cancel();
    ledger
        .wait_for_all(40, "every message once the first member's handlers finish")
        .await;
    // Acknowledged while both members run. Not after stopping them one by
    // one: a member that leaves starts a rebalance, and the other's final
    // commit may land in it and be refused (librdkafka's mock cluster
    // refuses every commit while the group is joining; Apache Kafka while
    // it completes), which is a redelivery to the next owner, not a loss.
    wait_until_acknowledged(backend, &source, &group, "messages (both members running)").await;
    first.stop().await;
    second.stop().await;
    assert_eq!(
        backend
            .unacknowledged(&source, &group)
            .await
            .expect("inspect"),
        0,
        "{}: stopping takes back no acknowledgement",
        backend.name()
    );
}
