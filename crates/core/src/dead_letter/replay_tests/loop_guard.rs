//! The loop guard: a letter replayed `max_replays` times is refused.

use tower::{Layer, ServiceBuilder, ServiceExt};

use super::support::*;
use crate::dead_letter::envelope;
use crate::dead_letter::{DeadLetter, DeadLetterLayer, DeadLetterSink, ReplayLayer, ReplayRefused};
use crate::error::ErrorClass;
use crate::layer_testing::{Scripted, Step};
use crate::memory::MemoryBroker;
use crate::message::Position;

#[tokio::test]
async fn a_letter_that_fails_on_every_replay_goes_round_max_replays_times_then_is_refused() {
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 1).expect("topic");
    let sink = broker.dead_letter_sink(TOPIC, GROUP).expect("sink");
    sink.write(&letter(7, 0)).await.expect("written");
    // Refused letters are kept by a dead-letter layer outside the replay.
    let refused = broker
        .dead_letter_sink(DEAD_LETTERS, "replay")
        .expect("sink of refused letters");

    let handler = Scripted::new(std::iter::repeat_n(Step::Permanent("still broken"), 10));
    let replay = ReplayLayer::keyed().max_replays(2);
    let report = replay.counters();
    let run = run_until_drained(
        &broker,
        DEAD_LETTERS,
        "replay",
        ServiceBuilder::new()
            .layer(DeadLetterLayer::new(refused))
            .layer(replay)
            // A replay that fails again is written back where it was read.
            .layer(DeadLetterLayer::new(sink))
            .service(handler.clone()),
    )
    .await;

    assert_eq!(handler.calls(), 2, "replayed twice, then refused");
    let letters = broker.dead_letters(TOPIC, GROUP).expect("letters");
    let replays: Vec<u32> = letters.iter().map(|letter| letter.replays).collect();
    assert_eq!(replays, [0, 1, 2]);
    assert!(
        letters
            .iter()
            .all(|letter| letter.first_failed_at == letters[0].first_failed_at),
        "every round keeps the first failure"
    );
    assert!(
        letters
            .iter()
            .all(|letter| letter.message.metadata().position() == Position::Offset(7))
    );
    assert_eq!(run.dead_lettered, 3, "two rounds and the refusal: {run:?}");
    let counts = report.snapshot();
    assert_eq!(
        (
            counts.records,
            counts.replayed,
            counts.over_limit,
            counts.succeeded
        ),
        (3, 2, 1, 0)
    );

    // The outer letter holds the refused dead letter whole.
    let outer = broker
        .dead_letters(DEAD_LETTERS, "replay")
        .expect("refused letters");
    assert_eq!(outer.len(), 1);
    assert_eq!(outer[0].class, ErrorClass::Permanent);
    assert!(
        outer[0].error.contains("replayed 2 time(s) already"),
        "{}",
        outer[0].error
    );
    let held = &outer[0].message;
    let inner = DeadLetter::read(held.key().cloned(), held.payload().clone(), held.headers())
        .expect("the refused letter reads back");
    assert_eq!(inner.replays, 2);
    assert_eq!(inner.message.metadata().position(), Position::Offset(7));
    assert_eq!(&inner.message.payload()[..], b"order-7");
}

#[tokio::test]
async fn a_letter_at_the_limit_is_refused_as_permanent_without_calling_the_handler() {
    let handler = Recorder::default();
    let replay = ReplayLayer::keyed();
    let refused = replay
        .layer(handler.clone())
        .oneshot(record_of(&letter(
            7,
            crate::dead_letter::DEFAULT_MAX_REPLAYS,
        )))
        .await
        .expect_err("refused");
    assert_eq!(refused.class(), ErrorClass::Permanent);
    assert!(
        matches!(
            refusal(&refused),
            Some(ReplayRefused::ReplayLimit {
                replays: 3,
                max_replays: 3
            })
        ),
        "{refused:?}"
    );
    assert_eq!(handler.calls(), 0);

    // One below the limit is replayed, as its last round.
    replay
        .layer(handler.clone())
        .oneshot(record_of(&letter(7, 2)))
        .await
        .expect("replayed");
    let seen = handler.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].headers().get_str(envelope::REPLAYS), Some("3"));

    let nothing = ReplayLayer::keyed()
        .max_replays(0)
        .layer(handler.clone())
        .oneshot(record_of(&letter(8, 0)))
        .await
        .expect_err("max_replays(0) replays nothing");
    assert!(matches!(
        refusal(&nothing),
        Some(ReplayRefused::ReplayLimit { replays: 0, .. })
    ));
    assert_eq!(handler.calls(), 1);
    let counts = replay.counters().snapshot();
    assert_eq!((counts.replayed, counts.over_limit), (1, 1));
}
