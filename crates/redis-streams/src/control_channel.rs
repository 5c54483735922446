//! [`RedisControlChannel`]: one of a consumer group's control logs
//! ([`intake_core::group_control`]) kept in a Redis stream.
//!
//! An append is one `XADD` on a shared, self-reconnecting connection; a
//! feed reads the stream from `0-0` with `XREAD … BLOCK` on a connection of
//! its own, since a blocking read holds its connection for the whole block
//! and every command queued behind it would wait as long.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use intake_core::group_control::{ControlChannel, ControlError, ControlFeed, ControlLog};
use redis::Value;
use redis::aio::MultiplexedConnection;
use tokio::sync::OnceCell;

use crate::connection::{Connector, SharedConnection};
use crate::error::Error;
use crate::source::convert::{RawEntry, bytes_of, parse_entries, parse_read_reply};
use crate::stream_id::StreamId;

/// The entry field that carries a record.
const RECORD_FIELD: &str = "record";

/// About how many entries a status log keeps (`MAXLEN ~`): the status of
/// every instance is appended at each console sample, and only the recent
/// ones matter.
const STATUS_ENTRIES: u64 = 10_000;

/// How many entries one read of a feed asks for.
const READ_COUNT: usize = 100;

/// How long one read of a feed blocks on the server for a new entry. Short,
/// so that a dropped feed's connection is given back soon, and a broken one
/// is noticed within the block plus the command timeout.
const READ_BLOCK: Duration = Duration::from_millis(1000);

/// One of a consumer group's control logs ([`ControlLog`]) in a Redis
/// stream: the commands log is stream `{group}:intake-control`, never
/// trimmed (a pause lasts until a resume); the status log is stream
/// `{group}:intake-status`, trimmed to about 10,000 entries at each append
/// (`XADD … MAXLEN ~ 10000`). Each entry has one field, `record`, holding
/// the record's bytes.
///
/// From [`RedisBroker::control_channel`](crate::RedisBroker::control_channel).
/// It connects at its first [`append`](ControlChannel::append), on a
/// connection its clones share; each [`follow`](ControlChannel::follow)
/// opens a connection of its own for the feed's blocking reads.
///
/// Every call is bounded: an append (connecting included) gives up after
/// the settings' connect timeout plus their command timeout
/// ([`ControlError::TimedOut`]); a feed reads with `XREAD COUNT 100 BLOCK
/// 1000`, each read bounded by the block plus the command timeout, and a
/// broken connection ends it with an error. An entry without a `record`
/// field (not written by a control channel) is skipped with a warning.
///
/// Neither `Debug` nor an error shows the URL's password.
#[derive(Clone)]
pub struct RedisControlChannel {
    connector: Connector,
    /// Connected at the first append; shared by the clones.
    connection: Arc<OnceCell<SharedConnection>>,
    group: Arc<str>,
    log: ControlLog,
    key: Arc<str>,
}

impl fmt::Debug for RedisControlChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisControlChannel")
            .field("endpoint", self.connector.endpoint())
            .field("group", &self.group)
            .field("log", &self.log)
            .field("stream", &self.key)
            .finish_non_exhaustive()
    }
}

impl RedisControlChannel {
    /// Group `group`'s `log` at the server of `connector`; nothing is
    /// connected yet.
    pub(crate) fn new(connector: Connector, group: &str, log: ControlLog) -> Self {
        Self {
            connector,
            connection: Arc::new(OnceCell::new()),
            group: group.into(),
            log,
            key: Self::stream_of(group, log).into(),
        }
    }

    /// The stream that keeps group `group`'s `log`:
    /// `{group}:intake-control` or `{group}:intake-status`.
    pub fn stream_of(group: &str, log: ControlLog) -> String {
        format!("{group}:intake-{}", log.as_str())
    }

    /// The stream this channel appends to and reads.
    pub fn stream(&self) -> &str {
        &self.key
    }

    /// The longest an append or the opening of a feed may take:
    /// connecting, then one command.
    fn bound(&self) -> Duration {
        self.connector.connect_timeout() + self.connector.command_timeout()
    }

    async fn connection(&self) -> Result<&SharedConnection, Error> {
        self.connection
            .get_or_try_init(|| async {
                let connection = self.connector.shared().await?;
                Ok(SharedConnection::new(connection, self.connector.clone()))
            })
            .await
    }

    async fn add(&self, record: &[u8]) -> Result<(), Error> {
        let shared = self.connection().await?;
        let mut command = redis::cmd("XADD");
        command.arg(&*self.key);
        if self.log == ControlLog::Status {
            command.arg("MAXLEN").arg("~").arg(STATUS_ENTRIES);
        }
        command.arg("*").arg(RECORD_FIELD).arg(record);
        let mut connection = shared.get();
        match command.query_async::<Value>(&mut connection).await {
            Ok(_) => Ok(()),
            Err(error) => {
                // A failover left the connection on a replica: the next
                // append goes through a new one.
                shared.replace_if_replica(&error).await;
                Err(self.connector.key_error(error, "XADD", &self.key))
            }
        }
    }
}

impl ControlChannel for RedisControlChannel {
    fn log(&self) -> ControlLog {
        self.log
    }

    async fn append(&self, record: Bytes) -> Result<(), ControlError> {
        let bound = self.bound();
        match tokio::time::timeout(bound, self.add(&record)).await {
            Ok(added) => added.map_err(control_error),
            Err(_) => Err(ControlError::TimedOut(bound)),
        }
    }

