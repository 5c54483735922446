//! The chain rules on their own, without a runtime.

use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use super::*;
use crate::message::{Metadata, Position};

fn turns(capacity: usize) -> Arc<KeyTurns> {
    Arc::new(KeyTurns::new(
        capacity,
        DeliveryOrder::Key,
        None,
        Waker::noop().clone(),
    ))
}

fn message(key: &str) -> Message {
    Message::new("", Metadata::new("in".into(), 0, Position::Offset(0))).with_key(key.to_owned())
}

fn take(turns: &Arc<KeyTurns>, slot: SlotId, key: &str) -> TurnHandle {
    turns
        .enter(slot, || current_turn(&message(key)))
        .expect("a keyed message in key order takes a turn")
}

fn poll<T>(poll: impl FnOnce(&mut Context<'_>) -> Poll<T>) -> Poll<T> {
    poll(&mut Context::from_waker(Waker::noop()))
}

/// Passes the gate and sends.
fn send(turn: &TurnHandle) {
    assert_eq!(poll(|cx| turn.poll_gate(cx)), Poll::Ready(Ok(())));
    assert_eq!(turn.sent(), Ok(()));
}

#[test]
fn no_turn_outside_a_poll_or_without_a_key() {
    let turns = turns(2);
    assert!(current_turn(&message("k")).is_none());
    let keyless = Message::new("", Metadata::new("in".into(), 0, Position::Offset(0)));
    assert!(turns.enter(0, || current_turn(&keyless)).is_none());
    assert!(!turns.is_live(0));
}

#[test]
fn a_later_turn_publishes_after_the_earlier_sent_and_answers_after_it_is_confirmed() {
    let turns = turns(4);
    let first = take(&turns, 0, "k");
    let second = take(&turns, 1, "k");
    assert!(
        poll(|cx| second.poll_gate(cx)).is_pending(),
        "first not sent"
    );
    send(&first);
    assert!(turns.any_released());
    let mut released = Vec::new();
    turns.take_released(&mut released);
    assert_eq!(released, [0]);
    send(&second);
    assert!(
        poll(|cx| second.poll_confirmed(cx)).is_pending(),
        "its own outputs are confirmed, the first's are not"
    );
    assert_eq!(poll(|cx| first.poll_confirmed(cx)), Poll::Ready(Ok(())));
    assert_eq!(poll(|cx| second.poll_confirmed(cx)), Poll::Ready(Ok(())));
}

#[test]
fn an_earlier_failure_overtakes_the_later_turns_that_sent() {
    let turns = turns(4);
    let first = take(&turns, 0, "k");
    let second = take(&turns, 1, "k");
    let other_key = take(&turns, 2, "j");
    send(&first);
    send(&second);
    send(&other_key);
    first.failed(false);
    assert_eq!(
        poll(|cx| second.poll_stopped(cx)),
        Poll::Ready(TurnError::EarlierFailed)
    );
    assert!(poll(|cx| other_key.poll_stopped(cx)).is_pending());
    // The second's next attempt waits for the first to send again.
    assert!(poll(|cx| second.poll_gate(cx)).is_pending());
    send(&first);
    send(&second);
}

#[test]
fn a_rejected_turn_leaves_the_later_ones_alone() {
    let turns = turns(4);
    let first = take(&turns, 0, "k");
    let second = take(&turns, 1, "k");
    let third = take(&turns, 2, "k");
    send(&first);
    send(&second);
    first.failed(true);
    assert!(poll(|cx| second.poll_stopped(cx)).is_pending());
    assert_eq!(poll(|cx| second.poll_confirmed(cx)), Poll::Ready(Ok(())));
    // A failure before the rejected turn still reaches past it.
    send(&third);
    second.failed(false);
    assert_eq!(
        poll(|cx| third.poll_stopped(cx)),
        Poll::Ready(TurnError::EarlierFailed)
    );
}

#[test]
fn an_unfinished_turn_poisons_the_later_ones_and_a_completed_one_does_not() {
    let turns = turns(4);
    let first = take(&turns, 0, "k");
    let second = take(&turns, 1, "k");
    send(&first);
    turns.end(0, true);
    assert_eq!(poll(|cx| second.poll_gate(cx)), Poll::Ready(Ok(())));
    assert_eq!(second.sent(), Ok(()));
    let third = take(&turns, 2, "k");
    turns.end(1, false);
    assert_eq!(
        poll(|cx| third.poll_gate(cx)),
        Poll::Ready(Err(TurnError::EarlierUnfinished))
    );
    // A stale handle waits for nothing and changes nothing.
    assert_eq!(poll(|cx| first.poll_confirmed(cx)), Poll::Ready(Ok(())));
    first.failed(false);
    turns.end(2, false);
    assert!(!turns.is_live(2));
    assert!(turns.lock().lanes.is_empty(), "no chain left");
}

#[test]
fn an_ended_turn_is_no_longer_released() {
    let turns = turns(2);
    let first = take(&turns, 0, "k");
    send(&first);
    turns.end(0, true);
    assert!(turns.lock().released.is_empty());
    // The slot's next delivery takes a turn of its own.
    let next = take(&turns, 0, "k");
    assert_eq!(poll(|cx| next.poll_gate(cx)), Poll::Ready(Ok(())));
}
