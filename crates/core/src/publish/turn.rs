//! One attempt of [`PublishService`](super::PublishService) in its key's
//! turn (`DeliveryOrder::Key` or `Partition`): the handler runs and the
//! outputs are sent once every earlier input of the key has sent its own;
//! the key's next input may then run; the attempt answers once its outputs
//! and every earlier one of its key are confirmed. See
//! `consumer/turns.rs` for the rule across failures.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;

use bytes::Bytes;

use super::output::Outputs;
use super::{KeyOrderError, PublishError, PublishErrorKind, Publisher};
use crate::consumer::turns::{TurnError, TurnHandle};
use crate::error::{ErrorClass, HandlerError};

/// The attempt's hold on its turn: dropped before it answered (a timeout
/// layer gave up on it, the runtime cancelled it), it fails the attempt as
/// an unconfirmed output would, so that later outputs of the key are sent
/// again after its next attempt.
struct Attempt {
    turn: TurnHandle,
    armed: bool,
}

impl Attempt {
    /// The attempt answers `result`: the turn knows its state already.
    fn answer(&mut self, result: Result<(), HandlerError>) -> Result<(), HandlerError> {
        self.armed = false;
        result
    }

    /// The attempt failed on its own (`rejected`: an output was refused).
    fn fail(&mut self, rejected: bool, error: HandlerError) -> Result<(), HandlerError> {
        self.armed = false;
        self.turn.failed(rejected);
        Err(error)
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if self.armed {
            self.turn.failed(false);
        }
    }
}

/// The receipts of one attempt's outputs; one output (the common case)
/// needs no list.
enum Receipts<R> {
    None,
    One(R),
    Many(Vec<R>),
}

/// Why waiting for the confirmations ended early.
enum Interrupted {
    Turn(TurnError),
    Publish(PublishError),
}

/// Runs one attempt in `turn`: see the [module docs](self).
pub(super) async fn publish_in_turn<F, P>(
    turn: TurnHandle,
    handled: F,
    publisher: Arc<P>,
    trace: Option<Bytes>,
) -> Result<(), HandlerError>
where
    F: Future<Output = Result<Outputs, HandlerError>>,
    P: Publisher,
{
    let mut attempt = Attempt { turn, armed: true };
    if let Err(error) = poll_fn(|cx| attempt.turn.poll_gate(cx)).await {
        return attempt.answer(Err(turn_error(error, None)));
    }
    let outputs = match handled.await {
        Ok(outputs) => outputs,
        Err(error) => return attempt.fail(false, error),
    };
    let mut destination = None;
    let receipts = match send_all(&*publisher, outputs, trace.as_ref(), &mut destination).await {
        Ok(receipts) => receipts,
        Err(error) => {
            let rejected = error.kind() == PublishErrorKind::Rejected;
            return attempt.fail(rejected, error.into());
        }
    };
    if let Err(error) = attempt.turn.sent() {
        return attempt.answer(Err(turn_error(error, destination)));
    }
    let confirmed = match receipts {
        Receipts::None => Ok(()),
        Receipts::One(receipt) => confirmations(&attempt.turn, receipt).await,
        Receipts::Many(receipts) => {
            confirmations(&attempt.turn, futures_util::future::try_join_all(receipts)).await
        }
    };
    match confirmed {
        Ok(()) => {}
        Err(Interrupted::Turn(error)) => {
            return attempt.answer(Err(turn_error(error, destination)));
        }
        Err(Interrupted::Publish(error)) => {
            let rejected = error.kind() == PublishErrorKind::Rejected;
            return attempt.fail(rejected, error.into());
        }
    }
    let earlier = poll_fn(|cx| attempt.turn.poll_confirmed(cx)).await;
    attempt.answer(earlier.map_err(|error| turn_error(error, destination)))
}

/// Sends `outputs` in order; remembers where the first went.
async fn send_all<P: Publisher>(
    publisher: &P,
    outputs: Outputs,
    trace: Option<&Bytes>,
    destination: &mut Option<Arc<str>>,
) -> Result<Receipts<P::Receipt>, PublishError> {
    let mut outputs = outputs.into_iter();
    let Some(mut first) = outputs.next() else {
        return Ok(Receipts::None);
    };
    *destination = Some(Arc::clone(&first.destination));
    first.continue_trace(trace);
    let first = publisher.send(first).await?;
    if outputs.len() == 0 {
        return Ok(Receipts::One(first));
    }
    let mut receipts = Vec::with_capacity(outputs.len() + 1);
    receipts.push(first);
    for mut output in outputs {
        output.continue_trace(trace);
        receipts.push(publisher.send(output).await?);
    }
    Ok(Receipts::Many(receipts))
}

/// Waits for `receipt` (every confirmation of the attempt), unless the
/// turn may not go on first (an earlier output of the key failed).
async fn confirmations<R, T>(turn: &TurnHandle, receipt: R) -> Result<(), Interrupted>
where
    R: Future<Output = Result<T, PublishError>>,
{
    let mut receipt = pin!(receipt);
    poll_fn(|cx| {
        // The receipt first: once it is in, the next step looks at the turn
        // anyway (one lock less per input).
        if let Poll::Ready(result) = receipt.as_mut().poll(cx) {
            return Poll::Ready(result.map(drop).map_err(Interrupted::Publish));
        }
        turn.poll_stopped(cx)
            .map(|error| Err(Interrupted::Turn(error)))
    })
    .await
}

/// The input's error when its turn may not go on although its own outputs
/// did not fail.
fn turn_error(error: TurnError, destination: Option<Arc<str>>) -> HandlerError {
    match (error, destination) {
        (TurnError::EarlierFailed, Some(destination)) => HandlerError::from(
            PublishError::new(
                PublishErrorKind::Unavailable,
                &*destination,
                "held back for its key's order; publish again",
            )
            .with_source(KeyOrderError::EarlierOutputFailed),
        )
        // The earlier output's failure is what the backoff hears of.
        .without_backoff(),
        (TurnError::EarlierFailed, None) => {
            HandlerError::retryable(KeyOrderError::EarlierOutputFailed).without_backoff()
        }
        (TurnError::EarlierUnfinished, _) => {
            HandlerError::retryable(KeyOrderError::EarlierInputUnfinished)
                .without_backoff()
                .reclassify(ErrorClass::Interrupted)
        }
    }
}
