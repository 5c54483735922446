//! Each command: what it prints, what it moves, how it fails.

use intake_core::dead_letter::store::{DeadLetterStore, Filter, LetterId, Replay, Selection};
use intake_core::{ErrorClass, Message};
use std::time::SystemTime;

use super::support::store_with_three;
use crate::dlq::*;
use crate::failure::Failure;

#[tokio::test]
async fn count_shows_letters_per_class() {
    let (_broker, store) = store_with_three().await;
    let text = count(&store, &Filter::all(), false, SystemTime::now())
        .await
        .unwrap();
    assert!(
        text.starts_with(
            "orders.billing.dlq\nCLASS      LETTERS\npermanent        2\n\
             retryable        1\ntotal            3\noldest: failed "
        ),
        "{text}"
    );
    let value: serde_json::Value = serde_json::from_str(
        &count(
            &store,
            &Filter::all().with_class(ErrorClass::Permanent),
            true,
            SystemTime::now(),
        )
        .await
        .unwrap(),
    )
    .unwrap();
    assert_eq!(value["total"], 2);
    assert_eq!(value["by_class"]["permanent"], 2);
}

#[tokio::test]
async fn list_pages_through_the_letters() {
    let (_broker, store) = store_with_three().await;
    let text = list(&store, &Filter::all(), 2, None, false, SystemTime::now())
        .await
        .unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("ID"), "{text}");
    assert_eq!(lines.len(), 4, "{text}");
    assert!(lines[3].starts_with("more: --after "), "{text}");
    let value: serde_json::Value = serde_json::from_str(
        &list(
            &store,
            &Filter::all().with_key("a"),
            10,
            None,
            true,
            SystemTime::now(),
        )
        .await
        .unwrap(),
    )
    .unwrap();
    let letters = value["letters"].as_array().unwrap();
    assert_eq!(letters.len(), 2);
    assert_eq!(letters[0]["letter"]["key"], "a");
    assert_eq!(letters[0]["letter"]["error"], "expected value");
    assert_eq!(value["next"], serde_json::Value::Null);
}

#[tokio::test]
async fn show_prints_the_payload_and_an_unknown_id_exits_3() {
    let (_broker, store) = store_with_three().await;
    let page = store.list(&Filter::all(), 1, None).await.unwrap();
    let id = page.letters[0].id.clone();
    let text = show(&store, &id, false, SystemTime::now()).await.unwrap();
    assert!(text.contains("payload:   payload 0\n"), "{text}");
    assert!(text.contains("class:     permanent\n"), "{text}");
    let missing = show(&store, &LetterId::new("999"), false, SystemTime::now())
        .await
        .unwrap_err();
    assert_eq!(missing.exit_code(), 3, "{missing}");
    let invalid = show(&store, &LetterId::new("x"), false, SystemTime::now())
        .await
        .unwrap_err();
    assert_eq!(invalid.exit_code(), 2, "{invalid}");
}

#[tokio::test]
async fn a_dry_run_replay_counts_by_class_and_moves_nothing() {
    let (broker, store) = store_with_three().await;
    let all = Selection::Matching(Filter::all());
    let text = replay(&store, &all, &Replay::to_origin().dry_run(true), false)
        .await
        .unwrap();
    assert!(text.starts_with("would replay 3 from "), "{text}");
    assert!(text.contains("permanent        2\n"), "{text}");
    assert_eq!(store.count(&Filter::all()).await.unwrap(), 3);
    assert!(broker.messages("orders", 0, 0).unwrap().is_empty());

    let text = replay(&store, &all, &Replay::to_origin(), true)
        .await
        .unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(value["replayed"], 3);
    assert_eq!(store.count(&Filter::all()).await.unwrap(), 0);
    assert_eq!(broker.messages("orders", 0, 0).unwrap().len(), 3);
}

