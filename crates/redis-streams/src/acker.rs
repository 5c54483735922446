//! [`RedisStreamsAcker`]: completed entries leave the pending list by `XACK`,
//! many ids per command, every stream of a batch in one pipelined round trip.
//!
//! One awaited `XACK` per message is about 18 times slower than one per
//! batch on this project's measurements, so the acker never does that: the
//! runtime hands it whatever completed since the last batch, and while the
//! round trip is under way the next batch grows.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use redis::Value;

use crate::connection::SharedConnection;
use crate::held::HeldEntries;
use crate::source::settings::Settings;
use crate::stream_id::StreamId;
use intake_core::backend::{AckBatch, AckError, AckMode, Acker};

/// Acknowledges entries of a consumer group (`XACK`), or nothing at all for a
/// broadcast reader.
///
/// A retry-later outcome (the runtime's requeue) sends nothing: the entry
/// stays pending and is claimed again after `claim_min_idle`, with Redis
/// counting the delivery.
pub struct RedisStreamsAcker {
    group: Option<GroupAcker>,
}

struct GroupAcker {
    connection: SharedConnection,
    settings: Arc<Settings>,
    held: Arc<HeldEntries>,
    /// Whether a refused deletion (another group reads a stream) was
    /// logged, so that it is logged once.
    refusal_logged: AtomicBool,
}

/// `delete_acked`'s deletion: `KEYS[1]` the stream; `ARGV` the ids. Deletes
/// them only while the stream has no consumer group but one (this group's,
/// which just acknowledged them): another group may not have read them.
/// Returns how many it deleted, or -1 when another group reads the stream.
/// Sent as `EVAL` in the acknowledgement's pipeline: the text is short, and
/// a pipeline cannot fall back from `EVALSHA` to `EVAL` by itself.
const DELETE_IF_SOLE_GROUP: &str = r"
if #redis.call('XINFO', 'GROUPS', KEYS[1]) > 1 then
  return -1
end
return redis.call('XDEL', KEYS[1], unpack(ARGV))
";

impl std::fmt::Debug for RedisStreamsAcker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.group {
            Some(group) => f
                .debug_struct("RedisStreamsAcker")
                .field("endpoint", group.connection.connector().endpoint())
                .field("group", &group.settings.group)
                .finish(),
            None => f.write_str("RedisStreamsAcker(broadcast)"),
        }
    }
}

impl RedisStreamsAcker {
    pub(crate) fn new(
        connection: SharedConnection,
        settings: Arc<Settings>,
        held: Arc<HeldEntries>,
    ) -> Self {
        let group = settings.group.is_some().then(|| GroupAcker {
            connection,
            settings,
            held,
            refusal_logged: AtomicBool::new(false),
        });
        Self { group }
    }
}

impl Acker for RedisStreamsAcker {
    fn mode(&self) -> AckMode {
        if self.group.is_some() {
            AckMode::Ids
        } else {
            AckMode::Watermark
        }
    }

    fn supports_requeue(&self) -> bool {
        // A group entry that is not acknowledged stays pending and comes back
        // by claim; a broadcast reader has no such thing, so the runtime
        // retries in process.
        self.group.is_some()
    }

    async fn ack(&mut self, batch: &AckBatch) -> Result<(), AckError> {
        match &mut self.group {
            Some(group) => group.ack(batch).await,
            None => Ok(()),
        }
    }
}

impl GroupAcker {
    async fn ack(&mut self, batch: &AckBatch) -> Result<(), AckError> {
        let Some(group) = self.settings.group.clone() else {
            return Ok(());
        };
        let mut pipe = redis::pipe();
        let mut acknowledged = 0_usize;
        for ack in &batch.partitions {
            // Left pending for a later claim: from now on a claim candidate.
            self.held.give_back(
                &ack.partition.source,
                ack.requeue
                    .iter()
                    .filter_map(|&position| StreamId::from_position(position)),
            );
            let ids = || {
                ack.completed
                    .iter()
                    .filter_map(|&position| StreamId::from_position(position))
            };
            let count = ids().count();
            if count < ack.completed.len() {
                tracing::error!(
                    partition = %ack.partition,
                    skipped = ack.completed.len() - count,
                    "positions that are not stream entry ids cannot be acknowledged"
                );
            }
            if count == 0 {
                continue;
            }
            acknowledged += count;
            // `Pipeline::arg` appends to the command just started, so the ids
            // go straight into its buffer.
            pipe.cmd("XACK").arg(&*ack.partition.source).arg(&*group);
            for id in ids() {
                pipe.arg(id);
            }
            pipe.ignore();
            if self.settings.delete_acked {
                // Deleted only while no other group reads the stream; the
                // answer is looked at below.
                pipe.cmd("EVAL")
                    .arg(DELETE_IF_SOLE_GROUP)
                    .arg(1)
                    .arg(&*ack.partition.source);
                for id in ids() {
                    pipe.arg(id);
                }
            }
        }
        if acknowledged == 0 {
            return Ok(());
        }
        let requeued: usize = batch.partitions.iter().map(|ack| ack.requeue.len()).sum();
        if requeued > 0 {
            tracing::debug!(requeued, "entries left pending for a later claim");
        }
        let mut connection = self.connection.get();
        let mut sent = pipe.query_async::<Vec<Value>>(&mut connection).await;
        let retry = match &sent {
            Ok(_) => false,
            // The shared connection reconnects after a failure by itself.
            Err(error) if error.is_connection_dropped() || error.is_io_error() => true,
            Err(error) => self.connection.replace_if_replica(error).await,
        };
        if retry {
            // XACK is idempotent, so one immediate retry spares a wait for
            // the next batch (and a redelivery, if there is none).
            let mut connection = self.connection.get();
            sent = pipe.query_async::<Vec<Value>>(&mut connection).await;
        }
        if let Ok(deletions) = &sent
            && deletions.contains(&Value::Int(-1))
            && !self.refusal_logged.swap(true, Ordering::Relaxed)
        {
            tracing::error!(
                group = %group,
                streams = %self.settings.stream_list(),
                "delete_acked deletes nothing: another consumer group reads the stream, and \
                 would lose the entries it has not read; acknowledged entries stay (turn \
                 delete_acked off, or trim on the producer side)"
            );
        }
        if sent.is_ok() {
            for ack in &batch.partitions {
                self.held.release(
                    &ack.partition.source,
                    ack.completed
                        .iter()
                        .filter_map(|&position| StreamId::from_position(position)),
                );
            }
        }
        sent.map(drop).map_err(|error| {
            let error = self.connection.connector().error(error, "XACK");
            // The runtime gives the work back and sends it with the next
            // batch; until then the entries stay pending, never lost.
            tracing::warn!(%error, "acknowledgement failed");
            error.into()
        })
    }
}
