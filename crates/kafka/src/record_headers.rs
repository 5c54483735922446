//! The headers of a consumed record, read without trusting their names to
//! be UTF-8: the source and the dead-letter store both read them here.
//!
//! [`HeaderPeek`] spares the source librdkafka's parse of a record that has
//! none: asking librdkafka (`rd_kafka_message_headers`) allocates and frees
//! a shadow buffer per record just to read a header count of zero.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr;

use bytes::Bytes;
use intake_core::Headers;
use rdkafka::bindings;
use rdkafka::message::BorrowedMessage;

/// The record's headers: names as text (bytes that are not UTF-8 become
/// U+FFFD), values as raw bytes, a header without a value as an empty one.
///
/// Read through librdkafka's C accessors rather than rdkafka's `Headers`:
/// rdkafka unwraps each name as UTF-8 and panics on any other bytes, which
/// producers in Go, C or Java write freely (into a consumed topic or the
/// dead-letter topic alike); in the source, that panic would kill the
/// polling thread on every member that takes the partition over.
pub(crate) fn read_headers(message: &BorrowedMessage<'_>) -> Headers {
    // SAFETY: `message.ptr()` is the live message `message` borrows.
    read_native_headers(unsafe { &*message.ptr() })
}

/// [`read_headers`] of a message librdkafka returned, by reference: the
/// message is live while the reference is.
pub(crate) fn read_native_headers(message: &bindings::rd_kafka_message_t) -> Headers {
    let mut native: *mut bindings::rd_kafka_headers_t = ptr::null_mut();
    // SAFETY: `message` is a live message (a reference to it); the header
    // list stays owned by the message and valid while it is.
    let found = unsafe { bindings::rd_kafka_message_headers(message, &mut native) };
    if found != bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || native.is_null() {
        return Headers::new();
    }
    // SAFETY: `native` is the message's header list (above).
    let count = unsafe { bindings::rd_kafka_header_cnt(native) };
    (0..count)
        .filter_map(|index| {
            let mut name: *const c_char = ptr::null();
            let mut value: *const c_void = ptr::null();
            let mut size = 0usize;
            // SAFETY: `index` is below the list's count; librdkafka points
            // `name` at a NUL-terminated string and `value` at `size` bytes
            // (or null), both owned by the list.
            let got = unsafe {
                bindings::rd_kafka_header_get_all(native, index, &mut name, &mut value, &mut size)
            };
            if got != bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
                return None;
            }
            // SAFETY: as above; both are copied before the message is released.
            let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
            let value = if value.is_null() || size == 0 {
                Bytes::new()
            } else {
                // SAFETY: as above.
                Bytes::copy_from_slice(unsafe {
                    std::slice::from_raw_parts(value.cast::<u8>(), size)
                })
            };
            Some((name, value))
        })
        .collect()
}

