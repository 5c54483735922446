//! Reading as a member of a consumer group: own pending entries, claimed
//! entries, then new entries; under key order (`key_order.rs`), an entry
//! with a key waits while an older entry of its key is in other hands.
//!
//! The parts: `recovery.rs` (own pending entries and claims), `setup.rs`
//! (creating the group, at the start and again where it vanished) and
//! `waiting.rs` (the entries that wait for an older entry of their key).
//!
//! # Claiming
//!
//! Entries pending longer than `claim_min_idle` with any consumer are
//! claimed with `XPENDING … IDLE` followed by `XCLAIM` with the same minimum
//! idle time, rather than with `XAUTOCLAIM`: the decision to dead-letter
//! needs each entry's delivery count, which `XPENDING` reports and
//! `XAUTOCLAIM` does not. `XCLAIM` re-checks the idle time atomically, so
//! an entry another consumer claimed in between is skipped, and (since
//! Redis 7.0) it drops entries deleted from the stream from the pending
//! list, as `XAUTOCLAIM` does. `XREADGROUP … CLAIM` (Redis 8.4) would merge
//! this into the read; it is not used yet.
//!
//! # Dead-lettering by delivery count
//!
//! The check lives here, before dispatch: an entry whose delivery count
//! passes `max_deliveries` is written to the dead-letter stream and
//! acknowledged in one atomic step, and never reaches the handler. Only
//! re-deliveries (own pending entries and claims) can pass the limit, so
//! the check costs nothing on the path of new entries, and it also catches
//! entries whose handler never finished at all (a crash loop), which no
//! handler-side layer could see.

mod recovery;
mod setup;
mod waiting;

use std::sync::Arc;
use std::time::Duration;

use intake_core::{DeadLetter, ErrorClass, Message};
use redis::Value;
use tokio::time::Instant;

pub(super) use self::setup::{create_groups, refuse_shared_streams};
use self::waiting::Clearance;
use super::blocking_connection::BlockingConnection;
use super::convert::{
    Decoded, EntryDecoder, PendingEntry, RawEntry, parse_entries, split_read_reply,
};
use super::key_order::{self, KeyOrder};
use super::staging::{OnFailure, Poison, Staging};
use crate::dead_letter::RedisDeadLetterSink;
use crate::error::Error;
use crate::held::HeldEntries;
use crate::source::settings::Settings;
use crate::stream_id::StreamId;

/// Deletes this consumer from the group if it has no pending entries. Atomic,
/// so a pending entry can never be dropped with its consumer.
static DELETE_IDLE_CONSUMER: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        r"
if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2]) == 0 then
  return redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
end
return -1
",
    )
});

struct GroupStream {
    name: intake_core::SourceName,
    /// The newest id decoded from this stream: every pending entry of this
    /// consumer after it has not reached the source.
    decoded: Option<StreamId>,
    /// Whether this consumer's pending entries after `decoded` must be read
    /// before new ones (at start, after a lost connection, after a dropped
    /// call).
    resync: bool,
    /// Whether the pending entries an earlier process left to this consumer
    /// were all read. Until then a re-read counts as a delivery (a handler
    /// there may have seen them, and a poison entry must not crash-loop
    /// with its count standing still); after, every entry a re-read finds
    /// was delivered to this process and never reached it, so re-reads
    /// leave the counts alone: calls dropped one after another must not
    /// push an entry no handler saw past `max_deliveries`.
    recovered: bool,
}

pub(super) struct GroupReader {
    settings: Arc<Settings>,
    group: Arc<str>,
    connection: BlockingConnection,
    streams: Vec<GroupStream>,
    decoder: EntryDecoder,
    sink: RedisDeadLetterSink,
    staging: Staging,
    held: Arc<HeldEntries>,
    next_claim: Instant,
    /// Times the group vanished in a row (each within
    /// [`LOST_GROUP_MEMORY`] of the one before), and when it last did.
    lost_groups: u32,
    last_lost_group: Option<Instant>,
    /// Entries that wait for an older entry of their key; `None` when the
    /// source keeps no key order (no key field, or turned off).
    key_order: Option<KeyOrder>,
    // Scratch space reused across calls.
    raw: Vec<RawEntry>,
    candidates: Vec<Message>,
    given_back: Vec<StreamId>,
    /// Per stream, whether the last read's summary showed entries pending
    /// with another consumer.
    others_pending: Vec<bool>,
    pending: Vec<PendingEntry>,
    replies: Vec<(usize, Value)>,
    deleted: Vec<StreamId>,
    staged: Vec<StreamId>,
}

