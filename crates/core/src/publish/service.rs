//! [`PublishService`]: runs the handler, publishes its outputs and answers
//! once the broker confirmed every one (and, in key or partition order,
//! every earlier output of the input's key: `turn.rs`).

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use tower::Service;

use super::output::Outputs;
use super::turn::publish_in_turn;
use super::{PublishError, PublishFuture, Publisher};
use crate::consumer::turns::current_turn;
use crate::error::HandlerError;
use crate::message::Message;
use crate::trace::TRACEPARENT;

/// The service of [`PublishLayer`](super::PublishLayer).
pub struct PublishService<S, P> {
    inner: S,
    publisher: Arc<P>,
}

impl<S, P> PublishService<S, P> {
    pub(super) fn new(inner: S, publisher: Arc<P>) -> Self {
        Self { inner, publisher }
    }
}

impl<S: Clone, P> Clone for PublishService<S, P> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            publisher: Arc::clone(&self.publisher),
        }
    }
}

impl<S: fmt::Debug, P> fmt::Debug for PublishService<S, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublishService")
            .field("inner", &self.inner)
            .field("publisher", &std::any::type_name::<P>())
            .finish()
    }
}

impl<S, P> Service<Message> for PublishService<S, P>
where
    S: Service<Message, Response = Outputs>,
    S::Error: Into<HandlerError>,
    S::Future: Send + 'static,
    P: Publisher,
{
    type Response = ();
    type Error = HandlerError;
    type Future = PublishFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), HandlerError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, message: Message) -> Self::Future {
        let trace = message.headers().get(TRACEPARENT).cloned();
        // In `Key` or `Partition` order, under the runtime: the input's turn
        // among its key's (see `publish_in_turn`).
        let turn = current_turn(&message);
        let handled = self.inner.call(message);
        let publisher = Arc::clone(&self.publisher);
        if let Some(turn) = turn {
            let handled = async move { handled.await.map_err(Into::into) };
            return Box::pin(publish_in_turn(turn, handled, publisher, trace));
        }
        Box::pin(async move {
            let outputs = handled.await.map_err(Into::into)?;
            publish_confirmed(&*publisher, outputs, trace.as_ref())
                .await
                .map_err(HandlerError::from)
        })
    }
}

/// Sends `outputs` in order (each waits only for room in the publisher),
/// then waits for every confirmation: the sends overlap the broker's round
/// trips, and the order of sending is the order on the broker.
pub(crate) async fn publish_confirmed<P: Publisher>(
    publisher: &P,
    outputs: Outputs,
    trace: Option<&Bytes>,
) -> Result<(), PublishError> {
    let mut outputs = outputs.into_iter();
    let Some(mut first) = outputs.next() else {
        return Ok(());
    };
    first.continue_trace(trace);
    let first = publisher.send(first).await?;
    if outputs.len() == 0 {
        return first.await.map(drop);
    }
    let mut receipts = Vec::with_capacity(outputs.len() + 1);
    receipts.push(first);
    for mut output in outputs {
        output.continue_trace(trace);
        receipts.push(publisher.send(output).await?);
    }
    futures_util::future::try_join_all(receipts).await.map(drop)
}