/// Finds records without headers by looking at their unparsed header bytes
/// in librdkafka's message, which `rd_kafka_message_headers` would copy into
/// a freshly allocated shadow buffer (a `calloc` and a `free` per record, on
/// the polling thread, the busiest of the source's stages) only to read a
/// count of zero.
///
/// librdkafka exposes no accessor for those bytes, so this reads its private
/// `rd_kafka_msg_t` (the struct behind every `rd_kafka_message_t`) through
/// [`NativeMsg`], a copy of its layout in librdkafka 2.12.1, the version
/// rdkafka-sys bundles. That is only done where it is known to hold:
///
/// - the linked librdkafka is [`LAYOUT_VERSION`] (any other, for instance
///   a system library under rdkafka's `dynamic-linking`, turns the peek
///   off for good);
/// - the first record is checked against librdkafka's own accessors of the
///   fields around the header bytes (timestamp and its type, broker id,
///   leader epoch); a mismatch turns the peek off for good;
/// - every record's header bytes must start where its value ends, as they
///   do in the v2 record format, and the peek answers only for a first byte
///   of zero (a header count of zero); anything else, an empty or null
///   value included (librdkafka points no payload at the record), is
///   librdkafka's to parse as before.
#[derive(Debug)]
pub(crate) struct HeaderPeek {
    state: PeekState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PeekState {
    /// The layout is yet to be checked on a first record.
    Unchecked,
    Verified,
    Off,
}

/// `rd_kafka_version()` of the librdkafka whose `rd_kafka_msg_t` layout
/// [`NativeMsg`] copies: 2.12.1 (rdkafka-sys 4.10's bundled source,
/// `src/rdkafka_msg.h`).
const LAYOUT_VERSION: c_int = 0x020c_01ff;

/// librdkafka 2.12.1's `rd_kafka_msg_t` up to the consumer's part of its
/// union (`rkm_u.consumer`); only ever read through a pointer to a message
/// librdkafka allocated, which is larger (the union's producer part).
#[repr(C)]
struct NativeMsg {
    /// `rkm_rkmessage`, the struct's first field.
    message: bindings::rd_kafka_message_t,
    /// `rkm_link`, a `TAILQ_ENTRY`: two pointers.
    link: [*mut c_void; 2],
    flags: c_int,
    /// `rd_kafka_timestamp_type_t`.
    timestamp_type: c_int,
    timestamp: i64,
    headers: *mut bindings::rd_kafka_headers_t,
    /// `rd_kafka_msg_status_t`.
    status: c_int,
    broker_id: i32,
    /// `rkm_u.consumer.binhdrs`, a `rd_kafkap_bytes_t`.
    binary_headers: NativeBytes,
    /// `rkm_u.consumer.leader_epoch`.
    leader_epoch: i32,
}

/// librdkafka's `rd_kafkap_bytes_t`.
#[repr(C)]
struct NativeBytes {
    /// -1 for null.
    len: i32,
    data: *const u8,
    inline: [u8; 1],
}

/// `RD_KAFKA_MSG_F_PRODUCER` (`rdkafka_msg.h`): a producer's message, whose
/// union holds no header bytes.
const PRODUCER_MESSAGE: c_int = 0x40000;

impl HeaderPeek {
    /// A peek for the linked librdkafka: off unless it is the version whose
    /// layout is copied here.
    pub(crate) fn new() -> Self {
        // SAFETY: a plain query of the linked library's version.
        let linked = unsafe { bindings::rd_kafka_version() };
        Self {
            state: if linked == LAYOUT_VERSION {
                PeekState::Unchecked
            } else {
                PeekState::Off
            },
        }
    }

    /// Whether the peek answers (tests).
    #[cfg(test)]
    pub(crate) fn is_on(&self) -> bool {
        self.state != PeekState::Off
    }

