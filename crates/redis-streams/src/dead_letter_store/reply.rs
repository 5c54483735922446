//! The entries of `XRANGE` and `XREVRANGE` replies (the reply helpers they
//! share with the source are in `source/convert.rs`).

use redis::Value;

use crate::error::Error;
use crate::source::convert::{bytes_of, into_items, unexpected};
use crate::stream_id::StreamId;

/// The `[id, [field, value, …]]` entries of an `XRANGE` or `XREVRANGE`
/// reply. An item that is no entry fails the reply: a store that skipped
/// it would count and list wrong, and a range reply is never partial.
pub(super) fn entries_of(
    reply: Value,
    command: &'static str,
) -> Result<Vec<(StreamId, Vec<Value>)>, Error> {
    into_items(reply, command)?
        .into_iter()
        .map(|entry| {
            let mut parts = into_items(entry, command)?.into_iter();
            let id = parts
                .next()
                .as_ref()
                .and_then(bytes_of)
                .and_then(StreamId::parse)
                .ok_or_else(|| unexpected(command, "an entry without an id"))?;
            let fields = match parts.next() {
                Some(fields) => into_items(fields, command)?,
                None => Vec::new(),
            };
            Ok((id, fields))
        })
        .collect()
}
