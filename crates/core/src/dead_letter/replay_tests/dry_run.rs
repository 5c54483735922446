//! A dry run counts what a replay would do and handles nothing.

use tower::{Layer, Service};

use super::support::*;
use crate::dead_letter::replay::{DryRunCounted, ReplayCounts};
use crate::dead_letter::store::{DeadLetterStore, Filter};
use crate::dead_letter::{DeadLetterSink, ReplayLayer};
use crate::error::ErrorClass;
use crate::memory::{MemoryBroker, Record};

#[tokio::test]
async fn a_dry_run_counts_by_class_and_verdict_calls_no_handler_and_leaves_the_letters_for_the_replay()
 {
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 1).expect("topic");
    let sink = broker.dead_letter_sink(TOPIC, GROUP).expect("sink");
    let letters = [
        letter(1, 0),
        letter(2, 1),
        letter(3, 0).with_class(ErrorClass::Retryable),
        letter(4, crate::dead_letter::DEFAULT_MAX_REPLAYS),
        letter(5, 0).to_reference(),
    ];
    for letter in &letters {
        sink.write(letter).await.expect("written");
    }
    broker
        .send(DEAD_LETTERS, Record::new("not a letter"))
        .expect("produce");

    let handler = Recorder::default();
    let dry = ReplayLayer::keyed().dry_run(true);
    let report = dry.counters();
    let run = run_until_drained(
        &broker,
        DEAD_LETTERS,
        "billing.dry-run",
        dry.layer(handler.clone()),
    )
    .await;

    assert_eq!(handler.calls(), 0, "a dry run handles nothing");
    assert_eq!(
        (run.ignored, run.discarded, run.dead_lettered),
        (6, 0, 0),
        "{run:?}"
    );
    let mut expected = ReplayCounts {
        records: 6,
        replayed: 3,
        over_limit: 1,
        references: 1,
        unreadable: 1,
        ..ReplayCounts::default()
    };
    expected.by_class.insert("permanent", 2);
    expected.by_class.insert("retryable", 1);
    assert_eq!(report.snapshot(), expected);

    // The letters are all still there, and the group that replays has
    // not moved.
    let store = broker.dead_letter_store(TOPIC, GROUP).expect("store");
    assert_eq!(store.count(&Filter::all()).await.expect("count"), 6);
    assert_eq!(broker.lag(DEAD_LETTERS, "billing.replay").expect("lag"), 6);
    let replay = ReplayLayer::keyed();
    let counts = replay.counters();
    run_until_drained(
        &broker,
        DEAD_LETTERS,
        "billing.replay",
        replay.layer(handler.clone()),
    )
    .await;
    assert_eq!(handler.calls(), 3);
    assert_eq!(
        ReplayCounts {
            succeeded: 0,
            ..counts.snapshot()
        },
        expected
    );
    assert_eq!(counts.snapshot().succeeded, 3);
}

#[test]
fn a_dry_run_outcome_is_an_ignored_failure_the_runtime_acknowledges() {
    let outcome = poll_once(
        ReplayLayer::keyed()
            .dry_run(true)
            .layer(Recorder::default())
            .call(record_of(&letter(1, 0))),
    )
    .expect_err("counted, not handled");
    assert_eq!(outcome.class(), ErrorClass::Ignore);
    assert!(outcome.cause().is::<DryRunCounted>());
}
