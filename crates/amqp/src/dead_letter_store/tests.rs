use std::time::{Duration, UNIX_EPOCH};

use intake_core::dead_letter::EnvelopeError;
use intake_core::{Message, Metadata, Position};

use super::pass::Ids;
use intake_core::dead_letter::DeadLetter;

#[test]
fn a_letter_id_names_its_failure_time_origin_and_sink_and_an_unreadable_entry_its_place() {
    let metadata = Metadata::new("orders".into(), 2, Position::Tag(7));
    let mut letter = DeadLetter::new(Message::new("x", metadata), "bad", 1);
    letter.failed_at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
    let letter = Ok(letter);
    let mut ids = Ids::default();
    assert_eq!(
        ids.id_of(&letter, Some("9f3a-12"), 0).as_str(),
        "1700000000123@orders/2/7/9f3a-12"
    );
    // Letters written before sinks gave ids: a repeat is told apart by
    // its place among the repeats.
    assert_eq!(
        ids.id_of(&letter, None, 1).as_str(),
        "1700000000123@orders/2/7"
    );
    assert_eq!(
        ids.id_of(&letter, None, 2).as_str(),
        "1700000000123@orders/2/7~2"
    );
    let unreadable = Err(EnvelopeError::Missing {
        field: "intake.dlq.version",
    });
    assert_eq!(ids.id_of(&unreadable, None, 3).as_str(), "unreadable#3");
}
