//! [`RedisDeadLetters`]: a Redis dead-letter stream as a [`DeadLetterLog`],
//! the log of [`RedisDeadLetterStore`].

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use intake_core::ConfigError;
use intake_core::Headers;
use intake_core::dead_letter::envelope::ORIGIN_GROUP;
use intake_core::dead_letter::store::{
    DeadLetterLog, LetterId, LogStore, StoreError, StoredLetter,
};
use redis::{Script, Value};

use crate::connection::SharedConnection;
use crate::error::Error;
use crate::publisher::RedisStreamsPublisher;
use crate::settings::RedisSettings;
use crate::source::settings::{DEFAULT_PAYLOAD_FIELD, DeadLetterStream};
use crate::stream_id::StreamId;

/// The dead-letter store of a Redis dead-letter stream.
pub type RedisDeadLetterStore = LogStore<RedisDeadLetters, RedisStreamsPublisher>;

/// A Redis dead-letter stream as a [`DeadLetterLog`] (its ids are entry
/// ids, `1700000000000-0`), so that [`RedisDeadLetterStore`] (a
/// [`LogStore`] replaying through a [`RedisStreamsPublisher`]) counts,
/// lists, reads, replays and purges what a
/// [`RedisDeadLetterSink`](crate::RedisDeadLetterSink) wrote. Build one with
/// [`RedisDeadLetters::builder`]; it is cheap to clone.
///
/// | store operation | Redis |
/// |---|---|
/// | count everything | `XLEN` |
/// | count with a filter, summary, list | `XRANGE` a page at a time after a cursor (the entry id) |
/// | read | `XRANGE id id` |
/// | replay | `XADD` to the origin through the publisher, then `XDEL` of the confirmed letters |
/// | purge | `XDEL` |
///
/// The letters of every consumer group of a stream share its dead-letter
/// stream (`intake.origin.group` tells them apart). A log scoped to a group
/// ([`group`](RedisDeadLettersBuilder::group)) counts, lists, reads,
/// replays and purges that group's letters only, and knows the group's way
/// back in: its return stream, when the group reads one
/// ([`DeadLetterLog::way_back_to_group`], for
/// [`Replay::to_group`](intake_core::dead_letter::store::Replay::to_group)).
/// Without a scope it takes every letter of the stream, and a replay can
/// only go to the origin, where every group reads it again. A count of a
/// scoped log is a scan (`XLEN` counts every group's).
///
/// An entry is read back as the sink wrote it: the payload field is the
/// payload, every other field a header or an envelope field, and the key
/// the envelope's `intake.origin.key`. A replayed message goes back as the
/// publisher writes any output (payload field, key field, headers as
/// fields), so give the publisher the source's
/// [`payload_field`](crate::RedisStreamsPublisherBuilder::payload_field)
/// and [`key_field`](crate::RedisStreamsPublisherBuilder::key_field).
///
/// ```no_run
/// use intake_core::dead_letter::store::{DeadLetterStore, Filter, Replay, Selection};
/// use intake_redis_streams::{RedisDeadLetters, RedisStreamsPublisher};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let url = "redis://127.0.0.1:6379";
/// let store = RedisDeadLetters::builder(url)
///     .dead_letters_of("orders") // the stream `orders:dlq`
///     .build()
///     .await?
///     .store(RedisStreamsPublisher::builder(url).build().await?);
/// println!("{} dead letters", store.count(&Filter::all()).await?);
/// let report = store
///     .replay(&Selection::Matching(Filter::all()), &Replay::to_origin())
///     .await?;
/// println!("{} back in `orders`, {} skipped", report.replayed, report.skipped.len());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisDeadLetters {
    connection: SharedConnection,
    stream: Arc<str>,
    payload_field: Arc<str>,
    /// The consumer group whose letters alone this log holds.
    group: Option<Arc<str>>,
    /// Return streams set by hand: (origin, return stream).
    returns: Arc<[(String, String)]>,
}

/// `KEYS[1]` the dead-letter stream; `ARGV[1]` the group field's name,
/// `ARGV[2]` the group, then ids. Deletes those of the ids whose entry
/// belongs to the group (its first group field is the group); returns how
/// many it deleted.
static REMOVE_OF_GROUP: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| {
    Script::new(
        r"
local removed = 0
for i = 3, #ARGV do
  local entry = redis.call('XRANGE', KEYS[1], ARGV[i], ARGV[i])[1]
  if entry then
    local fields = entry[2]
    for j = 1, #fields - 1, 2 do
      if fields[j] == ARGV[1] then
        if fields[j + 1] == ARGV[2] then
          removed = removed + redis.call('XDEL', KEYS[1], ARGV[i])
        end
        break
      end
    end
  end
end
return removed
",
    )
});

