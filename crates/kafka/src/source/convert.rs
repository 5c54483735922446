//! Turning an rdkafka message into an intake [`Message`], in two steps: the
//! polling thread copies it out of librdkafka's buffer into a [`Record`],
//! and the source makes the record a `Message` on the runtime's thread.
//!
//! librdkafka's buffer is released when the polled message is, so payloads
//! and keys are copied out. Small ones are copied into shared chunks rather
//! than an allocation each: at ~100-byte messages, two allocations per
//! message (freed on another thread) cost more than the rest of the
//! conversion.
//!
//! The `Message` itself is one allocation, which the runtime frees when it is
//! done with it. Made on the polling thread, every one would be freed on
//! another thread, and glibc's allocator then takes the polling thread's
//! arena lock for each free, against the polling thread's own allocations:
//! measured, about a quarter of the adapter's CPU per message
//! (`BENCHMARKS.md`). Made on the thread that will free it, it comes from
//! and goes back to that thread's cache.

use std::ffi::{CStr, c_void};

use bytes::{Bytes, BytesMut};
use intake_core::{Headers, Message, Metadata, Position, SourceName};
use rdkafka::bindings;
use rdkafka::message::BorrowedMessage;

use crate::record_headers::HeaderPeek;

/// Interns topic names so that messages share their topic's `Arc<str>`
/// instead of allocating one each.
///
/// Each message clones the `Arc` on the polling thread and the runtime drops
/// that clone on another, so one `Arc` shared by every message would bounce
/// its reference count's cache line between the two cores on every message.
/// A name is handed out [`SHARED_BY`] times, then replaced by a fresh copy:
/// one small allocation per that many messages, and the runtime's decrements
/// land on a count the polling thread no longer touches.
#[derive(Debug, Default)]
pub(crate) struct TopicNames {
    names: Vec<TopicName>,
}

#[derive(Debug)]
struct TopicName {
    name: SourceName,
    handed_out: u32,
}

/// How many messages share one copy of a topic name.
const SHARED_BY: u32 = 256;

impl TopicNames {
    /// The shared name of `topic`, given as librdkafka's bytes: compared as
    /// bytes, so a known name is not validated as UTF-8 again; a new one
    /// with bytes that are not UTF-8 (which no broker allows in a topic
    /// name) gets U+FFFD in their place.
    pub(crate) fn get(&mut self, topic: &[u8]) -> SourceName {
        let known = self
            .names
            .iter_mut()
            .find(|known| known.name.as_bytes() == topic);
        if let Some(known) = known {
            known.handed_out += 1;
            if known.handed_out >= SHARED_BY {
                known.name = SourceName::from(&*known.name);
                known.handed_out = 0;
            }
            return known.name.clone();
        }
        let name: SourceName = String::from_utf8_lossy(topic).into();
        self.names.push(TopicName {
            name: name.clone(),
            handed_out: 0,
        });
        name
    }
}

/// Size of a shared chunk. A chunk lives until the last message copied
/// into it is dropped, so a message that stays in flight keeps at most this
/// much memory besides its own.
const CHUNK: usize = 16 * 1024;

/// Payloads and keys larger than this get an allocation of their own.
const SHARED_UP_TO: usize = 1024;

/// Copies small byte strings into shared chunks.
#[derive(Debug, Default)]
pub(crate) struct Chunks {
    current: BytesMut,
}

impl Chunks {
    fn copy(&mut self, bytes: &[u8]) -> Bytes {
        if bytes.is_empty() {
            return Bytes::new();
        }
        if bytes.len() > SHARED_UP_TO {
            return Bytes::copy_from_slice(bytes);
        }
        if self.current.capacity() - self.current.len() < bytes.len() {
            self.current = BytesMut::with_capacity(CHUNK);
        }
        self.current.extend_from_slice(bytes);
        self.current.split().freeze()
    }
}

/// A message copied out of librdkafka, not yet a [`Message`]
/// ([`into_message`](Self::into_message), on the thread that will drop it).
#[derive(Debug)]
pub(crate) struct Record {
    metadata: Metadata,
    /// `None` for a null value: a tombstone ([`Message::tombstone`]).
    payload: Option<Bytes>,
    key: Option<Bytes>,
    headers: Headers,
}

impl Record {
    /// A record of `payload` without key or headers (tests build their own).
    #[cfg(test)]
    pub(crate) fn new(payload: Bytes, metadata: Metadata) -> Self {
        Self {
            metadata,
            payload: Some(payload),
            key: None,
            headers: Headers::new(),
        }
    }

    pub(crate) fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The bytes the message will hold: [`Message::byte_size`] of
    /// [`into_message`](Self::into_message).
    pub(crate) fn byte_size(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|header| header.name.len() + header.value.len())
            .sum();
        self.payload.as_ref().map_or(0, Bytes::len)
            + self.key.as_ref().map_or(0, Bytes::len)
            + headers
    }

    /// The message (a tombstone for a null value): its one allocation,
    /// made on the calling thread.
    pub(crate) fn into_message(self) -> Message {
        match self.payload {
            Some(payload) => Message::from_parts(payload, self.key, self.headers, self.metadata),
            None => Message::tombstone_from_parts(self.key, self.headers, self.metadata),
        }
    }
}

