//! The message a handler receives: payload, key, headers and [`Metadata`].
//!
//! Every part is cheap to clone (reference-counted bytes and names), so the
//! runtime can keep a copy for redelivery and middleware can inspect a message
//! without copying its payload.

mod headers;
mod metadata;

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

pub use self::headers::{Header, Headers};
pub use self::metadata::{FirstDelivery, Metadata, PartitionKey, Position, SourceName};

/// A delivery: payload, optional key, headers and metadata.
///
/// A message is one reference-counted allocation: cloning it is a single
/// reference-count bump and moving it copies one pointer, which is what lets
/// the runtime keep a copy for redelivery and hand another to the handler at
/// no measurable cost. The `*_mut` accessors copy the message first if it is
/// shared (copy-on-write), so changing one copy never changes another.
#[derive(Clone)]
pub struct Message {
    inner: Arc<MessageParts>,
}

#[derive(Clone)]
struct MessageParts {
    payload: Bytes,
    key: Option<Bytes>,
    headers: Headers,
    metadata: Metadata,
}

/// What every tombstone's payload points into: it is empty, at an address
/// no other payload has (a static of one byte is an object of its own), so
/// copies of a tombstone stay tombstones and no other message is one (see
/// [`Message::is_tombstone`]). A `bool` beside the payload made the parts
/// 8 bytes larger, and `pipeline_bytes` 5 instructions per message dearer
/// (714 -> 719, benches/callgrind.sh), although it reads no tombstone.
static TOMBSTONE: [u8; 1] = [0];

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("Message");
        if self.is_tombstone() {
            debug.field("tombstone", &true);
        } else {
            debug.field("payload", &self.inner.payload);
        }
        debug
            .field("key", &self.inner.key)
            .field("headers", &self.inner.headers)
            .field("metadata", &self.inner.metadata)
            .finish()
    }
}

impl Message {
    /// A message with `payload` and `metadata`, no key, no headers.
    pub fn new(payload: impl Into<Bytes>, metadata: Metadata) -> Self {
        Self {
            inner: Arc::new(MessageParts {
                payload: payload.into(),
                key: None,
                headers: Headers::new(),
                metadata,
            }),
        }
    }

    /// A message with every part given at once: what a source builds from a
    /// delivery. The same message as `Message::new(payload, metadata)`
    /// followed by [`with_key`](Self::with_key) (for `Some` key) and
    /// [`with_headers`](Self::with_headers), written once into its
    /// allocation instead of once per `with_*` call.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use intake_core::{Headers, Message, Metadata, Position};
    ///
    /// let headers: Headers = [("trace", "t-1")].into_iter().collect();
    /// let metadata = Metadata::new("orders".into(), 0, Position::Offset(7));
    /// let message = Message::from_parts("{}", Some(Bytes::from("customer-7")), headers, metadata);
    /// assert_eq!(message.key().map(|key| &key[..]), Some(&b"customer-7"[..]));
    /// assert_eq!(message.headers().get_str("trace"), Some("t-1"));
    /// ```
    pub fn from_parts(
        payload: impl Into<Bytes>,
        key: Option<Bytes>,
        headers: Headers,
        metadata: Metadata,
    ) -> Self {
        Self {
            inner: Arc::new(MessageParts {
                payload: payload.into(),
                key,
                headers,
                metadata,
            }),
        }
    }

    /// A message with no payload at all (see
    /// [`is_tombstone`](Self::is_tombstone)), no key, no headers: what a
    /// source builds from a record whose value is null.
    pub fn tombstone(metadata: Metadata) -> Self {
        Self::tombstone_from_parts(None, Headers::new(), metadata)
    }

    /// A tombstone (see [`is_tombstone`](Self::is_tombstone)) with its key
    /// and headers given at once, as [`from_parts`](Self::from_parts) does
    /// for a message with a payload.
    pub fn tombstone_from_parts(key: Option<Bytes>, headers: Headers, metadata: Metadata) -> Self {
        Self::from_parts(Bytes::from_static(&TOMBSTONE[..0]), key, headers, metadata)
    }

    /// Whether the broker delivered this message with no payload at all, as
    /// opposed to an empty one: a Kafka record whose value is null, which a
    /// compacted topic reads as "delete this key" (a tombstone). Its
    /// [`payload`](Self::payload) is empty.
    ///
    /// Only Kafka has such records; every other backend's messages always
    /// have a payload, if an empty one. The extractors that decode
    /// ([`Json`](crate::Json), [`Decoded`](crate::Decoded)) refuse a
    /// tombstone with a permanent [`DecodeError`](crate::DecodeError) that
    /// says so; `Option<Json<T>>` and `Option<Decoded<T>>` take it as
    /// `None`, for handlers of compacted topics. [`Payload`](crate::Payload)
    /// and `Message` hand it over as it is (an empty payload).
    pub fn is_tombstone(&self) -> bool {
        let payload = &self.inner.payload;
        payload.is_empty() && std::ptr::eq(payload.as_ptr(), TOMBSTONE.as_ptr())
    }

