//! Injected faults: fetch and commit failures.

use super::support::*;
use crate::acker::AckError;
use crate::acker::Acker;
use crate::source::Source;
use crate::source::SourceError;
use std::time::Duration;

#[tokio::test]
async fn injected_fetch_failures_are_transient_errors() {
    let broker = broker_with_topic(1);
    produce_to(&broker, 0, 1);
    let (mut source, _acker) = joined(&broker).await;
    broker
        .faults(TOPIC, GROUP)
        .expect("faults")
        .fail_next_fetches(2);
    let mut buf = Vec::new();
    for _ in 0..2 {
        let error = source
            .next(&mut buf, 10)
            .await
            .expect_err("injected failure");
        assert!(matches!(error, SourceError::Transient(_)));
        assert!(error.is_transient());
    }
    assert!(buf.is_empty(), "a failed fetch takes nothing");
    delivered(&mut source, &mut buf, 10).await;
    assert_eq!(offsets(&buf), [(0, 0)]);
}

#[tokio::test]
async fn injected_commit_failures_commit_nothing() {
    let broker = broker_with_topic(1);
    produce_to(&broker, 0, 3);
    let (mut source, mut acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    assigned(&mut source).await;
    broker
        .faults(TOPIC, GROUP)
        .expect("faults")
        .fail_next_commits(1);
    let failed = acker.ack(&commit_batch(0, 1)).await;
    assert!(matches!(failed, Err(AckError::Broker(_))), "{failed:?}");
    assert_eq!(broker.committed(TOPIC, GROUP).expect("committed"), [None]);
    acker.ack(&commit_batch(0, 1)).await.expect("next commit");
    assert_eq!(
        broker.committed(TOPIC, GROUP).expect("committed"),
        [Some(2)]
    );
}

#[tokio::test(start_paused = true)]
async fn a_delayed_commit_dropped_while_waiting_commits_nothing() {
    let broker = broker_with_topic(1);
    produce_to(&broker, 0, 3);
    let (mut source, mut acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    assigned(&mut source).await;
    broker
        .faults(TOPIC, GROUP)
        .expect("faults")
        .delay_commits(Duration::from_secs(1));
    let batch = commit_batch(0, 0);
    let cut_short = tokio::time::timeout(Duration::from_millis(500), acker.ack(&batch)).await;
    assert!(cut_short.is_err(), "the commit is still waiting");
    assert_eq!(broker.committed(TOPIC, GROUP).expect("committed"), [None]);
    acker.ack(&batch).await.expect("delayed commit");
    assert_eq!(
        broker.committed(TOPIC, GROUP).expect("committed"),
        [Some(1)]
    );
}
