//! Stream entries as Redis returns them, turned into intake [`Message`]s.
//!
//! Replies are taken apart by value, so each field value moves from the
//! client's buffer into the message's `Bytes` without a copy, and header
//! names are interned: a stream's entries repeat the same few field names,
//! and a name shared by reference costs no allocation per message.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use intake_core::{Headers, Message, Metadata, SourceName};
use redis::Value;

use crate::error::Error;
use crate::stream_id::StreamId;

/// A stream entry taken out of a reply.
pub(crate) struct RawEntry {
    pub(crate) id: StreamId,
    /// Field names and values, alternating. `None` when the entry was
    /// deleted while pending (history reads return its id alone).
    pub(crate) fields: Option<Vec<Value>>,
}

pub(crate) fn unexpected(command: &'static str, detail: impl Into<String>) -> Error {
    Error::UnexpectedReply {
        command,
        detail: detail.into(),
    }
}

pub(crate) fn into_items(value: Value, command: &'static str) -> Result<Vec<Value>, Error> {
    match value {
        Value::Array(items) | Value::Set(items) => Ok(items),
        Value::Nil => Ok(Vec::new()),
        Value::Map(pairs) => Ok(pairs
            .into_iter()
            .flat_map(|(name, value)| [name, value])
            .collect()),
        Value::Attribute { data, .. } => into_items(*data, command),
        other => Err(unexpected(
            command,
            format!("expected an array, got {other:?}"),
        )),
    }
}

pub(crate) fn bytes_of(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(text) => Some(text.as_bytes()),
        Value::VerbatimString { text, .. } => Some(text.as_bytes()),
        _ => None,
    }
}

fn into_bytes(value: Value) -> Option<Bytes> {
    match value {
        Value::BulkString(bytes) => Some(Bytes::from(bytes)),
        Value::SimpleString(text) => Some(Bytes::from(text)),
        Value::VerbatimString { text, .. } => Some(Bytes::from(text)),
        Value::Int(number) => Some(Bytes::from(number.to_string())),
        _ => None,
    }
}

pub(crate) fn integer_of(value: &Value) -> Option<u64> {
    match value {
        Value::Int(number) => u64::try_from(*number).ok(),
        other => std::str::from_utf8(bytes_of(other)?).ok()?.parse().ok(),
    }
}

/// What [`parse_entries`] left out of a reply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Skipped {
    /// Nil in place of an entry: `XCLAIM` before Redis 7.0 answers so for
    /// an entry deleted from the stream while it was pending.
    pub(crate) vanished: usize,
    /// Items that are no entry at all (no valid id, fields that are not a
    /// list): nothing a server sends, so logged and counted.
    pub(crate) malformed: usize,
}

/// Entries of one array of `[id, [field, value, …]]` pairs (an `XRANGE`,
/// `XCLAIM` or per-stream read reply).
///
/// Only a reply that is not an array at all is an error. A malformed item
/// is skipped (and counted) rather than failing the reply: the entries
/// around it are good, and failing would stop the consumer on every read
/// of the same reply.
pub(crate) fn parse_entries(
    value: Value,
    command: &'static str,
    out: &mut Vec<RawEntry>,
) -> Result<Skipped, Error> {
    let mut skipped = Skipped::default();
    for entry in into_items(value, command)? {
        if matches!(entry, Value::Nil) {
            skipped.vanished += 1;
            continue;
        }
        let Ok(parts) = into_items(entry, command) else {
            skipped.malformed += 1;
            continue;
        };
        let mut parts = parts.into_iter();
        let Some(id) = parts
            .next()
            .as_ref()
            .and_then(bytes_of)
            .and_then(StreamId::parse)
        else {
            skipped.malformed += 1;
            continue;
        };
        let fields = match parts.next() {
            None | Some(Value::Nil) => None,
            Some(fields) => match into_items(fields, command) {
                Ok(fields) => Some(fields),
                Err(_) => {
                    skipped.malformed += 1;
                    continue;
                }
            },
        };
        out.push(RawEntry { id, fields });
    }
    if skipped.malformed > 0 {
        tracing::error!(
            command,
            skipped = skipped.malformed,
            "items of the reply are not stream entries; they are skipped (and claimed again \
             later if they were entries)"
        );
    }
    Ok(skipped)
}

