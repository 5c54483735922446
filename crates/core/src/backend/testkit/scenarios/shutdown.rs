//! Shutdown: a graceful stop commits the work that finished.

use super::handlers::recording;
use crate::backend::testkit::Backend;
use crate::backend::testkit::harness::{Ledger, Running, numbered, unique_group};
use crate::consumer::Consumer;

/// A graceful shutdown acknowledges everything that finished: a new
/// consumer of the group receives none of it again.
pub async fn graceful_shutdown_commits_finished_work<B: Backend>(backend: &B) {
    let source = backend.create_source(1).await.expect("create the source");
    let group = unique_group("shutdown");
    backend
        .produce(&source, numbered(0, 50))
        .await
        .expect("produce");
    let ledger = Ledger::default();
    let first = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder(),
        16,
        recording(&ledger),
    )
    .await
    .expect("connect");
    ledger.wait_for_all(50, "all 50 messages").await;
    let report = first.stop().await;
    assert!(report.unfinished.is_empty());
    assert_eq!(
        backend
            .unacknowledged(&source, &group)
            .await
            .expect("inspect"),
        0
    );

    backend
        .produce(&source, numbered(50, 1))
        .await
        .expect("produce");
    let second_ledger = Ledger::default();
    let second = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder(),
        16,
        recording(&second_ledger),
    )
    .await
    .expect("connect");
    second_ledger
        .wait_until("the message produced after the shutdown", || {
            second_ledger.count(50) == 1
        })
        .await;
    second.stop().await;
    assert_eq!(
        second_ledger.missing(50).len(),
        50,
        "{}: nothing finished before the shutdown is delivered again",
        backend.name()
    );
}