    fn parts_mut(&mut self) -> &mut MessageParts {
        Arc::make_mut(&mut self.inner)
    }

    /// Sets the key.
    pub fn with_key(mut self, key: impl Into<Bytes>) -> Self {
        self.parts_mut().key = Some(key.into());
        self
    }

    /// Sets the headers.
    pub fn with_headers(mut self, headers: Headers) -> Self {
        self.parts_mut().headers = headers;
        self
    }

    /// The payload bytes.
    pub fn payload(&self) -> &Bytes {
        &self.inner.payload
    }

    /// The key, if the broker carries one (Kafka key, AMQP routing key, a
    /// configured Redis field).
    pub fn key(&self) -> Option<&Bytes> {
        self.inner.key.as_ref()
    }

    /// The headers.
    pub fn headers(&self) -> &Headers {
        &self.inner.headers
    }

    /// Mutable headers (copy-on-write).
    pub fn headers_mut(&mut self) -> &mut Headers {
        &mut self.parts_mut().headers
    }

    /// The metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.inner.metadata
    }

    /// Mutable metadata (copy-on-write; middleware that counts attempts uses
    /// this).
    pub fn metadata_mut(&mut self) -> &mut Metadata {
        &mut self.parts_mut().metadata
    }

    /// The bytes this message holds: payload, key, and header names and
    /// values. What the in-flight byte budget counts; the fixed cost of a
    /// message (its metadata and the `Arc`, about 150 bytes) is not.
    #[inline]
    pub fn byte_size(&self) -> usize {
        let parts = &*self.inner;
        let headers: usize = parts
            .headers
            .iter()
            .map(|header| header.name.len() + header.value.len())
            .sum();
        parts.payload.len() + parts.key.as_ref().map_or(0, Bytes::len) + headers
    }

    /// The payload, taken out of the message (a reference-count bump if the
    /// message is shared).
    pub fn into_payload(self) -> Bytes {
        match Arc::try_unwrap(self.inner) {
            Ok(parts) => parts.payload,
            Err(shared) => shared.payload.clone(),
        }
    }
}

/// A payload preview for error messages: at most `limit` bytes, with
/// non-printable bytes escaped, and a note of how much was cut.
pub fn payload_preview(payload: &[u8], limit: usize) -> String {
    let shown = &payload[..payload.len().min(limit)];
    let mut preview: String = shown.escape_ascii().to_string();
    if payload.len() > limit {
        preview.push_str(&format!("… ({} more bytes)", payload.len() - limit));
    }
    preview
}

