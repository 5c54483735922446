//! The message a handler receives: payload, key, headers and [`Metadata`].
//!
//! Every part is cheap to clone (reference-counted bytes and names), so the
//! runtime can keep a copy for redelivery and middleware can inspect a message
//! without copying its payload.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

/// The name of a topic, stream or queue. Cloning is a reference-count bump.
pub type SourceName = Arc<str>;

/// Where a delivery sits in its partition, in the broker's own terms.
///
/// Positions of one partition are strictly increasing in delivery order; they
/// may have gaps (Kafka transaction markers, compaction, deleted stream
/// entries), which the commit engine skips.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Position {
    /// A Kafka offset or a memory-broker offset.
    Offset(i64),
    /// A Redis stream entry id, `<ms>-<seq>`.
    StreamId {
        /// Milliseconds part of the id.
        ms: u64,
        /// Sequence part of the id.
        seq: u64,
    },
    /// An AMQP delivery tag (scoped to the channel it was delivered on).
    Tag(u64),
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Position::Offset(offset) => write!(f, "{offset}"),
            Position::StreamId { ms, seq } => write!(f, "{ms}-{seq}"),
            Position::Tag(tag) => write!(f, "{tag}"),
        }
    }
}

/// Identifies a partition: a source name and a partition number within it.
///
/// Kafka: topic and partition. Redis Streams: the stream key, partition 0.
/// AMQP: the queue and the epoch of the channel the deliveries arrived on (a
/// reopened channel is a new partition, so tags of the old one are fenced).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionKey {
    /// Topic, stream or queue.
    pub source: SourceName,
    /// Partition number within the source.
    pub partition: u32,
}

impl PartitionKey {
    /// A key for `partition` of `source`.
    pub fn new(source: impl Into<SourceName>, partition: u32) -> Self {
        Self {
            source: source.into(),
            partition,
        }
    }
}

impl fmt::Debug for PartitionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.source, self.partition)
    }
}

impl fmt::Display for PartitionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Where a message was first delivered: its source, partition and position
/// there. A parked copy that comes back is delivered elsewhere (a return
/// topic, a return stream, the tail of its queue) but is still that message:
/// see [`Metadata::parked_from`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FirstDelivery {
    /// Topic, stream or queue of the first delivery.
    pub source: SourceName,
    /// Partition within it.
    pub partition: u32,
    /// The broker's position of the first delivery.
    pub position: Position,
}

/// Where a message came from and how often it was delivered.
#[derive(Clone)]
pub struct Metadata {
    source: SourceName,
    partition: u32,
    position: Position,
    /// Nanoseconds since the Unix epoch, or [`NO_TIMESTAMP`], or
    /// [`RARE_TIMESTAMP`] for one past ±292 years of 1970. One word where
    /// `Option<SystemTime>` took two: with it the message's allocation is
    /// a 160-byte glibc chunk instead of 176.
    timestamp: i64,
    attempt: u32,
    /// Boxed: only parked copies that came back and timestamps past the
    /// range of `timestamp` have one, and every other message pays one
    /// word for it.
    rare: Option<Arc<RareMetadata>>,
}

/// The parts of [`Metadata`] that a message on the hot path does not have.
#[derive(Clone, Default)]
struct RareMetadata {
    parked_from: Option<FirstDelivery>,
    timestamp: Option<SystemTime>,
}

/// `Metadata::timestamp` for none.
const NO_TIMESTAMP: i64 = i64::MIN;
/// `Metadata::timestamp` for one kept in [`RareMetadata`].
const RARE_TIMESTAMP: i64 = i64::MIN + 1;

/// `time` as nanoseconds since the Unix epoch, if it is within ±292 years
/// of it (and not one of the two markers).
fn epoch_nanos(time: SystemTime) -> Option<i64> {
    let nanos = match time.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_nanos()).ok()?,
        Err(before) => i64::try_from(before.duration().as_nanos())
            .ok()?
            .checked_neg()?,
    };
    (nanos > RARE_TIMESTAMP).then_some(nanos)
}

