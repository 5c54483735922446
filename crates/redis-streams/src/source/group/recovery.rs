//! The group reader's recovery of pending entries: its own (from an
//! earlier run, or that never reached the source), and those claimed from
//! consumers that stopped refreshing them; see the parent module's docs.

use redis::Value;

use crate::error::Error;
use crate::source::convert::{RawEntry, Skipped, parse_entries, parse_pending, parse_read_reply};
use crate::stream_id::{After, StreamId};

use super::waiting::Clearance;
use super::{GroupReader, millis};

impl GroupReader {
    /// Re-reads this consumer's pending entries after the newest decoded id
    /// of one stream, with their delivery counts.
    pub(super) async fn read_own_pending(&mut self, index: usize, max: usize) -> Result<(), Error> {
        if self.streams[index].recovered {
            return self.read_own_pending_uncounted(index, max).await;
        }
        let stream = &self.streams[index];
        let name = stream.name.clone();
        let mut pipe = redis::pipe();
        let pending = pipe.cmd("XPENDING").arg(&*name).arg(&*self.group);
        match stream.decoded {
            Some(id) => pending.arg(After(id)),
            None => pending.arg("-"),
        };
        pending.arg("+").arg(max).arg(&*self.settings.consumer);
        pipe.cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&*self.group)
            .arg(&*self.settings.consumer)
            .arg("COUNT")
            .arg(max)
            .arg("STREAMS")
            .arg(&*name)
            .arg(stream.decoded.unwrap_or(StreamId::ZERO));
        let connector = self.connection.connector().clone();
        let (connection, _) = self.connection.get().await?;
        let (pending, read): (Value, Value) = pipe
            .query_async(connection)
            .await
            .map_err(|error| connector.key_error(error, "XREADGROUP", &name))?;
        self.pending.clear();
        parse_pending(pending, &mut self.pending)?;
        self.raw.clear();
        let mut malformed = 0;
        parse_read_reply(read, "XREADGROUP", |_, entries| {
            malformed += parse_entries(entries, "XREADGROUP", &mut self.raw)?.malformed;
            Ok(())
        })?;
        self.settings.counters.add_malformed(malformed);
        if self.raw.is_empty() {
            let stream = &mut self.streams[index];
            stream.resync = false;
            stream.recovered = true;
            return Ok(());
        }
        tracing::info!(
            stream = %name,
            entries = self.raw.len(),
            "re-reading entries still pending for this consumer"
        );
        // The counts were taken just before the read, which adds one.
        self.stage(index, 1, Clearance::Look).await
    }

    /// Re-reads, by id and without adding a delivery, the pending entries of
    /// one stream that were delivered to this process (`XREADGROUP` would
    /// count each re-read as one) but never reached it: their reply was
    /// lost with a dropped call or connection.
    pub(super) async fn read_own_pending_uncounted(
        &mut self,
        index: usize,
        max: usize,
    ) -> Result<(), Error> {
        let name = self.streams[index].name.clone();
        let mut command = redis::cmd("XPENDING");
        command.arg(&*name).arg(&*self.group);
        match self.streams[index].decoded {
            Some(id) => command.arg(After(id)),
            None => command.arg("-"),
        };
        command.arg("+").arg(max).arg(&*self.settings.consumer);
        let connector = self.connection.connector().clone();
        let (connection, _) = self.connection.get().await?;
        let pending: Value = command
            .query_async(connection)
            .await
            .map_err(|error| connector.key_error(error, "XPENDING", &name))?;
        self.pending.clear();
        parse_pending(pending, &mut self.pending)?;
        if self.pending.is_empty() {
            self.streams[index].resync = false;
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for entry in &self.pending {
            pipe.cmd("XRANGE").arg(&*name).arg(entry.id).arg(entry.id);
        }
        let (connection, _) = self.connection.get().await?;
        let ranges: Vec<Value> = pipe
            .query_async(connection)
            .await
            .map_err(|error| connector.key_error(error, "XRANGE", &name))?;
        self.raw.clear();
        let mut malformed = 0;
        for (entry, range) in self.pending.iter().zip(ranges) {
            let before = self.raw.len();
            let skipped = parse_entries(range, "XRANGE", &mut self.raw)?;
            malformed += skipped.malformed;
            // Only a clean empty answer means the entry was trimmed or
            // deleted while pending (and is acknowledged as such); one that
            // could not be read leaves it pending, for a claim.
            if self.raw.len() == before && skipped == Skipped::default() {
                self.raw.push(RawEntry {
                    id: entry.id,
                    fields: None,
                });
            }
        }
        self.settings.counters.add_malformed(malformed);
        tracing::info!(
            stream = %name,
            entries = self.raw.len(),
            "re-reading entries delivered to this consumer whose reply was lost"
        );
        // Nothing was delivered again: the counts stand as they are.
        self.stage(index, 0, Clearance::Look).await
    }

    /// Claims entries pending longer than `claim_min_idle` with any
    /// consumer; returns how many ids were claimed.
    pub(super) async fn claim(&mut self, max: usize) -> Result<usize, Error> {
        let min_idle = millis(self.settings.claim_min_idle);
        let mut pipe = redis::pipe();
        for (index, stream) in self.streams.iter().enumerate() {
            // Held entries are left out below; asking for as many more keeps
            // them from crowding out entries that may be claimed.
            let count = max.saturating_add(self.held.count(index));
            pipe.cmd("XPENDING")
                .arg(&*stream.name)
                .arg(&*self.group)
                .arg("IDLE")
                .arg(min_idle)
                .arg("-")
                .arg("+")
                .arg(count);
        }
        let connector = self.connection.connector().clone();
        let (connection, _) = self.connection.get().await?;
        let rows: Vec<Value> = pipe.query_async(connection).await.map_err(|error| {
            connector.key_error(error, "XPENDING", &self.settings.stream_list())
        })?;
        let mut budget = max;
        let mut claimed = 0;
        for (index, rows) in rows.into_iter().enumerate() {
            if budget == 0 {
                break;
            }
            self.pending.clear();
            parse_pending(rows, &mut self.pending)?;
            // Entries this consumer holds (queued or running) look idle to
            // Redis; claiming them would run them a second time.
            self.held
                .retain_unheld(index, &mut self.pending, |pending| pending.id);
            if self.pending.is_empty() {
                continue;
            }
            self.pending.truncate(budget);
            budget -= self.pending.len();
            claimed += self.pending.len();
            let name = self.streams[index].name.clone();
            let mut command = redis::cmd("XCLAIM");
            command
                .arg(&*name)
                .arg(&*self.group)
                .arg(&*self.settings.consumer)
                .arg(min_idle);
            for entry in &self.pending {
                command.arg(entry.id);
            }
            let (connection, _) = self.connection.get().await?;
            let reply: Value = command
                .query_async(connection)
                .await
                .map_err(|error| connector.key_error(error, "XCLAIM", &name))?;
            self.raw.clear();
            let skipped = parse_entries(reply, "XCLAIM", &mut self.raw)?;
            self.settings.counters.add_malformed(skipped.malformed);
            if skipped.vanished > 0 {
                self.acknowledge_vanished_claims(index).await?;
            }
            if !self.raw.is_empty() {
                tracing::info!(
                    stream = %name,
                    entries = self.raw.len(),
                    "claimed entries idle longer than claim_min_idle"
                );
            }
            // XCLAIM adds one to the counts XPENDING reported.
            self.stage(index, 1, Clearance::Look).await?;
        }
        Ok(claimed)
    }

    /// Acknowledges the entries of the last `XCLAIM` (ids in
    /// `self.pending`, entries returned in `self.raw`) that were deleted
    /// from stream `index` while pending.
    ///
    /// Before Redis 7.0, `XCLAIM` answers nil for such an entry and keeps it
    /// pending, now with this consumer, so every later claim (by any name)
    /// would meet it again. The nil does not say which id it stands for,
    /// and an id missing from the reply may also have been claimed by
    /// another consumer in between, so only the ids that are no longer in
    /// the stream are acknowledged: nobody can handle those any more.
    pub(super) async fn acknowledge_vanished_claims(&mut self, index: usize) -> Result<(), Error> {
        let mut returned: Vec<StreamId> = self.raw.iter().map(|entry| entry.id).collect();
        returned.sort_unstable();
        self.deleted.clear();
        self.deleted.extend(
            self.pending
                .iter()
                .map(|pending| pending.id)
                .filter(|id| returned.binary_search(id).is_err()),
        );
        if self.deleted.is_empty() {
            return Ok(());
        }
        let name = self.streams[index].name.clone();
        let mut pipe = redis::pipe();
        for id in &self.deleted {
            pipe.cmd("XRANGE").arg(&*name).arg(*id).arg(*id);
        }
        let connector = self.connection.connector().clone();
        let (connection, _) = self.connection.get().await?;
        let found: Vec<Value> = pipe
            .query_async(connection)
            .await
            .map_err(|error| connector.key_error(error, "XRANGE", &name))?;
        let mut present = found.into_iter().map(|range| {
            let mut entries = Vec::new();
            match parse_entries(range, "XRANGE", &mut entries) {
                Ok(skipped) => !entries.is_empty() || skipped != Skipped::default(),
                // An unreadable answer counts as present: acknowledging an
                // entry that still exists could lose it.
                Err(_) => true,
            }
        });
        self.deleted.retain(|_| !present.next().unwrap_or(true));
        self.acknowledge_deleted(index).await
    }

    /// Acknowledges the ids in `self.deleted`: entries of stream `index`
    /// deleted from the stream while pending. Nothing is left to handle, so
    /// the pending entry is only clutter (and would be met again by every
    /// claim).
    pub(super) async fn acknowledge_deleted(&mut self, index: usize) -> Result<(), Error> {
        if self.deleted.is_empty() {
            return Ok(());
        }
        let name = self.streams[index].name.clone();
        tracing::info!(
            stream = %name,
            entries = self.deleted.len(),
            "acknowledging entries deleted or trimmed from the stream while pending"
        );
        let mut command = redis::cmd("XACK");
        command.arg(&*name).arg(&*self.group);
        for id in &self.deleted {
            command.arg(*id);
        }
        let connector = self.connection.connector().clone();
        let (connection, _) = self.connection.get().await?;
        command
            .query_async::<()>(connection)
            .await
            .map_err(|error| connector.key_error(error, "XACK", &name))?;
        self.settings.counters.add_vanished(self.deleted.len());
        self.deleted.clear();
        Ok(())
    }
}
