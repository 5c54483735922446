//! Turning a lapin delivery into an intake [`Message`].
//!
//! The body moves into the message without a copy. The routing key becomes
//! the key; it is usually the same for every message of a queue, so the last
//! one is kept and shared instead of copied again. Header names repeat from
//! message to message too and are interned the same way.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use intake_core::{Headers, Message, Metadata, Position, SourceName};
use lapin::message::Delivery;
use lapin::types::{AMQPValue, FieldTable};

use crate::headers;

/// How many distinct header names are interned before new ones are simply
/// allocated (a bound, so a producer that invents names cannot grow it).
const INTERNED_NAMES: usize = 32;

/// Converts the deliveries of one source; keeps the small caches.
#[derive(Debug)]
pub(crate) struct DeliveryReader {
    source: SourceName,
    last_key: Bytes,
    names: Vec<Arc<str>>,
}

impl DeliveryReader {
    pub(crate) fn new(source: SourceName) -> Self {
        let names = [
            headers::MESSAGE_ID,
            headers::CORRELATION_ID,
            headers::CONTENT_TYPE,
            headers::DELIVERY_COUNT,
        ]
        .into_iter()
        .map(Arc::from)
        .collect();
        Self {
            source,
            last_key: Bytes::new(),
            names,
        }
    }

    /// The source name deliveries are stamped with.
    pub(crate) fn source(&self) -> &SourceName {
        &self.source
    }

    fn name(&mut self, name: &str) -> Arc<str> {
        if let Some(interned) = self.names.iter().find(|interned| &***interned == name) {
            return interned.clone();
        }
        let name: Arc<str> = Arc::from(name);
        if self.names.len() < INTERNED_NAMES {
            self.names.push(name.clone());
        }
        name
    }

    fn key(&mut self, routing_key: &str) -> Option<Bytes> {
        if routing_key.is_empty() {
            return None;
        }
        if self.last_key != routing_key.as_bytes() {
            self.last_key = Bytes::copy_from_slice(routing_key.as_bytes());
        }
        Some(self.last_key.clone())
    }

    /// The message for `delivery`, received on the channel of `epoch`.
    pub(crate) fn read(&mut self, delivery: Delivery, epoch: u32) -> Message {
        let Delivery {
            delivery_tag,
            routing_key,
            redelivered,
            properties,
            data,
            ..
        } = delivery;
        let attempt = attempt(properties.headers().as_ref(), redelivered);
        let mut metadata = Metadata::new(self.source.clone(), epoch, Position::Tag(delivery_tag))
            .with_attempt(attempt);
        if let Some(seconds) = properties.timestamp() {
            metadata
                .set_timestamp(SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(*seconds)));
        }
        let mut message = Message::new(Bytes::from(data), metadata);
        if let Some(key) = self.key(routing_key.as_str()) {
            message = message.with_key(key);
        }
        let table = properties
            .headers()
            .as_ref()
            .filter(|table| !table.inner().is_empty());
        let has_properties = properties.message_id().is_some()
            || properties.correlation_id().is_some()
            || properties.content_type().is_some();
        if table.is_some() || has_properties {
            let mut entries = Vec::with_capacity(table.map_or(0, |table| table.inner().len()) + 3);
            for (name, value) in [
                (headers::MESSAGE_ID, properties.message_id()),
                (headers::CORRELATION_ID, properties.correlation_id()),
                (headers::CONTENT_TYPE, properties.content_type()),
            ] {
                if let Some(value) = value {
                    entries.push((
                        self.name(name),
                        Bytes::copy_from_slice(value.as_str().as_bytes()),
                    ));
                }
            }
            for (name, value) in table.into_iter().flat_map(FieldTable::inner) {
                entries.push((self.name(name.as_str()), header_value(value)));
            }
            message = message.with_headers(entries.into_iter().collect::<Headers>());
        }
        message
    }
}