#[tokio::test]
async fn a_replay_to_the_group_without_a_way_back_exits_3_and_names_to_origin() {
    // The memory store knows no way back to one group alone.
    let (broker, store) = store_with_three().await;
    let all = Selection::Matching(Filter::all());
    let refused = replay(&store, &all, &Replay::to_group(), false)
        .await
        .unwrap_err();
    assert_eq!(refused.exit_code(), 3, "{refused}");
    let report = refused.report(None);
    for words in ["orders", "--to-origin", "every consumer group"] {
        assert!(report.contains(words), "{report}");
    }
    assert_eq!(store.count(&Filter::all()).await.unwrap(), 3);
    assert!(broker.messages("orders", 0, 0).unwrap().is_empty());
}

#[tokio::test]
async fn a_replay_the_broker_refuses_exits_3() {
    let (_broker, store) = store_with_three().await;
    let all = Selection::Matching(Filter::all());
    // No such topic: the memory publisher rejects it.
    let refused = replay(&store, &all, &Replay::to("nowhere"), false)
        .await
        .unwrap_err();
    assert_eq!(refused.exit_code(), 3, "{}", refused.report(None));
    assert_eq!(store.count(&Filter::all()).await.unwrap(), 3);
}

#[tokio::test]
async fn purge_asks_first_and_deletes_nothing_when_declined() {
    let (_broker, store) = store_with_three().await;
    let permanent = Selection::Matching(Filter::all().with_class(ErrorClass::Permanent));
    let dry = purge(
        &store,
        &permanent,
        true,
        false,
        Some(|_: &str| panic!("a dry run asks nothing")),
    )
    .await
    .unwrap();
    assert!(dry.starts_with("would purge 2 from "), "{dry}");

    let mut asked = String::new();
    let declined = purge(
        &store,
        &permanent,
        false,
        false,
        Some(|question: &str| {
            asked = question.to_owned();
            Err(Failure::NotConfirmed)
        }),
    )
    .await
    .unwrap_err();
    assert_eq!(declined.exit_code(), 5);
    assert!(asked.starts_with("Delete 2 dead letters from "), "{asked}");
    assert_eq!(store.count(&Filter::all()).await.unwrap(), 3);

    let done = purge(&store, &permanent, false, false, Some(|_: &str| Ok(())))
        .await
        .unwrap();
    assert!(done.starts_with("purged 2 from "), "{done}");
    assert_eq!(store.count(&Filter::all()).await.unwrap(), 1);
}

#[tokio::test]
async fn a_purge_deletes_only_the_letters_it_asked_about() {
    use intake_core::memory::{Record, dead_letter_topic};

    let (broker, store) = store_with_three().await;
    let topic = dead_letter_topic("orders", "billing");
    let originals = broker.messages(&topic, 0, 0).unwrap();
    let copy = |letter: &Message| {
        Record::new(letter.payload().clone())
            .with_optional_key(letter.key().cloned())
            .with_headers(letter.headers().clone())
    };
    for (selection, asked_for) in [
        (Selection::Matching(Filter::all()), 3),
        (
            Selection::Matching(Filter::all().with_class(ErrorClass::Permanent)),
            2,
        ),
    ] {
        store
            .purge(&Selection::Matching(Filter::all()))
            .await
            .unwrap();
        for letter in &originals {
            broker.send(&topic, copy(letter)).unwrap();
        }
        let mut asked = String::new();
        // Letters given up while the person reads the question: two
        // permanent failures, like the first letter.
        let done = purge(
            &store,
            &selection,
            false,
            true,
            Some(|question: &str| {
                asked = question.to_owned();
                for _ in 0..2 {
                    broker.send(&topic, copy(&originals[0])).unwrap();
                }
                Ok(())
            }),
        )
        .await
        .unwrap();
        assert!(
            asked.starts_with(&format!("Delete {asked_for} dead letters")),
            "{asked}"
        );
        let value: serde_json::Value = serde_json::from_str(&done).unwrap();
        assert_eq!(value["purged"], asked_for, "{done}");
        assert_eq!(
            store.count(&Filter::all()).await.unwrap(),
            3 - asked_for + 2,
            "the letters written meanwhile are left; {done}"
        );
    }
}