/// Entries of an `XREAD`/`XREADGROUP` reply, per stream key: `[[key,
/// entries], …]` in RESP2, a map in RESP3, nil on timeout.
pub(crate) fn parse_read_reply(
    value: Value,
    command: &'static str,
    mut on_stream: impl FnMut(&[u8], Value) -> Result<(), Error>,
) -> Result<(), Error> {
    match value {
        Value::Nil => Ok(()),
        Value::Map(pairs) => {
            for (key, entries) in pairs {
                let key = bytes_of(&key).ok_or_else(|| unexpected(command, "a non-text key"))?;
                on_stream(key, entries)?;
            }
            Ok(())
        }
        value => {
            for stream in into_items(value, command)? {
                let mut parts = into_items(stream, command)?.into_iter();
                let (Some(key), Some(entries)) = (parts.next(), parts.next()) else {
                    return Err(unexpected(command, "a stream without key or entries"));
                };
                let key = bytes_of(&key).ok_or_else(|| unexpected(command, "a non-text key"))?;
                on_stream(key, entries)?;
            }
            Ok(())
        }
    }
}

/// The per-stream parts of a read reply, each with the index `index_of`
/// gives its key. Entries of a stream that was not asked for are logged and
/// left out.
pub(crate) fn split_read_reply(
    value: Value,
    command: &'static str,
    index_of: impl Fn(&[u8]) -> Option<usize>,
    out: &mut Vec<(usize, Value)>,
) -> Result<(), Error> {
    parse_read_reply(value, command, |key, entries| {
        match index_of(key) {
            Some(index) => out.push((index, entries)),
            None => tracing::error!(
                key = %String::from_utf8_lossy(key),
                "Redis returned entries of a stream that was not asked for"
            ),
        }
        Ok(())
    })
}

/// One row of an extended `XPENDING` reply.
pub(crate) struct PendingEntry {
    pub(crate) id: StreamId,
    pub(crate) deliveries: u64,
}

/// Rows of `XPENDING key group [IDLE n] start end count [consumer]`:
/// `[[id, consumer, idle ms, deliveries], …]`.
pub(crate) fn parse_pending(value: Value, out: &mut Vec<PendingEntry>) -> Result<(), Error> {
    for row in into_items(value, "XPENDING")? {
        let row = into_items(row, "XPENDING")?;
        let id = row.first().and_then(bytes_of).and_then(StreamId::parse);
        let deliveries = row.get(3).and_then(integer_of);
        match (id, deliveries) {
            (Some(id), Some(deliveries)) => out.push(PendingEntry { id, deliveries }),
            _ => return Err(unexpected("XPENDING", "a row without id or delivery count")),
        }
    }
    Ok(())
}

/// The group names of an `XINFO GROUPS` reply: one field list (RESP2) or
/// map (RESP3) per group, its `name` among the fields.
pub(crate) fn group_names(value: Value) -> Result<Vec<String>, Error> {
    let mut names = Vec::new();
    for group in into_items(value, "XINFO GROUPS")? {
        let fields = into_items(group, "XINFO GROUPS")?;
        let name = fields
            .chunks_exact(2)
            .find(|pair| bytes_of(&pair[0]) == Some(b"name"))
            .and_then(|pair| bytes_of(&pair[1]))
            .ok_or_else(|| unexpected("XINFO GROUPS", "a group without a name"))?;
        names.push(String::from_utf8_lossy(name).into_owned());
    }
    Ok(names)
}

/// What became of an entry.
pub(crate) enum Decoded {
    /// A message ready for the handler.
    Message(Message),
    /// The entry lacks the payload field; the message carries its fields as
    /// headers and an empty payload, and goes to the dead-letter stream.
    MissingPayload(Message),
}

