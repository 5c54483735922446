//! The acknowledgement side of a run: hands the commit engine's batches to
//! the acker one at a time, in order.
//!
//! It runs in the same task as the dispatcher (joined, not spawned). While a
//! batch is with the broker, completions accumulate in the engine, so a slow
//! broker gets larger batches, not a queue.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Waker;

use tokio::sync::{mpsc, oneshot};

use crate::acker::{AckBatch, AckError, Acker};
use crate::error::chain_for_log;
use crate::message::PartitionKey;
use crate::observer::ConsumerObserver;

/// A batch for the acker, with a reply channel when the sender must wait for
/// the broker's answer (revocation, shutdown).
pub(crate) struct AckRequest {
    pub(crate) batch: AckBatch,
    pub(crate) reply: Option<oneshot::Sender<Result<(), AckError>>>,
}

/// A request as queued: numbered, so a fence can tell the requests sent
/// before it from those after.
struct Queued {
    number: u64,
    request: AckRequest,
}

/// Partitions whose assignment ended while requests with their work were
/// still queued, each with the number of the first request sent after: the
/// work of earlier requests belongs to the ended assignment and is dropped,
/// never committed. A broker that handed the partition back to this consumer
/// would accept it, and a committed position of the old assignment would
/// pass the new assignment's deliveries (or move back behind them).
#[derive(Default)]
struct Fences {
    /// Whether `fenced` holds anything: the ack loop looks at the list only
    /// then.
    any: AtomicBool,
    fenced: Mutex<Vec<(PartitionKey, u64)>>,
}

impl Fences {
    /// Removes the fenced partitions' work from request `number`.
    fn apply(&self, number: u64, batch: &mut AckBatch) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut fenced = self.fenced.lock().unwrap_or_else(PoisonError::into_inner);
        batch.partitions.retain(|ack| {
            !fenced
                .iter()
                .any(|(partition, first)| number < *first && *partition == ack.partition)
        });
        // A fence has done its work once the loop reaches its first request.
        fenced.retain(|(_, first)| number + 1 < *first);
        self.any.store(!fenced.is_empty(), Ordering::Release);
    }
}

/// The dispatcher's end: sends batches, knows whether one is under way, and
/// gets back the batches that failed so their work can be sent again.
pub(crate) struct AckQueue {
    sender: mpsc::UnboundedSender<Queued>,
    outstanding: Arc<AtomicUsize>,
    failed: mpsc::UnboundedReceiver<AckBatch>,
    /// How many batches wait in `failed`: the dispatcher looks every pass,
    /// and a load is what an empty channel should cost (`try_recv` on it
    /// cost about 250 instructions).
    returned: Arc<AtomicUsize>,
    /// The number of the next request.
    next: Arc<AtomicU64>,
    fences: Arc<Fences>,
}

impl AckQueue {
    /// A batch the acker failed to deliver, if any came back.
    pub(crate) fn take_failed(&mut self) -> Option<AckBatch> {
        if self.returned.load(Ordering::Acquire) == 0 {
            return None;
        }
        let batch = self.failed.try_recv().ok()?;
        self.returned.fetch_sub(1, Ordering::AcqRel);
        Some(batch)
    }

    pub(crate) fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Acquire)
    }

    /// Queues a batch; `false` if the ack loop is gone.
    pub(crate) fn send(&self, request: AckRequest) -> bool {
        self.outstanding.fetch_add(1, Ordering::AcqRel);
        let number = self.next.fetch_add(1, Ordering::AcqRel);
        if self.sender.send(Queued { number, request }).is_err() {
            self.outstanding.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// Drops `partition`'s work from every request queued so far: its
    /// assignment ended (see [`Fences`]).
    pub(crate) fn fence(&self, partition: PartitionKey) {
        if self.outstanding() == 0 {
            return;
        }
        let first = self.next.load(Ordering::Acquire);
        let mut fenced = self
            .fences
            .fenced
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        fenced.push((partition, first));
        self.fences.any.store(true, Ordering::Release);
    }
}

/// Creates the queue and the loop future that drains it into `acker`.
pub(crate) fn ack_loop<A: Acker>(
    mut acker: A,
    observer: Option<Arc<dyn ConsumerObserver>>,
    wake_dispatcher: Waker,
    failures: Arc<AtomicUsize>,
) -> (AckQueue, impl std::future::Future<Output = ()> + Send) {
    let (sender, mut receiver) = mpsc::unbounded_channel::<Queued>();
    let (failed_sender, failed) = mpsc::unbounded_channel::<AckBatch>();
    let outstanding = Arc::new(AtomicUsize::new(0));
    let returned = Arc::new(AtomicUsize::new(0));
    let fences = Arc::new(Fences::default());
    let queue = AckQueue {
        sender,
        outstanding: outstanding.clone(),
        failed,
        returned: returned.clone(),
        next: Arc::new(AtomicU64::new(0)),
        fences: fences.clone(),
    };
    let drain = async move {
        while let Some(Queued {
            number,
            mut request,
        }) = receiver.recv().await
        {
            fences.apply(number, &mut request.batch);
            let started = std::time::Instant::now();
            let result = if request.batch.is_empty() {
                // A barrier: everything sent before it has been handled.
                Ok(())
            } else {
                acker.ack(&request.batch).await
            };
            if let Some(observer) = &observer {
                observer.on_ack(
                    &request.batch,
                    result.as_ref().map(|_| ()),
                    started.elapsed(),
                );
            }
            if let Err(error) = &result {
                failures.fetch_add(1, Ordering::AcqRel);
                tracing::warn!(
                    error = %chain_for_log(error),
                    messages = request.batch.len(),
                    sync = request.batch.sync,
                    "acknowledgement failed; the messages stay unacknowledged and may be delivered again"
                );
            }
            match request.reply {
                Some(reply) => {
                    let _ = reply.send(result);
                }
                // Nobody waits for it: give the work back, so the next batch
                // sends it again instead of leaving it to a later watermark.
                None if result.is_err() => {
                    let sent = failed_sender.send(request.batch).is_ok();
                    returned.fetch_add(usize::from(sent), Ordering::AcqRel);
                }
                None => {}
            }
            outstanding.fetch_sub(1, Ordering::AcqRel);
            // The dispatcher holds back its next batch while one is under
            // way; tell it this one is done.
            wake_dispatcher.wake_by_ref();
        }
    };
    (queue, drain)
}
