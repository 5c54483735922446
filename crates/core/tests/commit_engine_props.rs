//! Properties of the ordered-commit engine under random schedules.
//!
//! The targeted properties come first; `engine_agrees_with_a_model_...` at the
//! end replays random mixes of every operation (admit, complete, requeue, take
//! a batch, revoke, reassign) across partitions against a plain model of the
//! contract and compares after every step.

use std::collections::HashSet;

use intake_core::commit_engine::{CommitEngine, Completion, PartitionId, Ticket};
use intake_core::{
    PartitionKey, Position,
    backend::{AckBatch, AckMode},
};
use proptest::prelude::*;

fn key(partition: u32) -> PartitionKey {
    PartitionKey::new("orders", partition)
}

/// `n` strictly increasing offsets starting anywhere, with gaps of 0 to 5.
fn offsets_with_gaps(max_len: usize) -> impl Strategy<Value = Vec<Position>> {
    (0i64..1_000, prop::collection::vec(0i64..=5, 1..max_len)).prop_map(|(start, gaps)| {
        let mut next = start;
        gaps.into_iter()
            .map(|gap| {
                let position = next + gap;
                next = position + 1;
                Position::Offset(position)
            })
            .collect()
    })
}

/// Strictly increasing Redis stream ids, several per millisecond or spread.
fn stream_ids(max_len: usize) -> impl Strategy<Value = Vec<Position>> {
    prop::collection::vec((0u64..3, 0u64..4), 1..max_len).prop_map(|steps| {
        let (mut ms, mut seq) = (1_700_000_000_000u64, 0u64);
        steps
            .into_iter()
            .map(|(ms_step, seq_step)| {
                if ms_step == 0 {
                    seq += 1 + seq_step;
                } else {
                    ms += ms_step;
                    seq = seq_step;
                }
                Position::StreamId { ms, seq }
            })
            .collect()
    })
}

/// Positions and an order in which to complete them.
fn positions_and_order(
    positions: impl Strategy<Value = Vec<Position>>,
) -> impl Strategy<Value = (Vec<Position>, Vec<usize>)> {
    positions.prop_flat_map(|positions| {
        let order = Just((0..positions.len()).collect::<Vec<_>>()).prop_shuffle();
        (Just(positions), order)
    })
}

/// The position ending the contiguous prefix of done entries, if any.
fn contiguous_end(positions: &[Position], done: &[bool]) -> Option<Position> {
    let prefix = done.iter().take_while(|&&done| done).count();
    prefix.checked_sub(1).map(|last| positions[last])
}

fn admit_all(engine: &mut CommitEngine, id: PartitionId, positions: &[Position]) -> Vec<Ticket> {
    positions
        .iter()
        .map(|&position| engine.admit(id, position).expect("partition is assigned"))
        .collect()
}

/// Checks the watermark against the done flags: it is the end of the
/// contiguous done prefix, and it lies before every unfinished position.
fn check_watermark(
    engine: &CommitEngine,
    id: PartitionId,
    positions: &[Position],
    done: &[bool],
) -> Result<(), TestCaseError> {
    let watermark = engine.watermark(id);
    prop_assert_eq!(watermark, contiguous_end(positions, done));
    for (position, _) in positions.iter().zip(done).filter(|(_, done)| !**done) {
        prop_assert!(
            watermark < Some(*position),
            "watermark {:?} passed unfinished {:?}",
            watermark,
            position
        );
    }
    Ok(())
}

