//! What a simulated run did, recorded as it happens, and the contract
//! checked against it at every step.
//!
//! The instruments (source, acker and handler wrappers) report here; every
//! check that fails becomes a violation with enough context to find it in a
//! replay. The ledger never panics: a violation inside the runtime's own
//! futures is recorded and the driver stops the seed at its next step.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;

use intake_core::{
    DeliveryOrder, PartitionKey, Position,
    backend::{AckBatch, AckError},
};
use tokio::time::Instant;

use super::rng::mix;
use super::scenario::{ConsumerPlan, MessagePlan};

/// Identifies one consumer of a run (one `Consumer::run`), in start order.
pub type InstanceId = usize;

/// How one handler call, as the runtime sees it, ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    Succeeded,
    DeadLettered,
    /// Any other error: not finished, the runtime keeps the message.
    Failed,
    /// The future was dropped before it answered.
    Dropped,
}

/// One partition as one consumer holds it.
#[derive(Debug, Default)]
struct Held {
    assigned: bool,
    /// Assignments of this partition to this consumer so far.
    generation: u32,
    /// The offset the next fetch must start at: the assignment starts at the
    /// committed offset and continues without gaps.
    next_fetch: i64,
    /// Offsets whose handler runs now, with how many runs (a redispatched
    /// delivery runs again only after the previous run ended).
    running: BTreeMap<i64, u32>,
    /// Offsets this assignment finished: each at most once.
    finished: HashSet<i64>,
    /// Delivery-order lanes: the last started offset per lane (one lane for the
    /// partition, or one per key).
    lanes: BTreeMap<u32, i64>,
    /// Duplicates finished in this assignment, and its share of the bound.
    duplicates: u64,
    bound: u64,
}

#[derive(Debug)]
struct Instance {
    plan: ConsumerPlan,
    running: usize,
    partitions: Vec<Held>,
}

/// Totals of one seed, for the report.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    pub messages: u64,
    pub consumers: u64,
    pub crashes: u64,
    pub leaves: u64,
    pub faults: u64,
    pub assignments: u64,
    pub handler_calls: u64,
    pub handler_failures: u64,
    pub dead_lettered: u64,
    pub duplicates: u64,
    pub duplicate_bound: u64,
    /// The most duplicates one assignment finished (after one crash, leave
    /// or rebalance), with that assignment's bound.
    pub most_duplicates_in_one_assignment: (u64, u64),
    pub commits: u64,
    pub refused_commits: u64,
    pub virtual_millis: u64,
}

/// The record of one run. See the [module docs](self).
pub struct Ledger {
    started: Instant,
    keys: u32,
    plans: Vec<MessagePlan>,
    /// Handler calls per message id, over every attempt and consumer.
    calls: Vec<u32>,
    succeeded: Vec<u32>,
    dead_lettered: Vec<u32>,
    /// Per partition: the message id at each offset.
    ids: Vec<Vec<u32>>,
    /// Per partition: whether each offset was finished by anyone.
    finished: Vec<Vec<bool>>,
    /// Per partition: every offset below it is finished.
    finished_prefix: Vec<usize>,
    /// Per partition: every offset below it was fetched by some consumer.
    fetched_until: Vec<i64>,
    /// Per partition: the committed offset last seen.
    committed: Vec<Option<i64>>,
    /// Per partition: duplicates finished, and the bound on them.
    duplicates: Vec<u64>,
    bound: Vec<u64>,
    instances: Vec<Instance>,
    violations: Vec<String>,
    fingerprint: u64,
    /// Prints every event (`INTAKE_SIM_TRACE=1`), for replaying a seed.
    verbose: bool,
    pub stats: Stats,
}

/// What the first number of each traced event means; the rest are
/// `[consumer, partition, offset, ...]` or the ids the event names.
const EVENT_NAMES: [&str; 11] = [
    "-",
    "produced",
    "consumer started",
    "consumer gone",
    "assigned",
    "revoked",
    "fetched",
    "handler started",
    "handler ended",
    "commit sent",
    "commit returned",
];

