use super::properties::properties;
use super::*;
use crate::headers;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};

fn table(properties: &BasicProperties) -> FieldTable {
    properties.headers().clone().unwrap_or_default()
}

fn text(table: &FieldTable, name: &str) -> Option<Vec<u8>> {
    match table.inner().get(name) {
        Some(AMQPValue::LongString(text)) => Some(text.as_bytes().to_vec()),
        _ => None,
    }
}

#[test]
fn a_forwarded_key_header_never_replaces_the_outputs_own_key() {
    let output = Output::new("orders.out", "x")
        .with_header(AmqpPublisher::KEY_HEADER, "stale")
        .with_key("fresh");
    let routing = Routing::Exchange(String::new());
    let properties = properties(&output, &routing, true).expect("properties");
    assert_eq!(
        text(&table(&properties), AmqpPublisher::KEY_HEADER),
        Some(b"fresh".to_vec())
    );
}

#[test]
fn properties_come_back_and_the_inputs_delivery_count_is_left_out() {
    let output = Output::new("orders.out", "x")
        .with_header(headers::MESSAGE_ID, "m-1")
        .with_header(headers::DELIVERY_COUNT, "3")
        .with_header("tenant", "acme")
        .with_key("k");
    let properties = properties(&output, &Routing::ByKey, false).expect("properties");
    let table = table(&properties);
    assert_eq!(
        properties.message_id().as_ref().map(ShortString::as_str),
        Some("m-1")
    );
    assert_eq!(*properties.delivery_mode(), None);
    assert_eq!(text(&table, "tenant"), Some(b"acme".to_vec()));
    assert!(!table.inner().contains_key(headers::DELIVERY_COUNT));
    assert!(!table.inner().contains_key(headers::MESSAGE_ID));
    // The routing key carries it.
    assert!(!table.inner().contains_key(AmqpPublisher::KEY_HEADER));
}
