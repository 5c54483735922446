//! Turning an rdkafka message into an intake [`Message`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use intake_core::{Headers, Message, Metadata, Position, SourceName};
use rdkafka::Message as _;
use rdkafka::message::{BorrowedMessage, Headers as _};

/// Interns topic names so that each message shares its topic's `Arc<str>`
/// instead of allocating one.
#[derive(Debug, Default)]
pub(crate) struct TopicNames {
    names: Vec<SourceName>,
}

impl TopicNames {
    pub(crate) fn get(&mut self, topic: &str) -> SourceName {
        if let Some(name) = self.names.iter().find(|name| ***name == *topic) {
            return name.clone();
        }
        let name: SourceName = topic.into();
        self.names.push(name.clone());
        name
    }
}

/// Copies `message` out of librdkafka's buffer. A header without a value
/// becomes an empty one. Returns `None` for a negative partition number,
/// which no broker sends.
pub(crate) fn to_message(
    message: &BorrowedMessage<'_>,
    topics: &mut TopicNames,
) -> Option<Message> {
    let partition = u32::try_from(message.partition()).ok()?;
    let mut metadata = Metadata::new(
        topics.get(message.topic()),
        partition,
        Position::Offset(message.offset()),
    );
    let timestamp = message
        .timestamp()
        .to_millis()
        .and_then(|millis| u64::try_from(millis).ok())
        .map(|millis| UNIX_EPOCH + Duration::from_millis(millis));
    metadata.set_timestamp(timestamp);
    let payload = message
        .payload()
        .map(Bytes::copy_from_slice)
        .unwrap_or_default();
    let mut converted = Message::new(payload, metadata);
    if let Some(key) = message.key() {
        converted = converted.with_key(Bytes::copy_from_slice(key));
    }
    if let Some(headers) = message.headers() {
        let headers: Headers = headers
            .iter()
            .map(|header| {
                (
                    header.key,
                    header.value.map(Bytes::copy_from_slice).unwrap_or_default(),
                )
            })
            .collect();
        converted = converted.with_headers(headers);
    }
    Some(converted)
}

/// Milliseconds since the Unix epoch, as text, for headers.
pub(crate) fn epoch_millis(time: SystemTime) -> String {
    time.duration_since(UNIX_EPOCH)
        .map(|since| since.as_millis())
        .unwrap_or(0)
        .to_string()
}