/// Ids per removal script call (Lua's `unpack` limit is far above; this
/// keeps one call short, as a script holds the server).
const REMOVE_CHUNK: usize = 1_000;

impl fmt::Debug for RedisDeadLetters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisDeadLetters")
            .field("endpoint", self.connection.connector().endpoint())
            .field("stream", &self.stream)
            .field("payload_field", &self.payload_field)
            .field("group", &self.group)
            .finish()
    }
}

impl RedisDeadLetters {
    /// A builder of the dead-letter stream's reader on a connection of its
    /// own to the server of `settings` (a [`RedisSettings`], or just the
    /// URL). Every store operation is a sequence of commands, each bounded
    /// by the settings' [`command_timeout`](RedisSettings::command_timeout).
    pub fn builder(settings: impl Into<RedisSettings>) -> RedisDeadLettersBuilder {
        RedisDeadLettersBuilder {
            connection: settings.into(),
            stream: None,
            payload_field: DEFAULT_PAYLOAD_FIELD.to_owned(),
            group: None,
            returns: Vec::new(),
        }
    }

    /// The store of this stream, replaying through `publisher`.
    pub fn store(self, publisher: RedisStreamsPublisher) -> RedisDeadLetterStore {
        LogStore::new(self, publisher)
    }

    /// The dead-letter stream.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The consumer group whose letters alone this log holds, if scoped.
    pub fn group(&self) -> Option<&str> {
        self.group.as_deref()
    }

    fn failed(
        &self,
        operation: &'static str,
        command: &'static str,
        error: redis::RedisError,
    ) -> StoreError {
        let error = self
            .connection
            .connector()
            .key_error(error, command, &self.stream);
        StoreError::broker(operation, &*self.stream, error)
    }

    /// The entries of `XRANGE stream start end COUNT max` (`XREVRANGE end
    /// start` when `reverse`), as they are, whatever their group.
    async fn raw_range(
        &self,
        operation: &'static str,
        start: StreamId,
        end: Option<StreamId>,
        max: usize,
        reverse: bool,
    ) -> Result<Vec<(StreamId, Vec<Value>)>, StoreError> {
        let name = if reverse { "XREVRANGE" } else { "XRANGE" };
        let mut command = redis::cmd(name);
        command.arg(&*self.stream);
        // `+` is the newest end; an id is one end or the other.
        let mut formatted = [0_u8; 41];
        let end: &[u8] = match end {
            Some(end) => end.format(&mut formatted),
            None => b"+",
        };
        if reverse {
            command.arg(end).arg(start);
        } else {
            command.arg(start).arg(end);
        }
        command.arg("COUNT").arg(max);
        let mut connection = self.connection.get();
        let reply: Value = command
            .query_async(&mut connection)
            .await
            .map_err(|error| self.failed(operation, name, error))?;
        entries_of(reply, name).map_err(|error| StoreError::broker(operation, &*self.stream, error))
    }

    /// Whether an entry with `fields` is a letter of this log's group (any
    /// entry, without a scope).
    fn belongs(&self, fields: &[Value]) -> bool {
        let Some(group) = &self.group else {
            return true;
        };
        fields
            .chunks_exact(2)
            .find(|pair| bytes_of(&pair[0]) == Some(ORIGIN_GROUP.as_bytes()))
            .and_then(|pair| bytes_of(&pair[1]))
            == Some(group.as_bytes())
    }

    /// Up to `max` entries of this log's group from `start` to `end`
    /// (included), oldest first: a full page means there may be more.
    async fn range(
        &self,
        operation: &'static str,
        mut start: StreamId,
        end: Option<StreamId>,
        max: usize,
    ) -> Result<Vec<StoredLetter>, StoreError> {
        let mut letters = Vec::new();
        // Another group's letters are skipped: pages are read until `max`
        // of this group's are found or the range ends.
        while letters.len() < max {
            let entries = self.raw_range(operation, start, end, max, false).await?;
            let full = entries.len() == max;
            let Some(&(last, _)) = entries.last() else {
                break;
            };
            letters.extend(
                entries
                    .into_iter()
                    .filter(|(_, fields)| self.belongs(fields))
                    .map(|(id, fields)| self.stored(id, fields)),
            );
            match successor(last) {
                Some(next) if full => start = next,
                _ => break,
            }
        }
        letters.truncate(max);
        Ok(letters)
    }

