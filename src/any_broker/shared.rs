//! The parts [`AnyBroker`](super::AnyBroker) derives beside routes: the
//! publisher, a route's dead-letter store, its lag probe and a group's
//! control channel.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use intake_core::dead_letter::store::{
    DeadLetterStore, Filter, LetterId, Page, Replay, ReplayReport, Selection, StoreError,
    StoredLetter, Summary,
};
use intake_core::group_control::{ControlChannel, ControlError, ControlFeed, ControlLog};
use intake_core::lag::{LagError, LagProbe, ParkedTier, PartitionLag};
use intake_core::publish::{Confirmation, Output, PublishError, Publisher};

/// What an `async_trait` method returns: the backends' own boxed futures
/// are passed on as they are.
type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

any_part! {
    /// The broker's [`Publisher`], of the backend it is.
    ///
    /// Its receipt is boxed ([`AnyReceipt`]): one allocation per output
    /// [sent](Publisher::send), which publishing makes anyway for the
    /// output itself. [`publish`](Publisher::publish) is forwarded to the
    /// backend's own and boxes nothing.
    AnyPublisher: Publisher, "publisher"
}
kind_debug!(AnyPublisher);

/// The receipt of an output [sent](Publisher::send) through an
/// [`AnyPublisher`]: the backend's own receipt, boxed. It resolves once
/// the broker confirmed the output, as the backend's does.
pub type AnyReceipt = BoxFuture<'static, Result<Confirmation, PublishError>>;

impl Publisher for AnyPublisher {
    type Receipt = AnyReceipt;

    async fn send(&self, output: Output) -> Result<AnyReceipt, PublishError> {
        dispatch!(self, publisher => {
            let receipt = publisher.send(output).await?;
            Ok(Box::pin(receipt) as AnyReceipt)
        })
    }

    async fn publish(&self, output: Output) -> Result<Confirmation, PublishError> {
        dispatch!(self, publisher => publisher.publish(output).await)
    }
}

any_part! {
    /// A route's [`DeadLetterStore`], of the backend its broker is.
    AnyDeadLetterStore: DeadLetterStore, "dead-letter store"
}
kind_debug!(AnyDeadLetterStore);

// Written out as `async_trait` expands the trait, so that the backend's
// boxed futures are returned as they are rather than boxed a second time.
impl DeadLetterStore for AnyDeadLetterStore {
    fn destination(&self) -> &str {
        dispatch!(self, store => store.destination())
    }

    fn count<'life0, 'life1, 'async_trait>(
        &'life0 self,
        filter: &'life1 Filter,
    ) -> BoxFuture<'async_trait, Result<u64, StoreError>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        dispatch!(self, store => store.count(filter))
    }

    fn summary<'life0, 'life1, 'async_trait>(
        &'life0 self,
        filter: &'life1 Filter,
    ) -> BoxFuture<'async_trait, Result<Summary, StoreError>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        dispatch!(self, store => store.summary(filter))
    }

    fn list<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        filter: &'life1 Filter,
        limit: usize,
        after: Option<&'life2 LetterId>,
    ) -> BoxFuture<'async_trait, Result<Page, StoreError>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        dispatch!(self, store => store.list(filter, limit, after))
    }

    fn read<'life0, 'life1, 'async_trait>(
        &'life0 self,
        id: &'life1 LetterId,
    ) -> BoxFuture<'async_trait, Result<StoredLetter, StoreError>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        dispatch!(self, store => store.read(id))
    }

    fn replay<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        selection: &'life1 Selection,
        replay: &'life2 Replay,
    ) -> BoxFuture<'async_trait, Result<ReplayReport, StoreError>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        dispatch!(self, store => store.replay(selection, replay))
    }

    fn purge<'life0, 'life1, 'async_trait>(
        &'life0 self,
        selection: &'life1 Selection,
    ) -> BoxFuture<'async_trait, Result<u64, StoreError>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        dispatch!(self, store => store.purge(selection))
    }
}

any_part! {
    /// A route's [`LagProbe`] (broker lag and parked backlog), of the
    /// backend its broker is.
    AnyLagProbe: LagProbe, "lag probe"
}
kind_debug!(AnyLagProbe);

impl LagProbe for AnyLagProbe {
    fn group(&self) -> &str {
        dispatch!(self, probe => probe.group())
    }

    async fn lag(&self) -> Result<Vec<PartitionLag>, LagError> {
        dispatch!(self, probe => probe.lag().await)
    }

    async fn parked(&self) -> Result<Option<u64>, LagError> {
        dispatch!(self, probe => probe.parked().await)
    }

    async fn parked_tiers(&self) -> Result<Option<Vec<ParkedTier>>, LagError> {
        dispatch!(self, probe => probe.parked_tiers().await)
    }
}

any_part! {
    /// One of a consumer group's control logs ([`ControlChannel`]), of the
    /// backend its broker is.
    AnyControlChannel: ControlChannel, "control channel"
}
kind_debug!(AnyControlChannel);

impl ControlChannel for AnyControlChannel {
    fn log(&self) -> ControlLog {
        dispatch!(self, channel => channel.log())
    }

    async fn append(&self, record: Bytes) -> Result<(), ControlError> {
        dispatch!(self, channel => channel.append(record).await)
    }

    async fn follow(&self) -> Result<ControlFeed, ControlError> {
        dispatch!(self, channel => channel.follow().await)
    }
}