/// Turns entries into messages: payload from one field, key from another,
/// every other field a header.
pub(crate) struct EntryDecoder {
    payload_field: Arc<str>,
    key_field: Option<Arc<str>>,
    names: Vec<Arc<str>>,
}

impl EntryDecoder {
    /// Distinct field names kept for reuse. Beyond this, names are
    /// allocated per message rather than letting the table grow with
    /// entries that use unique field names.
    const INTERNED_NAMES: usize = 64;

    pub(crate) fn new(payload_field: Arc<str>, key_field: Option<Arc<str>>) -> Self {
        Self {
            payload_field,
            key_field,
            names: Vec::new(),
        }
    }

    fn name(&mut self, raw: &[u8]) -> Arc<str> {
        if let Some(name) = self.names.iter().find(|name| name.as_bytes() == raw) {
            return name.clone();
        }
        let name: Arc<str> = String::from_utf8_lossy(raw).into();
        if self.names.len() < Self::INTERNED_NAMES {
            self.names.push(name.clone());
        }
        name
    }

    /// The message of entry `id` of `stream` with `fields`, delivered for
    /// the `attempt`th time.
    pub(crate) fn decode(
        &mut self,
        stream: &SourceName,
        id: StreamId,
        fields: Vec<Value>,
        attempt: u32,
    ) -> Decoded {
        let mut payload = None;
        let mut key = None;
        let mut headers = Vec::new();
        let mut fields = fields.into_iter();
        while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
            let Some(raw_name) = bytes_of(&name) else {
                continue;
            };
            let Some(value) = into_bytes(value) else {
                continue;
            };
            if payload.is_none() && raw_name == self.payload_field.as_bytes() {
                payload = Some(value);
                continue;
            }
            if key.is_none()
                && self
                    .key_field
                    .as_ref()
                    .is_some_and(|field| raw_name == field.as_bytes())
            {
                key = Some(value.clone());
            }
            let name = self.name(raw_name);
            headers.push((name, value));
        }
        let mut metadata = Metadata::new(stream.clone(), 0, id.position()).with_attempt(attempt);
        // Without a `SystemTime` made only to be taken apart again, unless
        // the id's milliseconds are past what an `i64` holds.
        match i64::try_from(id.ms) {
            Ok(millis) => metadata.set_timestamp_unix_millis(millis),
            Err(_) => metadata.set_timestamp(timestamp_of(id)),
        }
        let headers: Headers = headers.into_iter().collect();
        let found = payload.is_some();
        let message = Message::from_parts(payload.unwrap_or_default(), key, headers, metadata);
        if found {
            Decoded::Message(message)
        } else {
            Decoded::MissingPayload(message)
        }
    }
}

/// The instant an entry id's milliseconds name, if the platform's clock
/// type holds it: Redis takes any explicit id up to `u64::MAX` ms. On Unix
/// every one fits (`SystemTime` holds `i64` seconds); Windows' ends in the
/// year 30828, and an unchecked addition would panic there on an id a
/// producer chose.
fn timestamp_of(id: StreamId) -> Option<SystemTime> {
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_millis(id.ms))
}