    async fn follow(&self) -> Result<ControlFeed, ControlError> {
        let bound = self.bound();
        let connection =
            match tokio::time::timeout(bound, self.connector.blocking_reader(READ_BLOCK)).await {
                Ok(connection) => connection.map_err(control_error)?,
                Err(_) => return Err(ControlError::TimedOut(bound)),
            };
        let feed = Feed {
            connector: self.connector.clone(),
            connection,
            key: self.key.clone(),
            last: StreamId::ZERO,
            ready: VecDeque::new(),
            failed: false,
        };
        Ok(futures_util::stream::unfold(feed, Feed::next).boxed())
    }
}

/// A crate error as a control channel's: transient or refused.
fn control_error(error: Error) -> ControlError {
    let transient = error.is_transient();
    ControlError::from_backend(error, transient)
}

/// The state of one feed: its connection, the last id read and the records
/// of the last read not yet handed out.
struct Feed {
    connector: Connector,
    connection: MultiplexedConnection,
    key: Arc<str>,
    last: StreamId,
    ready: VecDeque<Bytes>,
    /// An error was handed out: the feed ends.
    failed: bool,
}

impl Feed {
    /// The next record, reading as often as it takes; after an error, the
    /// end of the feed.
    async fn next(mut self) -> Option<(Result<Bytes, ControlError>, Self)> {
        loop {
            if let Some(record) = self.ready.pop_front() {
                return Some((Ok(record), self));
            }
            if self.failed {
                return None;
            }
            if let Err(error) = self.read().await {
                self.failed = true;
                return Some((Err(error), self));
            }
        }
    }

    /// One `XREAD` after the last id; its records are queued in `ready`.
    async fn read(&mut self) -> Result<(), ControlError> {
        // The connection's response timeout bounds the read already; this
        // one also bounds a reply that trickles in.
        let bound = READ_BLOCK + self.connector.command_timeout() + Duration::from_secs(1);
        let mut command = redis::cmd("XREAD");
        command
            .arg("COUNT")
            .arg(READ_COUNT)
            .arg("BLOCK")
            .arg(READ_BLOCK.as_millis() as u64)
            .arg("STREAMS")
            .arg(&*self.key)
            .arg(self.last);
        let read = command.query_async::<Value>(&mut self.connection);
        let reply = match tokio::time::timeout(bound, read).await {
            Err(_) => return Err(ControlError::TimedOut(bound)),
            Ok(Err(error)) => {
                return Err(control_error(
                    self.connector.key_error(error, "XREAD", &self.key),
                ));
            }
            Ok(Ok(reply)) => reply,
        };
        let mut entries = Vec::new();
        parse_read_reply(reply, "XREAD", |_, stream| {
            parse_entries(stream, "XREAD", &mut entries).map(|_| ())
        })
        .map_err(control_error)?;
        for entry in entries {
            self.take(entry);
        }
        Ok(())
    }

    /// Queues the record of `entry`, or skips an entry that has none.
    fn take(&mut self, entry: RawEntry) {
        // Past it either way: an entry without a record is skipped, not
        // read again.
        self.last = self.last.max(entry.id);
        match record_of(&entry) {
            Some(record) => self.ready.push_back(record),
            None => tracing::warn!(
                stream = %self.key,
                id = ?entry.id,
                "an entry of the group's control log has no `record` field; skipped"
            ),
        }
    }
}

/// The value of the entry's `record` field; `None` for an entry without
/// one, or deleted.
fn record_of(entry: &RawEntry) -> Option<Bytes> {
    entry
        .fields
        .as_deref()?
        .chunks_exact(2)
        .find(|pair| bytes_of(&pair[0]) == Some(RECORD_FIELD.as_bytes()))
        .and_then(|pair| bytes_of(&pair[1]))
        .map(Bytes::copy_from_slice)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::RedisSettings;

    fn channel(log: ControlLog) -> RedisControlChannel {
        let connector = RedisSettings::new("redis://app:s3cr3t@127.0.0.1:1/0")
            .connector()
            .map_err(|error| error.to_string());
        match connector {
            Ok(connector) => RedisControlChannel::new(connector, "billing", log),
            Err(error) => panic!("the test URL parses: {error}"),
        }
    }

    #[test]
    fn each_log_has_its_stream_and_debug_hides_the_password() {
        let commands = channel(ControlLog::Commands);
        assert_eq!(commands.stream(), "billing:intake-control");
        assert_eq!(commands.log(), ControlLog::Commands);
        let status = channel(ControlLog::Status);
        assert_eq!(status.stream(), "billing:intake-status");
        let shown = format!("{commands:?} {status:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("127.0.0.1:1"), "{shown}");
    }

    fn entry(id: u64, fields: Option<Vec<Value>>) -> RawEntry {
        RawEntry {
            id: StreamId { ms: id, seq: 0 },
            fields,
        }
    }

    fn text(value: &str) -> Value {
        Value::BulkString(value.as_bytes().to_vec())
    }

    #[test]
    fn an_entry_without_a_record_field_has_no_record() {
        let records: Vec<Option<Bytes>> = [
            entry(1, Some(vec![text("record"), text("first")])),
            entry(2, Some(vec![text("other"), text("x")])),
            entry(3, None),
            entry(
                4,
                Some(vec![text("a"), text("b"), text("record"), text("second")]),
            ),
            entry(5, Some(vec![text("record")])),
            entry(6, Some(vec![text("record"), Value::Nil])),
        ]
        .iter()
        .map(record_of)
        .collect();
        assert_eq!(
            records,
            [
                Some(Bytes::from("first")),
                None,
                None,
                Some(Bytes::from("second")),
                None,
                None
            ]
        );
    }
}
