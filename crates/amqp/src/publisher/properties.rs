//! An output's AMQP properties, and the size of the frame that carries
//! them.

use intake_core::publish::{Output, PublishError, PublishErrorKind};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use crate::headers;
use crate::topology::MAX_NAME_BYTES;

use super::{AmqpPublisher, PERSISTENT, Routing};

/// The output's properties: persistent, the `amqp.` headers as
/// properties again, the others as a table of long strings.
pub(super) fn properties(
    output: &Output,
    routing: &Routing,
    persistent: bool,
) -> Result<BasicProperties, PublishError> {
    let mut properties = BasicProperties::default();
    if persistent {
        properties = properties.with_delivery_mode(PERSISTENT);
    }
    let mut table = FieldTable::default();
    for header in output.headers() {
        let (name, value) = (&*header.name, &header.value);
        let property = || {
            std::str::from_utf8(value)
                .ok()
                .and_then(|text| ShortString::try_new(text).ok())
        };
        match (name, property()) {
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
            (headers::DELIVERY_COUNT, _) => continue,
            _ => {}
        }
        let Ok(name) = ShortString::try_new(name) else {
            return Err(PublishError::new(
                PublishErrorKind::Rejected,
                output.destination(),
                format!(
                    "header `{}…` has a name longer than the {MAX_NAME_BYTES} bytes AMQP \
                     allows",
                    &name[..name.floor_char_boundary(32)]
                ),
            ));
        };
        table.insert(
            name,
            AMQPValue::LongString(LongString::from(value.to_vec())),
        );
    }
    // After the headers: a forwarded message's own key header must not
    // stand in for this output's key.
    if let (Routing::Exchange(_), Some(key)) = (routing, output.key()) {
        table.insert(
            ShortString::from(AmqpPublisher::KEY_HEADER),
            AMQPValue::LongString(LongString::from(key.to_vec())),
        );
    }
    Ok(properties.with_headers(table))
}

/// The size of the content header frame's payload for `properties` as this
/// publisher sets them: class, weight, body size, flags, then the
/// properties it uses.
pub(super) fn content_header_len(properties: &BasicProperties) -> usize {
    let short =
        |text: &Option<ShortString>| text.as_ref().map_or(0, |text| 1 + text.as_str().len());
    let table = properties.headers().as_ref().map_or(0, |table| {
        4 + table
            .inner()
            .iter()
            .map(|(name, value)| {
                1 + name.as_str().len()
                    + match value {
                        AMQPValue::LongString(text) => 1 + 4 + text.as_bytes().len(),
                        // Only long strings are written; anything else is
                        // counted generously.
                        _ => 1 + 8,
                    }
            })
            .sum::<usize>()
    });
    2 + 2
        + 8
        + 2
        + short(properties.content_type())
        + short(properties.message_id())
        + short(properties.correlation_id())
        + usize::from(properties.delivery_mode().is_some())
        + table
}
