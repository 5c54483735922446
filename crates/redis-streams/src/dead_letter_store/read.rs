//! Counting, listing and reading the letters: `XLEN`, or `XRANGE` a page at
//! a time after a cursor (the entry id); a log scoped to a group skips
//! every other group's letters.

use bytes::Bytes;
use intake_core::Headers;
use intake_core::dead_letter::envelope::ORIGIN_GROUP;
use intake_core::dead_letter::store::{LetterId, StoreError, StoredLetter};
use redis::Value;

use super::RedisDeadLetters;
use super::ids::{letter_id, predecessor, stream_id, successor};
use super::reply::entries_of;
use crate::error::Error;
use crate::source::convert::{bytes_of, integer_of};
use crate::stream_id::StreamId;

/// Entries read per round trip by a scan of a scoped log.
const PAGE: usize = 256;

impl RedisDeadLetters {
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

    /// How many letters the log holds ([`DeadLetterLog::entries`]).
    ///
    /// [`DeadLetterLog::entries`]: intake_core::dead_letter::store::DeadLetterLog::entries
    pub(super) async fn count(&self) -> Result<u64, StoreError> {
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

    /// The newest letter's id ([`DeadLetterLog::last`]).
    ///
    /// [`DeadLetterLog::last`]: intake_core::dead_letter::store::DeadLetterLog::last
    pub(super) async fn newest(&self) -> Result<Option<LetterId>, StoreError> {
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

    /// Up to `max` letters after `after` through `through`
    /// ([`DeadLetterLog::scan`]).
    ///
    /// [`DeadLetterLog::scan`]: intake_core::dead_letter::store::DeadLetterLog::scan
    pub(super) async fn list(
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

    /// The letter `id` if this log holds it ([`DeadLetterLog::get`]).
    ///
    /// [`DeadLetterLog::get`]: intake_core::dead_letter::store::DeadLetterLog::get
    pub(super) async fn read(&self, id: &LetterId) -> Result<Option<StoredLetter>, StoreError> {
        let id = stream_id(id)?;
        Ok(self
            .raw_range("read", id, Some(id), 1, false)
            .await?
            .into_iter()
            .find(|(_, fields)| self.belongs(fields))
            .map(|(id, fields)| self.stored(id, fields)))
    }
}