impl GroupReader {
    pub(super) fn new(
        settings: Arc<Settings>,
        connection: BlockingConnection,
        sink: RedisDeadLetterSink,
        held: Arc<HeldEntries>,
    ) -> Self {
        let streams = settings
            .streams
            .iter()
            .map(|name| GroupStream {
                name: name.clone(),
                decoded: None,
                resync: true,
                recovered: false,
            })
            .collect();
        Self {
            group: settings.group.clone().unwrap_or_else(|| Arc::from("")),
            decoder: EntryDecoder::new(settings.payload_field.clone(), settings.key_field.clone()),
            connection,
            streams,
            sink,
            staging: Staging::default(),
            held,
            next_claim: Instant::now(),
            lost_groups: 0,
            last_lost_group: None,
            key_order: (settings.key_order && settings.key_field.is_some())
                .then(|| KeyOrder::new(settings.streams.len())),
            raw: Vec::new(),
            candidates: Vec::new(),
            given_back: Vec::new(),
            others_pending: Vec::new(),
            pending: Vec::new(),
            replies: Vec::new(),
            deleted: Vec::new(),
            staged: Vec::new(),
            settings,
        }
    }

    /// At most `max_in_flight` entries wait for an older entry of their
    /// key at once; none do for a consumer that runs unordered (`keeps_order`
    /// false), which would pay the waits for an order it does not keep.
    pub(super) fn set_limits(&mut self, max_in_flight: usize, keeps_order: bool) {
        if !keeps_order {
            self.key_order = None;
        }
        if let Some(key_order) = &mut self.key_order {
            key_order.set_cap(max_in_flight);
        }
    }

    pub(super) async fn next(
        &mut self,
        deliveries: &mut Vec<Message>,
        max: usize,
    ) -> Result<(), Error> {
        if self.connection.begin_call() {
            self.resync_all();
        }
        let result = self.fill(deliveries, max).await;
        self.connection.end_call();
        result
    }

    fn resync_all(&mut self) {
        for stream in &mut self.streams {
            stream.resync = true;
        }
    }