/// `text` cut to at most `limit` bytes at a char boundary, with a note of
/// how much was cut: for error text that may quote outside input.
pub(crate) fn capped_text(mut text: String, limit: usize) -> String {
    if text.len() <= limit {
        return text;
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let cut = text.len() - end;
    text.truncate(end);
    text.push_str(&format!("… ({cut} bytes cut)"));
    text
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;

    #[test]
    fn headers_are_empty_without_allocation_and_copy_on_write() {
        let mut headers = Headers::new();
        assert!(headers.is_empty());
        headers.insert("a", Bytes::from_static(b"1"));
        let shared = headers.clone();
        headers.set("a", Bytes::from_static(b"2"));
        assert_eq!(shared.get_str("a"), Some("1"));
        assert_eq!(headers.get_str("a"), Some("2"));
        assert_eq!(headers.len(), 1);
    }

    #[test]
    fn preview_escapes_and_truncates() {
        let preview = payload_preview(b"ab\x00\xffcd", 4);
        assert_eq!(preview, "ab\\x00\\xff… (2 more bytes)");
    }

    /// The parts live in one `Arc` allocation per message (two counters,
    /// 16 bytes, on top): at 136 bytes that is a 152-byte request, a
    /// 160-byte glibc chunk (176 with `Option<SystemTime>` as the
    /// timestamp). A field added here costs every message.
    #[test]
    fn message_parts_stay_within_their_size() {
        let parts = std::mem::size_of::<MessageParts>();
        println!(
            "MessageParts: {parts} bytes, Metadata: {} bytes",
            std::mem::size_of::<Metadata>()
        );
        assert!(parts <= 136, "MessageParts grew to {parts} bytes");
        assert_eq!(std::mem::size_of::<Message>(), std::mem::size_of::<usize>());
    }

    #[test]
    fn from_parts_is_new_with_key_and_headers() {
        let metadata = Metadata::new("orders".into(), 3, Position::Offset(9));
        let headers: Headers = [("a", "1")].into_iter().collect();
        let built = Message::new("p", metadata.clone())
            .with_key("k")
            .with_headers(headers.clone());
        let at_once = Message::from_parts(
            "p",
            Some(Bytes::from_static(b"k")),
            headers.clone(),
            metadata.clone(),
        );
        assert_eq!(format!("{built:?}"), format!("{at_once:?}"));
        assert!(!at_once.is_tombstone());
        let tombstone = Message::tombstone_from_parts(None, Headers::new(), metadata.clone());
        assert!(tombstone.is_tombstone());
        assert_eq!(
            format!("{tombstone:?}"),
            format!("{:?}", Message::tombstone(metadata))
        );
    }

    #[test]
    fn timestamps_and_first_deliveries_read_back_as_set() {
        let mut metadata = Metadata::new("orders".into(), 0, Position::Offset(1));
        assert_eq!(metadata.timestamp(), None);
        let far = Duration::from_secs(400 * 365 * 24 * 3600);
        let times = [
            SystemTime::UNIX_EPOCH,
            SystemTime::UNIX_EPOCH + Duration::new(1_764_900_000, 123_456_789),
            SystemTime::UNIX_EPOCH - Duration::new(5, 1),
            SystemTime::UNIX_EPOCH + far,
            SystemTime::UNIX_EPOCH - far,
            SystemTime::UNIX_EPOCH + Duration::from_nanos(i64::MAX as u64),
            SystemTime::UNIX_EPOCH - Duration::from_nanos(i64::MAX as u64 - 1),
            SystemTime::UNIX_EPOCH - Duration::from_nanos(i64::MAX as u64),
        ];
        for time in times {
            metadata.set_timestamp(Some(time));
            assert_eq!(metadata.timestamp(), Some(time));
        }
        metadata.set_timestamp(None);
        assert_eq!(metadata.timestamp(), None);
        assert!(!metadata.has_rare(), "nothing rare is left allocated");

        let first = FirstDelivery {
            source: "orders".into(),
            partition: 2,
            position: Position::Offset(5),
        };
        metadata.set_parked_from(Some(first.clone()));
        metadata.set_timestamp(Some(SystemTime::UNIX_EPOCH + far));
        let copy = metadata.clone();
        metadata.set_timestamp(Some(SystemTime::UNIX_EPOCH));
        assert_eq!(metadata.parked_from(), Some(&first));
        assert_eq!(copy.timestamp(), Some(SystemTime::UNIX_EPOCH + far));
        assert_eq!(metadata.timestamp(), Some(SystemTime::UNIX_EPOCH));
        assert_eq!(metadata.first_delivery(), first);
        metadata.set_parked_from(None);
        assert!(!metadata.has_rare());
        assert_eq!(metadata.first_delivery().position, Position::Offset(1));
    }

    #[test]
    fn unix_millis_set_the_same_timestamp_as_the_instant() {
        let max_nanos_millis = i64::MAX / 1_000_000;
        let millis = [
            0,
            1,
            -1,
            1_764_900_000_123,
            max_nanos_millis,
            max_nanos_millis + 1,
            -max_nanos_millis,
            -max_nanos_millis - 1,
            i64::MAX,
            i64::MIN,
        ];
        let far = SystemTime::UNIX_EPOCH + Duration::from_secs(400 * 365 * 24 * 3600);
        for millis in millis {
            let after = Duration::from_millis(millis.unsigned_abs());
            let instant = if millis >= 0 {
                SystemTime::UNIX_EPOCH.checked_add(after)
            } else {
                SystemTime::UNIX_EPOCH.checked_sub(after)
            };
            // From no timestamp, and from one kept out of line.
            for before in [None, Some(far)] {
                let mut by_millis = Metadata::new("orders".into(), 0, Position::Offset(1));
                by_millis.set_timestamp(before);
                by_millis.set_timestamp_unix_millis(millis);
                assert_eq!(by_millis.timestamp(), instant, "{millis} ms");
                let mut by_instant = Metadata::new("orders".into(), 0, Position::Offset(1));
                by_instant.set_timestamp(instant);
                assert_eq!(by_millis.has_rare(), by_instant.has_rare(), "{millis} ms");
            }
        }
    }

    #[test]
    fn positions_display_in_broker_terms() {
        assert_eq!(Position::StreamId { ms: 5, seq: 1 }.to_string(), "5-1");
        assert_eq!(Position::Offset(42).to_string(), "42");
    }
}