    /// `true` when `message` surely has no headers; `false` when librdkafka
    /// has to be asked. `message` is a consumed message without an error.
    pub(crate) fn has_none(&mut self, message: &bindings::rd_kafka_message_t) -> bool {
        match self.state {
            PeekState::Off => false,
            PeekState::Verified => peek(message),
            PeekState::Unchecked => {
                self.state = if layout_matches(message) {
                    PeekState::Verified
                } else {
                    tracing::debug!(
                        "librdkafka's message layout is not the one known: headers are read through librdkafka's parse"
                    );
                    PeekState::Off
                };
                self.has_none(message)
            }
        }
    }
}

/// Whether librdkafka's own accessors read, in `message`, what
/// [`NativeMsg`] reads at the same places: the fields before and after the
/// header bytes.
fn layout_matches(message: &bindings::rd_kafka_message_t) -> bool {
    let native = ptr::from_ref(message).cast::<NativeMsg>();
    let mut timestamp_type = bindings::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
    // SAFETY: `message` is live; `rd_kafka_message_t` is the first field of
    // the `rd_kafka_msg_t` librdkafka allocated it in, whose layout up to
    // `leader_epoch` is `NativeMsg`'s in the version `HeaderPeek::new`
    // checked; the fields are read in place, not moved out. The reads go
    // past the `rd_kafka_message_t` into the struct around it, as
    // librdkafka's own `rd_kafka_message2msg` does: C memory that Rust
    // never owned or moved.
    unsafe {
        let timestamp = bindings::rd_kafka_message_timestamp(message, &mut timestamp_type);
        timestamp == ptr::addr_of!((*native).timestamp).read()
            && timestamp_type as c_int == ptr::addr_of!((*native).timestamp_type).read()
            && bindings::rd_kafka_message_broker_id(message)
                == ptr::addr_of!((*native).broker_id).read()
            && bindings::rd_kafka_message_leader_epoch(message)
                == ptr::addr_of!((*native).leader_epoch).read()
    }
}

/// `true` when `message`'s unparsed header bytes start, right where its
/// value ends, with a header count of zero (or there are none at all).
fn peek(message: &bindings::rd_kafka_message_t) -> bool {
    let native = ptr::from_ref(message).cast::<NativeMsg>();
    // SAFETY: as in `layout_matches`, with the layout verified on a first
    // record by it.
    let (flags, parsed, len, data) = unsafe {
        (
            ptr::addr_of!((*native).flags).read(),
            ptr::addr_of!((*native).headers).read(),
            ptr::addr_of!((*native).binary_headers.len).read(),
            ptr::addr_of!((*native).binary_headers.data).read(),
        )
    };
    if flags & PRODUCER_MESSAGE != 0 || !parsed.is_null() {
        return false;
    }
    if len == 0 || len == -1 {
        // librdkafka answers "no headers" without parsing.
        return true;
    }
    if message.payload.is_null() || data.is_null() {
        return false;
    }
    // A v2 record's header count follows its value: librdkafka's header
    // bytes start where the payload it points at ends.
    let value_end = message.payload.cast::<u8>().wrapping_add(message.len);
    if !ptr::eq(data, value_end) {
        return false;
    }
    // SAFETY: `data` points at the record's `len` (> 0) header bytes in
    // the fetch buffer the live message holds.
    let count = unsafe { data.read() };
    // The count is a zigzag varint: zero is the single byte 0.
    count == 0
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use rdkafka::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer as _};
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer as _, ThreadedProducer};

    use super::*;

    #[test]
    fn the_bundled_librdkafka_is_the_one_whose_message_layout_the_peek_copies() {
        // An rdkafka-sys with another librdkafka turns the peek off (headers
        // then cost librdkafka's parse again): compare `NativeMsg` with the
        // new `src/rdkafka_msg.h`, then move `LAYOUT_VERSION`.
        assert!(
            HeaderPeek::new().is_on(),
            "librdkafka {:#x} is linked; the peek copies {LAYOUT_VERSION:#x}'s layout",
            // SAFETY: a plain query of the linked library's version.
            unsafe { bindings::rd_kafka_version() }
        );
    }

    /// Records with and without headers, an empty and a null value,
    /// through a consumer of rdkafka's mock cluster: the peek answers only
    /// for records without headers, and what it answers is what librdkafka
    /// reads.
    #[test]
    fn the_peek_answers_no_headers_only_where_librdkafka_reads_none() {
        let cluster = MockCluster::new(1).expect("a mock cluster");
        let topic = "peek";
        cluster.create_topic(topic, 1, 1).expect("the topic");
        let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .create()
            .expect("a producer");
        let headers = OwnedHeaders::new().insert(Header {
            key: "trace",
            value: Some("abc"),
        });
        let records = [
            BaseRecord::to(topic).payload("plain").key("k"),
            BaseRecord::to(topic).payload("").key("k"),
            BaseRecord::to(topic)
                .payload("with")
                .headers(headers.clone()),
            BaseRecord::to(topic).payload("").headers(headers),
            BaseRecord::to(topic).key("tombstone"),
        ];
        for record in records {
            producer
                .send(record)
                .map_err(|(error, _)| error)
                .expect("sent");
        }
        producer.flush(Duration::from_secs(10)).expect("flushed");

        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("group.id", "peek")
            .set("auto.offset.reset", "earliest")
            .create()
            .expect("a consumer");
        consumer.subscribe(&[topic]).expect("subscribed");
        let mut peek = HeaderPeek::new();
        let mut answers = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while answers.len() < 5 {
            assert!(
                Instant::now() < deadline,
                "only {answers:?} consumed in 30 s"
            );
            let Some(polled) = consumer.poll(Duration::from_millis(100)) else {
                continue;
            };
            let message = polled.expect("a message");
            // SAFETY: the live message `message` borrows.
            let native = unsafe { &*message.ptr() };
            let none = peek.has_none(native);
            let read = read_native_headers(native);
            assert!(!none || read.is_empty(), "the peek hid {read:?}");
            answers.push((none, read.len()));
        }
        assert_eq!(
            answers,
            [(true, 0), (false, 0), (false, 1), (false, 1), (false, 0)],
            "(peeked none, headers read) per record; an empty or null value is librdkafka's to \
             read (no payload to find the header bytes after)"
        );
        assert_eq!(peek.state, PeekState::Verified);
    }
}
