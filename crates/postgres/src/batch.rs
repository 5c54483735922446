//! [`ExactlyOnceBatch`]: one transaction for a batch of messages, with a
//! processed-marker per message.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use intake_core::{FromMessage, HandlerError, Message};
use tower::Service;

use crate::context::Context;
use crate::counters::ExactlyOnceCounters;
use crate::error::Error;
use crate::handler::IntoTxResult;
use crate::message_id::MarkerKey;
use crate::tx::Tx;

/// An async fn (or closure) that handles a batch in one transaction:
/// `async fn(Tx, Vec<T>) -> R`, where each `T` is extracted from one message
/// ([`FromMessage`]: `Json<Order>`, `Payload`, `Message`, …) and `R` is `()`
/// or `Result<(), E>` ([`IntoTxResult`]).
///
/// `Item` records `T` (and how it is extracted); you never name it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an exactly-once batch handler fn",
    label = "expected an async fn taking a `Tx` and a `Vec<T>`, returning `()` or `Result<(), E>`",
    note = "`T` is extracted from each message: `Json<Order>`, `Decoded<T>`, `Payload` or `Message`",
    note = "the fn and its future must be `Send + 'static`"
)]
pub trait TxBatchHandler<Item>: Clone + Send + Sized + 'static {
    /// What each message becomes.
    type Item: Send + 'static;
    /// The fn's future.
    type Future: Future<Output: IntoTxResult> + Send + 'static;

    /// Extracts one message's item, or the error that message gets.
    fn extract(message: Message) -> Result<Self::Item, HandlerError>;

    /// Calls the fn.
    fn call(self, tx: Tx, items: Vec<Self::Item>) -> Self::Future;
}

impl<F, Fut, T, M> TxBatchHandler<(M, T)> for F
where
    F: FnOnce(Tx, Vec<T>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output: IntoTxResult> + Send + 'static,
    T: FromMessage<M> + Send + 'static,
{
    type Item = T;
    type Future = Fut;

    fn extract(message: Message) -> Result<T, HandlerError> {
        T::from_message(message)
    }

    fn call(self, tx: Tx, items: Vec<T>) -> Fut {
        self(tx, items)
    }
}

/// The future of an exactly-once batch service.
pub type BatchResponseFuture =
    Pin<Box<dyn Future<Output = Result<Vec<Result<(), HandlerError>>, Infallible>> + Send>>;

/// A batch handler (`tower::Service<Vec<Message>>`) that runs `F` on a
/// whole batch in one transaction, which also inserts a processed-marker per
/// message (one statement for all of them). Build it with
/// [`ExactlyOnceBuilder::batch_handler`](crate::ExactlyOnceBuilder::batch_handler).
///
/// It returns one outcome per message, in order, and never fails as a
/// whole; so it plugs into intake's batch layer (which turns it into a
/// per-message handler) or can be called directly with batches you form.
///
/// For a batch:
/// - a message without a usable id, or whose payload does not extract, gets
///   its own error and is left out; so is a second copy of one message in
///   the same batch (retryable without backoff: the retry finds the first
///   copy's marker and is skipped);
/// - messages whose marker already existed are skipped (acknowledged,
///   counted as [duplicates](ExactlyOnceCounters::duplicates)), and the fn gets
///   only the new ones; if there are none, it is not called;
/// - `Ok` commits the effects and every marker, and then every message is
///   `Ok`;
/// - a permanent error from the fn (a constraint violation, say) rolls back
///   and then runs each new message alone, in its own transaction, so that
///   only the messages at fault fail and the rest commit;
/// - any other failure (retryable, a failed commit) rolls back and gives every
///   new message that error.
pub struct ExactlyOnceBatch<F, Item> {
    handler: F,
    context: Arc<Context>,
    _item: PhantomData<fn() -> Item>,
}

impl<F, Item> ExactlyOnceBatch<F, Item> {
    pub(crate) fn new(handler: F, context: Arc<Context>) -> Self {
        Self {
            handler,
            context,
            _item: PhantomData,
        }
    }

    /// The counters of this handler (shared by its clones).
    pub fn counters(&self) -> &Arc<ExactlyOnceCounters> {
        &self.context.counters
    }

    /// The consumer group whose markers this handler writes.
    pub fn group(&self) -> &str {
        &self.context.group
    }
}

impl<F: Clone, Item> Clone for ExactlyOnceBatch<F, Item> {
    fn clone(&self) -> Self {
        Self {
            handler: self.handler.clone(),
            context: Arc::clone(&self.context),
            _item: PhantomData,
        }
    }
}

impl<F, Item> fmt::Debug for ExactlyOnceBatch<F, Item> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExactlyOnceBatch")
            .field("group", &self.context.group)
            .field("table", &self.context.table)
            .field("message_id", &self.context.message_id)
            .field("handler", &std::any::type_name::<F>())
            .finish_non_exhaustive()
    }
}