proptest! {
    #[test]
    fn watermark_is_the_end_of_the_contiguous_completed_prefix_for_any_completion_order(
        (positions, order) in positions_and_order(offsets_with_gaps(200)),
    ) {
        let mut engine = CommitEngine::new(AckMode::Watermark);
        let id = engine.assign(key(0));
        let tickets = admit_all(&mut engine, id, &positions);
        let mut done = vec![false; positions.len()];
        for &index in &order {
            prop_assert_eq!(engine.complete(tickets[index]), Completion::Recorded);
            done[index] = true;
            check_watermark(&engine, id, &positions, &done)?;
        }
        // Any completion order ends where the sorted order ends.
        prop_assert_eq!(engine.watermark(id), positions.last().copied());
        prop_assert_eq!(engine.in_flight(id), 0);
        prop_assert_eq!(engine.uncommitted(id), 0);
    }

    #[test]
    fn gaps_between_positions_are_skipped(
        (positions, order) in positions_and_order(prop_oneof![offsets_with_gaps(120), stream_ids(120)]),
        completed in 0usize..120,
    ) {
        let mut engine = CommitEngine::new(AckMode::Watermark);
        let id = engine.assign(key(0));
        let tickets = admit_all(&mut engine, id, &positions);
        let mut done = vec![false; positions.len()];
        for &index in order.iter().take(completed) {
            engine.complete(tickets[index]);
            done[index] = true;
        }
        check_watermark(&engine, id, &positions, &done)?;
        let stats = engine.progress(id).expect("assigned");
        prop_assert_eq!(stats.oldest_unfinished, done.iter().position(|d| !d).map(|i| positions[i]));
        prop_assert_eq!(stats.newest, positions.last().copied());
    }

    #[test]
    fn requeued_positions_count_as_done_for_the_watermark(
        (positions, order) in positions_and_order(offsets_with_gaps(150)),
        requeue in prop::collection::vec(any::<bool>(), 150),
    ) {
        let mut engine = CommitEngine::new(AckMode::Ids);
        let id = engine.assign(key(0));
        let tickets = admit_all(&mut engine, id, &positions);
        let mut done = vec![false; positions.len()];
        let (mut acked, mut requeued) = (Vec::new(), Vec::new());
        for &index in &order {
            if requeue[index] {
                prop_assert_eq!(engine.requeue(tickets[index]), Completion::Recorded);
                requeued.push(positions[index]);
            } else {
                prop_assert_eq!(engine.complete(tickets[index]), Completion::Recorded);
                acked.push(positions[index]);
            }
            done[index] = true;
            check_watermark(&engine, id, &positions, &done)?;
        }
        let mut batch = AckBatch::default();
        engine.take_batch(&mut batch);
        prop_assert_eq!(batch.partitions.len(), 1);
        let ack = &batch.partitions[0];
        prop_assert_eq!(ack.watermark, positions.last().copied());
        prop_assert_eq!(&ack.completed, &acked, "acked ids in completion order");
        prop_assert_eq!(&ack.requeue, &requeued, "requeued ids in completion order");
    }

    #[test]
    fn ids_batches_contain_exactly_the_completed_positions_each_once(
        (positions, order) in positions_and_order(offsets_with_gaps(150)),
        take_after in prop::collection::vec(any::<bool>(), 150),
        completed in 0usize..150,
        twice in prop::collection::vec(0usize..150, 0..20),
    ) {
        let mut engine = CommitEngine::new(AckMode::Ids);
        let id = engine.assign(key(0));
        let tickets = admit_all(&mut engine, id, &positions);
        let mut batch = AckBatch::default();
        let mut handed_out = Vec::new();
        let mut expected = Vec::new();
        let completed = completed.min(order.len());
        for (step, &index) in order.iter().take(completed).enumerate() {
            engine.complete(tickets[index]);
            expected.push(positions[index]);
            // A duplicate completion of something already done changes nothing.
            if let Some(&again) = twice.get(step) {
                let again = order[again % (step + 1)];
                prop_assert_eq!(engine.complete(tickets[again]), Completion::Stale);
            }
            if take_after[step] {
                engine.take_batch(&mut batch);
                for ack in batch.partitions.drain(..) {
                    handed_out.extend(ack.completed);
                }
                prop_assert_eq!(engine.pending(), 0);
            }
        }
        engine.take_batch(&mut batch);
        for ack in batch.partitions.drain(..) {
            handed_out.extend(ack.completed);
        }
        prop_assert_eq!(&handed_out, &expected);
        let distinct: HashSet<_> = handed_out.iter().collect();
        prop_assert_eq!(distinct.len(), handed_out.len());
    }

    #[test]
    fn completions_of_an_earlier_assignment_are_ignored(
        (old_positions, old_order) in positions_and_order(offsets_with_gaps(80)),
        (new_positions, new_order) in positions_and_order(offsets_with_gaps(80)),
        completed_before in 0usize..80,
        revoke_first in any::<bool>(),
        interleave in prop::collection::vec(any::<bool>(), 160),
    ) {
        let mut engine = CommitEngine::new(AckMode::Ids);
        let id = engine.assign(key(0));
        let old = admit_all(&mut engine, id, &old_positions);
        for &index in old_order.iter().take(completed_before) {
            engine.complete(old[index]);
        }
        let id = if revoke_first {
            engine.revoke(id);
            // Another partition may take the freed slot first.
            let other = engine.assign(key(1));
            let other_ticket = engine.admit(other, Position::Offset(0)).expect("assigned");
            let id = engine.assign(key(0));
            prop_assert_eq!(engine.complete(other_ticket), Completion::Recorded);
            id
        } else {
            engine.assign(key(0))
        };
        let mut batch = AckBatch::default();
        engine.take_batch(&mut batch);
        prop_assert!(
            batch.partitions.iter().all(|ack| ack.partition != key(0)),
            "nothing of the old assignment is handed out after a reassignment: {:?}",
            batch
        );

        let new = admit_all(&mut engine, id, &new_positions);
        let mut done = vec![false; new_positions.len()];
        let mut old_left = old_order.iter().skip(completed_before);
        let mut new_left = new_order.iter();
        for &old_first in &interleave {
            let step = if old_first { old_left.next().map(|&i| (true, i)) } else { None }
                .or_else(|| new_left.next().map(|&i| (false, i)));
            let Some((is_old, index)) = step else { break };
            if is_old {
                prop_assert_eq!(engine.complete(old[index]), Completion::Stale);
            } else {
                prop_assert_eq!(engine.complete(new[index]), Completion::Recorded);
                done[index] = true;
            }
            check_watermark(&engine, id, &new_positions, &done)?;
        }
        for &index in old_left {
            prop_assert_eq!(engine.requeue(old[index]), Completion::Stale);
        }
        check_watermark(&engine, id, &new_positions, &done)?;
        engine.take_batch(&mut batch);
        let completed: Vec<Position> = batch
            .partitions
            .iter()
            .filter(|ack| ack.partition == key(0))
            .flat_map(|ack| ack.completed.iter().copied())
            .collect();
        let new_set: HashSet<_> = new_positions.iter().collect();
        prop_assert!(completed.iter().all(|position| new_set.contains(position)));
        prop_assert_eq!(completed.len(), done.iter().filter(|&&d| d).count());
    }
}