/// Converts polled messages, sharing topic names and chunks across them.
#[derive(Debug)]
pub(crate) struct Converter {
    topics: TopicNames,
    chunks: Chunks,
    /// Whether records' headers are read (see `ignore_headers` on the
    /// builder).
    read_headers: bool,
    /// Answers "no headers" without librdkafka's parse where it can.
    peek: HeaderPeek,
}

impl Converter {
    pub(crate) fn new(read_headers: bool) -> Self {
        Self {
            topics: TopicNames::default(),
            chunks: Chunks::default(),
            read_headers,
            peek: HeaderPeek::new(),
        }
    }

    /// Copies `message` out of librdkafka's buffer. A header without a value
    /// becomes an empty one. Returns `None` for a negative partition number,
    /// which no broker sends.
    pub(crate) fn convert(&mut self, message: &BorrowedMessage<'_>) -> Option<Record> {
        // SAFETY: `message.ptr()` is the live message `message` borrows.
        self.convert_native(unsafe { &*message.ptr() })
    }

    /// [`convert`](Self::convert) of a message librdkafka returned, by
    /// reference (live while the reference is), without an error.
    pub(crate) fn convert_native(
        &mut self,
        message: &bindings::rd_kafka_message_t,
    ) -> Option<Record> {
        let mut record = to_record(message, &mut self.topics, &mut self.chunks)?;
        if self.read_headers && !self.peek.has_none(message) {
            record.headers = crate::record_headers::read_native_headers(message);
        }
        Some(record)
    }
}

/// The record without its headers.
fn to_record(
    message: &bindings::rd_kafka_message_t,
    topics: &mut TopicNames,
    chunks: &mut Chunks,
) -> Option<Record> {
    let partition = u32::try_from(message.partition).ok()?;
    let mut metadata = Metadata::new(
        topics.get(topic_name(message)),
        partition,
        Position::Offset(message.offset),
    );
    set_timestamp(&mut metadata, timestamp(message));
    Some(Record {
        metadata,
        // A null value stays `None`: a tombstone, not an empty payload.
        // SAFETY: librdkafka points `payload` at `len` bytes and `key` at
        // `key_len` bytes (or null) owned by the message, which is live.
        payload: unsafe { bytes_of(message.payload, message.len) }
            .map(|payload| chunks.copy(payload)),
        // SAFETY: as above.
        key: unsafe { bytes_of(message.key, message.key_len) }.map(|key| chunks.copy(key)),
        headers: Headers::new(),
    })
}

/// The `len` bytes at `data`, `None` for a null pointer.
///
/// # Safety
///
/// A non-null `data` points at `len` initialised bytes that outlive `'a`.
unsafe fn bytes_of<'a>(data: *const c_void, len: usize) -> Option<&'a [u8]> {
    if data.is_null() {
        return None;
    }
    // SAFETY: see the function's contract.
    Some(unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) })
}

/// The record's timestamp in ms since the epoch, as rdkafka's
/// `Timestamp::to_millis` reads it: none when the record has none.
fn timestamp(message: &bindings::rd_kafka_message_t) -> Option<i64> {
    let mut kind = bindings::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
    // SAFETY: `message` is live (a reference to it); `kind` is written.
    let millis = unsafe { bindings::rd_kafka_message_timestamp(message, &mut kind) };
    match kind {
        bindings::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE => None,
        _ if millis == -1 => None,
        _ => Some(millis),
    }
}

/// Sets a record's timestamp, `millis` ms since the epoch: none for a
/// negative one (Kafka's `-1` is "no timestamp", and its producers refuse
/// the others, which a hostile one may still write). Whatever the platform's
/// clock type cannot hold is kept without a panic (Windows' ends in the
/// year 30828), as `Metadata` keeps it.
fn set_timestamp(metadata: &mut Metadata, millis: Option<i64>) {
    if let Some(millis) = millis.filter(|millis| *millis >= 0) {
        metadata.set_timestamp_unix_millis(millis);
    }
}

