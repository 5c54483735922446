//! Which delivery tag a `basic.ack(multiple)` may name.
//!
//! RabbitMQ closes the channel (`PRECONDITION_FAILED - unknown delivery tag`)
//! when an ack names a tag that is no longer outstanding, even with
//! `multiple=true`. Tags settled one by one (`basic.reject` for a retry, or
//! into a broker-side dead-letter exchange) are exactly such tags, and the
//! commit engine's watermark may stop on one, because for the watermark a
//! requeued message counts as done. The ledger remembers the tags settled
//! individually above the last acknowledged one, so the acker can name the
//! highest tag at or below the watermark that is still outstanding.
//!
//! This relies on RabbitMQ numbering the deliveries of a channel 1, 2, 3, …
//! without gaps, which holds on a channel with a single consumer and no
//! `basic.get`: the only way intake uses a channel.

use std::collections::BTreeSet;

/// Per-channel record of acknowledged and individually settled tags.
#[derive(Debug, Default)]
pub(crate) struct TagLedger {
    /// Every tag up to and including this one is settled.
    acked_through: u64,
    /// Tags above `acked_through` settled individually.
    settled: BTreeSet<u64>,
}

impl TagLedger {
    /// Records that `tag` was (or is about to be) settled on its own, by a
    /// reject or a nack.
    pub(crate) fn settle(&mut self, tag: u64) {
        if tag > self.acked_through {
            self.settled.insert(tag);
        }
    }

    /// Moves the ledger to `watermark` (every tag up to it is done) and
    /// returns the tag that `basic.ack(multiple=true)` should name, or `None`
    /// when every tag up to the watermark was already settled.
    pub(crate) fn advance(&mut self, watermark: u64) -> Option<u64> {
        if watermark <= self.acked_through {
            return None;
        }
        let mut candidate = watermark;
        while candidate > self.acked_through && self.settled.contains(&candidate) {
            candidate -= 1;
        }
        let ack = (candidate > self.acked_through).then_some(candidate);
        self.acked_through = watermark;
        self.settled = self.settled.split_off(&(watermark + 1));
        ack
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_watermark_is_acknowledged_as_is() {
        let mut ledger = TagLedger::default();
        assert_eq!(ledger.advance(10), Some(10));
        assert_eq!(ledger.advance(25), Some(25));
    }

    #[test]
    fn the_ack_steps_below_tags_that_were_rejected() {
        let mut ledger = TagLedger::default();
        ledger.settle(9);
        ledger.settle(10);
        assert_eq!(ledger.advance(10), Some(8));
    }

    #[test]
    fn a_rejection_remembered_from_an_earlier_batch_still_counts() {
        let mut ledger = TagLedger::default();
        ledger.settle(5);
        assert_eq!(ledger.advance(3), Some(3));
        assert_eq!(ledger.advance(5), Some(4));
    }

    #[test]
    fn nothing_is_acknowledged_when_every_tag_was_settled() {
        let mut ledger = TagLedger::default();
        assert_eq!(ledger.advance(4), Some(4));
        ledger.settle(5);
        ledger.settle(6);
        assert_eq!(ledger.advance(6), None);
        assert_eq!(ledger.advance(7), Some(7));
    }

    #[test]
    fn a_watermark_that_does_not_move_sends_nothing() {
        let mut ledger = TagLedger::default();
        assert_eq!(ledger.advance(3), Some(3));
        assert_eq!(ledger.advance(3), None);
        assert_eq!(ledger.advance(2), None);
    }

    #[test]
    fn settled_tags_at_or_below_the_watermark_are_forgotten() {
        let mut ledger = TagLedger::default();
        ledger.settle(2);
        ledger.settle(8);
        ledger.advance(5);
        assert_eq!(ledger.settled.iter().copied().collect::<Vec<_>>(), vec![8]);
        ledger.settle(4);
        assert_eq!(ledger.settled.len(), 1);
    }
}

#[cfg(test)]
mod properties {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::TagLedger;

    #[derive(Clone, Debug)]
    enum Step {
        /// Reject the n-th outstanding tag above the watermark.
        Reject(usize),
        /// Move the watermark up by this much.
        Advance(u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0usize..8).prop_map(Step::Reject),
            (0u64..6).prop_map(Step::Advance),
        ]
    }

    proptest! {
        /// A model channel with tags 1..=64 outstanding: whatever mix of
        /// rejects and watermark moves, every ack names an outstanding tag
        /// (the broker would close the channel otherwise) and leaves nothing
        /// outstanding at or below the watermark.
        #[test]
        fn every_ack_names_an_outstanding_tag(steps in proptest::collection::vec(step(), 1..60)) {
            let mut outstanding: BTreeSet<u64> = (1..=64).collect();
            let mut ledger = TagLedger::default();
            let mut watermark = 0u64;
            for step in steps {
                match step {
                    Step::Reject(nth) => {
                        let above: Vec<u64> = outstanding.range(watermark + 1..).copied().collect();
                        if let Some(&tag) = above.get(nth) {
                            ledger.settle(tag);
                            outstanding.remove(&tag);
                        }
                    }
                    Step::Advance(by) => {
                        watermark = (watermark + by).min(64);
                        if let Some(tag) = ledger.advance(watermark) {
                            prop_assert!(outstanding.contains(&tag), "ack names settled tag {tag}");
                            outstanding = outstanding.split_off(&(tag + 1));
                        }
                        prop_assert!(outstanding.range(..=watermark).next().is_none());
                    }
                }
            }
        }
    }
}