impl<F, Item> Service<Vec<Message>> for ExactlyOnceBatch<F, Item>
where
    F: TxBatchHandler<Item>,
    Item: 'static,
{
    type Response = Vec<Result<(), HandlerError>>;
    type Error = Infallible;
    type Future = BatchResponseFuture;

    fn poll_ready(&mut self, _cx: &mut TaskContext<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, batch: Vec<Message>) -> BatchResponseFuture {
        let context = Arc::clone(&self.context);
        let handler = self.handler.clone();
        Box::pin(async move { Ok(process_batch(context, handler, batch).await) })
    }
}

/// The messages of a batch that go to the database, in parallel vectors.
struct Pending<T> {
    /// Index of each in the batch.
    indexes: Vec<usize>,
    keys: Vec<MarkerKey>,
    items: Vec<T>,
    /// Each message, for running it alone if the batch fails permanently
    /// (a clone is a few reference-count bumps).
    copies: Vec<Message>,
}

async fn process_batch<F, Item>(
    context: Arc<Context>,
    handler: F,
    batch: Vec<Message>,
) -> Vec<Result<(), HandlerError>>
where
    F: TxBatchHandler<Item>,
{
    let mut outcomes: Vec<Result<(), HandlerError>> = Vec::with_capacity(batch.len());
    let mut keyed = Vec::with_capacity(batch.len());
    for (index, message) in batch.into_iter().enumerate() {
        match context.message_id.key_of(&message) {
            Ok(key) => {
                outcomes.push(Ok(()));
                keyed.push((index, key, message));
            }
            Err(error) => outcomes.push(Err(error.into())),
        }
    }

    let repeated = later_copies(keyed.iter().map(|(_, key, _)| key));
    let mut pending = Pending {
        indexes: Vec::with_capacity(keyed.len()),
        keys: Vec::with_capacity(keyed.len()),
        items: Vec::with_capacity(keyed.len()),
        copies: Vec::with_capacity(keyed.len()),
    };
    for ((index, key, message), repeated) in keyed.into_iter().zip(repeated) {
        if repeated {
            let error = Error::RepeatedInBatch {
                message_id: key.id.clone(),
            };
            outcomes[index] = Err(HandlerError::from(error).without_backoff());
            continue;
        }
        let copy = message.clone();
        match F::extract(message) {
            Ok(item) => {
                pending.indexes.push(index);
                pending.keys.push(key);
                pending.items.push(item);
                pending.copies.push(copy);
            }
            Err(error) => outcomes[index] = Err(error),
        }
    }
    if pending.keys.is_empty() {
        return outcomes;
    }

    let Pending {
        indexes,
        keys,
        items,
        copies,
    } = pending;
    let Err(failure) = transact(&context, handler.clone(), &keys, items).await else {
        return outcomes;
    };
    if failure.from_handler && failure.error.is_permanent() && failure.affected.len() > 1 {
        // Some message made the fn fail for good; find which by running each
        // alone, so that the others still commit.
        for at in failure.affected {
            let outcome = match F::extract(copies[at].clone()) {
                Ok(item) => transact(&context, handler.clone(), &keys[at..=at], vec![item])
                    .await
                    .map_err(|failure| failure.error),
                Err(error) => Err(error),
            };
            if outcome.is_err() {
                context.counters.add_rolled_back(1);
            }
            outcomes[indexes[at]] = outcome;
        }
    } else {
        context.counters.add_rolled_back(failure.affected.len());
        let errors = share(failure.error, failure.affected.len());
        for (at, error) in failure.affected.into_iter().zip(errors) {
            outcomes[indexes[at]] = Err(error);
        }
    }
    outcomes
}

/// A batch transaction that did not commit.
struct Failure {
    error: HandlerError,
    /// Indexes (into the keys) of the messages it leaves unprocessed.
    affected: Vec<usize>,
    /// The fn itself failed (rather than a step of the transaction).
    from_handler: bool,
}

impl Failure {
    fn of_step(error: Error, affected: Vec<usize>) -> Self {
        Self {
            error: error.into(),
            affected,
            from_handler: false,
        }
    }
}