    /// An entry as the sink wrote it: the first payload field is the
    /// payload, the other fields the headers (envelope included).
    fn stored(&self, id: StreamId, fields: Vec<Value>) -> StoredLetter {
        let id = letter_id(id);
        let mut payload = Bytes::new();
        let mut headers = Headers::new();
        let mut has_payload = false;
        let mut fields = fields.into_iter();
        while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
            let (Some(name), Some(value)) = (bytes_of(&name), bytes_of(&value)) else {
                continue;
            };
            if !has_payload && name == self.payload_field.as_bytes() {
                payload = Bytes::copy_from_slice(value);
                has_payload = true;
                continue;
            }
            headers.insert(
                String::from_utf8_lossy(name).into_owned(),
                Bytes::copy_from_slice(value),
            );
        }
        StoredLetter::read(id, None, payload, &headers)
    }
}

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

fn bytes_of(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(text) => Some(text.as_bytes()),
        Value::VerbatimString { text, .. } => Some(text.as_bytes()),
        _ => None,
    }
}

fn integer_of(value: &Value) -> Option<u64> {
    match value {
        Value::Int(number) => u64::try_from(*number).ok(),
        other => std::str::from_utf8(bytes_of(other)?).ok()?.parse().ok(),
    }
}

/// The `[id, [field, value, …]]` entries of an `XRANGE` or `XREVRANGE`
/// reply. An item that is no entry fails the reply: a store that skipped
/// it would count and list wrong, and a range reply is never partial.
fn entries_of(reply: Value, command: &'static str) -> Result<Vec<(StreamId, Vec<Value>)>, Error> {
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

fn letter_id(id: StreamId) -> LetterId {
    LetterId::new(format!("{}-{}", id.ms, id.seq))
}

fn stream_id(id: &LetterId) -> Result<StreamId, StoreError> {
    StreamId::parse(id.as_str().as_bytes()).ok_or_else(|| StoreError::InvalidId {
        id: id.as_str().to_owned(),
        expected: "a stream entry id, such as 1700000000000-0",
    })
}

/// Entries read per round trip by a scan of a scoped log.
const PAGE: usize = 256;

/// The last id before `id`, `None` before the first.
fn predecessor(id: StreamId) -> Option<StreamId> {
    match id.seq.checked_sub(1) {
        Some(seq) => Some(StreamId { ms: id.ms, seq }),
        None => id
            .ms
            .checked_sub(1)
            .map(|ms| StreamId { ms, seq: u64::MAX }),
    }
}

/// The first id after `id`, `None` past the last id a stream can hold.
/// (`XRANGE`'s exclusive `(` start needs Redis 6.2; this works on any.)
fn successor(id: StreamId) -> Option<StreamId> {
    match id.seq.checked_add(1) {
        Some(seq) => Some(StreamId { ms: id.ms, seq }),
        None => id.ms.checked_add(1).map(|ms| StreamId { ms, seq: 0 }),
    }
}

#[async_trait::async_trait]
impl DeadLetterLog for RedisDeadLetters {
    fn name(&self) -> &str {
        &self.stream
    }

    async fn entries(&self) -> Result<u64, StoreError> {
        if self.group.is_some() {
            // Every group's letters share the stream: only a scan counts one
            // group's.
            let mut count = 0;
            let mut start = StreamId::ZERO;
            loop {
                let entries = self.raw_range("count", start, None, PAGE, false).await?;
                let full = entries.len() == PAGE;
                let Some(&(last, _)) = entries.last() else {
                    return Ok(count);
                };
                count += entries
                    .iter()
                    .filter(|(_, fields)| self.belongs(fields))
                    .count() as u64;
                match successor(last) {
                    Some(next) if full => start = next,
                    _ => return Ok(count),
                }
            }
        }
        let mut connection = self.connection.get();
        let reply: Value = redis::cmd("XLEN")
            .arg(&*self.stream)
            .query_async(&mut connection)
            .await
            .map_err(|error| self.failed("count", "XLEN", error))?;
        integer_of(&reply).ok_or_else(|| {
            StoreError::broker(
                "count",
                &*self.stream,
                Error::UnexpectedReply {
                    command: "XLEN",
                    detail: format!("expected a length, got {reply:?}"),
                },
            )
        })
    }

    async fn last(&self) -> Result<Option<LetterId>, StoreError> {
        let page = if self.group.is_some() { PAGE } else { 1 };
        let mut end = None;
        loop {
            let entries = self
                .raw_range("read", StreamId::ZERO, end, page, true)
                .await?;
            let full = entries.len() == page;
            if let Some((id, _)) = entries.iter().find(|(_, fields)| self.belongs(fields)) {
                return Ok(Some(letter_id(*id)));
            }
            match entries.last().and_then(|&(oldest, _)| predecessor(oldest)) {
                Some(before) if full => end = Some(before),
                _ => return Ok(None),
            }
        }
    }

    async fn scan(
        &self,
        after: Option<&LetterId>,
        through: Option<&LetterId>,
        max: usize,
    ) -> Result<Vec<StoredLetter>, StoreError> {
        let start = match after.map(stream_id).transpose()? {
            None => StreamId::ZERO,
            Some(after) => match successor(after) {
                Some(start) => start,
                None => return Ok(Vec::new()),
            },
        };
        let end = through.map(stream_id).transpose()?;
        if max == 0 || end.is_some_and(|end| end < start) {
            return Ok(Vec::new());
        }
        self.range("list", start, end, max).await
    }

    async fn get(&self, id: &LetterId) -> Result<Option<StoredLetter>, StoreError> {
        let id = stream_id(id)?;
        Ok(self
            .raw_range("read", id, Some(id), 1, false)
            .await?
            .into_iter()
            .find(|(_, fields)| self.belongs(fields))
            .map(|(id, fields)| self.stored(id, fields)))
    }

    async fn remove(&self, ids: &[LetterId]) -> Result<u64, StoreError> {
        let ids = ids.iter().map(stream_id).collect::<Result<Vec<_>, _>>()?;
        if ids.is_empty() {
            return Ok(0);
        }
        if let Some(group) = &self.group {
            // Checked and deleted in one step on the server: an id of
            // another group's letter is left alone.
            let mut removed = 0;
            for chunk in ids.chunks(REMOVE_CHUNK) {
                let mut invocation = REMOVE_OF_GROUP.key(&*self.stream);
                invocation.arg(ORIGIN_GROUP).arg(&**group);
                for id in chunk {
                    invocation.arg(*id);
                }
                let mut connection = self.connection.get();
                let reply: Value = invocation
                    .invoke_async(&mut connection)
                    .await
                    .map_err(|error| self.failed("remove letters from", "XDEL", error))?;
                removed += integer_of(&reply).ok_or_else(|| {
                    StoreError::broker(
                        "remove letters from",
                        &*self.stream,
                        Error::UnexpectedReply {
                            command: "XDEL",
                            detail: format!("expected a count, got {reply:?}"),
                        },
                    )
                })?;
            }
            return Ok(removed);
        }
        let mut connection = self.connection.get();
        let reply: Value = redis::cmd("XDEL")
            .arg(&*self.stream)
            .arg(&ids)
            .query_async(&mut connection)
            .await
            .map_err(|error| self.failed("remove letters from", "XDEL", error))?;
        integer_of(&reply).ok_or_else(|| {
            StoreError::broker(
                "remove letters from",
                &*self.stream,
                Error::UnexpectedReply {
                    command: "XDEL",
                    detail: format!("expected a count, got {reply:?}"),
                },
            )
        })
    }

    /// The group's return stream of `origin` (`<origin>:<group>:returned`,
    /// or the one set with
    /// [`return_stream`](RedisDeadLettersBuilder::return_stream)) when the
    /// group reads it: the group exists there, which its source makes sure
    /// of when it reads the stream, and the parking's mover when it moves a
    /// copy there. `None` without a scope, or when the group does not read
    /// it: a message written there would never be read (or, by a group
    /// created there later at `$`, skipped).
    async fn way_back_to_group(&self, origin: &str) -> Result<Option<Arc<str>>, StoreError> {
        let Some(group) = &self.group else {
            return Ok(None);
        };
        let returned = self
            .returns
            .iter()
            .find(|(stream, _)| stream == origin)
            .map_or_else(
                || crate::RedisParking::return_stream(origin, group),
                |(_, returned)| returned.clone(),
            );
        let mut connection = self.connection.get();
        // The summary form answers NOGROUP when the stream or the group
        // on it is missing.
        let read: Result<Value, _> = redis::cmd("XPENDING")
            .arg(&returned)
            .arg(&**group)
            .query_async(&mut connection)
            .await;
        match read {
            Ok(_) => Ok(Some(returned.into())),
            Err(error) if error.code() == Some("NOGROUP") => Ok(None),
            Err(error) => {
                let error = self
                    .connection
                    .connector()
                    .key_error(error, "XPENDING", &returned);
                Err(StoreError::broker(
                    "look for the way back to",
                    &*self.stream,
                    error,
                ))
            }
        }
    }
}

/// Builds [`RedisDeadLetters`]; see [`RedisDeadLetters::builder`].
#[derive(Clone)]
#[must_use = "a builder does nothing until `.build().await`"]
pub struct RedisDeadLettersBuilder {
    connection: RedisSettings,
    stream: Option<String>,
    payload_field: String,
    group: Option<String>,
    returns: Vec<(String, String)>,
}

impl fmt::Debug for RedisDeadLettersBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisDeadLettersBuilder")
            .field("connection", &self.connection)
            .field("stream", &self.stream)
            .field("payload_field", &self.payload_field)
            .field("group", &self.group)
            .field("return_streams", &self.returns)
            .finish_non_exhaustive()
    }
}

