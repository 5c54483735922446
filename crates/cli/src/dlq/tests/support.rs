//! A memory store with letters to work on.

use intake_core::backend::DeadLetterSink;
use intake_core::memory::{MemoryBroker, MemoryDeadLetterStore};
use intake_core::{DeadLetter, ErrorClass, Message, Metadata, Position};

/// A memory broker whose `orders`/`billing` dead letters hold two
/// permanent failures (keys `a`, `b`) and one retryable one (key `a`).
pub(super) async fn store_with_three() -> (MemoryBroker, MemoryDeadLetterStore) {
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 1).unwrap();
    let sink = broker.dead_letter_sink("orders", "billing").unwrap();
    for (offset, key, class) in [
        (0, "a", ErrorClass::Permanent),
        (1, "b", ErrorClass::Permanent),
        (2, "a", ErrorClass::Retryable),
    ] {
        let message = Message::new(
            format!("payload {offset}"),
            Metadata::new("orders".into(), 0, Position::Offset(offset)),
        )
        .with_key(key);
        sink.write(&DeadLetter::new(message, "expected value", 3).with_class(class))
            .await
            .unwrap();
    }
    let store = broker.dead_letter_store("orders", "billing").unwrap();
    (broker, store)
}
