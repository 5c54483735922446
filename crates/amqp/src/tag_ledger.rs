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
//! Messages completed above the watermark (out of order, past a message
//! that is still running) are acknowledged one by one: they count against
//! the channel's prefetch until acknowledged, so leaving them for the
//! watermark would let one stuck message fill the prefetch and stop the
//! consumer. They join the individually settled tags.
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

    /// How many of the tags up to `last` are settled (acknowledged, or
    /// settled on their own).
    pub(crate) fn settled_through(&self, last: u64) -> u64 {
        let above = self.settled.range(..=last).count();
        self.acked_through.min(last) + u64::try_from(above).unwrap_or(u64::MAX)
    }

    /// Plans the acknowledgement of one batch: pushes onto `individual` the
    /// `completed` tags above the watermark (to acknowledge one by one), and
    /// returns the tag for `basic.ack(multiple=true)`, if any. Rejects must
    /// have been [`settle`](Self::settle)d first.
    pub(crate) fn acknowledge(
        &mut self,
        completed: impl IntoIterator<Item = u64>,
        watermark: Option<u64>,
        individual: &mut Vec<u64>,
    ) -> Option<u64> {
        let covered = watermark.unwrap_or(0).max(self.acked_through);
        for tag in completed {
            if tag > covered && self.settled.insert(tag) {
                individual.push(tag);
            }
        }
        watermark.and_then(|watermark| self.advance(watermark))
    }

    /// Moves the ledger to `watermark` (every tag up to it is done) and
    /// returns the tag that `basic.ack(multiple=true)` should name, or `None`
    /// when every tag up to the watermark was already settled.
    fn advance(&mut self, watermark: u64) -> Option<u64> {
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
    fn completions_above_a_stuck_message_are_acknowledged_one_by_one() {
        let mut ledger = TagLedger::default();
        let mut individual = Vec::new();
        // Tag 2 is still running; 1, 3 and 4 finished.
        let ack = ledger.acknowledge([3, 1, 4], Some(1), &mut individual);
        assert_eq!((ack, individual.as_slice()), (Some(1), &[3, 4][..]));
        // Tag 2 finishes: the watermark jumps to 4 but only 2 is still out.
        individual.clear();
        let ack = ledger.acknowledge([2], Some(4), &mut individual);
        assert_eq!((ack, individual.as_slice()), (Some(2), &[][..]));
    }

    #[test]
    fn completions_the_watermark_covers_are_not_acknowledged_twice() {
        let mut ledger = TagLedger::default();
        let mut individual = Vec::new();
        assert_eq!(
            ledger.acknowledge([2, 1, 3], Some(3), &mut individual),
            Some(3)
        );
        assert!(individual.is_empty());
    }

    #[test]
    fn work_the_runtime_sends_again_is_not_acknowledged_twice() {
        // RabbitMQ closes the channel on a second ack of a tag; the runtime
        // resends work after a failed batch and on revocation or shutdown.
        let mut ledger = TagLedger::default();
        let mut individual = Vec::new();
        assert_eq!(
            ledger.acknowledge([1, 2, 4], Some(2), &mut individual),
            Some(2)
        );
        assert_eq!(individual, [4]);
        individual.clear();
        assert_eq!(
            ledger.acknowledge([1, 2, 4], Some(2), &mut individual),
            None
        );
        assert!(individual.is_empty());
    }

    #[test]
    fn settled_through_counts_acknowledged_and_individually_settled_tags() {
        let mut ledger = TagLedger::default();
        let mut individual = Vec::new();
        // 1–3 acknowledged, 5 acknowledged alone, 7 rejected; 4 and 6 out.
        ledger.acknowledge([1, 2, 3, 5], Some(3), &mut individual);
        ledger.settle(7);
        assert_eq!(ledger.settled_through(8), 5);
        assert_eq!(ledger.settled_through(5), 4);
        assert_eq!(ledger.settled_through(2), 2);
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

    const TAGS: u64 = 48;

    #[derive(Clone, Copy, Debug)]
    enum Step {
        /// The n-th unfinished tag finishes: done (`true`) or requeued.
        Finish(usize, bool),
        /// The runtime hands a batch to the acker.
        Batch,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => (0usize..6, prop::bool::weighted(0.8)).prop_map(|(nth, done)| Step::Finish(nth, done)),
            1 => Just(Step::Batch),
        ]
    }

    /// The commit engine in miniature: the watermark is the end of the
    /// contiguous run of finished tags (a requeue counts as finished).
    struct Engine {
        unfinished: BTreeSet<u64>,
        completed: Vec<u64>,
        requeue: Vec<u64>,
        sent_watermark: u64,
    }

    impl Engine {
        fn watermark(&self) -> u64 {
            self.unfinished.first().map_or(TAGS, |oldest| oldest - 1)
        }
    }

    /// The broker's side of the channel: which tags are still out.
    struct Channel {
        outstanding: BTreeSet<u64>,
        requeued: BTreeSet<u64>,
    }

    fn batch(
        engine: &mut Engine,
        ledger: &mut TagLedger,
        channel: &mut Channel,
    ) -> Result<(), TestCaseError> {
        let watermark = engine.watermark();
        let watermark = (watermark > engine.sent_watermark).then_some(watermark);
        if let Some(watermark) = watermark {
            engine.sent_watermark = watermark;
        }
        for tag in engine.requeue.drain(..) {
            ledger.settle(tag);
            prop_assert!(
                channel.outstanding.remove(&tag),
                "reject of tag {tag} that is not out"
            );
            channel.requeued.insert(tag);
        }
        let mut individual = Vec::new();
        let ack = ledger.acknowledge(engine.completed.drain(..), watermark, &mut individual);
        for tag in individual {
            prop_assert!(
                channel.outstanding.remove(&tag),
                "single ack of tag {tag} that is not out"
            );
        }
        if let Some(tag) = ack {
            prop_assert!(
                channel.outstanding.contains(&tag),
                "ack multiple of tag {tag} that is not out"
            );
            let acked: Vec<u64> = channel.outstanding.range(..=tag).copied().collect();
            for acked in acked {
                prop_assert!(
                    !engine.unfinished.contains(&acked),
                    "acked unfinished tag {acked}"
                );
                channel.outstanding.remove(&acked);
            }
        }
        Ok(())
    }

    proptest! {
        /// Whatever the completion order and mix of retries, every frame the
        /// acker sends names a tag that is still out (RabbitMQ closes the
        /// channel otherwise), nothing unfinished is acknowledged, no retry
        /// is acknowledged instead of requeued, and once everything finished
        /// nothing is left out.
        #[test]
        fn acknowledgements_only_name_outstanding_tags(steps in proptest::collection::vec(step(), 1..120)) {
            let mut engine = Engine {
                unfinished: (1..=TAGS).collect(),
                completed: Vec::new(),
                requeue: Vec::new(),
                sent_watermark: 0,
            };
            let mut channel = Channel { outstanding: (1..=TAGS).collect(), requeued: BTreeSet::new() };
            let mut ledger = TagLedger::default();
            for step in steps {
                match step {
                    Step::Finish(nth, done) => {
                        if let Some(&tag) = engine.unfinished.iter().nth(nth) {
                            engine.unfinished.remove(&tag);
                            if done { engine.completed.push(tag) } else { engine.requeue.push(tag) }
                        }
                    }
                    Step::Batch => batch(&mut engine, &mut ledger, &mut channel)?,
                }
            }
            let unfinished: Vec<u64> = engine.unfinished.iter().copied().collect();
            for tag in unfinished {
                engine.unfinished.remove(&tag);
                engine.completed.push(tag);
            }
            batch(&mut engine, &mut ledger, &mut channel)?;
            prop_assert!(channel.outstanding.is_empty(), "left out: {:?}", channel.outstanding);
            let requeued = channel.requeued.len();
            prop_assert!(requeued <= TAGS as usize);
        }
    }
}