#[cfg(test)]
mod tests {
    use intake_core::Position;

    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn payload_key_and_headers_come_from_fields() {
        let mut decoder = EntryDecoder::new("payload".into(), Some("key".into()));
        let stream: SourceName = "orders".into();
        let fields = vec![
            bulk("key"),
            bulk("k1"),
            bulk("payload"),
            bulk("{}"),
            bulk("trace"),
            bulk("abc"),
        ];
        let Decoded::Message(message) =
            decoder.decode(&stream, StreamId { ms: 1000, seq: 2 }, fields, 3)
        else {
            panic!("the payload field is present");
        };
        assert_eq!(message.payload(), &Bytes::from_static(b"{}"));
        assert_eq!(message.key(), Some(&Bytes::from_static(b"k1")));
        assert_eq!(message.headers().get_str("trace"), Some("abc"));
        assert_eq!(message.headers().get_str("key"), Some("k1"));
        assert_eq!(message.headers().get("payload"), None);
        assert_eq!(message.metadata().attempt(), 3);
        assert_eq!(
            message.metadata().position(),
            Position::StreamId { ms: 1000, seq: 2 }
        );
        assert_eq!(
            message.metadata().timestamp(),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1))
        );
    }

    #[test]
    fn an_id_of_any_milliseconds_converts_without_a_panic() {
        assert_eq!(timestamp_of(StreamId::ZERO), Some(SystemTime::UNIX_EPOCH));
        for ms in [u64::MAX, u64::MAX - 1, 1 << 63] {
            let expected = SystemTime::UNIX_EPOCH.checked_add(Duration::from_millis(ms));
            assert_eq!(
                timestamp_of(StreamId { ms, seq: u64::MAX }),
                expected,
                "{ms}"
            );
            #[cfg(unix)]
            assert!(expected.is_some(), "{ms}");
        }
        let mut decoder = EntryDecoder::new("payload".into(), None);
        let fields = vec![bulk("payload"), bulk("x")];
        let far = StreamId {
            ms: u64::MAX,
            seq: u64::MAX,
        };
        let Decoded::Message(message) = decoder.decode(&"s".into(), far, fields, 1) else {
            panic!("the payload field is present");
        };
        assert_eq!(message.metadata().timestamp(), timestamp_of(far));
    }

    #[test]
    fn header_names_are_shared_between_messages() {
        let mut decoder = EntryDecoder::new("payload".into(), None);
        let stream: SourceName = "s".into();
        let mut names = Vec::new();
        for seq in 0..2 {
            let fields = vec![bulk("payload"), bulk("x"), bulk("h"), bulk("v")];
            if let Decoded::Message(message) =
                decoder.decode(&stream, StreamId { ms: 1, seq }, fields, 1)
            {
                names.extend(message.headers().iter().map(|header| header.name.clone()));
            }
        }
        assert_eq!(names.len(), 2);
        assert!(Arc::ptr_eq(&names[0], &names[1]));
    }

    #[test]
    fn an_entry_without_the_payload_field_is_flagged() {
        let mut decoder = EntryDecoder::new("payload".into(), None);
        let fields = vec![bulk("body"), bulk("x")];
        let decoded = decoder.decode(&"s".into(), StreamId::ZERO, fields, 1);
        match decoded {
            Decoded::MissingPayload(message) => {
                assert_eq!(message.headers().get_str("body"), Some("x"));
            }
            Decoded::Message(_) => panic!("an entry without payload field must be flagged"),
        }
    }

    #[test]
    fn read_replies_parse_in_resp2_and_resp3_shapes() {
        let entries = || {
            Value::Array(vec![Value::Array(vec![
                bulk("1-1"),
                Value::Array(vec![bulk("payload"), bulk("a")]),
            ])])
        };
        for reply in [
            Value::Array(vec![Value::Array(vec![bulk("s"), entries()])]),
            Value::Map(vec![(bulk("s"), entries())]),
        ] {
            let mut seen = Vec::new();
            let parsed = parse_read_reply(reply, "XREADGROUP", |key, value| {
                let mut raw = Vec::new();
                parse_entries(value, "XREADGROUP", &mut raw)?;
                seen.push((key.to_vec(), raw.len()));
                Ok(())
            });
            assert!(parsed.is_ok());
            assert_eq!(seen, vec![(b"s".to_vec(), 1)]);
        }
    }

    #[test]
    fn a_malformed_reply_is_an_error_not_a_panic() {
        let mut raw = Vec::new();
        assert!(parse_entries(Value::Int(3), "XCLAIM", &mut raw).is_err());
        let mut pending = Vec::new();
        assert!(parse_pending(Value::Array(vec![Value::Int(3)]), &mut pending).is_err());
        assert!(parse_read_reply(Value::Int(1), "XREAD", |_, _| Ok(())).is_err());
    }

    #[test]
    fn malformed_and_nil_items_are_skipped_and_counted_and_the_good_entries_kept() {
        let good = |id: &str| {
            Value::Array(vec![
                bulk(id),
                Value::Array(vec![bulk("payload"), bulk("x")]),
            ])
        };
        let reply = Value::Array(vec![
            good("1-1"),
            Value::Nil,
            Value::Array(vec![bulk("not-an-id")]),
            Value::Int(7),
            Value::Array(vec![bulk("2-1"), Value::Int(3)]),
            Value::Array(vec![bulk("3-1"), Value::Nil]),
            good("4-1"),
        ]);
        let mut raw = Vec::new();
        let skipped = parse_entries(reply, "XCLAIM", &mut raw).expect("an array of entries");
        assert_eq!(
            skipped,
            Skipped {
                vanished: 1,
                malformed: 3
            }
        );
        let ids: Vec<_> = raw
            .iter()
            .map(|entry| (entry.id.ms, entry.fields.is_some()))
            .collect();
        assert_eq!(ids, vec![(1, true), (3, false), (4, true)]);
    }

    /// Any reply a server (or something posing as one) could send: leaves
    /// biased toward the shapes the parsers look for (ids, field names),
    /// nested in every container kind.
    fn any_reply() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let text = prop_oneof![
            Just("payload".to_owned()),
            Just("key".to_owned()),
            "[0-9]{1,21}-[0-9]{1,21}",
            "[0-9-]{0,8}",
            ".{0,12}",
        ];
        let leaf = prop_oneof![
            Just(Value::Nil),
            Just(Value::Okay),
            any::<i64>().prop_map(Value::Int),
            text.clone()
                .prop_map(|text| Value::BulkString(text.into_bytes())),
            prop::collection::vec(any::<u8>(), 0..16).prop_map(Value::BulkString),
            text.prop_map(Value::SimpleString),
            any::<f64>().prop_map(Value::Double),
            any::<bool>().prop_map(Value::Boolean),
        ];
        leaf.prop_recursive(5, 64, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Set),
                prop::collection::vec((inner.clone(), inner.clone()), 0..4).prop_map(Value::Map),
                (
                    inner.clone(),
                    prop::collection::vec((inner.clone(), inner), 0..2)
                )
                    .prop_map(|(data, attributes)| Value::Attribute {
                        data: Box::new(data),
                        attributes,
                    }),
            ]
        })
    }

    /// `value` in RESP (RESP3 types included), as a server would send it.
    fn encode(value: &Value, out: &mut Vec<u8>) {
        let mut header = |kind: char, length: usize| {
            out.extend_from_slice(format!("{kind}{length}\r\n").as_bytes());
        };
        match value {
            Value::Nil => out.extend_from_slice(b"$-1\r\n"),
            Value::Okay => out.extend_from_slice(b"+OK\r\n"),
            Value::Int(number) => out.extend_from_slice(format!(":{number}\r\n").as_bytes()),
            Value::SimpleString(text) if !text.contains(['\r', '\n']) => {
                out.extend_from_slice(format!("+{text}\r\n").as_bytes());
            }
            Value::SimpleString(text) => encode(&Value::BulkString(text.clone().into_bytes()), out),
            Value::BulkString(bytes) => {
                header('$', bytes.len());
                out.extend_from_slice(bytes);
                out.extend_from_slice(b"\r\n");
            }
            Value::Double(number) => {
                let text = if number.is_nan() {
                    "nan".to_owned()
                } else if number.is_infinite() {
                    if *number > 0.0 { "inf" } else { "-inf" }.to_owned()
                } else {
                    format!("{number:?}")
                };
                out.extend_from_slice(format!(",{text}\r\n").as_bytes());
            }
            Value::Boolean(true) => out.extend_from_slice(b"#t\r\n"),
            Value::Boolean(false) => out.extend_from_slice(b"#f\r\n"),
            Value::Array(items) | Value::Set(items) => {
                header(
                    if matches!(value, Value::Set(_)) {
                        '~'
                    } else {
                        '*'
                    },
                    items.len(),
                );
                for item in items {
                    encode(item, out);
                }
            }
            Value::Map(pairs) => {
                header('%', pairs.len());
                for (name, value) in pairs {
                    encode(name, out);
                    encode(value, out);
                }
            }
            Value::Attribute { data, attributes } => {
                header('|', attributes.len());
                for (name, value) in attributes {
                    encode(name, out);
                    encode(value, out);
                }
                encode(data, out);
            }
            _ => out.extend_from_slice(b"_\r\n"),
        }
    }

    /// Runs `reply` through every parser the source applies to the replies
    /// of `XREADGROUP`, `XREAD`, `XCLAIM`, `XRANGE` and `XPENDING`, and the
    /// entry decoder.
    fn parse_every_way(reply: &Value) {
        let mut decoder = EntryDecoder::new("payload".into(), Some("key".into()));
        let stream: SourceName = "orders".into();
        let mut entries = Vec::new();
        let _ = parse_read_reply(reply.clone(), "XREADGROUP", |_, value| {
            parse_entries(value, "XREADGROUP", &mut entries).map(drop)
        });
        let mut split = Vec::new();
        let _ = split_read_reply(
            reply.clone(),
            "XREAD",
            |key| (key == b"orders").then_some(0),
            &mut split,
        );
        let _ = parse_entries(reply.clone(), "XCLAIM", &mut entries);
        for entry in entries {
            if let Some(fields) = entry.fields {
                let _ = decoder.decode(&stream, entry.id, fields, 1);
            }
        }
        let mut pending = Vec::new();
        let _ = parse_pending(reply.clone(), &mut pending);
        let _ = integer_of(reply);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2_000))]

        #[test]
        fn any_reply_is_parsed_or_refused_never_a_panic(reply in any_reply()) {
            parse_every_way(&reply);
        }

        /// The same through the client's own RESP parser, from bytes as they
        /// arrive: whole, cut short anywhere, or with one byte changed.
        #[test]
        fn any_reply_bytes_are_parsed_or_refused_never_a_panic(
            reply in any_reply(),
            cut in proptest::prelude::any::<proptest::sample::Index>(),
            flip in proptest::prelude::any::<(proptest::sample::Index, u8)>(),
        ) {
            let mut bytes = Vec::new();
            encode(&reply, &mut bytes);
            let whole = redis::parse_redis_value(&bytes);
            proptest::prop_assert!(whole.is_ok(), "{:?}: {:?}", bytes.escape_ascii().to_string(), whole);
            if let Ok(parsed) = whole {
                parse_every_way(&parsed);
            }
            if let Ok(parsed) = redis::parse_redis_value(&bytes[..cut.index(bytes.len() + 1)]) {
                parse_every_way(&parsed);
            }
            let (at, byte) = flip;
            let at = at.index(bytes.len());
            bytes[at] = byte;
            if let Ok(parsed) = redis::parse_redis_value(&bytes) {
                parse_every_way(&parsed);
            }
        }

        /// Every item of an entry list becomes an entry or is counted as
        /// vanished or malformed: nothing is dropped silently.
        #[test]
        fn every_item_of_an_entry_list_is_an_entry_or_counted(items in proptest::collection::vec(any_reply(), 0..12)) {
            let count = items.len();
            let mut entries = Vec::new();
            let skipped = parse_entries(Value::Array(items), "XCLAIM", &mut entries);
            proptest::prop_assert!(skipped.is_ok());
            if let Ok(skipped) = skipped {
                proptest::prop_assert_eq!(entries.len() + skipped.vanished + skipped.malformed, count);
            }
        }

    }
}
