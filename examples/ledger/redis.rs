//! Redis Streams: the producer and the consumer-group source.
//!
//! PARTITION is always 0 (a stream is one partition), POSITION the entry id
//! (`1700000000000-0`).

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use intake::redis_streams::redis;
use intake::redis_streams::{RedisParking, RedisStreamsPublisher, RedisStreamsSource};
use tokio::task::JoinSet;

use crate::BoxError;

/// Overrides how long (ms) an entry stays pending with a consumer before
/// another may claim it. Default [`DEFAULT_CLAIM_MIN_IDLE`].
pub const CLAIM_MIN_IDLE_ENV: &str = "LEDGER_REDIS_CLAIM_MIN_IDLE_MS";

/// Entries a killed consumer held are claimed by others once idle this long.
/// Short, so that restarts after SIGKILL resume within seconds; long enough
/// that nothing waits that long inside a live consumer (a few ms at most,
/// plus retry backoff of up to a second), which would deliver it twice.
const DEFAULT_CLAIM_MIN_IDLE: Duration = Duration::from_secs(3);

/// Entries per pipelined round trip, and round trips in flight at once.
const CHUNK: u64 = 1_000;
const PIPELINES_IN_FLIGHT: u64 = 4;

/// Appends ids `0..count` (field `payload`, field `key` = `id % 64`) and
/// returns once Redis replied to every `XADD`. Each key's ids are appended
/// in ascending order, as a keyed producer would: pipeline `w` of the
/// [`PIPELINES_IN_FLIGHT`] carries only the keys `k` with
/// `k % PIPELINES_IN_FLIGHT == w`, one round trip after the other, so the
/// pipelines never overtake each other within a key.
pub async fn produce(url: &str, stream: &str, count: u64) -> Result<(), BoxError> {
    let client = redis::Client::open(url)?;
    // One multiplexed connection carries several pipelines at once.
    let connection = client.get_multiplexed_async_connection().await?;
    let mut pipelines = JoinSet::new();
    for worker in 0..PIPELINES_IN_FLIGHT {
        let mut connection = connection.clone();
        let stream = stream.to_owned();
        pipelines.spawn(async move {
            let mut ids = (0..count).filter(move |id| (id % 64) % PIPELINES_IN_FLIGHT == worker);
            loop {
                let mut pipe = redis::pipe();
                let mut sent = 0_u64;
                for id in ids.by_ref().take(CHUNK as usize) {
                    pipe.xadd(&stream, "*", &[("payload", id), ("key", id % 64)]);
                    sent += 1;
                }
                if sent == 0 {
                    return Ok::<(), BoxError>(());
                }
                let replies: Vec<String> = pipe.query_async(&mut connection).await?;
                if replies.len() as u64 != sent {
                    return Err(format!(
                        "Redis answered {} of {sent} XADDs of pipeline {worker}",
                        replies.len()
                    )
                    .into());
                }
            }
        });
    }
    while let Some(done) = pipelines.join_next().await {
        done??;
    }
    Ok(())
}

/// The relay's publisher: `XADD`s pipelined on one connection, each
/// output confirmed by its reply.
pub async fn publisher(url: &str) -> Result<RedisStreamsPublisher, BoxError> {
    Ok(RedisStreamsPublisher::builder(url).build().await?)
}

/// A member of consumer group `group` on `stream`, under a consumer name
/// of its own (`GROUP-<pid>-<random>`): a restarted process is a new
/// consumer, and what the killed one held is claimed from it.
///
/// With `parks` (`--later-every`), it also reads the group's return stream,
/// where parked copies come back once due.
pub async fn source(
    url: &str,
    stream: &str,
    group: &str,
    parks: bool,
) -> Result<RedisStreamsSource, BoxError> {
    let claim_min_idle = match std::env::var(CLAIM_MIN_IDLE_ENV) {
        Ok(ms) => Duration::from_millis(
            ms.parse()
                .map_err(|_| format!("{CLAIM_MIN_IDLE_ENV}: `{ms}` is not milliseconds"))?,
        ),
        Err(_) => DEFAULT_CLAIM_MIN_IDLE,
    };
    let consumer = format!(
        "{group}-{}-{:08x}",
        std::process::id(),
        RandomState::new().hash_one(std::time::SystemTime::now()) as u32
    );
    tracing::info!(%consumer, ?claim_min_idle, "joining the consumer group");
    let mut builder = RedisStreamsSource::builder(url).stream(stream);
    if parks {
        builder = builder.stream(RedisParking::return_stream(stream, group));
    }
    let source = builder
        .group(group)
        .consumer(consumer)
        // `produce` (and the publisher, by default) writes the key as the
        // field `key`; without this the source would carry it as a header,
        // and `relay` would run every entry unordered for want of a key.
        .key_field("key")
        .claim_min_idle(claim_min_idle)
        // Look for abandoned entries often, so a restart resumes quickly.
        .claim_interval(Duration::from_millis(500))
        // Every id must reach the ledger: an entry that happened to be in
        // flight at several kills is delivered again, never given up.
        .unlimited_deliveries()
        .block(Duration::from_millis(500))
        .build()
        .await?;
    Ok(source)
}

/// Asks Redis whether the group still has entries that were delivered and
/// not acknowledged, by any consumer. The idle exit waits for them: entries
/// a killed consumer held become claimable only `claim_min_idle` after it
/// died, which may be later than a restarted consumer's idle deadline.
pub struct PendingProbe {
    /// Reconnects by itself: the chaos suite kills this connection too.
    connection: redis::aio::ConnectionManager,
    stream: String,
    group: String,
}

impl PendingProbe {
    pub async fn connect(url: &str, stream: &str, group: &str) -> Result<Self, BoxError> {
        let connection = redis::Client::open(url)?.get_connection_manager().await?;
        Ok(Self {
            connection,
            stream: stream.to_owned(),
            group: group.to_owned(),
        })
    }

    /// Entries pending in the group, or `None` when Redis could not say.
    pub async fn pending(&mut self) -> Option<u64> {
        let reply: Result<redis::streams::StreamPendingReply, _> = redis::cmd("XPENDING")
            .arg(&self.stream)
            .arg(&self.group)
            .query_async(&mut self.connection)
            .await;
        match reply {
            Ok(reply) => Some(reply.count() as u64),
            Err(error) => {
                tracing::warn!(%error, "XPENDING failed; the backlog is unknown");
                None
            }
        }
    }
}
