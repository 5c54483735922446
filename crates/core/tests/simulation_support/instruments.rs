//! The memory broker's source and acker, and the handler stack, each
//! wrapped to report to the [`Ledger`]: what was fetched, started, finished
//! and committed, at the moment it happens.
//!
//! The wrappers add no await of their own, so the runtime's schedule is the
//! one it has without them, and they stay cancel-safe: the source wrapper
//! records an event in the same poll in which the memory source returns it.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use intake_core::dead_letter::DeadLettered;
use intake_core::memory::{MemoryAcker, MemoryBroker, MemorySource};
use intake_core::{
    ErrorClass, HandlerError, Message, Position,
    backend::{AckBatch, AckError, AckMode, Acker, Source, SourceError, SourceEvent},
};
use tower::Service;

use super::ledger::{Ending, InstanceId, Ledger};

/// The ledger, shared by the driver and every instrument.
#[derive(Clone)]
pub struct SharedLedger(Arc<Mutex<Ledger>>);

impl SharedLedger {
    pub fn new(ledger: Ledger) -> Self {
        Self(Arc::new(Mutex::new(ledger)))
    }

    /// The ledger; a panic elsewhere must not hide what it recorded.
    pub fn lock(&self) -> MutexGuard<'_, Ledger> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Where the instruments read the group's committed offsets.
#[derive(Clone)]
pub struct Group {
    pub broker: MemoryBroker,
    pub topic: &'static str,
    pub group: &'static str,
}

impl Group {
    pub fn committed(&self) -> Vec<Option<i64>> {
        self.broker
            .committed(self.topic, self.group)
            .unwrap_or_default()
    }
}

/// The message id a payload carries (the decimal id the driver produced).
pub fn id_of(message: &Message) -> Option<u32> {
    std::str::from_utf8(message.payload()).ok()?.parse().ok()
}

/// The offset of a memory broker message.
pub fn offset_of(message: &Message) -> i64 {
    match message.metadata().position() {
        Position::Offset(offset) => offset,
        _ => -1,
    }
}

/// A [`MemorySource`] that reports its events.
pub struct RecordedSource {
    pub inner: MemorySource,
    pub instance: InstanceId,
    pub ledger: SharedLedger,
    pub group: Group,
}

impl Source for RecordedSource {
    async fn next(
        &mut self,
        deliveries: &mut Vec<Message>,
        max: usize,
    ) -> Result<SourceEvent, SourceError> {
        let before = deliveries.len();
        let event = self.inner.next(deliveries, max).await?;
        match &event {
            SourceEvent::Delivered => {
                let fetched: Vec<(u32, i64, u32)> = deliveries[before..]
                    .iter()
                    .map(|message| {
                        (
                            message.metadata().partition(),
                            offset_of(message),
                            id_of(message).unwrap_or(u32::MAX),
                        )
                    })
                    .collect();
                self.ledger.lock().fetched(self.instance, &fetched, max);
            }
            SourceEvent::Assigned(partitions) => {
                let committed = self.group.committed();
                self.ledger
                    .lock()
                    .assigned(self.instance, partitions, &committed);
            }
            SourceEvent::Revoked(revocation) => {
                self.ledger
                    .lock()
                    .revoked(self.instance, revocation.partitions());
            }
            // `Exhausted` (and any event a later core adds) changes nothing
            // the ledger checks.
            _ => {}
        }
        Ok(event)
    }

    async fn close(&mut self) -> Result<(), SourceError> {
        self.inner.close().await
    }
}

/// A [`MemoryAcker`] whose batches are checked before they go out, and the
/// group's committed offsets after they came back.
pub struct RecordedAcker {
    pub inner: MemoryAcker,
    pub instance: InstanceId,
    pub ledger: SharedLedger,
    pub group: Group,
}

impl Acker for RecordedAcker {
    fn mode(&self) -> AckMode {
        self.inner.mode()
    }

    fn supports_requeue(&self) -> bool {
        self.inner.supports_requeue()
    }

    async fn ack(&mut self, batch: &AckBatch) -> Result<(), AckError> {
        self.ledger.lock().ack_sent(self.instance, batch);
        let result = self.inner.ack(batch).await;
        let committed = self.group.committed();
        self.ledger
            .lock()
            .ack_returned(self.instance, &committed, &result);
        result
    }
}

/// The outermost layer of a consumer's handler stack: reports each call
/// from its start to its answer (or to the drop of its future).
#[derive(Clone)]
pub struct Recorded<S> {
    pub inner: S,
    pub instance: InstanceId,
    pub ledger: SharedLedger,
}

/// One call in progress; reports `Dropped` unless it answered.
struct Call {
    ledger: SharedLedger,
    instance: InstanceId,
    partition: u32,
    offset: i64,
    id: u32,
    /// The assignment of the partition it runs in.
    generation: u32,
    answered: bool,
}

impl Call {
    fn end(&mut self, ending: Ending) {
        self.answered = true;
        self.ledger.lock().handler_ended(
            self.instance,
            self.partition,
            self.offset,
            self.id,
            self.generation,
            ending,
        );
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        if !self.answered {
            self.end(Ending::Dropped);
        }
    }
}

impl<S> Service<Message> for Recorded<S>
where
    S: Service<Message, Response = (), Error = HandlerError>,
    S::Future: Send + 'static,
{
    type Response = ();
    type Error = HandlerError;
    type Future = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), HandlerError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, message: Message) -> Self::Future {
        let partition = message.metadata().partition();
        let offset = offset_of(&message);
        let id = id_of(&message).unwrap_or(u32::MAX);
        let generation = self
            .ledger
            .lock()
            .handler_started(self.instance, partition, offset, id);
        let mut call = Call {
            generation,
            ledger: self.ledger.clone(),
            instance: self.instance,
            partition,
            offset,
            id,
            answered: false,
        };
        let future = self.inner.call(message);
        Box::pin(async move {
            let result = future.await;
            call.end(ending_of(&result));
            result
        })
    }
}

fn ending_of(result: &Result<(), HandlerError>) -> Ending {
    match result {
        Ok(()) => Ending::Succeeded,
        Err(error)
            if error.class() == ErrorClass::Ignore
                && error.cause().downcast_ref::<DeadLettered>().is_some() =>
        {
            Ending::DeadLettered
        }
        Err(_) => Ending::Failed,
    }
}
