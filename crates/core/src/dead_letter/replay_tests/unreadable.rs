//! Records a replay cannot replay (a reference letter, anything that is no
//! readable dead letter) are refused as permanent, and none panics it.

use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use tower::{Layer, Service, ServiceExt};

use super::support::*;
use crate::dead_letter::envelope;
use crate::dead_letter::{EnvelopeError, ReplayLayer, ReplayRefused};
use crate::error::ErrorClass;
use crate::message::Message;

#[tokio::test]
async fn a_reference_letter_is_refused_it_has_no_payload_to_replay() {
    let handler = Recorder::default();
    let replay = ReplayLayer::keyed();
    let refused = replay
        .layer(handler.clone())
        .oneshot(record_of(&letter(7, 0).to_reference()))
        .await
        .expect_err("refused");
    assert_eq!(refused.class(), ErrorClass::Permanent);
    assert!(matches!(refusal(&refused), Some(ReplayRefused::Reference)));
    assert_eq!(handler.calls(), 0);
    assert_eq!(replay.counters().snapshot().references, 1);
}

/// A record's headers, as pairs to edit.
type Pairs = Vec<(String, Bytes)>;

/// Records that are no readable dead letter, each with what is wrong.
fn hostile_records() -> Vec<(&'static str, Message)> {
    let valid = record_of(&letter(7, 0));
    let with = |edit: &dyn Fn(&mut Pairs)| {
        let mut pairs: Pairs = valid
            .headers()
            .iter()
            .map(|header| (header.name.to_string(), header.value.clone()))
            .collect();
        edit(&mut pairs);
        valid.clone().with_headers(pairs.into_iter().collect())
    };
    let set = |name: &'static str, value: &'static [u8]| {
        with(&move |pairs: &mut Pairs| {
            for pair in pairs.iter_mut().filter(|pair| pair.0 == name) {
                pair.1 = Bytes::from_static(value);
            }
        })
    };
    vec![
        (
            "no envelope at all",
            Message::new("order-7", valid.metadata().clone()),
        ),
        ("a newer version", set(envelope::VERSION, b"2")),
        ("an unknown broker", set(envelope::ORIGIN_BROKER, b"pulsar")),
        (
            "a position of no broker",
            set(envelope::ORIGIN_POSITION, b"-"),
        ),
        (
            "a partition not a number",
            set(envelope::ORIGIN_PARTITION, b"\xff\xfe"),
        ),
        ("replays not a number", set(envelope::REPLAYS, b"many")),
        (
            "the origin twice",
            with(&|pairs: &mut Pairs| {
                pairs.push((
                    envelope::ORIGIN_SOURCE.to_owned(),
                    Bytes::from_static(b"payments"),
                ));
            }),
        ),
        (
            "no error class",
            with(&|pairs: &mut Pairs| {
                pairs.retain(|pair| pair.0 != envelope::ERROR_CLASS);
            }),
        ),
    ]
}

#[tokio::test]
async fn a_record_that_is_no_dead_letter_is_refused_with_the_envelope_error_as_cause() {
    let handler = Recorder::default();
    let replay = ReplayLayer::keyed();
    let hostile = hostile_records();
    for (what, record) in &hostile {
        let refused = replay
            .layer(handler.clone())
            .oneshot(record.clone())
            .await
            .expect_err(what);
        assert_eq!(refused.class(), ErrorClass::Permanent, "{what}");
        let Some(cause @ ReplayRefused::Unreadable(_)) = refusal(&refused) else {
            panic!("{what}: {refused:?}");
        };
        let source = std::error::Error::source(cause)
            .and_then(|source| source.downcast_ref::<EnvelopeError>());
        assert!(source.is_some(), "{what}: the envelope error is the source");
    }
    assert_eq!(handler.calls(), 0);
    assert_eq!(
        replay.counters().snapshot().unreadable,
        hostile.len() as u64
    );
}

/// One change to a valid letter's headers.
#[derive(Clone, Debug)]
enum Edit {
    Drop,
    Duplicate,
    Replace(Vec<u8>),
}

fn edit() -> impl Strategy<Value = (usize, Edit)> {
    (
        0usize..32,
        prop_oneof![
            Just(Edit::Drop),
            Just(Edit::Duplicate),
            proptest::collection::vec(any::<u8>(), 0..12).prop_map(Edit::Replace),
            proptest::sample::select(vec![
                "0",
                "1",
                "3",
                "-1",
                "18446744073709551616",
                "memory",
                "kafka",
                "1-0"
            ])
            .prop_map(|text| Edit::Replace(text.as_bytes().to_vec())),
        ],
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn no_record_makes_the_replay_panic_and_each_is_replayed_or_refused_as_permanent(
        edits in proptest::collection::vec(edit(), 0..6),
        keyed in any::<bool>(),
    ) {
        let valid = record_of(&letter(7, 1));
        let mut pairs: Vec<(Arc<str>, Bytes)> = valid
            .headers()
            .iter()
            .map(|header| (header.name.clone(), header.value.clone()))
            .collect();
        for (at, edit) in edits {
            if pairs.is_empty() {
                break;
            }
            let at = at % pairs.len();
            match edit {
                Edit::Drop => {
                    pairs.remove(at);
                }
                Edit::Duplicate => pairs.push(pairs[at].clone()),
                Edit::Replace(value) => pairs[at].1 = Bytes::from(value),
            }
        }
        let record = valid.with_headers(pairs.into_iter().collect());
        let handler = Recorder::default();
        let replay = if keyed { ReplayLayer::keyed() } else { ReplayLayer::keyless() };
        let outcome = poll_once(replay.layer(handler.clone()).call(record));
        match outcome {
            Ok(()) => prop_assert_eq!(handler.calls(), 1),
            Err(error) => {
                prop_assert_eq!(error.class(), ErrorClass::Permanent);
                prop_assert!(refusal(&error).is_some(), "{:?}", error);
                prop_assert_eq!(handler.calls(), 0);
            }
        }
    }
}