impl RedisDeadLettersBuilder {
    /// The dead-letter stream to read, by its own name.
    pub fn stream(mut self, stream: impl Into<String>) -> Self {
        self.stream = Some(stream.into());
        self
    }

    /// The dead-letter stream of source stream `stream` under the default
    /// [`DeadLetterStream`] (`<stream>:dlq`).
    pub fn dead_letters_of(self, stream: &str) -> Self {
        self.dead_letters_of_with(stream, &DeadLetterStream::default())
    }

    /// The dead-letter stream of source stream `stream` under `naming`
    /// (what the sink was given).
    pub fn dead_letters_of_with(self, stream: &str, naming: &DeadLetterStream) -> Self {
        self.stream(naming.name_for(stream))
    }

    /// Scopes the log to the letters of consumer group `group` (their
    /// `intake.origin.group`): it counts, lists, reads, replays and purges
    /// those alone, and a replay to the group goes to the group's return
    /// stream (see [`RedisDeadLetters`]). Letters written without a group
    /// (a broadcast reader's) belong to no group's scope.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Sets the group's return stream of origin `stream`, when its parking
    /// was given another name than the default
    /// [`RedisParking::return_stream`](crate::RedisParking::return_stream).
    pub fn return_stream(
        mut self,
        stream: impl Into<String>,
        return_stream: impl Into<String>,
    ) -> Self {
        let (stream, return_stream) = (stream.into(), return_stream.into());
        self.returns.retain(|(origin, _)| *origin != stream);
        self.returns.push((stream, return_stream));
        self
    }

