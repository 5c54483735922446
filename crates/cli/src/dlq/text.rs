//! Text for a terminal: times as ages and epoch milliseconds, producer bytes
//! escaped onto one line.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::output::{escaped, escaped_bytes, human_duration};

pub(super) fn epoch_millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    })
}

pub(super) fn age(time: SystemTime, now: SystemTime) -> String {
    format!(
        "{} ago",
        human_duration(now.duration_since(time).unwrap_or(Duration::ZERO))
    )
}

/// Bytes a producer wrote (a key, a header's value) for one line of a
/// terminal: see [`escaped_bytes`].
pub(super) fn printable(bytes: &[u8]) -> String {
    escaped_bytes(bytes).into_owned()
}

/// Text for one cell of a table: escaped (see [`escaped`]), at most
/// `chars` characters.
pub(super) fn one_line(text: &str, chars: usize) -> String {
    let line = escaped(text);
    match line.char_indices().nth(chars) {
        Some((end, _)) => format!("{}…", &line[..end]),
        None => line.into_owned(),
    }
}
