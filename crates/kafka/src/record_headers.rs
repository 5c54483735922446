//! The headers of a consumed record, read without trusting their names to
//! be UTF-8: the source and the dead-letter store both read them here.

use std::ffi::{CStr, c_char, c_void};
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