    async fn fill(&mut self, deliveries: &mut Vec<Message>, max: usize) -> Result<(), Error> {
        loop {
            // A failed write leaves its entry pending, for a claim.
            let _ = self
                .staging
                .dead_letter(&self.sink, OnFailure::LeavePending)
                .await;
            if self.staging.hand_out(deliveries, max) {
                return Ok(());
            }
            let reopened = match self.connection.get().await {
                Ok((_, reopened)) => reopened,
                Err(error) => return Err(error),
            };
            if reopened {
                self.resync_all();
            }
            match self.step(max).await {
                Ok(()) => self.connection.succeeded(),
                Err(error) if error.is_missing_group() => {
                    self.create_group_again(error).await?;
                }
                Err(error) if error.is_transient() => {
                    self.connection.drop_connection();
                    self.connection.back_off(error).await?;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// One round of reading: own pending entries if they need a re-read,
    /// else claims if due, else a blocking read of new entries.
    async fn step(&mut self, max: usize) -> Result<(), Error> {
        if let Some(index) = self.streams.iter().position(|stream| stream.resync) {
            return self.read_own_pending(index, max).await;
        }
        if Instant::now() >= self.next_claim {
            let claimed = self.claim(max).await?;
            self.next_claim = if claimed >= max {
                // A full batch: more may be waiting.
                Instant::now()
            } else {
                Instant::now() + self.settings.claim_interval
            };
            if claimed > 0 {
                return Ok(());
            }
        }
        let mut block = self.settings.block;
        if let Some(key_order) = &self.key_order
            && key_order.any_waiting()
        {
            if key_order.check_due() {
                let released = self.release_waiting_all().await?;
                if released > 0 {
                    return Ok(());
                }
            }
            let Some(key_order) = &self.key_order else {
                return Ok(());
            };
            if key_order.is_full() {
                // No more is read while this many wait: they are looked at
                // again shortly, and claims go on meanwhile.
                let wait = key_order
                    .until_check()
                    .min(self.next_claim.saturating_duration_since(Instant::now()));
                tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
                return Ok(());
            }
            // A read must not sleep past the next look at those waiting.
            block = block.min(key_order.until_check().max(Duration::from_millis(1)));
        }
        self.read_new(max, block).await
    }

    /// A blocking read of new entries of every stream, for at most `block`.
    async fn read_new(&mut self, max: usize, block: Duration) -> Result<(), Error> {
        // Redis applies COUNT per stream; splitting it keeps one read near
        // `max` in total. Any excess waits in the staging queue.
        let count = (max / self.streams.len()).max(1);
        let mut command = redis::cmd("XREADGROUP");
        command
            .arg("GROUP")
            .arg(&*self.group)
            .arg(&*self.settings.consumer)
            .arg("COUNT")
            .arg(count)
            .arg("BLOCK")
            .arg(millis(block))
            .arg("STREAMS");
        for stream in &self.streams {
            command.arg(&*stream.name);
        }
        for _ in &self.streams {
            command.arg(">");
        }
        let connector = self.connection.connector().clone();
        let (connection, _) = self.connection.get().await?;
        let reply: Value = if self.key_order.is_some() {
            // Who else has entries pending, right after the read and in the
            // same round trip: a single consumer learns here that none of
            // its new entries can wait for an older one of its key.
            let mut pipe = redis::pipe();
            pipe.add_command(command);
            for stream in &self.streams {
                pipe.cmd("XPENDING").arg(&*stream.name).arg(&*self.group);
            }
            let mut replies: Vec<Value> = pipe.query_async(connection).await.map_err(|error| {
                connector.key_error(error, "XREADGROUP", &self.settings.stream_list())
            })?;
            self.others_pending.clear();
            self.others_pending.extend(
                replies
                    .iter()
                    .skip(1)
                    .map(|summary| key_order::others_pending(summary, &self.settings.consumer)),
            );
            if replies.is_empty() {
                Value::Nil
            } else {
                replies.swap_remove(0)
            }
        } else {
            command.query_async(connection).await.map_err(|error| {
                connector.key_error(error, "XREADGROUP", &self.settings.stream_list())
            })?
        };
        self.replies.clear();
        let streams = &self.streams;
        split_read_reply(
            reply,
            "XREADGROUP",
            |key| {
                streams
                    .iter()
                    .position(|stream| stream.name.as_bytes() == key)
            },
            &mut self.replies,
        )?;
        let mut replies = std::mem::take(&mut self.replies);
        for (index, entries) in replies.drain(..) {
            self.raw.clear();
            self.pending.clear();
            let skipped = parse_entries(entries, "XREADGROUP", &mut self.raw)?;
            self.settings.counters.add_malformed(skipped.malformed);
            let clearance = if self.others_pending.get(index).copied().unwrap_or(true)
                || self.held.has_given_back(index)
            {
                Clearance::Look
            } else {
                Clearance::Clear
            };
            self.stage(index, 1, clearance).await?;
        }
        self.replies = replies;
        Ok(())
    }

    /// Decodes `self.raw` (entries of stream `index`) into the staging
    /// queue. An entry's attempt is its count in `self.pending` (sorted by
    /// id) plus `added`, or 1 for an entry not listed there (a new one).
    /// Under key order, an entry with a key goes through the waiting
    /// entries unless `clearance` says nothing can hold it back.
    async fn stage(&mut self, index: usize, added: u64, clearance: Clearance) -> Result<(), Error> {
        let stream = &mut self.streams[index];
        let mut newest = stream.decoded;
        self.deleted.clear();
        self.staged.clear();
        for entry in self.raw.drain(..) {
            newest = newest.max(Some(entry.id));
            let Some(fields) = entry.fields else {
                self.deleted.push(entry.id);
                continue;
            };
            let attempt = self
                .pending
                .binary_search_by_key(&entry.id, |pending| pending.id)
                .ok()
                .map_or(1, |found| {
                    self.pending[found].deliveries.saturating_add(added)
                });
            let attempt = u32::try_from(attempt).unwrap_or(u32::MAX);
            match self.decoder.decode(&stream.name, entry.id, fields, attempt) {
                Decoded::Message(message) => match self.settings.max_deliveries {
                    Some(limit) if attempt > limit => self.staging.poison.push_back(Poison {
                        letter: DeadLetter::new(
                            message,
                            format!(
                                "delivered {} times without being acknowledged \
                                 (max_deliveries = {limit})",
                                attempt - 1
                            ),
                            attempt - 1,
                        )
                        // Its attempts are used up, whatever failed them.
                        .with_class(ErrorClass::Retryable),
                        with_payload: true,
                    }),
                    _ => {
                        self.staged.push(entry.id);
                        if self.key_order.is_some() && message.key().is_some() {
                            self.candidates.push(message);
                        } else {
                            self.staging.ready.push_back(message);
                        }
                    }
                },
                Decoded::MissingPayload(message) => self.staging.poison.push_back(Poison {
                    letter: DeadLetter::new(
                        message,
                        format!(
                            "the entry has no `{}` field; set `payload_field` to the field \
                             that holds the payload",
                            self.settings.payload_field
                        ),
                        attempt - 1,
                    ),
                    with_payload: false,
                }),
            }
        }
        // From here on these entries count as received: a re-read after a
        // dropped call starts after them (see the module docs of `source`).
        stream.decoded = newest;
        self.held.hold(index, &self.staged);
        if !self.candidates.is_empty()
            && let Some(key_order) = &mut self.key_order
        {
            if clearance == Clearance::Clear && !key_order.is_waiting(index) {
                self.staging.ready.extend(self.candidates.drain(..));
            } else {
                key_order.add(index, self.candidates.drain(..));
            }
        }
        self.acknowledge_deleted(index).await?;
        if self
            .key_order
            .as_ref()
            .is_some_and(|key_order| key_order.is_waiting(index) && key_order.check_due())
        {
            self.release_waiting(index).await?;
        }
        Ok(())
    }

    /// Leaves the group if nothing is pending for this consumer, so that
    /// consumers with generated names do not pile up in `XINFO CONSUMERS`.
    pub(super) async fn close(&mut self) -> Result<(), Error> {
        // If the runtime dropped a blocking read to stop, the server would
        // answer the commands below only after that block ran out: begin on
        // a fresh connection then.
        self.connection.begin_call();
        // Leaving the group is tidying up, and the process is waiting to
        // stop: one attempt within the connect and command timeouts, never
        // the reconnect policy (retry forever by default), which would hang
        // a shutdown during an outage.
        self.connection.stop_retrying();
        let result = self.delete_if_idle().await;
        self.connection.end_call();
        result
    }

    async fn delete_if_idle(&mut self) -> Result<(), Error> {
        let connector = self.connection.connector().clone();
        let (connection, _) = self.connection.get().await?;
        for stream in &self.streams {
            let deleted: Result<i64, _> = DELETE_IDLE_CONSUMER
                .key(&*stream.name)
                .arg(&*self.group)
                .arg(&*self.settings.consumer)
                .invoke_async(connection)
                .await;
            match deleted {
                Ok(-1) => tracing::debug!(
                    stream = %stream.name,
                    "entries still pending for this consumer; it stays in the group"
                ),
                Ok(_) => {}
                Err(error) => {
                    let error = connector.key_error(error, "XGROUP DELCONSUMER", &stream.name);
                    if error.is_transient() {
                        // The server is unreachable: the other streams
                        // would wait out the same timeout each.
                        return Err(error);
                    }
                    tracing::warn!(%error, "could not remove the consumer from its group");
                }
            }
        }
        Ok(())
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
