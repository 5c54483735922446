//! [`ReadSize`]: how many entries one read may ask for, so that its reply
//! stays within a share of the consumer's byte budget.
//!
//! Redis bounds a read (`XREADGROUP`, `XREAD`, `XCLAIM`) by a count of
//! entries, never by bytes, and the client holds a reply twice while it
//! parses it: the bytes read from the socket and the entries made of them
//! (the socket buffer keeps its capacity afterwards, too). A read sized by
//! the runtime's room alone (64 MiB of room, 1 MB entries: 64 entries)
//! therefore held twice the budget at its peak, measured with
//! `benches/memory_bound.rs`. So once the consumer told its byte budget
//! ([`Source::set_limits`](intake_core::backend::Source::set_limits)), one read asks
//! for at most as many entries as fit in an eighth of it at the average
//! size of the entries read before, and for one while no size is known.
//! Entries much larger than those before them can still make one read
//! larger than that share, as the runtime's own fetches can.

/// See the [module docs](self).
#[derive(Debug, Default)]
pub(super) struct ReadSize {
    /// Bytes one read may bring; `None` until the consumer tells its
    /// budget (a source driven by hand reads as many entries as asked).
    bytes_per_read: Option<usize>,
    /// A running average of the entries' sizes (0 until the first read).
    average: usize,
}

impl ReadSize {
    /// The share of the byte budget one read may bring: the reply's
    /// transient copy and the retained socket buffer then add about a
    /// quarter of the budget, where a read of the whole room added all of
    /// it. Reads of an eighth cost more round trips only for entries so
    /// large that a few fill the share (8 MiB of the default 64 MiB budget).
    const SHARE_OF_BUDGET: usize = 8;

    /// Takes the consumer's byte budget.
    pub(super) fn set_budget(&mut self, max_in_flight_bytes: usize) {
        self.bytes_per_read = Some((max_in_flight_bytes / Self::SHARE_OF_BUDGET).max(1));
    }

    /// How many entries the next read asks for when the runtime allows
    /// `max` (at least 1).
    pub(super) fn limit(&self, max: usize) -> usize {
        let Some(bytes) = self.bytes_per_read else {
            return max;
        };
        let fit = bytes.checked_div(self.average).unwrap_or(1);
        max.min(fit).max(1)
    }

    /// Learns the size of the entries a read brought: `bytes` over `count`.
    /// Half this read's average and half the earlier one, as the runtime's
    /// byte budget does, so a change of sizes is followed within a few
    /// reads.
    pub(super) fn observe(&mut self, bytes: usize, count: usize) {
        if count == 0 {
            return;
        }
        let read = (bytes / count).max(1);
        self.average = if self.average == 0 {
            read
        } else {
            (self.average + read).div_ceil(2)
        };
    }

    /// Whether reads are sized by bytes, so that their sizes must be
    /// learnt.
    pub(super) fn is_bounded(&self) -> bool {
        self.bytes_per_read.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_budget_a_read_asks_for_what_the_runtime_allows() {
        let mut size = ReadSize::default();
        size.observe(1_000_000, 1);
        assert_eq!(size.limit(500), 500);
    }

    #[test]
    fn a_read_asks_for_what_fits_in_an_eighth_of_the_budget() {
        let mut size = ReadSize::default();
        size.set_budget(64 << 20);
        assert_eq!(size.limit(64), 1, "no size known yet: learn one");
        size.observe(1_000_000, 1);
        assert_eq!(size.limit(64), 8, "8 MiB at 1 MB");
        assert_eq!(size.limit(3), 3, "never more than the runtime allows");
        size.observe(100, 1);
        size.observe(100, 1);
        size.observe(100, 1);
        assert!(size.limit(500) > 8, "smaller entries: more per read");
    }

    #[test]
    fn an_entry_larger_than_the_share_is_still_read_alone() {
        let mut size = ReadSize::default();
        size.set_budget(1_000);
        size.observe(10_000, 1);
        assert_eq!(size.limit(100), 1);
        size.set_budget(0);
        assert_eq!(size.limit(100), 1, "a zero budget still reads");
    }
}