// ---------------------------------------------------------------------------
// Model-based check of every operation together.

const PARTITIONS: u32 = 3;

#[derive(Clone, Debug)]
enum Op {
    Admit { partition: u32, gap: i64 },
    Complete { ticket: usize },
    Requeue { ticket: usize },
    TakeBatch,
    TakePartitionBatch { partition: u32 },
    Revoke { partition: u32 },
    Assign { partition: u32 },
}

fn op() -> impl Strategy<Value = Op> {
    let partition = 0..PARTITIONS;
    prop_oneof![
        6 => (partition.clone(), 0i64..3).prop_map(|(partition, gap)| Op::Admit { partition, gap }),
        6 => any::<usize>().prop_map(|ticket| Op::Complete { ticket }),
        2 => any::<usize>().prop_map(|ticket| Op::Requeue { ticket }),
        2 => Just(Op::TakeBatch),
        1 => partition.clone().prop_map(|partition| Op::TakePartitionBatch { partition }),
        1 => partition.clone().prop_map(|partition| Op::Revoke { partition }),
        1 => partition.prop_map(|partition| Op::Assign { partition }),
    ]
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum State {
    InFlight,
    Acked,
    Requeued,
}

/// One assignment of one partition, as the contract describes it.
#[derive(Debug, Default)]
struct ModelPartition {
    /// `None` while revoked.
    id: Option<PartitionId>,
    /// Bumped by every assignment; tickets of another epoch are stale.
    epoch: u64,
    entries: Vec<(Position, State)>,
    next_position: i64,
    sent_watermark: Option<Position>,
    /// Recorded since the last batch, in completion order.
    unsent_acked: Vec<Position>,
    unsent_requeued: Vec<Position>,
    /// Completions recorded since the last batch (acked or requeued).
    unsent_count: usize,
}

impl ModelPartition {
    fn watermark(&self) -> Option<Position> {
        self.entries
            .iter()
            .take_while(|(_, state)| *state != State::InFlight)
            .last()
            .map(|(position, _)| *position)
    }

    fn in_flight(&self) -> usize {
        self.entries
            .iter()
            .filter(|(_, s)| *s == State::InFlight)
            .count()
    }

    fn uncommitted(&self) -> usize {
        let done_prefix = self
            .entries
            .iter()
            .take_while(|(_, state)| *state != State::InFlight)
            .count();
        self.entries.len() - done_prefix
    }

    fn start_epoch(&mut self, id: PartitionId) {
        self.id = Some(id);
        self.epoch += 1;
        self.entries.clear();
        self.sent_watermark = None;
        self.unsent_acked.clear();
        self.unsent_requeued.clear();
        self.unsent_count = 0;
    }
}

struct Model {
    mode: AckMode,
    partitions: Vec<ModelPartition>,
    /// Every ticket handed out: (partition, epoch, seq, ticket).
    tickets: Vec<(u32, u64, usize, Ticket)>,
}

impl Model {
    fn pending(&self) -> usize {
        self.partitions.iter().map(|p| p.unsent_count).sum()
    }

    /// The acknowledgement the engine owes for `partition`, and marks it sent.
    fn take(&mut self, partition: u32) -> Option<(Option<Position>, Vec<Position>, Vec<Position>)> {
        let model = &mut self.partitions[partition as usize];
        model.id?;
        let watermark = model.watermark();
        let moved = (watermark != model.sent_watermark)
            .then_some(watermark)
            .flatten();
        model.sent_watermark = watermark;
        let acked = std::mem::take(&mut model.unsent_acked);
        let requeued = std::mem::take(&mut model.unsent_requeued);
        model.unsent_count = 0;
        (moved.is_some() || !acked.is_empty() || !requeued.is_empty())
            .then_some((moved, acked, requeued))
    }

    fn finish(
        &mut self,
        engine: &mut CommitEngine,
        index: usize,
        requeue: bool,
    ) -> Result<(), TestCaseError> {
        let Some(&(partition, epoch, seq, ticket)) =
            self.tickets.get(index % self.tickets.len().max(1))
        else {
            return Ok(());
        };
        let model = &mut self.partitions[partition as usize];
        let current = model.id.is_some() && model.epoch == epoch;
        let expected = if current && model.entries[seq].1 == State::InFlight {
            let position = model.entries[seq].0;
            model.entries[seq].1 = if requeue {
                State::Requeued
            } else {
                State::Acked
            };
            if requeue {
                model.unsent_requeued.push(position);
            } else if self.mode == AckMode::Ids {
                model.unsent_acked.push(position);
            }
            model.unsent_count += 1;
            Completion::Recorded
        } else {
            Completion::Stale
        };
        let actual = if requeue {
            engine.requeue(ticket)
        } else {
            engine.complete(ticket)
        };
        prop_assert_eq!(
            actual,
            expected,
            "ticket {:?} of partition {} epoch {}",
            ticket,
            partition,
            epoch
        );
        Ok(())
    }

    fn apply(&mut self, engine: &mut CommitEngine, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Admit { partition, gap } => {
                let model = &mut self.partitions[partition as usize];
                let Some(id) = model.id else { return Ok(()) };
                let position = Position::Offset(model.next_position + gap);
                model.next_position += gap + 1;
                let ticket = engine.admit(id, position);
                prop_assert!(ticket.is_some(), "an assigned partition admits");
                if let Some(ticket) = ticket {
                    let seq = model.entries.len();
                    model.entries.push((position, State::InFlight));
                    self.tickets.push((partition, model.epoch, seq, ticket));
                }
            }
            Op::Complete { ticket } => self.finish(engine, ticket, false)?,
            Op::Requeue { ticket } => self.finish(engine, ticket, true)?,
            Op::TakeBatch => {
                let mut batch = AckBatch::default();
                engine.take_batch(&mut batch);
                let mut expected = Vec::new();
                for partition in 0..PARTITIONS {
                    if let Some(ack) = self.take(partition) {
                        expected.push((key(partition), ack));
                    }
                }
                let mut actual: Vec<_> = batch
                    .partitions
                    .into_iter()
                    .map(|ack| (ack.partition, (ack.watermark, ack.completed, ack.requeue)))
                    .collect();
                actual.sort_by(|a, b| a.0.cmp(&b.0));
                prop_assert_eq!(actual, expected);
            }
            Op::TakePartitionBatch { partition } => {
                let Some(id) = self.partitions[partition as usize].id else {
                    return Ok(());
                };
                let mut batch = AckBatch::default();
                engine.take_partition_batch(id, &mut batch);
                let actual: Vec<_> = batch
                    .partitions
                    .into_iter()
                    .map(|ack| (ack.partition, (ack.watermark, ack.completed, ack.requeue)))
                    .collect();
                let expected: Vec<_> = self
                    .take(partition)
                    .map(|ack| (key(partition), ack))
                    .into_iter()
                    .collect();
                prop_assert_eq!(actual, expected);
            }
            Op::Revoke { partition } => {
                let model = &mut self.partitions[partition as usize];
                if let Some(id) = model.id.take() {
                    engine.revoke(id);
                    // Unbatched work of a revoked partition is discarded.
                    model.unsent_count = 0;
                    model.unsent_acked.clear();
                    model.unsent_requeued.clear();
                    prop_assert_eq!(engine.key(id), None);
                }
            }
            Op::Assign { partition } => {
                let id = engine.assign(key(partition));
                let model = &mut self.partitions[partition as usize];
                if let Some(previous) = model.id {
                    prop_assert_eq!(previous, id, "a reassigned partition keeps its id");
                }
                // A new assignment resumes after what was committed.
                model.next_position = match model.sent_watermark {
                    Some(Position::Offset(offset)) => offset + 1,
                    _ => model.next_position,
                };
                model.start_epoch(id);
            }
        }
        self.check(engine)
    }

    fn check(&self, engine: &CommitEngine) -> Result<(), TestCaseError> {
        for (partition, model) in self.partitions.iter().enumerate() {
            let Some(id) = model.id else {
                prop_assert_eq!(engine.lookup(&key(partition as u32)), None);
                continue;
            };
            prop_assert_eq!(engine.lookup(&key(partition as u32)), Some(id));
            prop_assert_eq!(
                engine.watermark(id),
                model.watermark(),
                "watermark of partition {}",
                partition
            );
            prop_assert_eq!(
                engine.in_flight(id),
                model.in_flight(),
                "in flight on partition {}",
                partition
            );
            prop_assert_eq!(
                engine.uncommitted(id),
                model.uncommitted(),
                "uncommitted on partition {}",
                partition
            );
        }
        prop_assert_eq!(engine.pending(), self.pending(), "pending completions");
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn engine_agrees_with_a_model_of_the_contract_under_random_schedules(
        ids_mode in any::<bool>(),
        ops in prop::collection::vec(op(), 1..300),
    ) {
        let mode = if ids_mode { AckMode::Ids } else { AckMode::Watermark };
        let mut engine = CommitEngine::new(mode);
        let mut model = Model {
            mode,
            partitions: (0..PARTITIONS).map(|_| ModelPartition::default()).collect(),
            tickets: Vec::new(),
        };
        for partition in 0..PARTITIONS {
            model.apply(&mut engine, &Op::Assign { partition })?;
        }
        for op in &ops {
            model.apply(&mut engine, op)?;
        }
    }
}
