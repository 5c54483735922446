//! The mover of a [`RedisParking`]: rounds on every stream, paced by the
//! earliest due time, backing off while they fail.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use intake_core::parking::DUE;
use intake_core::{BackoffPolicy, Exponential};
use redis::Value;
use tokio::sync::{Notify, watch};

use super::round::{ROUND, Round};
use super::{RedisParking, StreamKeys, timed_out, unix_millis};
use crate::connection::SharedConnection;
use crate::dead_letter::MAX_DEAD_LETTER_VALUES;
use crate::error::Error;

/// Most parked entries one round indexes per stream; a round that reads
/// this many runs again at once.
pub(super) const INDEX_PER_ROUND: usize = 1_000;

/// The longest wait between failed rounds, should the policy give up
/// (the crate's never does): the mover itself never gives up.
pub(super) const LONGEST_BACKOFF: Duration = Duration::from_secs(10);

/// Moves due entries back; see [`RedisParking`].
pub(super) struct Mover {
    pub(super) connection: SharedConnection,
    pub(super) keys: Vec<StreamKeys>,
    /// The consumer group that reads the return streams.
    pub(super) group: String,
    pub(super) batch: usize,
    pub(super) max_len: Option<u64>,
    pub(super) poll_interval: Duration,
    pub(super) command_timeout: Duration,
    pub(super) reconnect: Exponential,
    pub(super) wake: Arc<Notify>,
    /// Rounds failed in a row.
    pub(super) failures: u32,
}

impl Mover {
    /// Runs after a first round (in `build`) that asked for `wait`, until
    /// told to stop or the parking is gone.
    pub(super) async fn run(mut self, mut wait: Duration, mut stop: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                biased;
                _ = stop.wait_for(|stopped| *stopped) => break,
                () = self.wake.notified() => {}
                () = tokio::time::sleep(wait) => {}
            }
            wait = tokio::select! {
                biased;
                _ = stop.wait_for(|stopped| *stopped) => break,
                wait = self.rounds() => wait,
            };
        }
        tracing::debug!(
            endpoint = %self.connection.connector().endpoint(),
            "Redis parking mover stopped"
        );
    }

    /// One round on every stream; how long to wait before the next.
    async fn rounds(&mut self) -> Duration {
        let mut wait = self.poll_interval;
        let mut failed = 0;
        for keys in &self.keys {
            match self.round(keys).await {
                Ok(round) => {
                    report(keys, &round);
                    wait = pace(wait, &round);
                }
                Err(error) => {
                    failed += 1;
                    if self.failures == 0 {
                        tracing::warn!(
                            stream = %keys.stream,
                            %error,
                            "moving parked messages back failed; retrying with backoff (they \
                             stay parked meanwhile)"
                        );
                    } else {
                        tracing::debug!(stream = %keys.stream, %error, "moving parked messages back still fails");
                    }
                }
            }
        }
        if failed == 0 {
            if self.failures > 0 {
                tracing::info!(
                    endpoint = %self.connection.connector().endpoint(),
                    "moving parked messages back works again"
                );
                self.failures = 0;
            }
            return wait;
        }
        self.failures = self.failures.saturating_add(1);
        let backoff = self
            .reconnect
            .delay(self.failures)
            .unwrap_or(LONGEST_BACKOFF);
        if failed == self.keys.len() {
            backoff
        } else {
            // The streams that work keep their pace; the failing one is
            // tried with them.
            wait
        }
    }

    /// Runs the round script on one stream.
    pub(super) async fn round(&self, keys: &StreamKeys) -> Result<Round, Error> {
        let mut invocation = ROUND.prepare_invoke();
        invocation
            .key(&keys.returned)
            .key(&keys.parked)
            .key(&keys.due)
            .arg(unix_millis(SystemTime::now()))
            .arg(self.batch)
            .arg(INDEX_PER_ROUND)
            .arg(DUE)
            .arg(RedisParking::MOVER_GROUP)
            .arg(MAX_DEAD_LETTER_VALUES);
        match self.max_len {
            Some(max_len) => invocation.arg(max_len),
            None => invocation.arg(""),
        };
        invocation.arg(&self.group);
        let mut connection = self.connection.get();
        // The connection's own response timeout does not cover waiting for
        // a reconnect; this bounds both.
        let reply = tokio::time::timeout(
            self.command_timeout,
            invocation.invoke_async::<Value>(&mut connection),
        )
        .await
        .unwrap_or_else(|_| Err(timed_out()));
        match reply {
            Ok(reply) => Round::parse(reply).ok_or_else(|| Error::UnexpectedReply {
                command: "EVALSHA",
                detail: "not the reply of the parking round script".to_owned(),
            }),
            Err(error) => {
                self.connection.replace_if_replica(&error).await;
                let keys = format!("{}, {}, {}", keys.returned, keys.parked, keys.due);
                Err(self
                    .connection
                    .connector()
                    .key_error(error, "EVALSHA", &keys))
            }
        }
    }
}

/// How long to wait after `round`, at most `wait`: not at all when it
/// reached a limit, otherwise until the earliest due time it left.
pub(super) fn pace(wait: Duration, round: &Round) -> Duration {
    if round.more {
        return Duration::ZERO;
    }
    match round.next_due {
        Some(due) => {
            let until = due.saturating_sub(unix_millis(SystemTime::now()));
            wait.min(Duration::from_millis(until))
        }
        None => wait,
    }
}

/// Logs what a round did that someone may look for.
pub(super) fn report(keys: &StreamKeys, round: &Round) {
    if round.moved > 0 || round.indexed > 0 || round.trimmed > 0 {
        tracing::debug!(
            stream = %keys.stream,
            return_stream = %keys.returned,
            indexed = round.indexed,
            moved = round.moved,
            trimmed = round.trimmed,
            "parked messages indexed and moved to the return stream; copies every group \
             acknowledged trimmed from it"
        );
    }
    if round.undated > 0 {
        tracing::warn!(
            stream = %keys.stream,
            parked_stream = %keys.parked,
            entries = round.undated,
            "parked entries without a valid due time (`{DUE}`) are moved back at once"
        );
    }
    if round.vanished > 0 {
        tracing::warn!(
            stream = %keys.stream,
            parked_stream = %keys.parked,
            entries = round.vanished,
            "due parked entries were no longer in the parking stream (deleted or trimmed); \
             dropped from the due index"
        );
    }
    if !round.left.is_empty() {
        tracing::error!(
            stream = %keys.stream,
            parked_stream = %keys.parked,
            ids = ?round.left,
            "parked entries have more fields than a script can move; left in the parking \
             stream and dropped from the due index: move them by hand"
        );
    }
}
