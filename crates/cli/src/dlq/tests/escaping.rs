//! Producer-controlled text never drives the terminal, and `--json`
//! carries it exactly.

use intake_core::backend::DeadLetterSink;
use intake_core::dead_letter::store::{Filter, LetterId};
use intake_core::memory::{MemoryBroker, MemoryDeadLetterStore};
use intake_core::{DeadLetter, Message, Metadata, Position};
use std::time::SystemTime;

use crate::dlq::text::{one_line, printable};
use crate::dlq::*;

/// What a producer (or a handler's error quoting its input) can put in
/// a letter to drive a terminal: OSC 0 (the window title), OSC 52 (the
/// clipboard), CSI (erase, move up), a C1 CSI, DEL, CR, BS, a bidi
/// override (Trojan Source), and a newline forging a field of its own.
const HOSTILE: &str = "\x1b]0;owned\x07\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\x1b[1A\u{9b}31m\x7f\r\x08\u{202e}\nclass:     retryable";

/// Whether `c` may reach a terminal: no control character but the
/// newline between lines, no bidi control. Written out here, not taken
/// from the code under test.
fn inert(c: char) -> bool {
    c == '\n'
        || !(c.is_control()
            || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'))
}

fn assert_inert(text: &str) {
    if let Some(c) = text.chars().find(|&c| !inert(c)) {
        panic!("{c:?} reaches the terminal in {text:?}");
    }
}

/// A memory store whose one letter has the hostile text in every
/// producer-controlled field: source, key, error, header name and
/// value, payload; and a second entry that is no letter, whose
/// unreadable field quotes the hostile text.
async fn store_with_hostile_letter() -> (MemoryBroker, MemoryDeadLetterStore) {
    use intake_core::Headers;
    use intake_core::dead_letter::envelope::ATTEMPTS;
    use intake_core::memory::{Record, dead_letter_topic};

    let broker = MemoryBroker::new();
    broker.create_topic("orders", 1).unwrap();
    let sink = broker.dead_letter_sink("orders", "billing").unwrap();
    let mut headers = Headers::default();
    headers.insert(HOSTILE, HOSTILE.as_bytes().to_vec());
    let message = Message::new(
        HOSTILE,
        Metadata::new(HOSTILE.into(), 0, Position::Offset(7)),
    )
    .with_key(HOSTILE)
    .with_headers(headers);
    sink.write(&DeadLetter::new(message, HOSTILE, 1))
        .await
        .unwrap();
    let topic = dead_letter_topic("orders", "billing");
    let written = broker.messages(&topic, 0, 0).unwrap().remove(0);
    let mut forged = written.headers().clone();
    forged.set(ATTEMPTS, HOSTILE.as_bytes().to_vec());
    broker
        .send(&topic, Record::new("x").with_headers(forged))
        .unwrap();
    let store = broker.dead_letter_store("orders", "billing").unwrap();
    (broker, store)
}

#[tokio::test]
async fn show_escapes_every_producer_controlled_field() {
    let (_broker, store) = store_with_hostile_letter().await;
    let text = show(&store, &LetterId::new("0"), false, SystemTime::now())
        .await
        .unwrap();
    assert_inert(&text);
    // One line per field, none forged: only the payload (the last
    // field) may span lines, and its further lines are indented, so no
    // line of it can pass for a field.
    let labels: Vec<&str> = text
        .lines()
        .filter(|line| !line.starts_with(' '))
        .map(|line| line.split_whitespace().next().unwrap_or_default())
        .collect();
    assert_eq!(
        labels,
        [
            "id:",
            "origin:",
            "group:",
            "key:",
            "class:",
            "attempts:",
            "replays:",
            "failed:",
            "first:",
            "error:",
            "header:",
            "bytes:",
            "payload:"
        ],
        "{text}"
    );
    assert!(text.contains("error:     \\x1b]0;owned\\x07"), "{text}");
    let unreadable = show(&store, &LetterId::new("1"), false, SystemTime::now())
        .await
        .unwrap();
    assert_inert(&unreadable);
    assert_eq!(unreadable.lines().count(), 3, "{unreadable}");
}

#[tokio::test]
async fn list_and_count_escape_every_producer_controlled_field() {
    let (_broker, store) = store_with_hostile_letter().await;
    let text = list(&store, &Filter::all(), 10, None, false, SystemTime::now())
        .await
        .unwrap();
    assert_inert(&text);
    assert_eq!(text.lines().count(), 3, "{text}");
    let text = count(&store, &Filter::all(), false, SystemTime::now())
        .await
        .unwrap();
    assert_inert(&text);
}

#[tokio::test]
async fn json_carries_the_exact_text_with_nothing_raw_for_a_terminal() {
    let (_broker, store) = store_with_hostile_letter().await;
    for text in [
        show(&store, &LetterId::new("0"), true, SystemTime::now())
            .await
            .unwrap(),
        list(&store, &Filter::all(), 10, None, true, SystemTime::now())
            .await
            .unwrap(),
    ] {
        // `jq .` and a terminal both read it: every such character is a
        // JSON escape, which parses back to the very text.
        assert_inert(&text);
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let letter = if value["letters"].is_array() {
            &value["letters"][0]["letter"]
        } else {
            &value["letter"]
        };
        assert_eq!(letter["error"], HOSTILE, "{text}");
        assert_eq!(letter["source"], HOSTILE, "{text}");
        assert!(letter["headers"].get(HOSTILE).is_some(), "{text}");
    }
}

#[test]
fn keys_and_payloads_cannot_drive_the_terminal() {
    assert_eq!(printable(b"plain text"), "plain text");
    assert_eq!(printable(b"\x1b[2Jgone"), "\\x1b[2Jgone");
    assert_eq!(printable(&[0xff, 0x00]), "\\xff\\x00");
    assert_eq!(one_line("a\nb", 10), "a\\nb");
    assert_eq!(one_line("abcdef", 3), "abc…");
}