impl Ledger {
    pub fn new(partitions: u32, keys: u32, plans: Vec<MessagePlan>) -> Self {
        let partitions = partitions as usize;
        let count = plans.len();
        Self {
            started: Instant::now(),
            keys,
            plans,
            calls: vec![0; count],
            succeeded: vec![0; count],
            dead_lettered: vec![0; count],
            ids: vec![Vec::new(); partitions],
            finished: vec![Vec::new(); partitions],
            finished_prefix: vec![0; partitions],
            fetched_until: vec![0; partitions],
            committed: vec![None; partitions],
            duplicates: vec![0; partitions],
            bound: vec![0; partitions],
            instances: Vec::new(),
            violations: Vec::new(),
            fingerprint: 0,
            verbose: std::env::var_os("INTAKE_SIM_TRACE").is_some(),
            stats: Stats::default(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Folds an event into the run's fingerprint: two runs of a seed must
    /// produce the same one.
    fn trace(&mut self, parts: &[u64]) {
        if self.verbose {
            let what = EVENT_NAMES.get(parts[0] as usize).copied().unwrap_or("?");
            eprintln!("{:>7} ms {what:<18} {:?}", self.now_ms(), &parts[1..]);
        }
        let mut hash = self.fingerprint ^ self.now_ms();
        for &part in parts {
            hash = mix(hash ^ part);
        }
        self.fingerprint = hash;
    }

    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    pub fn violation(&mut self, text: String) {
        let at = self.now_ms();
        if self.violations.len() < 8 {
            self.violations.push(format!("at {at} ms: {text}"));
        }
    }

    pub fn violations(&self) -> &[String] {
        &self.violations
    }

    // ---- producing -------------------------------------------------------

    pub fn produced(&mut self, id: u32, partition: u32, offset: i64) {
        let expected = self.ids[partition as usize].len() as i64;
        if offset != expected {
            self.violation(format!(
                "message {id} stored at offset {offset} of partition {partition}, expected \
                 {expected}"
            ));
        }
        self.ids[partition as usize].push(id);
        self.finished[partition as usize].push(false);
        self.stats.messages += 1;
        self.trace(&[1, u64::from(id), u64::from(partition)]);
    }

    pub fn produced_count(&self) -> usize {
        self.ids.iter().map(Vec::len).sum()
    }

    /// The key lane of message `id` (its key is `k{id % keys}`).
    pub fn key_of(&self, id: u32) -> u32 {
        id % self.keys
    }

    /// The id at `offset` of `partition`, if that is where it was stored.
    fn id_at(&self, partition: u32, offset: i64) -> Option<u32> {
        let offset = usize::try_from(offset).ok()?;
        self.ids.get(partition as usize)?.get(offset).copied()
    }

    // ---- consumers ---------------------------------------------------------

    pub fn consumer_started(&mut self, plan: ConsumerPlan) -> InstanceId {
        let partitions = self.ids.len();
        self.instances.push(Instance {
            plan,
            running: 0,
            partitions: (0..partitions).map(|_| Held::default()).collect(),
        });
        self.stats.consumers += 1;
        let id = self.instances.len() - 1;
        self.trace(&[2, id as u64]);
        id
    }

    /// The consumer's run future is gone (crashed or ended): whatever it
    /// still held must have been dropped with it.
    pub fn consumer_gone(&mut self, instance: InstanceId, crashed: bool) {
        if crashed {
            self.stats.crashes += 1;
        }
        let running: usize = self.instances[instance]
            .partitions
            .iter()
            .map(|held| held.running.len())
            .sum();
        if running > 0 || self.instances[instance].running > 0 {
            self.violation(format!(
                "consumer {instance} is gone but {running} handler(s) of it still run"
            ));
        }
        for held in &mut self.instances[instance].partitions {
            held.assigned = false;
        }
        self.trace(&[3, instance as u64, u64::from(crashed)]);
    }

    // ---- the source ----------------------------------------------------------

    /// `instance` was assigned `partitions`; `committed` is the group's
    /// committed offsets now, where the new assignment starts.
    pub fn assigned(
        &mut self,
        instance: InstanceId,
        partitions: &[PartitionKey],
        committed: &[Option<i64>],
    ) {
        for key in partitions {
            let p = key.partition as usize;
            let start = committed.get(p).copied().flatten().unwrap_or(0);
            // Everything fetched at or past the start may be handled again
            // in this assignment: the duplicate bound of docs/CONTRACT.md §5 in
            // checkable form (see RELIABILITY.md).
            let bound = u64::try_from(self.fetched_until[p] - start).unwrap_or(0);
            self.bound[p] += bound;
            // Handlers of an earlier assignment may still run here: the
            // runtime cancels them when it takes the event (see
            // `handler_ended`), before any handler of this one starts.
            let held = &mut self.instances[instance].partitions[p];
            held.duplicates = 0;
            held.bound = bound;
            held.assigned = true;
            held.generation += 1;
            held.next_fetch = start;
            held.finished.clear();
            held.lanes.clear();
            self.stats.assignments += 1;
            self.trace(&[4, instance as u64, p as u64, start as u64]);
        }
    }

    pub fn revoked(&mut self, instance: InstanceId, partitions: &[PartitionKey]) {
        for key in partitions {
            let p = key.partition as usize;
            self.instances[instance].partitions[p].assigned = false;
            self.trace(&[5, instance as u64, p as u64]);
        }
    }

    /// The source handed `instance` these deliveries (asked for `max`).
    pub fn fetched(&mut self, instance: InstanceId, deliveries: &[(u32, i64, u32)], max: usize) {
        if deliveries.len() > max {
            self.violation(format!(
                "consumer {instance} asked for {max} deliveries and got {}",
                deliveries.len()
            ));
        }
        for &(partition, offset, id) in deliveries {
            let p = partition as usize;
            if self.id_at(partition, offset) != Some(id) {
                self.violation(format!(
                    "consumer {instance} got message {id} as offset {offset} of partition \
                     {partition}, which holds {:?}",
                    self.id_at(partition, offset)
                ));
            }
            let held = &mut self.instances[instance].partitions[p];
            let (assigned, expected) = (held.assigned, held.next_fetch);
            held.next_fetch = offset + 1;
            if !assigned {
                self.violation(format!(
                    "consumer {instance} fetched offset {offset} of partition {partition}, \
                     which it does not own"
                ));
                continue;
            }
            if offset != expected {
                self.violation(format!(
                    "consumer {instance} fetched offset {offset} of partition {partition}; \
                     the next one in its assignment is {expected} (a gap or a repeat)"
                ));
            }
            self.fetched_until[p] = self.fetched_until[p].max(offset + 1);
            self.trace(&[6, instance as u64, p as u64, offset as u64]);
        }
    }

    // ---- the handler -----------------------------------------------------------

    /// A call of the innermost handler (the application) for message `id`:
    /// what it must do, and how many calls came before.
    pub fn application_call(&mut self, id: u32) -> Option<(MessagePlan, u32)> {
        let index = id as usize;
        let calls = *self.calls.get(index)?;
        self.calls[index] += 1;
        self.stats.handler_calls += 1;
        let plan = self.plans[index];
        if plan.poison || calls < plan.failures {
            self.stats.handler_failures += 1;
        }
        Some((plan, calls))
    }

    /// The lane a delivery of `id` runs in under `ordering`, if any.
    fn lane(&self, ordering: DeliveryOrder, id: u32) -> Option<u32> {
        match ordering {
            DeliveryOrder::Partition => Some(u32::MAX),
            DeliveryOrder::Key => Some(self.key_of(id)),
            DeliveryOrder::Unordered => None,
        }
    }

    /// The runtime started the handler stack for a delivery; returns the
    /// assignment it belongs to.
    pub fn handler_started(
        &mut self,
        instance: InstanceId,
        partition: u32,
        offset: i64,
        id: u32,
    ) -> u32 {
        let p = partition as usize;
        let plan = self.instances[instance].plan;
        let lane = self.lane(plan.ordering, id);
        let keys_running: Vec<u32> = self.instances[instance].partitions[p]
            .running
            .keys()
            .filter_map(|&running| self.id_at(partition, running))
            .collect();
        let instance_state = &mut self.instances[instance];
        instance_state.running += 1;
        let over_budget = instance_state.running > plan.max_in_flight;
        let held = &mut instance_state.partitions[p];
        let owned = held.assigned;
        let lane_busy = match lane {
            Some(u32::MAX) => !held.running.is_empty(),
            Some(key) => keys_running.iter().any(|&other| other % self.keys == key),
            None => false,
        };
        let out_of_order = lane.and_then(|lane| {
            let last = held.lanes.insert(lane, offset)?;
            (offset < last).then_some(last)
        });
        *held.running.entry(offset).or_insert(0) += 1;
        let twice = held.running[&offset] > 1;
        if over_budget {
            self.violation(format!(
                "consumer {instance} runs more than max_in_flight = {} handlers",
                plan.max_in_flight
            ));
        }
        if !owned {
            self.violation(format!(
                "consumer {instance} started offset {offset} of partition {partition}, which \
                 it does not own (revoked or never assigned)"
            ));
        }
        if lane_busy {
            self.violation(format!(
                "consumer {instance} started offset {offset} of partition {partition} while \
                 another delivery of its lane runs ({:?} ordering)",
                plan.ordering
            ));
        }
        if let Some(last) = out_of_order {
            self.violation(format!(
                "consumer {instance} started offset {offset} of partition {partition} after \
                 offset {last} of the same lane ({:?} ordering)",
                plan.ordering
            ));
        }
        if twice {
            self.violation(format!(
                "consumer {instance} runs offset {offset} of partition {partition} twice at once"
            ));
        }
        self.trace(&[7, instance as u64, p as u64, offset as u64]);
        self.instances[instance].partitions[p].generation
    }

    /// The handler stack of a delivery answered, or was dropped.
    pub fn handler_ended(
        &mut self,
        instance: InstanceId,
        partition: u32,
        offset: i64,
        id: u32,
        generation: u32,
        ending: Ending,
    ) {
        let p = partition as usize;
        let instance_state = &mut self.instances[instance];
        instance_state.running = instance_state.running.saturating_sub(1);
        let held = &mut instance_state.partitions[p];
        if let Some(runs) = held.running.get_mut(&offset) {
            *runs -= 1;
            if *runs == 0 {
                held.running.remove(&offset);
            }
        }
        if !matches!(ending, Ending::Succeeded | Ending::DeadLettered) {
            self.trace(&[8, instance as u64, p as u64, offset as u64, ending as u64]);
            return;
        }
        if generation != held.generation {
            let current = held.generation;
            self.violation(format!(
                "consumer {instance} finished offset {offset} of partition {partition} in \
                 assignment {generation}, after assignment {current} of the partition began \
                 (a stale handler ran on beside the new assignment)"
            ));
            return;
        }
        let held = &mut self.instances[instance].partitions[p];
        let again_here = !held.finished.insert(offset);
        self.trace(&[8, instance as u64, p as u64, offset as u64, ending as u64]);
        if again_here {
            self.violation(format!(
                "consumer {instance} finished offset {offset} of partition {partition} twice \
                 in one assignment"
            ));
        }
        let index = id as usize;
        let before = self.succeeded[index] + self.dead_lettered[index];
        if before > 0 {
            self.duplicates[p] += 1;
            let held = &mut self.instances[instance].partitions[p];
            held.duplicates += 1;
            let most = &mut self.stats.most_duplicates_in_one_assignment;
            if held.duplicates > most.0 {
                *most = (held.duplicates, held.bound);
            }
        }
        match ending {
            Ending::Succeeded => self.succeeded[index] += 1,
            _ => {
                self.dead_lettered[index] += 1;
                self.stats.dead_lettered += 1;
            }
        }
        let finished = &mut self.finished[p];
        if let Some(done) = usize::try_from(offset)
            .ok()
            .and_then(|o| finished.get_mut(o))
        {
            *done = true;
        }
        let prefix = &mut self.finished_prefix[p];
        while finished.get(*prefix).copied().unwrap_or(false) {
            *prefix += 1;
        }
    }

    // ---- the acker ---------------------------------------------------------------

    /// The runtime hands `batch` to `instance`'s acker: no watermark may pass
    /// a delivery whose handler still runs there.
    pub fn ack_sent(&mut self, instance: InstanceId, batch: &AckBatch) {
        for ack in &batch.partitions {
            let p = ack.partition.partition as usize;
            if !ack.requeue.is_empty() {
                self.violation(format!(
                    "consumer {instance} asked the memory broker to requeue {:?}",
                    ack.requeue
                ));
            }
            let Some(watermark) = ack.watermark else {
                continue;
            };
            let Position::Offset(watermark) = watermark else {
                self.violation(format!("consumer {instance} committed {watermark:?}"));
                continue;
            };
            let unfinished = self.instances[instance].partitions[p]
                .running
                .range(..=watermark)
                .next()
                .map(|(&offset, _)| offset);
            if let Some(offset) = unfinished {
                self.violation(format!(
                    "consumer {instance} commits partition {p} through offset {watermark} while \
                     offset {offset} still runs"
                ));
            }
            self.trace(&[9, instance as u64, p as u64, watermark as u64]);
        }
    }

    /// After an acknowledgement of `instance` returned `result`, the group's
    /// committed offsets are `committed`.
    pub fn ack_returned(
        &mut self,
        instance: InstanceId,
        committed: &[Option<i64>],
        result: &Result<(), AckError>,
    ) {
        match result {
            Ok(()) => self.stats.commits += 1,
            Err(_) => self.stats.refused_commits += 1,
        }
        self.observe_committed(committed, &format!("after a commit of consumer {instance}"));
        self.trace(&[10, instance as u64, u64::from(result.is_ok())]);
    }

    /// Checks the committed offsets: never behind what was seen before, and
    /// never past a message nobody finished.
    pub fn observe_committed(&mut self, committed: &[Option<i64>], when: &str) {
        for (p, &now) in committed.iter().enumerate() {
            let before = self.committed[p];
            if now < before {
                self.violation(format!(
                    "{when}: partition {p}'s committed offset went back from {before:?} to {now:?}"
                ));
            }
            if let Some(offset) = now {
                let prefix = self.finished_prefix[p] as i64;
                if offset > prefix {
                    self.violation(format!(
                        "{when}: partition {p} is committed up to offset {offset}, but offset \
                         {prefix} (message {:?}) was never finished",
                        self.id_at(p as u32, prefix)
                    ));
                }
            }
            self.committed[p] = now;
        }
    }

    // ---- the end ---------------------------------------------------------------

    /// Every id handled or dead-lettered, as planned.
    pub fn unfinished(&self) -> usize {
        self.finished
            .iter()
            .map(|partition| partition.iter().filter(|done| !**done).count())
            .sum()
    }

    /// The checks once everything drained: nothing lost, everything
    /// committed, the dead-letter topic as recorded, duplicates within bound.
    pub fn final_checks(
        &mut self,
        committed: &[Option<i64>],
        high_watermarks: &[i64],
        dead_letter_ids: &[u32],
    ) {
        self.observe_committed(committed, "at the end");
        let produced = self.produced_count();
        for index in 0..produced {
            let plan = self.plans[index];
            let (ok, dead) = (self.succeeded[index], self.dead_lettered[index]);
            if ok + dead == 0 {
                self.violation(format!(
                    "message {index} was lost: never handled ({plan:?})"
                ));
            }
            if plan.poison && ok > 0 {
                self.violation(format!("poison message {index} succeeded"));
            }
            if !plan.poison && plan.failures == 0 && plan.work.is_zero() && dead > 0 {
                self.violation(format!(
                    "message {index} never fails, yet it was dead-lettered"
                ));
            }
        }
        for (p, (&committed, &end)) in committed.iter().zip(high_watermarks).enumerate() {
            if committed.unwrap_or(0) != end {
                self.violation(format!(
                    "partition {p} ends committed at {committed:?}, but holds {end} messages"
                ));
            }
        }
        let mut recorded: Vec<u32> = Vec::new();
        for (id, &count) in self.dead_lettered.iter().enumerate() {
            recorded.extend(std::iter::repeat_n(id as u32, count as usize));
        }
        let mut stored = dead_letter_ids.to_vec();
        stored.sort_unstable();
        if stored != recorded {
            self.violation(format!(
                "the dead-letter topic holds {stored:?}, the handlers dead-lettered {recorded:?}"
            ));
        }
        for p in 0..self.duplicates.len() {
            if self.duplicates[p] > self.bound[p] {
                self.violation(format!(
                    "partition {p}: {} duplicate(s), above the bound of {}",
                    self.duplicates[p], self.bound[p]
                ));
            }
        }
        self.stats.duplicates = self.duplicates.iter().sum();
        self.stats.duplicate_bound = self.bound.iter().sum();
        self.stats.virtual_millis = self.now_ms();
    }

    /// A short account of what is still open, for a stalled run.
    pub fn open_work(&self) -> String {
        let mut text = String::new();
        for (p, finished) in self.finished.iter().enumerate() {
            let open: Vec<usize> = finished
                .iter()
                .enumerate()
                .filter(|(_, done)| !**done)
                .map(|(offset, _)| offset)
                .take(10)
                .collect();
            let _ = write!(
                text,
                "partition {p}: committed {:?}, unfinished offsets {open:?}; ",
                self.committed[p]
            );
        }
        text
    }
}