/// Runs `items` (one per key) in one transaction. Counts processed messages
/// and duplicates; failures are counted by the caller, which may retry them.
async fn transact<F, Item>(
    context: &Context,
    handler: F,
    keys: &[MarkerKey],
    items: Vec<F::Item>,
) -> Result<(), Failure>
where
    F: TxBatchHandler<Item>,
{
    let everything = || (0..keys.len()).collect::<Vec<_>>();
    let mut transaction = context
        .begin()
        .await
        .map_err(|error| Failure::of_step(error, everything()))?;
    let key_refs: Vec<&MarkerKey> = keys.iter().collect();
    let (mut new, id) = match context.mark_all(&mut transaction, &key_refs).await {
        Ok(marked) => marked,
        Err(error) => {
            context.roll_back(transaction).await;
            return Err(Failure::of_step(error, everything()));
        }
    };
    new.sort_unstable();
    let duplicates = keys.len() - new.len();
    if duplicates > 0 {
        context.counters.add_duplicates(duplicates);
        tracing::debug!(
            group = %context.group,
            duplicates,
            "already processed; skipped and acknowledged"
        );
    }
    let Some(id) = id.filter(|_| !new.is_empty()) else {
        context.roll_back(transaction).await;
        return Ok(());
    };

    let mut is_new = vec![false; keys.len()];
    for &at in &new {
        is_new[at] = true;
    }
    let items: Vec<F::Item> = items
        .into_iter()
        .zip(is_new)
        .filter_map(|(item, is_new)| is_new.then_some(item))
        .collect();

    let (tx, lent) = Tx::lend(transaction);
    let outcome = handler.call(tx, items).await.into_tx_result();
    let Some(transaction) = lent.take_back() else {
        return Err(Failure::of_step(Error::TransactionEscaped, new));
    };
    match outcome {
        Ok(()) => match context.commit(transaction, id).await {
            Ok(()) => {
                context.counters.add_processed(new.len());
                Ok(())
            }
            Err(error) => Err(Failure::of_step(error, new)),
        },
        Err(error) => {
            context.roll_back(transaction).await;
            Err(Failure {
                error,
                affected: new,
                from_handler: true,
            })
        }
    }
}

/// For each key, whether an equal key came earlier: the later copies of a
/// message that appears twice in one batch.
fn later_copies<'a>(keys: impl ExactSizeIterator<Item = &'a MarkerKey>) -> Vec<bool> {
    let keys: Vec<&MarkerKey> = keys.collect();
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by(|&a, &b| keys[a].cmp(keys[b]).then(a.cmp(&b)));
    let mut repeated = vec![false; keys.len()];
    for pair in order.windows(2) {
        if keys[pair[0]] == keys[pair[1]] {
            repeated[pair[1]] = true;
        }
    }
    repeated
}

/// `count` errors of the class of `error`, sharing its cause.
fn share(error: HandlerError, count: usize) -> Vec<HandlerError> {
    match count {
        0 => return Vec::new(),
        1 => return vec![error],
        _ => {}
    }
    let class = error.class();
    let attempts = error.attempts();
    let shared = Arc::new(error);
    (0..count)
        .map(|_| {
            HandlerError::retryable(SharedCause(Arc::clone(&shared)))
                .reclassify(class)
                .with_attempts(attempts)
        })
        .collect()
}

/// The cause of one failure that several messages share.
#[derive(Debug)]
struct SharedCause(Arc<HandlerError>);

impl fmt::Display for SharedCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(HandlerError::cause(&self.0), f)
    }
}

impl std::error::Error for SharedCause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        HandlerError::cause(&self.0).source()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> MarkerKey {
        MarkerKey {
            source: "orders".into(),
            partition: -1,
            id: id.to_owned(),
        }
    }

    #[test]
    fn only_later_copies_of_a_message_are_marked_repeated() {
        let keys = [key("b"), key("a"), key("b"), key("c"), key("a"), key("b")];
        assert_eq!(
            later_copies(keys.iter()),
            vec![false, false, true, false, true, true]
        );
    }

    #[test]
    fn a_shared_error_keeps_its_class_and_cause_for_every_message() {
        let errors = share(HandlerError::permanent("row too wide"), 3);
        assert_eq!(errors.len(), 3);
        for error in errors {
            assert!(error.is_permanent());
            assert_eq!(error.cause().to_string(), "row too wide");
        }
    }
}
