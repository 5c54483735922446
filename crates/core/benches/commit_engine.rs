//! The commit engine alone: admissions and completions per second when
//! handlers finish in random order, with 1 and 16 partitions.
//!
//! Two schedules, each with 1024 messages in flight:
//! - `window`: admit 1024, complete all of them in a shuffled order;
//! - `sliding`: a steady state where each step completes a random in-flight
//!   message and admits the next one in its place (some messages stay in
//!   flight long, as slow handlers do, so the watermark lags).
//!
//! A batch is taken every 64 completions, as the runtime's acker loop would.
//! Random choices are drawn before the timed loop.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use intake_core::commit_engine::{CommitEngine, PartitionId, Ticket};
use intake_core::{
    PartitionKey, Position,
    backend::{AckBatch, AckMode},
};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const IN_FLIGHT: usize = 1024;
const BATCH_EVERY: usize = 64;
const SLIDING_STEPS: usize = 64 * 1024;

/// An engine with `partitions` assigned, admitting round-robin across them.
struct Feed {
    engine: CommitEngine,
    ids: Vec<PartitionId>,
    next_offset: Vec<i64>,
    next_partition: usize,
    batch: AckBatch,
    since_batch: usize,
}

impl Feed {
    fn new(mode: AckMode, partitions: u32) -> Self {
        let mut engine = CommitEngine::new(mode);
        let ids: Vec<_> = (0..partitions)
            .map(|partition| engine.assign(PartitionKey::new("orders", partition)))
            .collect();
        Self {
            engine,
            next_offset: vec![0; ids.len()],
            ids,
            next_partition: 0,
            batch: AckBatch::default(),
            since_batch: 0,
        }
    }

    fn admit(&mut self) -> Ticket {
        let partition = self.next_partition;
        self.next_partition = (partition + 1) % self.ids.len();
        let offset = self.next_offset[partition];
        self.next_offset[partition] = offset + 1;
        self.engine
            .admit(self.ids[partition], Position::Offset(offset))
            .expect("benchmark partitions stay assigned")
    }

    fn complete(&mut self, ticket: Ticket) {
        black_box(self.engine.complete(ticket));
        self.since_batch += 1;
        if self.since_batch == BATCH_EVERY {
            self.since_batch = 0;
            self.engine.take_batch(&mut self.batch);
            black_box(&self.batch);
            self.batch.partitions.clear();
        }
    }
}

fn window(c: &mut Criterion, mode: AckMode, partitions: u32) {
    let mut order: Vec<usize> = (0..IN_FLIGHT).collect();
    order.shuffle(&mut StdRng::seed_from_u64(7));
    let mut feed = Feed::new(mode, partitions);
    let mut tickets = Vec::with_capacity(IN_FLIGHT);

    let mut group = c.benchmark_group(format!("commit_engine/window/{mode:?}"));
    group.throughput(Throughput::Elements(IN_FLIGHT as u64));
    group.bench_function(BenchmarkId::from_parameter(partitions), |b| {
        b.iter(|| {
            tickets.clear();
            for _ in 0..IN_FLIGHT {
                tickets.push(feed.admit());
            }
            for &index in &order {
                feed.complete(tickets[index]);
            }
        })
    });
    group.finish();
}

fn sliding(c: &mut Criterion, partitions: u32) {
    let mut rng = StdRng::seed_from_u64(11);
    let slots: Vec<usize> = (0..SLIDING_STEPS)
        .map(|_| rng.random_range(0..IN_FLIGHT))
        .collect();
    let mut feed = Feed::new(AckMode::Watermark, partitions);
    let mut in_flight: Vec<Ticket> = (0..IN_FLIGHT).map(|_| feed.admit()).collect();

    let mut group = c.benchmark_group("commit_engine/sliding/Watermark");
    group.throughput(Throughput::Elements(SLIDING_STEPS as u64));
    group.bench_function(BenchmarkId::from_parameter(partitions), |b| {
        b.iter(|| {
            for &slot in &slots {
                feed.complete(in_flight[slot]);
                in_flight[slot] = feed.admit();
            }
        })
    });
    group.finish();
}

fn benches(c: &mut Criterion) {
    for partitions in [1, 16] {
        window(c, AckMode::Watermark, partitions);
    }
    window(c, AckMode::Ids, 1);
    for partitions in [1, 16] {
        sliding(c, partitions);
    }
}

criterion_group!(commit_engine, benches);
criterion_main!(commit_engine);
