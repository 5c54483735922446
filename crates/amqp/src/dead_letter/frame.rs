//! Fitting a dead letter into one frame: its properties, whole or
//! reduced, and the size AMQP encodes them in.

use intake_core::DeadLetter;
use intake_core::dead_letter::envelope::{Carrier, Envelope};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use crate::headers;
use crate::topology::{MAX_NAME_BYTES, short};

use super::PERSISTENT;

/// How a dead letter fits the connection's frames.
pub(super) enum Fit {
    /// Whole.
    Full(BasicProperties),
    /// Reduced; `full` is the size its headers would have taken whole.
    Reduced {
        properties: BasicProperties,
        full: usize,
    },
    /// Not even reduced; `reduced` is the size its headers take then.
    Rejected { reduced: usize },
}

/// Frame type, channel, payload size and end marker.
pub(super) const FRAME_OVERHEAD: usize = 8;

/// How `letter` fits frames of `frame_max` bytes (0: no limit): whole,
/// reduced, or not at all.
pub(super) fn fitting(letter: &DeadLetter, carrier: &Carrier, frame_max: u32, token: &str) -> Fit {
    let full = properties(letter, carrier, Shape::Full, token);
    let room = usize::try_from(frame_max)
        .unwrap_or(usize::MAX)
        .saturating_sub(FRAME_OVERHEAD);
    let full_size = content_header_len(&full);
    if frame_max == 0 || full_size <= room {
        return Fit::Full(full);
    }
    let reduced = properties(letter, carrier, Shape::Reduced, token);
    match content_header_len(&reduced) {
        size if size <= room => Fit::Reduced {
            properties: reduced,
            full: full_size,
        },
        size => Fit::Rejected { reduced: size },
    }
}

/// What a dead letter carries of its original.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shape {
    /// Everything.
    Full,
    /// What fits the smallest frame: the properties, the envelope, the
    /// error cut; no other headers.
    Reduced,
}

/// Properties of the dead letter: persistent, the original properties, the
/// original headers (unless reduced), the envelope's fields and the
/// letter's `token` ([`headers::LETTER_ID`]), all as long strings.
pub(super) fn properties(
    letter: &DeadLetter,
    carrier: &Carrier,
    shape: Shape,
    token: &str,
) -> BasicProperties {
    let mut envelope = Envelope::new(letter, carrier);
    let mut properties = BasicProperties::default().with_delivery_mode(PERSISTENT);
    let mut table = FieldTable::default();
    let mut omitted = 0;
    for (name, value) in envelope.headers() {
        // The properties a delivery's headers show under `amqp.` names go
        // back to being properties; one that cannot be a property (longer
        // than 255 bytes, not UTF-8: from another broker) stays a header.
        let property = || {
            std::str::from_utf8(value)
                .ok()
                .and_then(|text| ShortString::try_new(text).ok())
        };
        match (&*name, property()) {
            (headers::MESSAGE_ID, Some(value)) => {
                properties = properties.with_message_id(value);
                continue;
            }
            (headers::CORRELATION_ID, Some(value)) => {
                properties = properties.with_correlation_id(value);
                continue;
            }
            (headers::CONTENT_TYPE, Some(value)) => {
                properties = properties.with_content_type(value);
                continue;
            }
            _ if shape == Shape::Reduced => {
                omitted += 1;
                continue;
            }
            _ => {}
        }
        match ShortString::try_new(&*name) {
            Ok(name) => {
                table.insert(
                    name,
                    AMQPValue::LongString(LongString::from(value.to_vec())),
                );
            }
            Err(_) => {
                omitted += 1;
                tracing::warn!(
                    header = &name[..name.floor_char_boundary(64)],
                    "header name longer than {MAX_NAME_BYTES} bytes left out of the dead letter"
                );
            }
        }
    }
    envelope.count_omitted(omitted);
    if shape == Shape::Reduced {
        envelope.cap_error(headers::DEAD_LETTER_ERROR_REDUCED_BYTES);
    }
    for (name, value) in envelope.fields() {
        table.insert(
            short(name),
            AMQPValue::LongString(LongString::from(value.to_vec())),
        );
    }
    table.insert(
        short(headers::LETTER_ID),
        AMQPValue::LongString(LongString::from(token)),
    );
    properties.with_headers(table)
}

/// The size of the content header frame's payload that carries
/// `properties` (class, weight, body size, property flags, properties), as
/// AMQP 0-9-1 encodes it.
pub(super) fn content_header_len(properties: &BasicProperties) -> usize {
    let short =
        |text: &Option<ShortString>| text.as_ref().map_or(0, |text| 1 + text.as_str().len());
    let octet = |value: &Option<u8>| usize::from(value.is_some());
    2 + 2
        + 8
        + 2
        + short(properties.content_type())
        + short(properties.content_encoding())
        + properties.headers().as_ref().map_or(0, table_len)
        + octet(properties.delivery_mode())
        + octet(properties.priority())
        + short(properties.correlation_id())
        + short(properties.reply_to())
        + short(properties.expiration())
        + short(properties.message_id())
        + properties.timestamp().map_or(0, |_| 8)
        + short(properties.kind())
        + short(properties.user_id())
        + short(properties.app_id())
        + short(properties.cluster_id())
}

fn table_len(table: &FieldTable) -> usize {
    4 + table
        .inner()
        .iter()
        .map(|(name, value)| 1 + name.as_str().len() + value_len(value))
        .sum::<usize>()
}

/// A field value with its type tag.
fn value_len(value: &AMQPValue) -> usize {
    1 + match value {
        AMQPValue::Boolean(_) | AMQPValue::ShortShortInt(_) | AMQPValue::ShortShortUInt(_) => 1,
        AMQPValue::ShortInt(_) | AMQPValue::ShortUInt(_) => 2,
        AMQPValue::LongInt(_) | AMQPValue::LongUInt(_) | AMQPValue::Float(_) => 4,
        AMQPValue::LongLongInt(_) | AMQPValue::Double(_) | AMQPValue::Timestamp(_) => 8,
        AMQPValue::DecimalValue(_) => 5,
        AMQPValue::ShortString(text) => 1 + text.as_str().len(),
        AMQPValue::LongString(text) => 4 + text.as_bytes().len(),
        AMQPValue::FieldArray(items) => 4 + items.as_slice().iter().map(value_len).sum::<usize>(),
        AMQPValue::FieldTable(table) => table_len(table),
        AMQPValue::ByteArray(bytes) => 4 + bytes.as_slice().len(),
        AMQPValue::Void => 0,
    }
}