/// The delivery attempt: `x-delivery-count` (quorum queues count earlier
/// returns) plus one, or 2 for a redelivery the queue does not count, or 1.
fn attempt(table: Option<&FieldTable>, redelivered: bool) -> u32 {
    let counted = table
        .and_then(|table| table.inner().get(headers::DELIVERY_COUNT))
        .and_then(integer);
    match counted {
        Some(count) => u32::try_from(count.saturating_add(1)).unwrap_or(u32::MAX),
        None if redelivered => 2,
        None => 1,
    }
}

fn integer(value: &AMQPValue) -> Option<u64> {
    match *value {
        AMQPValue::ShortShortInt(v) => u64::try_from(v).ok(),
        AMQPValue::ShortShortUInt(v) => Some(u64::from(v)),
        AMQPValue::ShortInt(v) => u64::try_from(v).ok(),
        AMQPValue::ShortUInt(v) => Some(u64::from(v)),
        AMQPValue::LongInt(v) => u64::try_from(v).ok(),
        AMQPValue::LongUInt(v) => Some(u64::from(v)),
        AMQPValue::LongLongInt(v) => u64::try_from(v).ok(),
        AMQPValue::Timestamp(v) => Some(v),
        _ => None,
    }
}

/// A header value as bytes: strings and byte arrays as they are, numbers and
/// booleans as text, arrays and tables (such as `x-death`) rendered
/// readably.
fn header_value(value: &AMQPValue) -> Bytes {
    match value {
        AMQPValue::LongString(text) => Bytes::copy_from_slice(text.as_bytes()),
        AMQPValue::ShortString(text) => Bytes::copy_from_slice(text.as_str().as_bytes()),
        AMQPValue::ByteArray(bytes) => Bytes::copy_from_slice(bytes.as_slice()),
        AMQPValue::Void => Bytes::new(),
        other => {
            let mut text = String::new();
            render(other, &mut text);
            Bytes::from(text)
        }
    }
}

