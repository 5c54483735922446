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
        let key = self.key(routing_key.as_str());
        let table = properties
            .headers()
            .as_ref()
            .filter(|table| !table.inner().is_empty());
        let has_properties = properties.message_id().is_some()
            || properties.correlation_id().is_some()
            || properties.content_type().is_some();
        let headers = if table.is_some() || has_properties {
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
            entries.into_iter().collect::<Headers>()
        } else {
            Headers::new()
        };
        Message::from_parts(Bytes::from(data), key, headers, metadata)
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
        // `Debug` switches to an exponent for very large and very small
        // numbers; `Display` writes every digit (309 for `f64::MAX`), which
        // would let nine bytes on the wire cost hundreds in memory.
        AMQPValue::Float(v) => write!(out, "{v:?}"),
        AMQPValue::Double(v) => write!(out, "{v:?}"),
        AMQPValue::Timestamp(v) => write!(out, "{v}"),
        AMQPValue::DecimalValue(decimal) => {
            write_decimal(decimal.value, decimal.scale, out);
            Ok(())
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

/// An AMQP decimal exactly (`value` × 10^-`scale`): `123.45`, `0.005`, or
/// with an exponent (`12345e-20`) once zeros would outnumber the digits, so
/// the text stays as short as the six bytes it came in are bounded.
fn write_decimal(value: u32, scale: u8, out: &mut String) {
    use std::fmt::Write;
    let digits = value.to_string();
    let scale = usize::from(scale);
    // Writing to a String cannot fail.
    let _ = if scale == 0 {
        write!(out, "{digits}")
    } else if scale < digits.len() {
        let (whole, fraction) = digits.split_at(digits.len() - scale);
        write!(out, "{whole}.{fraction}")
    } else if scale <= 10 {
        write!(out, "0.{}{digits}", "0".repeat(scale - digits.len()))
    } else {
        write!(out, "{digits}e-{scale}")
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
    fn numbers_in_nested_headers_read_exactly_and_briefly() {
        let mut out = String::new();
        render(
            &AMQPValue::FieldArray(
                vec![
                    AMQPValue::DecimalValue(lapin::types::DecimalValue {
                        scale: 2,
                        value: 12345,
                    }),
                    AMQPValue::DecimalValue(lapin::types::DecimalValue { scale: 3, value: 5 }),
                    AMQPValue::DecimalValue(lapin::types::DecimalValue {
                        scale: 200,
                        value: 7,
                    }),
                    AMQPValue::Double(f64::MAX),
                    AMQPValue::Float(0.5),
                ]
                .into(),
            ),
            &mut out,
        );
        assert_eq!(out, "[123.45, 0.005, 7e-200, 1.7976931348623157e308, 0.5]");
    }

    #[test]
    fn a_header_named_like_a_property_does_not_replace_it() {
        let mut reader = DeliveryReader::new("orders".into());
        let properties = BasicProperties::default()
            .with_message_id("m-1".into())
            .with_headers(table(&[(
                headers::MESSAGE_ID,
                AMQPValue::LongString("spoofed".into()),
            )]));
        let message = reader.read(delivery(1, false, properties), 1);
        assert_eq!(message.headers().get_str(headers::MESSAGE_ID), Some("m-1"));
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

/// Hostile content after the handshake: header tables of any shape, and
/// `x-delivery-count` of every AMQP type, encoded as a producer would send
/// them, parsed by lapin's own parser and converted by [`DeliveryReader`].
#[cfg(test)]
mod properties {
    use lapin::BasicProperties;
    use lapin::types::parsing::parse_field_table;
    use lapin::types::{AMQPValue, DecimalValue, FieldArray, FieldTable, ShortString};
    use proptest::collection::vec;
    use proptest::prelude::*;

    use super::*;

    /// Every value type RabbitMQ puts on the wire (a short string has no
    /// type tag in a table, so it never arrives as a value).
    fn scalar() -> impl Strategy<Value = AMQPValue> {
        prop_oneof![
            any::<bool>().prop_map(AMQPValue::Boolean),
            any::<i8>().prop_map(AMQPValue::ShortShortInt),
            any::<u8>().prop_map(AMQPValue::ShortShortUInt),
            any::<i16>().prop_map(AMQPValue::ShortInt),
            any::<u16>().prop_map(AMQPValue::ShortUInt),
            any::<i32>().prop_map(AMQPValue::LongInt),
            any::<u32>().prop_map(AMQPValue::LongUInt),
            any::<i64>().prop_map(AMQPValue::LongLongInt),
            any::<f32>().prop_map(AMQPValue::Float),
            any::<f64>().prop_map(AMQPValue::Double),
            (any::<u8>(), any::<u32>())
                .prop_map(|(scale, value)| AMQPValue::DecimalValue(DecimalValue { scale, value })),
            vec(any::<u8>(), 0..48).prop_map(|bytes| AMQPValue::LongString(bytes.into())),
            any::<u64>().prop_map(AMQPValue::Timestamp),
            vec(any::<u8>(), 0..48).prop_map(|bytes| AMQPValue::ByteArray(bytes.into())),
            Just(AMQPValue::Void),
        ]
    }

    fn value() -> impl Strategy<Value = AMQPValue> {
        scalar().prop_recursive(6, 64, 8, |inner| {
            prop_oneof![
                vec(inner.clone(), 0..8)
                    .prop_map(|items| AMQPValue::FieldArray(FieldArray::from(items))),
                vec((".{0,12}", inner), 0..8).prop_map(|entries| {
                    let mut table = FieldTable::default();
                    for (name, value) in entries {
                        table.insert(ShortString::from(name), value);
                    }
                    AMQPValue::FieldTable(table)
                }),
            ]
        })
    }

    /// A header name as a producer in any language may write it: any bytes
    /// up to AMQP's 255, mostly text.
    fn name() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            4 => ".{0,24}".prop_map(String::into_bytes),
            1 => Just(headers::DELIVERY_COUNT.as_bytes().to_vec()),
            1 => Just(headers::MESSAGE_ID.as_bytes().to_vec()),
            1 => vec(any::<u8>(), 0..255),
        ]
    }

    /// The AMQP 0-9-1 encoding (RabbitMQ's type tags), written here rather
    /// than taken from lapin so that the parser is checked against an
    /// independent producer.
    fn encode_value(value: &AMQPValue, out: &mut Vec<u8>) {
        fn long(bytes: &[u8], out: &mut Vec<u8>) {
            out.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
            out.extend_from_slice(bytes);
        }
        match value {
            AMQPValue::Boolean(v) => out.extend_from_slice(&[b't', u8::from(*v)]),
            AMQPValue::ShortShortInt(v) => out.extend_from_slice(&[b'b', v.to_be_bytes()[0]]),
            AMQPValue::ShortShortUInt(v) => out.extend_from_slice(&[b'B', *v]),
            AMQPValue::ShortInt(v) => {
                out.push(b's');
                out.extend_from_slice(&v.to_be_bytes());
            }
            AMQPValue::ShortUInt(v) => {
                out.push(b'u');
                out.extend_from_slice(&v.to_be_bytes());
            }
            AMQPValue::LongInt(v) => {
                out.push(b'I');
                out.extend_from_slice(&v.to_be_bytes());
            }
            AMQPValue::LongUInt(v) => {
                out.push(b'i');
                out.extend_from_slice(&v.to_be_bytes());
            }
            AMQPValue::LongLongInt(v) => {
                out.push(b'l');
                out.extend_from_slice(&v.to_be_bytes());
            }
            AMQPValue::Float(v) => {
                out.push(b'f');
                out.extend_from_slice(&v.to_be_bytes());
            }
            AMQPValue::Double(v) => {
                out.push(b'd');
                out.extend_from_slice(&v.to_be_bytes());
            }
            AMQPValue::DecimalValue(decimal) => {
                out.extend_from_slice(&[b'D', decimal.scale]);
                out.extend_from_slice(&decimal.value.to_be_bytes());
            }
            AMQPValue::ShortString(text) => {
                out.push(b'S');
                long(text.as_str().as_bytes(), out);
            }
            AMQPValue::LongString(text) => {
                out.push(b'S');
                long(text.as_bytes(), out);
            }
            AMQPValue::FieldArray(items) => {
                out.push(b'A');
                let mut inner = Vec::new();
                for item in items.as_slice() {
                    encode_value(item, &mut inner);
                }
                long(&inner, out);
            }
            AMQPValue::Timestamp(v) => {
                out.push(b'T');
                out.extend_from_slice(&v.to_be_bytes());
            }
            AMQPValue::FieldTable(table) => {
                out.push(b'F');
                let entries: Vec<(Vec<u8>, AMQPValue)> = table
                    .inner()
                    .iter()
                    .map(|(name, value)| (name.as_str().as_bytes().to_vec(), value.clone()))
                    .collect();
                encode_table(&entries, out);
            }
            AMQPValue::ByteArray(bytes) => {
                out.push(b'x');
                long(bytes.as_slice(), out);
            }
            AMQPValue::Void => out.push(b'V'),
        }
    }

    fn encode_table(entries: &[(Vec<u8>, AMQPValue)], out: &mut Vec<u8>) {
        let mut inner = Vec::new();
        for (name, value) in entries {
            inner.push(u8::try_from(name.len()).unwrap_or(u8::MAX));
            inner.extend_from_slice(&name[..name.len().min(255)]);
            encode_value(value, &mut inner);
        }
        out.extend_from_slice(&u32::try_from(inner.len()).unwrap_or(u32::MAX).to_be_bytes());
        out.extend_from_slice(&inner);
    }

    /// The bytes a message's headers hold, values and names.
    fn header_bytes(message: &Message) -> usize {
        message
            .headers()
            .iter()
            .map(|header| header.name.len() + header.value.len())
            .sum()
    }

    fn deliver(table: FieldTable, redelivered: bool, message_id: Option<String>) -> Delivery {
        let mut delivery = Delivery::mock(
            7,
            ShortString::from("ex"),
            ShortString::from("orders"),
            redelivered,
            b"payload".to_vec(),
        );
        let mut properties = BasicProperties::default().with_headers(table);
        if let Some(id) = message_id {
            properties = properties.with_message_id(ShortString::from(id));
        }
        delivery.properties = properties;
        delivery
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1_000))]

        /// Whatever header table a producer wrote: lapin either refuses it
        /// (a name that is not UTF-8: the connection-level failure the
        /// source handles) or it becomes a message with every entry, the
        /// original tag and payload, and headers at most four times the
        /// encoded table (byte arrays nested in arrays are escaped,
        /// `\xff` for one byte), so a producer cannot make one delivery
        /// cost more memory than a constant factor of what it sent.
        #[test]
        fn any_header_table_becomes_a_message_of_bounded_size_or_a_parse_error(
            entries in vec((name(), value()), 0..10),
            redelivered in any::<bool>(),
            message_id in proptest::option::of(".{0,60}"),
        ) {
            let mut encoded = Vec::new();
            encode_table(&entries, &mut encoded);
            let parsed = parse_field_table(encoded.as_slice());
            let every_name_is_text = entries.iter().all(|(name, _)| std::str::from_utf8(name).is_ok());
            let table = match parsed {
                Ok((rest, table)) => {
                    prop_assert!(rest.is_empty());
                    prop_assert!(every_name_is_text, "lapin took a name that is not UTF-8");
                    table
                }
                Err(_) => {
                    prop_assert!(!every_name_is_text, "lapin refused a table of text names");
                    return Ok(());
                }
            };
            let entries_in_table = table.inner().len();
            let id_bytes = message_id.as_ref().map_or(0, |id| id.len() + headers::MESSAGE_ID.len());
            let has_id = message_id.is_some();
            let mut reader = DeliveryReader::new("orders".into());
            let message = reader.read(deliver(table, redelivered, message_id), 1);
            prop_assert_eq!(message.metadata().position(), Position::Tag(7));
            prop_assert_eq!(&message.payload()[..], b"payload");
            prop_assert_eq!(message.headers().len(), entries_in_table + usize::from(has_id));
            prop_assert!(message.metadata().attempt() >= 1);
            let bound = 4 * encoded.len() + id_bytes;
            prop_assert!(
                header_bytes(&message) <= bound,
                "{} header bytes from a {}-byte table", header_bytes(&message), encoded.len()
            );
        }

        /// `x-delivery-count` of any type: a non-negative integer (any
        /// width, or a timestamp) counts the earlier attempts; anything
        /// else is ignored and the attempt comes from the redelivered flag.
        #[test]
        fn a_delivery_count_of_any_type_gives_a_sensible_attempt(
            count in value(),
            redelivered in any::<bool>(),
        ) {
            let mut table = FieldTable::default();
            table.insert(ShortString::from(headers::DELIVERY_COUNT), count.clone());
            let mut reader = DeliveryReader::new("orders".into());
            let message = reader.read(deliver(table, redelivered, None), 1);
            let attempt = message.metadata().attempt();
            let earlier: Option<i128> = match count {
                AMQPValue::ShortShortInt(v) => Some(v.into()),
                AMQPValue::ShortShortUInt(v) => Some(v.into()),
                AMQPValue::ShortInt(v) => Some(v.into()),
                AMQPValue::ShortUInt(v) => Some(v.into()),
                AMQPValue::LongInt(v) => Some(v.into()),
                AMQPValue::LongUInt(v) => Some(v.into()),
                AMQPValue::LongLongInt(v) => Some(v.into()),
                AMQPValue::Timestamp(v) => Some(v.into()),
                _ => None,
            };
            let expected = match earlier.filter(|earlier| *earlier >= 0) {
                Some(earlier) => u32::try_from(earlier + 1).unwrap_or(u32::MAX),
                None if redelivered => 2,
                None => 1,
            };
            prop_assert_eq!(attempt, expected);
        }

        /// Bytes off the wire as a header table: never a panic, and what
        /// lapin accepts converts within the same bound.
        #[test]
        fn arbitrary_bytes_as_a_header_table_never_panic(bytes in vec(any::<u8>(), 0..512)) {
            if let Ok((_, table)) = parse_field_table(bytes.as_slice()) {
                let mut reader = DeliveryReader::new("orders".into());
                let message = reader.read(deliver(table, false, None), 1);
                prop_assert!(header_bytes(&message) <= 4 * bytes.len());
            }
        }
    }
}
