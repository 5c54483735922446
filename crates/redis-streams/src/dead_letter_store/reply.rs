//! The parsing of `XRANGE`, `XREVRANGE`, `XLEN` and `XDEL` replies.

use redis::Value;

use crate::error::Error;
use crate::stream_id::StreamId;

fn unexpected(command: &'static str, detail: String) -> Error {
    Error::UnexpectedReply { command, detail }
}

fn items(value: Value, command: &'static str) -> Result<Vec<Value>, Error> {
    match value {
        Value::Array(items) | Value::Set(items) => Ok(items),
        Value::Nil => Ok(Vec::new()),
        Value::Map(pairs) => Ok(pairs
            .into_iter()
            .flat_map(|(name, value)| [name, value])
            .collect()),
        Value::Attribute { data, .. } => items(*data, command),
        other => Err(unexpected(
            command,
            format!("expected an array, got {other:?}"),
        )),
    }
}

pub(super) fn bytes_of(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(text) => Some(text.as_bytes()),
        Value::VerbatimString { text, .. } => Some(text.as_bytes()),
        _ => None,
    }
}

pub(super) fn integer_of(value: &Value) -> Option<u64> {
    match value {
        Value::Int(number) => u64::try_from(*number).ok(),
        other => std::str::from_utf8(bytes_of(other)?).ok()?.parse().ok(),
    }
}

/// The `[id, [field, value, …]]` entries of an `XRANGE` or `XREVRANGE`
/// reply. An item that is no entry fails the reply: a store that skipped
/// it would count and list wrong, and a range reply is never partial.
pub(super) fn entries_of(
    reply: Value,
    command: &'static str,
) -> Result<Vec<(StreamId, Vec<Value>)>, Error> {
    items(reply, command)?
        .into_iter()
        .map(|entry| {
            let mut parts = items(entry, command)?.into_iter();
            let id = parts
                .next()
                .as_ref()
                .and_then(bytes_of)
                .and_then(StreamId::parse)
                .ok_or_else(|| unexpected(command, "an entry without an id".to_owned()))?;
            let fields = match parts.next() {
                Some(fields) => items(fields, command)?,
                None => Vec::new(),
            };
            Ok((id, fields))
        })
        .collect()
}