fn render(value: &AMQPValue, out: &mut String) {
    use std::fmt::Write;
    // Writing to a String cannot fail.
    let _ = match value {
        AMQPValue::Boolean(v) => write!(out, "{v}"),
        AMQPValue::ShortShortInt(v) => write!(out, "{v}"),
        AMQPValue::ShortShortUInt(v) => write!(out, "{v}"),
        AMQPValue::ShortInt(v) => write!(out, "{v}"),
        AMQPValue::ShortUInt(v) => write!(out, "{v}"),
        AMQPValue::LongInt(v) => write!(out, "{v}"),
        AMQPValue::LongUInt(v) => write!(out, "{v}"),
        AMQPValue::LongLongInt(v) => write!(out, "{v}"),
        AMQPValue::Float(v) => write!(out, "{v}"),
        AMQPValue::Double(v) => write!(out, "{v}"),
        AMQPValue::Timestamp(v) => write!(out, "{v}"),
        AMQPValue::DecimalValue(decimal) => {
            let scale = 10f64.powi(i32::from(decimal.scale));
            write!(out, "{}", f64::from(decimal.value) / scale)
        }
        AMQPValue::ShortString(text) => write!(out, "{}", text.as_str()),
        AMQPValue::LongString(text) => write!(out, "{text}"),
        AMQPValue::ByteArray(bytes) => write!(out, "{}", bytes.as_slice().escape_ascii()),
        AMQPValue::Void => Ok(()),
        AMQPValue::FieldArray(items) => {
            out.push('[');
            for (index, item) in items.as_slice().iter().enumerate() {
                if index > 0 {
                    out.push_str(", ");
                }
                render(item, out);
            }
            out.push(']');
            Ok(())
        }
        AMQPValue::FieldTable(table) => {
            out.push('{');
            for (index, (name, item)) in table.inner().iter().enumerate() {
                if index > 0 {
                    out.push_str(", ");
                }
                out.push_str(name.as_str());
                out.push_str(": ");
                render(item, out);
            }
            out.push('}');
            Ok(())
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::BasicProperties;
    use lapin::types::ShortString;

    fn delivery(tag: u64, redelivered: bool, properties: BasicProperties) -> Delivery {
        let mut delivery = Delivery::mock(
            tag,
            ShortString::from("ex"),
            ShortString::from("orders"),
            redelivered,
            b"payload".to_vec(),
        );
        delivery.properties = properties;
        delivery
    }

    fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
        let mut table = FieldTable::default();
        for (name, value) in entries {
            table.insert(ShortString::from(*name), value.clone());
        }
        table
    }

    #[test]
    fn position_partition_and_key_come_from_tag_epoch_and_routing_key() {
        let mut reader = DeliveryReader::new("orders".into());
        let message = reader.read(delivery(7, false, BasicProperties::default()), 3);
        let metadata = message.metadata();
        assert_eq!(metadata.position(), Position::Tag(7));
        assert_eq!(metadata.partition(), 3);
        assert_eq!(&**metadata.source(), "orders");
        assert_eq!(metadata.attempt(), 1);
        assert_eq!(message.key().map(|key| &key[..]), Some(&b"orders"[..]));
        assert_eq!(&message.payload()[..], b"payload");
        assert!(message.headers().is_empty());
    }

    #[test]
    fn a_quorum_delivery_count_is_the_number_of_earlier_attempts() {
        let mut reader = DeliveryReader::new("orders".into());
        let properties = BasicProperties::default()
            .with_headers(table(&[("x-delivery-count", AMQPValue::LongLongInt(2))]));
        let message = reader.read(delivery(1, true, properties), 1);
        assert_eq!(message.metadata().attempt(), 3);
        assert_eq!(message.headers().get_str("x-delivery-count"), Some("2"));
    }

    #[test]
    fn a_redelivery_without_a_count_is_a_second_attempt() {
        let mut reader = DeliveryReader::new("orders".into());
        let message = reader.read(delivery(1, true, BasicProperties::default()), 1);
        assert_eq!(message.metadata().attempt(), 2);
    }

    #[test]
    fn properties_and_headers_become_readable_headers() {
        let mut reader = DeliveryReader::new("orders".into());
        let properties = BasicProperties::default()
            .with_message_id("m-1".into())
            .with_content_type("application/json".into())
            .with_timestamp(1_700_000_000)
            .with_headers(table(&[
                ("tenant", AMQPValue::LongString("acme".into())),
                ("retry", AMQPValue::Boolean(true)),
                (
                    "x-death",
                    AMQPValue::FieldArray(
                        vec![AMQPValue::FieldTable(table(&[(
                            "count",
                            AMQPValue::LongInt(1),
                        )]))]
                        .into(),
                    ),
                ),
            ]));
        let message = reader.read(delivery(1, false, properties), 1);
        let headers = message.headers();
        assert_eq!(headers.get_str(headers::MESSAGE_ID), Some("m-1"));
        assert_eq!(
            headers.get_str(headers::CONTENT_TYPE),
            Some("application/json")
        );
        assert_eq!(headers.get_str("tenant"), Some("acme"));
        assert_eq!(headers.get_str("retry"), Some("true"));
        assert_eq!(headers.get_str("x-death"), Some("[{count: 1}]"));
        assert_eq!(
            message.metadata().timestamp(),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000))
        );
    }

    #[test]
    fn the_same_routing_key_is_shared_not_copied() {
        let mut reader = DeliveryReader::new("orders".into());
        let first = reader.read(delivery(1, false, BasicProperties::default()), 1);
        let second = reader.read(delivery(2, false, BasicProperties::default()), 1);
        let (first, second) = (first.key().cloned(), second.key().cloned());
        assert_eq!(
            first.as_ref().map(|key| key.as_ptr()),
            second.as_ref().map(|key| key.as_ptr())
        );
    }
}