/// The message's topic name as librdkafka holds it, without rdkafka's UTF-8
/// check (which [`TopicNames`] makes once per name, not per message).
pub(crate) fn topic_name(message: &bindings::rd_kafka_message_t) -> &[u8] {
    if message.rkt.is_null() {
        return &[];
    }
    // SAFETY: `message` is live (a reference to it); a fetched message holds
    // its topic handle, whose name is a NUL-terminated string that lives as
    // long as the handle.
    unsafe { CStr::from_ptr(bindings::rd_kafka_topic_name(message.rkt)).to_bytes() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn a_record_counts_the_bytes_of_the_message_it_becomes() {
        let mut headers = Headers::new();
        headers.insert("trace", Bytes::from_static(b"abc"));
        let record = Record {
            key: Some(Bytes::from_static(b"key")),
            headers,
            ..Record::new(
                Bytes::from_static(b"payload"),
                Metadata::new("t".into(), 2, Position::Offset(7)),
            )
        };
        let size = record.byte_size();
        let message = record.into_message();
        assert_eq!(size, message.byte_size());
        assert_eq!(message.key().map(Bytes::as_ref), Some(&b"key"[..]));
        assert_eq!(message.headers().get_str("trace"), Some("abc"));
        assert_eq!(message.metadata().position(), Position::Offset(7));
        assert_eq!(message.payload().as_ref(), b"payload");

        let bare = Record::new(
            Bytes::new(),
            Metadata::new("t".into(), 0, Position::Offset(0)),
        )
        .into_message();
        assert!(bare.key().is_none() && bare.headers().is_empty());
    }

    #[test]
    fn a_null_value_becomes_a_tombstone_with_its_key_and_headers() {
        let mut headers = Headers::new();
        headers.insert("trace", Bytes::from_static(b"abc"));
        let record = Record {
            payload: None,
            key: Some(Bytes::from_static(b"key")),
            headers,
            metadata: Metadata::new("t".into(), 2, Position::Offset(7)),
        };
        let size = record.byte_size();
        let message = record.into_message();
        assert!(message.is_tombstone());
        assert!(message.payload().is_empty());
        assert_eq!(size, message.byte_size());
        assert_eq!(message.key().map(Bytes::as_ref), Some(&b"key"[..]));
        assert_eq!(message.headers().get_str("trace"), Some("abc"));
        assert_eq!(message.metadata().position(), Position::Offset(7));

        let empty = Record::new(
            Bytes::new(),
            Metadata::new("t".into(), 0, Position::Offset(0)),
        )
        .into_message();
        assert!(!empty.is_tombstone(), "an empty value is a value");
    }

    #[test]
    fn any_timestamp_converts_without_a_panic() {
        let timestamp_of = |millis| {
            let mut metadata = Metadata::new("t".into(), 0, Position::Offset(0));
            set_timestamp(&mut metadata, Some(millis));
            metadata.timestamp()
        };
        assert_eq!(timestamp_of(0), Some(UNIX_EPOCH));
        assert_eq!(
            timestamp_of(1_700_000_000_123),
            Some(UNIX_EPOCH + Duration::from_millis(1_700_000_000_123))
        );
        for negative in [-1, -5, i64::MIN] {
            assert_eq!(timestamp_of(negative), None, "{negative}");
        }
        for far in [i64::MAX, i64::MAX - 1, 253_402_300_800_000] {
            // Whatever the platform holds: on Unix, the instant itself.
            let expected = UNIX_EPOCH.checked_add(Duration::from_millis(far as u64));
            assert_eq!(timestamp_of(far), expected, "{far}");
            #[cfg(unix)]
            assert!(expected.is_some(), "{far}");
        }
    }

    #[test]
    fn a_topic_name_is_shared_then_replaced_by_an_equal_copy() {
        let mut names = TopicNames::default();
        let first = names.get(b"orders");
        let second = names.get(b"orders");
        assert!(std::sync::Arc::ptr_eq(&first, &second));
        assert_eq!(&*names.get(b"payments"), "payments");
        let later: Vec<SourceName> = (0..SHARED_BY).map(|_| names.get(b"orders")).collect();
        assert!(later.iter().all(|name| &**name == "orders"));
        assert!(
            later
                .iter()
                .any(|name| !std::sync::Arc::ptr_eq(name, &first)),
            "after {SHARED_BY} messages a fresh copy is handed out"
        );
        assert_eq!(&*names.get(b"bad\xffname"), "bad\u{fffd}name");
    }

    #[test]
    fn small_copies_share_a_chunk_and_keep_their_bytes() {
        let mut chunks = Chunks::default();
        let first = chunks.copy(b"first payload");
        let key = chunks.copy(b"k");
        let second = chunks.copy(b"second");
        assert_eq!(first.as_ref(), b"first payload");
        assert_eq!(key.as_ref(), b"k");
        assert_eq!(second.as_ref(), b"second");
        // Contiguous in one chunk: no allocation of their own.
        assert_eq!(first.as_ptr().wrapping_add(first.len()), key.as_ptr());
        drop(first);
        assert_eq!(second.as_ref(), b"second");
    }

    #[test]
    fn a_full_chunk_is_replaced_and_large_copies_stand_alone() {
        let mut chunks = Chunks::default();
        let small = vec![7u8; SHARED_UP_TO];
        let copies: Vec<Bytes> = (0..2 * CHUNK / SHARED_UP_TO + 1)
            .map(|_| chunks.copy(&small))
            .collect();
        assert!(copies.iter().all(|copy| copy.as_ref() == small.as_slice()));
        let large = vec![9u8; SHARED_UP_TO + 1];
        assert_eq!(chunks.copy(&large).as_ref(), large.as_slice());
        assert!(chunks.copy(b"").is_empty());
    }
}