    /// The field that carries each letter's payload (default `payload`, the
    /// sink's).
    pub fn payload_field(mut self, field: impl Into<String>) -> Self {
        self.payload_field = field.into();
        self
    }

    /// Checks the settings, then connects.
    ///
    /// Fails with [`Error::Config`] for no stream or an empty name, before
    /// connecting, and with a typed error for a bad URL, an unreachable
    /// server or refused credentials.
    pub async fn build(self) -> Result<RedisDeadLetters, Error> {
        let stream = match self.stream {
            Some(stream) if !stream.is_empty() => stream,
            Some(_) => return Err(ConfigError::new("stream", "is empty").into()),
            None => {
                return Err(ConfigError::new(
                    "stream",
                    "is not set; name the dead-letter stream (`stream`) or its source \
                     (`dead_letters_of`)",
                )
                .into());
            }
        };
        if self.payload_field.is_empty() {
            return Err(ConfigError::new("payload_field", "is empty").into());
        }
        if self.group.as_deref() == Some("") {
            return Err(ConfigError::new("group", "is empty").into());
        }
        let connector = self.connection.connector()?;
        let connection = SharedConnection::new(connector.shared().await?, connector);
        Ok(RedisDeadLetters {
            connection,
            stream: stream.into(),
            payload_field: self.payload_field.into(),
            group: self.group.map(Arc::from),
            returns: self.returns.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_successor_of_an_id_carries_into_the_milliseconds() {
        let id = |ms, seq| StreamId { ms, seq };
        assert_eq!(successor(id(5, 1)), Some(id(5, 2)));
        assert_eq!(successor(id(5, u64::MAX)), Some(id(6, 0)));
        assert_eq!(successor(id(u64::MAX, u64::MAX)), None);
        assert_eq!(predecessor(id(5, 2)), Some(id(5, 1)));
        assert_eq!(predecessor(id(6, 0)), Some(id(5, u64::MAX)));
        assert_eq!(predecessor(id(0, 0)), None);
    }

    #[test]
    fn an_id_of_another_form_is_refused() {
        for id in ["41", "a-b", "", "1-2-3"] {
            assert!(
                matches!(
                    stream_id(&LetterId::new(id)),
                    Err(StoreError::InvalidId { .. })
                ),
                "{id}"
            );
        }
        assert_eq!(
            stream_id(&LetterId::new("1700000000000-7")).ok(),
            Some(StreamId {
                ms: 1_700_000_000_000,
                seq: 7
            })
        );
    }
}
