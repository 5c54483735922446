//! [`RedisLagProbe`]: a consumer group's lag on its streams, from
//! `XINFO GROUPS`, and its parked backlog, from the length of its parking
//! streams.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use intake_core::lag::{DEFAULT_LAG_TIMEOUT, LagError, LagProbe, ParkedTier, PartitionLag};
use intake_core::{PartitionKey, SourceName};
use redis::aio::ConnectionManager;
use redis::streams::{StreamInfoGroupsReply, StreamPendingReply};
use tokio::sync::OnceCell;

use crate::connection::{Connector, SharedConnection};
use crate::error::Error;
use crate::settings::RedisSettings;

/// Reports a consumer group's lag on each of its streams (partition 0 of
/// each), as `XINFO GROUPS` counts it: `lag` (entries added after the
/// group's last delivered one, never delivered) plus `pending` (delivered
/// and not `XACK`ed). The age is that of the oldest of them, from its
/// entry id: the oldest pending entry, else the first undelivered one.
///
/// `lag` needs Redis 7; where the server cannot tell it (Redis 6, or after
/// an `XDEL` or a trim past the group's position) the probe reports the
/// count as unknown (`messages: None`) rather than a guess.
///
/// [`parked`](LagProbe::parked) counts what the group parked
/// ([`RedisParking`](crate::RedisParking)) and the mover has not moved back
/// yet, by any instance: the length (`XLEN`) of the group's parking stream
/// of each stream, `<stream>:<group>:parked`. The originals of those
/// messages are acknowledged, so broker lag does not show them. It is
/// `Some(0)` for a group that never parked.
///
/// Get one from a source ([`RedisStreamsSource::lag_probe`](crate::RedisStreamsSource::lag_probe),
/// sharing its connection), from a [`RedisBroker`](crate::RedisBroker)
/// ([`lag_probe`](intake_core::backend::Broker::lag_probe), which also
/// reports the route's return stream once it exists) or with
/// [`RedisLagProbe::new`] in a process that does not consume. Every query
/// is bounded by [`timeout`](Self::timeout) (5 s by default).
#[derive(Clone)]
pub struct RedisLagProbe {
    connector: Connector,
    connection: Arc<OnceCell<ConnectionManager>>,
    group: Arc<str>,
    streams: Arc<[SourceName]>,
    /// Return streams of the group's parking, reported once they exist
    /// with the group: before the first park they are not there at all.
    returns: Arc<[SourceName]>,
    timeout: Duration,
}

