//! Test doubles for the layer tests: a scripted handler, a dead-letter sink
//! that can be made to fail, and a way to poll with a consumer's shutdown
//! token current.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;
use tower::Service;

use crate::dead_letter::{DeadLetter, DeadLetterError, DeadLetterSink};
use crate::error::HandlerError;
use crate::message::{Headers, Message, Metadata, Position};
use crate::shutdown_scope::scope_shutdown;

/// A message at offset 7 of `orders`/0 with key `k1` and one header.
pub(crate) fn message(payload: &'static str) -> Message {
    let headers: Headers = [("origin", Bytes::from_static(b"test"))]
        .into_iter()
        .collect();
    Message::new(
        Bytes::from_static(payload.as_bytes()),
        Metadata::new("orders".into(), 0, Position::Offset(7)),
    )
    .with_key(Bytes::from_static(b"k1"))
    .with_headers(headers)
}

/// What the scripted handler does on one call.
#[derive(Clone, Debug)]
pub(crate) enum Step {
    Succeed,
    Retryable(&'static str),
    Permanent(&'static str),
    Ignore,
    Panic(&'static str),
    /// Sleep, then succeed.
    Slow(Duration),
}

/// A handler that plays a script, one step per call (then succeeds), and
/// records every message it was called with.
#[derive(Clone, Default)]
pub(crate) struct Scripted {
    script: Arc<Mutex<VecDeque<Step>>>,
    seen: Arc<Mutex<Vec<Message>>>,
}

impl Scripted {
    pub(crate) fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        Self {
            script: Arc::new(Mutex::new(steps.into_iter().collect())),
            seen: Arc::default(),
        }
    }

    /// Calls made so far.
    pub(crate) fn calls(&self) -> usize {
        self.seen.lock().map(|seen| seen.len()).unwrap_or(0)
    }

    /// The attempt number each call saw.
    pub(crate) fn attempts_seen(&self) -> Vec<u32> {
        self.seen
            .lock()
            .map(|seen| seen.iter().map(|m| m.metadata().attempt()).collect())
            .unwrap_or_default()
    }
}

impl Service<Message> for Scripted {
    type Response = ();
    type Error = HandlerError;
    type Future = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), HandlerError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, message: Message) -> Self::Future {
        if let Ok(mut seen) = self.seen.lock() {
            seen.push(message);
        }
        let step = self
            .script
            .lock()
            .ok()
            .and_then(|mut script| script.pop_front())
            .unwrap_or(Step::Succeed);
        Box::pin(async move {
            match step {
                Step::Succeed => Ok(()),
                Step::Retryable(why) => Err(HandlerError::retryable(why)),
                Step::Permanent(why) => Err(HandlerError::permanent(why)),
                Step::Ignore => Err(HandlerError::ignore("not for us")),
                Step::Panic(why) => panic!("{why}"),
                Step::Slow(delay) => {
                    tokio::time::sleep(delay).await;
                    Ok(())
                }
            }
        })
    }
}

/// A dead-letter sink that keeps letters in memory and fails while told to.
#[derive(Clone, Default)]
pub(crate) struct RecordingSink {
    letters: Arc<Mutex<Vec<DeadLetter>>>,
    failures_left: Arc<AtomicUsize>,
    writes: Arc<Mutex<usize>>,
}

impl RecordingSink {
    /// Fails the next `writes` writes (`usize::MAX`: until told otherwise).
    pub(crate) fn fail_writes(&self, writes: usize) {
        self.failures_left.store(writes, Ordering::SeqCst);
    }

    pub(crate) fn letters(&self) -> Vec<DeadLetter> {
        self.letters
            .lock()
            .map(|letters| letters.clone())
            .unwrap_or_default()
    }

    /// Write attempts, failed ones included.
    pub(crate) fn writes(&self) -> usize {
        self.writes.lock().map(|writes| *writes).unwrap_or(0)
    }
}

#[async_trait::async_trait]
impl DeadLetterSink for RecordingSink {
    async fn write(&self, letter: &DeadLetter) -> Result<(), DeadLetterError> {
        if let Ok(mut writes) = self.writes.lock() {
            *writes += 1;
        }
        let failing = self
            .failures_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| match left {
                0 => None,
                usize::MAX => Some(usize::MAX),
                left => Some(left - 1),
            })
            .is_ok();
        if failing {
            return Err(DeadLetterError("dead-letter topic unavailable".into()));
        }
        if let Ok(mut letters) = self.letters.lock() {
            letters.push(letter.clone());
        }
        Ok(())
    }
}

/// Polls `future` with `token` as the current consumer's shutdown token, as
/// the runtime does.
pub(crate) struct UnderConsumer<F> {
    token: CancellationToken,
    future: Pin<Box<F>>,
}

impl<F: Future> UnderConsumer<F> {
    pub(crate) fn new(token: &CancellationToken, future: F) -> Self {
        Self {
            token: token.clone(),
            future: Box::pin(future),
        }
    }
}

impl<F: Future> Future for UnderConsumer<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        scope_shutdown(&this.token, || this.future.as_mut().poll(cx))
    }
}