impl fmt::Debug for Metadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metadata")
            .field("source", &self.source)
            .field("partition", &self.partition)
            .field("position", &self.position)
            .field("timestamp", &self.timestamp())
            .field("attempt", &self.attempt)
            .field("parked_from", &self.parked_from())
            .finish()
    }
}

impl Metadata {
    /// Metadata for a first delivery at `position` of `source`/`partition`.
    pub fn new(source: SourceName, partition: u32, position: Position) -> Self {
        Self {
            source,
            partition,
            position,
            timestamp: NO_TIMESTAMP,
            attempt: 1,
            rare: None,
        }
    }

    /// Topic, stream or queue the message was read from.
    pub fn source(&self) -> &SourceName {
        &self.source
    }

    /// Partition within the source.
    pub fn partition(&self) -> u32 {
        self.partition
    }

    /// The partition this message belongs to, as a key.
    pub fn partition_key(&self) -> PartitionKey {
        PartitionKey {
            source: self.source.clone(),
            partition: self.partition,
        }
    }

    /// The broker's position of the message within its partition.
    pub fn position(&self) -> Position {
        self.position
    }

    /// When the broker (or producer) stamped the message, if it did.
    pub fn timestamp(&self) -> Option<SystemTime> {
        match self.timestamp {
            NO_TIMESTAMP => None,
            RARE_TIMESTAMP => self.rare.as_ref().and_then(|rare| rare.timestamp),
            nanos => match u64::try_from(nanos) {
                Ok(after) => SystemTime::UNIX_EPOCH.checked_add(Duration::from_nanos(after)),
                Err(_) => {
                    SystemTime::UNIX_EPOCH.checked_sub(Duration::from_nanos(nanos.unsigned_abs()))
                }
            },
        }
    }

    /// Delivery attempt, starting at 1. Counts broker redeliveries where the
    /// broker keeps a count (Redis, AMQP quorum queues) and in-process retries.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Where this message was first delivered, when this delivery came
    /// back from a park (a parked copy, or on NATS the original handed back
    /// after its delay, whose first delivery is its own position); `None`
    /// for a message delivered first-hand. A handler tells a second chance
    /// by it (`meta.parked_from().is_some()`).
    ///
    /// The [`ParkingLayer`](crate::parking::ParkingLayer) sets it, for the
    /// layers and handler inside it, from the park headers of a copy its
    /// parking gave back (never from headers a producer wrote on an
    /// ordinary message). What identifies a message across redeliveries
    /// (an exactly-once marker, a dead letter's origin) is this first
    /// delivery, not the copy's own position, which is new each time the
    /// message is parked.
    pub fn parked_from(&self) -> Option<&FirstDelivery> {
        self.rare
            .as_ref()
            .and_then(|rare| rare.parked_from.as_ref())
    }

    /// The first delivery of this message: [`parked_from`](Self::parked_from)
    /// for a parked copy that came back, this delivery otherwise.
    pub fn first_delivery(&self) -> FirstDelivery {
        match self.parked_from() {
            Some(first) => first.clone(),
            None => FirstDelivery {
                source: self.source.clone(),
                partition: self.partition,
                position: self.position,
            },
        }
    }

    /// Sets where this message was first delivered (see
    /// [`parked_from`](Self::parked_from)).
    pub fn set_parked_from(&mut self, first: Option<FirstDelivery>) {
        self.set_rare(|rare| rare.parked_from = first);
    }

    /// Changes the rare parts, allocating them only when they are not all
    /// `None` afterwards.
    fn set_rare(&mut self, change: impl FnOnce(&mut RareMetadata)) {
        let mut rare = self
            .rare
            .take()
            .map(Arc::unwrap_or_clone)
            .unwrap_or_default();
        change(&mut rare);
        if rare.parked_from.is_some() || rare.timestamp.is_some() {
            self.rare = Some(Arc::new(rare));
        }
    }

    /// Sets the timestamp.
    pub fn set_timestamp(&mut self, timestamp: Option<SystemTime>) {
        let nanos = match timestamp {
            None => Some(NO_TIMESTAMP),
            Some(time) => epoch_nanos(time),
        };
        if self.timestamp == RARE_TIMESTAMP {
            self.set_rare(|rare| rare.timestamp = None);
        }
        match nanos {
            Some(nanos) => self.timestamp = nanos,
            None => {
                self.timestamp = RARE_TIMESTAMP;
                self.set_rare(|rare| rare.timestamp = timestamp);
            }
        }
    }