impl std::fmt::Debug for RedisLagProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLagProbe")
            .field("endpoint", self.connector.endpoint())
            .field("group", &self.group)
            .field("streams", &self.streams)
            .field("return_streams", &self.returns)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl RedisLagProbe {
    /// A probe of `group` on `streams` at the server of `settings` (a
    /// [`RedisSettings`], or just the URL: `redis://…`, `rediss://…`). It
    /// connects at its first query.
    ///
    /// # Errors
    ///
    /// A URL the client cannot use ([`Error::InvalidUrl`], password
    /// redacted).
    pub fn new(
        settings: impl Into<RedisSettings>,
        group: &str,
        streams: impl IntoIterator<Item = impl Into<SourceName>>,
    ) -> Result<Self, Error> {
        let connector = settings.into().connector()?;
        Ok(Self {
            connector,
            connection: Arc::new(OnceCell::new()),
            group: group.into(),
            streams: streams.into_iter().map(Into::into).collect(),
            returns: Arc::new([]),
            timeout: DEFAULT_LAG_TIMEOUT,
        })
    }

    /// The probe of a route derived from a broker: `group` on `stream`,
    /// and on `returned` (the route's return stream) once it exists. It
    /// connects at its first query.
    pub(crate) fn of_route(
        connector: Connector,
        group: &str,
        stream: &str,
        returned: &str,
    ) -> Self {
        Self {
            connector,
            connection: Arc::new(OnceCell::new()),
            group: group.into(),
            streams: Arc::new([SourceName::from(stream)]),
            returns: Arc::new([SourceName::from(returned)]),
            timeout: DEFAULT_LAG_TIMEOUT,
        }
    }

    /// The probe of a source's group, on the source's connection.
    pub(crate) fn of_source(
        shared: &SharedConnection,
        group: Arc<str>,
        streams: &[SourceName],
    ) -> Self {
        Self {
            connector: shared.connector().clone(),
            connection: Arc::new(OnceCell::new_with(Some(shared.get()))),
            group,
            streams: streams.into(),
            returns: Arc::new([]),
            timeout: DEFAULT_LAG_TIMEOUT,
        }
    }

    /// The longest a query may take, connecting included.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    async fn connection(&self) -> Result<ConnectionManager, Error> {
        Ok(self
            .connection
            .get_or_try_init(|| self.connector.shared())
            .await?
            .clone())
    }

    async fn query(&self) -> Result<Vec<PartitionLag>, Error> {
        let mut connection = self.connection().await?;
        let mut lags = Vec::with_capacity(self.streams.len() + self.returns.len());
        for stream in self.streams.iter() {
            match self.stream_lag(&mut connection, stream).await? {
                Some(lag) => lags.push(lag),
                None => {
                    return Err(Error::UnexpectedReply {
                        command: "XINFO GROUPS",
                        detail: format!("stream `{stream}` has no consumer group `{}`", self.group),
                    });
                }
            }
        }
        for stream in self.returns.iter() {
            let key: &str = stream;
            let exists: bool = redis::cmd("EXISTS")
                .arg(key)
                .query_async(&mut connection)
                .await
                .map_err(|error| self.connector.key_error(error, "EXISTS", key))?;
            if exists && let Some(lag) = self.stream_lag(&mut connection, stream).await? {
                lags.push(lag);
            }
        }
        Ok(lags)
    }

    /// The sum of the lengths of the group's parking streams, and the
    /// earliest due time (Unix milliseconds) in their due indexes.
    async fn parked_query(&self) -> Result<(u64, Option<u64>), Error> {
        let mut connection = self.connection().await?;
        let mut parked = 0_u64;
        let mut next_due: Option<u64> = None;
        for stream in self.streams.iter() {
            let key = crate::RedisParking::parked_stream(stream, &self.group);
            let length: u64 = redis::cmd("XLEN")
                .arg(&key)
                .query_async(&mut connection)
                .await
                .map_err(|error| self.connector.key_error(error, "XLEN", &key))?;
            parked = parked.saturating_add(length);
            let index = crate::RedisParking::due_index(stream, &self.group);
            let first: Vec<(String, f64)> = redis::cmd("ZRANGE")
                .arg(&index)
                .arg(0)
                .arg(0)
                .arg("WITHSCORES")
                .query_async(&mut connection)
                .await
                .map_err(|error| self.connector.key_error(error, "ZRANGE", &index))?;
            if let Some((_, due)) = first.first()
                && due.is_finite()
                && *due >= 0.0
            {
                // Scores are whole milliseconds; the cast saturates.
                let due = *due as u64;
                next_due = Some(next_due.map_or(due, |earliest| earliest.min(due)));
            }
        }
        Ok((parked, next_due))
    }

    /// The group's lag on `stream`; `None` when the stream has no such
    /// group.
    async fn stream_lag(
        &self,
        connection: &mut ConnectionManager,
        stream: &SourceName,
    ) -> Result<Option<PartitionLag>, Error> {
        let key = stream.as_ref();
        let reply: StreamInfoGroupsReply = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(key)
            .query_async(connection)
            .await
            .map_err(|error| self.connector.key_error(error, "XINFO GROUPS", key))?;
        let partition = PartitionKey::new(stream.clone(), 0);
        let Some(group) = reply
            .groups
            .into_iter()
            .find(|group| *group.name == *self.group)
        else {
            return Ok(None);
        };
        let messages = group
            .lag
            .map(|undelivered| (undelivered + group.pending) as u64);
        // The oldest entry the group still owes: the oldest pending one, or
        // else the first one after its last delivered id.
        let oldest_id = if group.pending > 0 {
            let pending: StreamPendingReply = redis::cmd("XPENDING")
                .arg(key)
                .arg(&*self.group)
                .query_async(connection)
                .await
                .map_err(|error| self.connector.key_error(error, "XPENDING", key))?;
            match pending {
                StreamPendingReply::Data(data) => Some(data.start_id),
                _ => None,
            }
        } else if group.lag != Some(0) {
            let next: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
                .arg(key)
                .arg(format!("({}", group.last_delivered_id))
                .arg("+")
                .arg("COUNT")
                .arg(1)
                .query_async(connection)
                .await
                .map_err(|error| self.connector.key_error(error, "XRANGE", key))?;
            next.ids.into_iter().next().map(|entry| entry.id)
        } else {
            None
        };
        let lag = PartitionLag::new(partition, messages);
        Ok(Some(match oldest_id.as_deref().and_then(id_millis) {
            Some(millis) => lag.with_oldest_age(age_of(millis)),
            None if messages == Some(0) => lag.with_oldest_age(Duration::ZERO),
            None => lag,
        }))
    }
}

