//! [`ExactlyOnce`]: a per-message handler whose effects and processed-marker
//! commit together.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use intake_core::{ConfigError, HandlerError, Message};
use sqlx::PgPool;
use tower::Service;

// The one import loop of the crate, as in every adapter: a type and the
// builder that makes it (`ExactlyOnce::builder` returns the builder, whose
// `handler` returns an `ExactlyOnce`).
use crate::builder::ExactlyOnceBuilder;
use crate::context::Context;
use crate::counters::ExactlyOnceCounters;
use crate::error::Error;
use crate::handler::{IntoTxResult, TxHandler};
use crate::tx::Tx;

/// The future of an exactly-once service.
///
/// Boxed: it holds the transaction across the user's future, and sqlx boxes
/// each statement's future anyway, so a named type would save one allocation
/// next to several.
pub type ResponseFuture = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>;

/// The exactly-once service over `handler` for consumer group `group`, with
/// the default [marker table](crate::MarkerTable), message identity
/// ([`MessageId::Position`](crate::MessageId::Position)) and isolation. See
/// [`ExactlyOnce::builder`] for the others.
///
/// # Errors
///
/// An empty or overlong group name.
pub fn exactly_once<F, Args>(
    pool: PgPool,
    group: impl Into<String>,
    handler: F,
) -> Result<ExactlyOnce<F, Args>, ConfigError>
where
    F: TxHandler<Args>,
{
    ExactlyOnce::builder(pool, group).handler(handler)
}

/// A handler (`tower::Service<Message>`) that runs `F` in a transaction which
/// also records the message as processed. See the [crate docs](crate).
///
/// For each message:
/// 1. the message id is read and the arguments extracted (a bad payload
///    fails here, before any database work);
/// 2. a transaction begins and the processed-marker is inserted with
///    `ON CONFLICT DO NOTHING`;
/// 3. if the marker existed, the message was processed before (a redelivery
///    after a crash between commit and acknowledgement): the transaction is
///    rolled back, the handler does not run, the message is acknowledged and
///    counted as a [duplicate](ExactlyOnceCounters::duplicates);
/// 4. otherwise the handler runs with the [`Tx`]; on `Ok` one statement
///    checks that the transaction is still the marker's and has not failed,
///    the transaction commits, and only then does the service return `Ok`
///    (so the runtime acknowledges only committed messages); on `Err` it
///    rolls back.
///
/// Clones share the pool, settings and [counters](Self::counters).
pub struct ExactlyOnce<F, Args> {
    handler: F,
    context: Arc<Context>,
    _args: PhantomData<fn() -> Args>,
}

impl ExactlyOnce<(), ()> {
    /// Settings for an exactly-once handler of consumer group `group`.
    pub fn builder(pool: PgPool, group: impl Into<String>) -> ExactlyOnceBuilder {
        ExactlyOnceBuilder::new(pool, group)
    }
}

impl<F, Args> ExactlyOnce<F, Args> {
    pub(crate) fn new(handler: F, context: Arc<Context>) -> Self {
        Self {
            handler,
            context,
            _args: PhantomData,
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

impl<F: Clone, Args> Clone for ExactlyOnce<F, Args> {
    fn clone(&self) -> Self {
        Self {
            handler: self.handler.clone(),
            context: Arc::clone(&self.context),
            _args: PhantomData,
        }
    }
}

impl<F, Args> fmt::Debug for ExactlyOnce<F, Args> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExactlyOnce")
            .field("group", &self.context.group)
            .field("table", &self.context.table)
            .field("message_id", &self.context.message_id)
            .field("handler", &std::any::type_name::<F>())
            .finish_non_exhaustive()
    }
}

impl<F, Args> Service<Message> for ExactlyOnce<F, Args>
where
    F: TxHandler<Args>,
    Args: 'static,
{
    type Response = ();
    type Error = HandlerError;
    type Future = ResponseFuture;

    /// Always ready: the pool bounds how many transactions run, and a
    /// message that waits too long for a connection fails retryably.
    fn poll_ready(&mut self, _cx: &mut TaskContext<'_>) -> Poll<Result<(), HandlerError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, message: Message) -> ResponseFuture {
        Box::pin(process(
            Arc::clone(&self.context),
            self.handler.clone(),
            message,
        ))
    }
}

async fn process<F, Args>(
    context: Arc<Context>,
    handler: F,
    message: Message,
) -> Result<(), HandlerError>
where
    F: TxHandler<Args>,
{
    let key = context.message_id.key_of(&message)?;
    let extracted = F::extract(message)?;

    let mut transaction = context.begin().await?;
    let Some(id) = context.mark(&mut transaction, &key).await? else {
        context.roll_back(transaction).await;
        context.counters.add_duplicates(1);
        tracing::debug!(
            group = %context.group,
            source = %key.source,
            partition = key.partition,
            message_id = %key.id,
            "already processed; skipped and acknowledged"
        );
        return Ok(());
    };

    let (tx, lent) = Tx::lend(transaction);
    let outcome = handler.call(tx, extracted).await.into_tx_result();
    let Some(transaction) = lent.take_back() else {
        context.counters.add_rolled_back(1);
        return Err(Error::TransactionEscaped.into());
    };
    match outcome {
        Ok(()) => match context.commit(transaction, id).await {
            Ok(()) => {
                context.counters.add_processed(1);
                Ok(())
            }
            Err(error) => {
                context.counters.add_rolled_back(1);
                Err(error.into())
            }
        },
        Err(error) => {
            context.roll_back(transaction).await;
            context.counters.add_rolled_back(1);
            Err(error)
        }
    }
}
