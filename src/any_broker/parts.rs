//! The parts of one route, as [`AnyBroker`](super::AnyBroker) derives them
//! together: source, acker, dead-letter sink and parking.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use intake_core::backend::{
    AckBatch, AckError, AckMode, Acker, DeadLetter, DeadLetterError, DeadLetterSink, Limits,
    Message, PartitionKey, Reachability, Source, SourceError, SourceEvent,
};
use intake_core::parking::{ParkError, Parked, Parking};

/// What an `async_trait` method returns: the backends' own boxed futures
/// are passed on as they are.
type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

any_part! {
    /// A route's [`Source`], of the backend its broker is.
    AnySource: Source, "source"
}
kind_debug!(AnySource);

impl Source for AnySource {
    async fn next(
        &mut self,
        deliveries: &mut Vec<Message>,
        max: usize,
    ) -> Result<SourceEvent, SourceError> {
        dispatch!(self, source => source.next(deliveries, max).await)
    }

    fn pause(&mut self, partition: &PartitionKey) -> bool {
        dispatch!(self, source => source.pause(partition))
    }

    fn resume(&mut self, partition: &PartitionKey) {
        dispatch!(self, source => source.resume(partition))
    }

    fn set_limits(&mut self, limits: Limits) {
        dispatch!(self, source => source.set_limits(limits))
    }

    fn reachability(&self) -> Option<Reachability> {
        dispatch!(self, source => source.reachability())
    }

    async fn close(&mut self) -> Result<(), SourceError> {
        dispatch!(self, source => source.close().await)
    }
}

any_part! {
    /// A route's [`Acker`], of the backend its broker is.
    AnyAcker: Acker, "acker"
}
kind_debug!(AnyAcker);

impl Acker for AnyAcker {
    fn mode(&self) -> AckMode {
        dispatch!(self, acker => acker.mode())
    }

    fn supports_requeue(&self) -> bool {
        dispatch!(self, acker => acker.supports_requeue())
    }

    fn supports_delayed_requeue(&self) -> bool {
        dispatch!(self, acker => acker.supports_delayed_requeue())
    }

    async fn ack(&mut self, batch: &AckBatch) -> Result<(), AckError> {
        dispatch!(self, acker => acker.ack(batch).await)
    }
}

any_part! {
    /// A route's [`DeadLetterSink`], of the backend its broker is.
    AnyDeadLetterSink: DeadLetterSink, "dead-letter sink"
}
kind_debug!(AnyDeadLetterSink);

// Written out as `async_trait` expands the trait, so that the backend's
// boxed future is returned as it is rather than boxed a second time.
impl DeadLetterSink for AnyDeadLetterSink {
    fn write<'life0, 'life1, 'async_trait>(
        &'life0 self,
        letter: &'life1 DeadLetter,
    ) -> BoxFuture<'async_trait, Result<(), DeadLetterError>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        dispatch!(self, sink => sink.write(letter))
    }
}

any_part! {
    /// A route's [`Parking`], of the backend its broker is.
    #[derive(Clone)]
    AnyParking: Parking, "parking"
}
kind_debug!(AnyParking);

// As the dead-letter sink: the backend's boxed future, not boxed again.
impl Parking for AnyParking {
    fn park<'life0, 'life1, 'async_trait>(
        &'life0 self,
        message: &'life1 Message,
        delay: Duration,
    ) -> BoxFuture<'async_trait, Result<Parked, ParkError>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        dispatch!(self, parking => parking.park(message, delay))
    }

    fn is_returned_copy(&self, message: &Message) -> bool {
        dispatch!(self, parking => parking.is_returned_copy(message))
    }

    fn parks(&self, message: &Message) -> u32 {
        dispatch!(self, parking => parking.parks(message))
    }
}