/// The milliseconds part of an entry id (`<ms>-<seq>`).
fn id_millis(id: &str) -> Option<u64> {
    id.split_once('-')
        .map_or(id, |(millis, _)| millis)
        .parse()
        .ok()
}

/// How long ago `millis` (since the epoch) was; zero for a clock behind
/// the server's.
fn age_of(millis: u64) -> Duration {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    now.saturating_sub(Duration::from_millis(millis))
}

impl LagProbe for RedisLagProbe {
    fn group(&self) -> &str {
        &self.group
    }

    async fn lag(&self) -> Result<Vec<PartitionLag>, LagError> {
        bounded(self.timeout, self.query()).await
    }

    /// What the group parked and the mover has not moved back yet: the
    /// length of its parking stream of each stream (see the type docs).
    async fn parked(&self) -> Result<Option<u64>, LagError> {
        let (parked, _) = bounded(self.timeout, self.parked_query()).await?;
        Ok(Some(parked))
    }

    /// One tier, `exact` (each parked message keeps its own due time), with
    /// the earliest due time in the group's due indexes: a message the
    /// parking's round has not indexed yet is counted but not in it.
    async fn parked_tiers(&self) -> Result<Option<Vec<ParkedTier>>, LagError> {
        let (parked, next_due) = bounded(self.timeout, self.parked_query()).await?;
        let mut tier = ParkedTier::new("exact", parked);
        if let Some(due) = next_due {
            tier = tier.with_next_due(UNIX_EPOCH + Duration::from_millis(due));
        }
        Ok(Some(vec![tier]))
    }
}

/// `query` within `timeout`, its error sorted for the caller.
async fn bounded<T>(
    timeout: Duration,
    query: impl Future<Output = Result<T, Error>>,
) -> Result<T, LagError> {
    match tokio::time::timeout(timeout, query).await {
        Err(_) => Err(LagError::TimedOut(timeout)),
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(error)) => {
            let transient = error.is_transient();
            Err(LagError::from_backend(error, transient))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_id_gives_its_milliseconds() {
        assert_eq!(id_millis("1700000000000-3"), Some(1_700_000_000_000));
        assert_eq!(id_millis("42"), Some(42));
        assert_eq!(id_millis("not-an-id"), None);
    }

    #[test]
    fn a_url_with_a_password_stays_out_of_debug() {
        let probe = RedisLagProbe::new("redis://user:hunter2@127.0.0.1:1", "g", ["s"]).unwrap();
        assert!(!format!("{probe:?}").contains("hunter2"));
    }
}