    /// Sets the delivery attempt (1 = first delivery).
    pub fn set_attempt(&mut self, attempt: u32) {
        self.attempt = attempt.max(1);
    }

    /// Builder form of [`Metadata::set_timestamp`].
    pub fn with_timestamp(mut self, timestamp: SystemTime) -> Self {
        self.set_timestamp(Some(timestamp));
        self
    }

    /// Builder form of [`Metadata::set_attempt`].
    pub fn with_attempt(mut self, attempt: u32) -> Self {
        self.set_attempt(attempt);
        self
    }
}

/// One header: a name and raw bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Header name. Brokers compare names case-sensitively; so does intake.
    pub name: Arc<str>,
    /// Raw header value.
    pub value: Bytes,
}

/// Message headers: an ordered list, cheap to clone, empty without allocation.
///
/// Lookups are linear: messages carry few headers, and a scan of a handful of
/// entries is faster than hashing.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Headers {
    entries: Option<Arc<Vec<Header>>>,
}

impl Headers {
    /// No headers.
    pub const fn new() -> Self {
        Self { entries: None }
    }

    /// The first value of header `name`.
    pub fn get(&self, name: &str) -> Option<&Bytes> {
        self.iter()
            .find(|header| &*header.name == name)
            .map(|header| &header.value)
    }

    /// The first value of header `name`, if it is UTF-8.
    pub fn get_str(&self, name: &str) -> Option<&str> {
        self.get(name)
            .and_then(|value| std::str::from_utf8(value).ok())
    }

    /// Appends a header (copy-on-write if this list is shared).
    pub fn insert(&mut self, name: impl Into<Arc<str>>, value: impl Into<Bytes>) {
        let entries = self.entries.get_or_insert_with(Default::default);
        Arc::make_mut(entries).push(Header {
            name: name.into(),
            value: value.into(),
        });
    }

    /// Replaces every header called `name` with one of value `value`.
    pub fn set(&mut self, name: impl Into<Arc<str>>, value: impl Into<Bytes>) {
        let name = name.into();
        if let Some(entries) = self.entries.as_mut() {
            Arc::make_mut(entries).retain(|header| header.name != name);
        }
        self.insert(name, value);
    }

    /// All headers in order.
    pub fn iter(&self) -> std::slice::Iter<'_, Header> {
        match &self.entries {
            Some(entries) => entries.iter(),
            None => [].iter(),
        }
    }

    /// Number of headers.
    pub fn len(&self) -> usize {
        self.entries.as_ref().map_or(0, |entries| entries.len())
    }

    /// Whether there are no headers.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.iter().map(|header| {
                (
                    &*header.name,
                    String::from_utf8_lossy(&header.value).into_owned(),
                )
            }))
            .finish()
    }
}

impl<N: Into<Arc<str>>, V: Into<Bytes>> FromIterator<(N, V)> for Headers {
    fn from_iter<I: IntoIterator<Item = (N, V)>>(iter: I) -> Self {
        let entries: Vec<Header> = iter
            .into_iter()
            .map(|(name, value)| Header {
                name: name.into(),
                value: value.into(),
            })
            .collect();
        if entries.is_empty() {
            Self::new()
        } else {
            Self {
                entries: Some(Arc::new(entries)),
            }
        }
    }
}

impl<'a> IntoIterator for &'a Headers {
    type Item = &'a Header;
    type IntoIter = std::slice::Iter<'a, Header>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

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
        assert!(metadata.rare.is_none(), "nothing rare is left allocated");

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
        assert!(metadata.rare.is_none());
        assert_eq!(metadata.first_delivery().position, Position::Offset(1));
    }

    #[test]
    fn positions_display_in_broker_terms() {
        assert_eq!(Position::StreamId { ms: 5, seq: 1 }.to_string(), "5-1");
        assert_eq!(Position::Offset(42).to_string(), "42");
    }
}
