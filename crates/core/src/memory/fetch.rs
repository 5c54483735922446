//! Fetching a batch: which messages a member receives next, fairly across
//! its partitions, and with which delivery attempt.

use std::collections::{BTreeMap, BTreeSet};

use crate::message::Message;

/// A group's reading position in one partition.
#[derive(Debug, Default)]
pub(crate) struct Delivery {
    /// The owner's next offset to fetch.
    cursor: usize,
    /// Every offset below this was delivered to the group at least once.
    delivered_until: usize,
    /// Deliveries so far of offsets delivered more than once, kept only for
    /// offsets not yet committed: first deliveries cost nothing to count.
    redeliveries: BTreeMap<usize, u32>,
    /// Offsets this group never receives: copies parked by another group
    /// of the topic, given back to that group alone (as Kafka's return
    /// topic or Redis' return stream would). Empty unless another group
    /// parks, so the hot path checks one length.
    hidden: BTreeSet<usize>,
}

impl Delivery {
    /// Fetch from `offset` next (a new owner starts at the committed offset).
    pub(crate) fn rewind(&mut self, offset: usize) {
        self.cursor = offset;
    }

    /// Drops the delivery counts of committed offsets, which are never
    /// delivered again.
    pub(crate) fn forget_below(&mut self, committed: usize) {
        while let Some(entry) = self.redeliveries.first_entry() {
            if *entry.key() >= committed {
                break;
            }
            entry.remove();
        }
    }

    /// Hides `offset` from this group: a copy another group parked.
    pub(crate) fn hide(&mut self, offset: usize) {
        self.hidden.insert(offset);
    }

    /// The first offset from `offset` on (before `end`) this group sees:
    /// a commit or a lag count passes over the copies hidden from it.
    pub(crate) fn visible_from(&self, mut offset: usize, end: usize) -> usize {
        while offset < end && self.hidden.contains(&offset) {
            offset += 1;
        }
        offset
    }

    /// How many offsets in `from..end` are hidden from this group.
    pub(crate) fn hidden_between(&self, from: usize, end: usize) -> usize {
        if from >= end {
            return 0;
        }
        self.hidden.range(from..end).count()
    }

    /// Appends up to `limit` messages from the cursor, passing over the
    /// offsets hidden from this group; returns how many.
    #[inline]
    fn take(&mut self, log: &[Message], buf: &mut Vec<Message>, limit: usize) -> usize {
        if self.hidden.is_empty() {
            return self.take_run(log, buf, limit);
        }
        let mut taken = 0;
        while taken < limit {
            self.cursor = self.visible_from(self.cursor, log.len());
            // The run of visible messages up to the next hidden one.
            let end = self
                .hidden
                .range(self.cursor..)
                .next()
                .map_or(log.len(), |&hidden| hidden.min(log.len()));
            let run = self.take_run(&log[..end], buf, limit - taken);
            if run == 0 {
                break;
            }
            taken += run;
        }
        taken
    }

    /// Appends up to `limit` messages of `log` from the cursor; returns how
    /// many.
    #[inline]
    fn take_run(&mut self, log: &[Message], buf: &mut Vec<Message>, limit: usize) -> usize {
        let start = self.cursor;
        let Some(available) = log.len().checked_sub(start).filter(|&n| n > 0) else {
            return 0;
        };
        let end = start + available.min(limit);
        if self.delivered_until <= start {
            // The hot path: first deliveries only, plain clones (reference
            // count increments, no allocation). With many partitions a fetch
            // takes one message from each, so this path is per message.
            buf.extend_from_slice(&log[start..end]);
            self.cursor = end;
            self.delivered_until = end;
            return end - start;
        }
        let first_delivery = self.delivered_until.clamp(start, end);
        for (offset, message) in (start..first_delivery).zip(&log[start..first_delivery]) {
            let deliveries = self.redeliveries.entry(offset).or_insert(1);
            *deliveries = deliveries.saturating_add(1);
            let mut message = message.clone();
            message.metadata_mut().set_attempt(*deliveries);
            buf.push(message);
        }
        buf.extend_from_slice(&log[first_delivery..end]);
        self.cursor = end;
        self.delivered_until = self.delivered_until.max(end);
        end - start
    }

    fn has_more(&self, log: &[Message]) -> bool {
        self.visible_from(self.cursor, log.len()) < log.len()
    }
}

/// Appends at most `max` messages from the partitions in `owned` (indexes
/// into `deliveries` and `logs`) but not in `paused` to `buf`
/// and returns how many.
///
/// Each call starts at the next partition in turn (`first`), and no
/// partition takes more than an even share of `max` while another still has
/// messages, so a backlog on one partition never starves the others.
pub(crate) fn fetch(
    owned: &[u32],
    paused: &[u32],
    first: &mut usize,
    deliveries: &mut [Delivery],
    logs: &[Vec<Message>],
    buf: &mut Vec<Message>,
    max: usize,
) -> usize {
    let count = owned.len();
    if count == 0 || max == 0 {
        return 0;
    }
    let start = *first % count;
    *first = (start + 1) % count;
    let share = max.div_ceil(count);
    let mut remaining = max;
    let mut more = false;
    for turn in 0..count {
        if remaining == 0 {
            break;
        }
        let partition = owned[(start + turn) % count];
        if paused.contains(&partition) {
            continue;
        }
        let partition = partition as usize;
        let (state, log) = (&mut deliveries[partition], &logs[partition]);
        remaining -= state.take(log, buf, share.min(remaining));
        more |= state.has_more(log);
    }
    if more {
        // Some partitions had less than their share: the rest of the batch
        // goes to those that have more, in the same order.
        for turn in 0..count {
            if remaining == 0 {
                break;
            }
            let partition = owned[(start + turn) % count];
            if paused.contains(&partition) {
                continue;
            }
            let partition = partition as usize;
            remaining -= deliveries[partition].take(&logs[partition], buf, remaining);
        }
    }
    max - remaining
}
