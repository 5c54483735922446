//! A stand-in for the runtime, for tests of the source and acker alone:
//! it "processes" every delivery at once, acks watermarks, and answers
//! revocations as the runtime does (sync commit, then complete).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use intake_core::source::{RevocationOutcome, RevokedPartition};
use intake_core::{
    AckBatch, Acker, Message, PartitionAck, PartitionKey, Position, Source, SourceEvent,
};
use intake_kafka::{KafkaAcker, KafkaSource};

pub struct Driver {
    pub source: KafkaSource,
    pub acker: KafkaAcker,
    /// Every delivery, in order.
    pub received: Vec<Message>,
    /// Partitions currently assigned.
    pub assigned: BTreeSet<PartitionKey>,
    /// Revocations seen.
    pub revocations: usize,
    /// Whether deliveries are acked (watermark committed) as they arrive.
    pub ack: bool,
    watermarks: BTreeMap<PartitionKey, i64>,
    buffer: Vec<Message>,
}

impl Driver {
    pub fn new(source: KafkaSource, ack: bool) -> Self {
        let acker = source.acker();
        Self {
            source,
            acker,
            received: Vec::new(),
            assigned: BTreeSet::new(),
            revocations: 0,
            ack,
            watermarks: BTreeMap::new(),
            buffer: Vec::new(),
        }
    }

    /// Runs until `total` deliveries were received overall, or `within`
    /// passed. Returns how many were received overall.
    pub async fn receive_until(&mut self, total: usize, within: Duration) -> usize {
        let _ = tokio::time::timeout(within, async {
            while self.received.len() < total {
                if self.step(64).await.is_err() {
                    break;
                }
            }
        })
        .await;
        self.received.len()
    }

    /// Runs for `duration`, handling whatever comes.
    pub async fn run_for(&mut self, duration: Duration) {
        let _ = tokio::time::timeout(duration, async {
            loop {
                if self.step(64).await.is_err() {
                    break;
                }
            }
        })
        .await;
    }

    /// Runs until `stop` is set.
    pub async fn run_until_stopped(&mut self, stop: &std::sync::atomic::AtomicBool) {
        while !stop.load(std::sync::atomic::Ordering::Acquire) {
            self.run_for(Duration::from_millis(200)).await;
        }
    }

    /// Takes one event from the source and handles it.
    pub async fn step(&mut self, max: usize) -> Result<(), intake_core::SourceError> {
        self.buffer.clear();
        match self.source.next(&mut self.buffer, max).await? {
            SourceEvent::Delivered => {
                let mut batch = AckBatch::default();
                for message in self.buffer.drain(..) {
                    let key = message.metadata().partition_key();
                    if let Position::Offset(offset) = message.metadata().position() {
                        self.watermarks.insert(key, offset);
                    }
                    self.received.push(message);
                }
                if self.ack {
                    for (partition, offset) in &self.watermarks {
                        let mut ack = PartitionAck::new(partition.clone());
                        ack.watermark = Some(Position::Offset(*offset));
                        batch.partitions.push(ack);
                    }
                    self.acker.ack(&batch).await.expect("commit accepted");
                }
            }
            SourceEvent::Assigned(partitions) => {
                for partition in partitions {
                    self.watermarks.remove(&partition);
                    self.assigned.insert(partition);
                }
            }
            SourceEvent::Revoked(revocation) => {
                self.revocations += 1;
                let mut outcome = RevocationOutcome::default();
                let mut batch = AckBatch {
                    sync: true,
                    ..AckBatch::default()
                };
                for partition in revocation.partitions() {
                    self.assigned.remove(partition);
                    let committed = if self.ack {
                        self.watermarks.remove(partition).map(Position::Offset)
                    } else {
                        None
                    };
                    if let Some(position) = committed {
                        let mut ack = PartitionAck::new(partition.clone());
                        ack.watermark = Some(position);
                        batch.partitions.push(ack);
                    }
                    outcome.partitions.push(RevokedPartition {
                        partition: partition.clone(),
                        committed,
                        unfinished: 0,
                    });
                }
                // As the runtime does, a failed commit is reported and the
                // revocation completes anyway (the callback commits again).
                if !batch.partitions.is_empty()
                    && let Err(error) = self.acker.ack(&batch).await
                {
                    eprintln!("sync commit on revoke failed: {error}");
                }
                revocation.complete(outcome);
            }
            SourceEvent::Exhausted => {}
        }
        Ok(())
    }

    /// Shuts down as the runtime does: a final synchronous commit of every
    /// watermark, then close.
    pub async fn finish(mut self) -> Self {
        if self.ack {
            let mut batch = AckBatch {
                sync: true,
                ..AckBatch::default()
            };
            for (partition, offset) in &self.watermarks {
                let mut ack = PartitionAck::new(partition.clone());
                ack.watermark = Some(Position::Offset(*offset));
                batch.partitions.push(ack);
            }
            if let Err(error) = self.acker.ack(&batch).await {
                eprintln!("final commit failed: {error}");
            }
        }
        self.source.close().await.expect("close");
        self
    }

    /// Payloads received, as text.
    pub fn payloads(&self) -> Vec<String> {
        self.received
            .iter()
            .map(|message| String::from_utf8_lossy(message.payload()).into_owned())
            .collect()
    }
}
