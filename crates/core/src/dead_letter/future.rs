//! [`ResponseFuture`]: one message through the
//! [`DeadLetterService`](super::DeadLetterService), from the handler's
//! outcome to the failure policy's verdict.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use pin_project_lite::pin_project;
use tower::Service;

use super::policy::Action;
use super::{
    DeadLetter, DeadLetterError, DeadLetterSink, DeadLetterWriteFailed, DeadLettered, Discarded,
    FailurePolicy,
};
use crate::error::{ErrorChain, ErrorClass, HandlerError, chain_for_log};
use crate::interruptible_sleep::{InterruptibleSleep, Wake, outlasts_the_drain};
use crate::message::Message;
use crate::outcome::Outcome;

/// A dead-letter write in progress; it hands the letter back so that a
/// failed write can be tried again. Boxed: only failed messages write.
type Write = Pin<Box<dyn Future<Output = (Result<(), DeadLetterError>, DeadLetter)> + Send>>;

pin_project! {
    /// The future of [`DeadLetterService`](super::DeadLetterService).
    pub struct ResponseFuture<F, S> {
        #[pin]
        state: State<F>,
        routing: Routing<S>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Called { #[pin] future: F },
        Writing { write: Write },
        Sleeping { sleep: Pin<Box<InterruptibleSleep>>, then: After },
        // Block: poll the handler ready, then call it again.
        CallAgain,
    }
}

enum After {
    CallAgain,
    Write {
        sink: Arc<dyn DeadLetterSink>,
        letter: DeadLetter,
    },
}

/// What routing a failure needs, apart from the pinned state.
struct Routing<S> {
    /// The original message: the dead letter's content, or the next
    /// attempt's under `block`.
    message: Message,
    /// Under `block` only: the handler to call again.
    service: Option<S>,
    policy: Arc<FailurePolicy>,
    /// Under `block`, failed attempts; under `dead-letter`, failed writes.
    failures: u32,
    last_delay: Duration,
    /// The failure being dead-lettered while the write is in flight.
    failure: Option<HandlerError>,
    /// Why the last destination took neither the letter nor its reference,
    /// while a fallback policy decides.
    undeliverable: Option<DeadLetterError>,
}

enum Next<F> {
    Finish(Result<(), HandlerError>),
    Go(State<F>),
}

impl<F, S> ResponseFuture<F, S> {
    pub(super) fn new(
        future: F,
        message: Message,
        service: Option<S>,
        policy: Arc<FailurePolicy>,
    ) -> Self {
        Self {
            state: State::Called { future },
            routing: Routing {
                message,
                service,
                policy,
                failures: 0,
                last_delay: Duration::ZERO,
                failure: None,
                undeliverable: None,
            },
        }
    }
}

impl<S> Routing<S> {
    fn attempts_of(&self, error: &HandlerError) -> u32 {
        error.attempts().max(self.message.metadata().attempt())
    }

    /// Applies the policy to a failure of the handler.
    fn route<F>(&mut self, error: HandlerError) -> Next<F> {
        // A message a layer inside settled (ignored, parked: a message
        // handed back to the broker to be handled later is parked, not
        // failed) is not this layer's to route, nor one the shutdown cut.
        if error.outcome().is_some() || error.class() == ErrorClass::Interrupted {
            return Next::Finish(Err(error));
        }
        let attempts = self.attempts_of(&error);
        let policy = Arc::clone(&self.policy);
        let metadata = self.message.metadata();
        match &policy.action {
            Action::Discard => {
                let undeliverable = self.undeliverable.take();
                if let Some(write_error) = &undeliverable {
                    tracing::error!(
                        source = %metadata.source(),
                        partition = metadata.partition(),
                        position = %metadata.position(),
                        attempts,
                        error = %chain_for_log(&error),
                        write_error = %chain_for_log(write_error),
                        "message discarded: the dead-letter destination took neither its letter \
                         nor a reference to it",
                    );
                } else {
                    tracing::warn!(
                        source = %metadata.source(),
                        partition = metadata.partition(),
                        position = %metadata.position(),
                        attempts,
                        error = %chain_for_log(&error),
                        "message discarded after a final failure",
                    );
                }
                let fallback = undeliverable.is_some();
                let discarded = HandlerError::settled(
                    Outcome::Discarded,
                    Discarded {
                        error,
                        undeliverable,
                    },
                )
                .with_attempts(attempts);
                Next::Finish(Err(match fallback {
                    true => discarded.with_fallback(),
                    false => discarded,
                }))
            }
            Action::DeadLetter { sink, .. } => {
                let letter = DeadLetter::new(
                    self.message.clone(),
                    ErrorChain::new(&error).to_string(),
                    attempts,
                )
                .with_class(error.class());
                self.failure = Some(error);
                self.failures = 0;
                Next::Go(State::Writing {
                    write: write(Arc::clone(sink), letter),
                })
            }
            Action::Block { backoff } => {
                self.failures = self.failures.saturating_add(1);
                // Past the policy's cap the last delay repeats: block never
                // gives up.
                let delay = backoff.delay(self.failures).unwrap_or(self.last_delay);
                self.last_delay = delay;
                if outlasts_the_drain(delay) {
                    return Next::Finish(Err(HandlerError::interrupted().with_attempts(attempts)));
                }
                tracing::warn!(
                    source = %metadata.source(),
                    partition = metadata.partition(),
                    position = %metadata.position(),
                    attempts,
                    retry_in = ?delay,
                    error = %chain_for_log(&error),
                    "message failed; blocking its partition until it succeeds",
                );
                self.message
                    .metadata_mut()
                    .set_attempt(attempts.saturating_add(1));
                Next::Go(State::Sleeping {
                    sleep: Box::pin(InterruptibleSleep::new(delay)),
                    then: After::CallAgain,
                })
            }
        }
    }

    /// The outcome of a dead-letter write: done; or tried again after the
    /// write backoff; or, once the attempts are used up (at once for a
    /// letter the destination rejects), the letter's reference; or, when
    /// that failed too, the fallback.
    fn written<F>(&mut self, result: Result<(), DeadLetterError>, letter: DeadLetter) -> Next<F> {
        let error = match self.failure.take() {
            Some(error) => error,
            None => HandlerError::permanent(letter.error.clone()),
        };
        let attempts = letter.attempts;
        let policy = Arc::clone(&self.policy);
        let Action::DeadLetter {
            sink,
            write_backoff,
            fallback,
        } = &policy.action
        else {
            return Next::Finish(Err(HandlerError::retryable(
                "a dead-letter write finished under a policy that writes none",
            )));
        };
        let metadata = letter.message.metadata();
        let write_error = match result {
            Ok(()) => {
                let reference = letter.reference.is_some();
                if reference {
                    tracing::error!(
                        source = %metadata.source(),
                        partition = metadata.partition(),
                        position = %metadata.position(),
                        attempts,
                        error = %chain_for_log(&error),
                        "message dead-lettered as a reference only (origin and sizes): its \
                         letter could not be written",
                    );
                } else {
                    tracing::warn!(
                        source = %metadata.source(),
                        partition = metadata.partition(),
                        position = %metadata.position(),
                        attempts,
                        error = %chain_for_log(&error),
                        "message dead-lettered",
                    );
                }
                let dead_lettered =
                    HandlerError::settled(Outcome::DeadLettered, DeadLettered { error, reference })
                        .with_attempts(attempts);
                // Written as a reference only: the policy's own fallback.
                return Next::Finish(Err(match reference {
                    true => dead_lettered.with_fallback(),
                    false => dead_lettered,
                }));
            }
            Err(write_error) => write_error,
        };
        if letter.reference.is_some() {
            return self.undeliverable(error, write_error, fallback.clone());
        }
        self.failures = self.failures.saturating_add(1);
        let retry_in = match write_error.is_rejected() {
            true => None,
            false => write_backoff.delay(self.failures),
        };
        match retry_in {
            Some(delay) if outlasts_the_drain(delay) => {
                Next::Finish(Err(HandlerError::interrupted().with_attempts(attempts)))
            }
            Some(delay) => {
                tracing::warn!(
                    source = %metadata.source(),
                    partition = metadata.partition(),
                    position = %metadata.position(),
                    retry_in = ?delay,
                    error = %chain_for_log(&write_error),
                    "dead-letter write failed; retrying",
                );
                self.failure = Some(error);
                Next::Go(State::Sleeping {
                    sleep: Box::pin(InterruptibleSleep::new(delay)),
                    then: After::Write {
                        sink: Arc::clone(sink),
                        letter,
                    },
                })
            }
            None => {
                tracing::warn!(
                    source = %metadata.source(),
                    partition = metadata.partition(),
                    position = %metadata.position(),
                    writes = self.failures,
                    error = %chain_for_log(&write_error),
                    "dead-letter write failed for good; writing a reference to the message \
                     instead",
                );
                self.failure = Some(error);
                Next::Go(State::Writing {
                    write: write(Arc::clone(sink), letter.to_reference()),
                })
            }
        }
    }

    /// Neither the letter nor its reference could be written: the fallback
    /// decides, or, without one, the message is left for redelivery.
    fn undeliverable<F>(
        &mut self,
        error: HandlerError,
        write_error: DeadLetterError,
        fallback: Option<Arc<FailurePolicy>>,
    ) -> Next<F> {
        let attempts = self.attempts_of(&error);
        match fallback {
            Some(fallback) => {
                self.policy = fallback;
                self.undeliverable = Some(write_error);
                self.route(error)
            }
            None => {
                let metadata = self.message.metadata();
                tracing::error!(
                    source = %metadata.source(),
                    partition = metadata.partition(),
                    position = %metadata.position(),
                    attempts,
                    error = %chain_for_log(&error),
                    write_error = %chain_for_log(&write_error),
                    "the dead-letter destination took neither the letter nor a reference to it; \
                     the message is left unacknowledged for redelivery",
                );
                // Left for redelivery, and still the panic it was.
                let make = match error.is_panic() {
                    true => HandlerError::panicked,
                    false => HandlerError::retryable,
                };
                Next::Finish(Err(make(DeadLetterWriteFailed {
                    error,
                    write: write_error,
                })
                .with_attempts(attempts)
                .with_fallback()))
            }
        }
    }
}

fn write(sink: Arc<dyn DeadLetterSink>, letter: DeadLetter) -> Write {
    Box::pin(async move {
        let result = sink.write(&letter).await;
        (result, letter)
    })
}

impl<F, S, E> Future for ResponseFuture<F, S>
where
    F: Future<Output = Result<(), E>>,
    E: Into<HandlerError>,
    S: Service<Message, Response = (), Error = E, Future = F>,
{
    type Output = Result<(), HandlerError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::Called { future } => match ready!(future.poll(cx)) {
                    Ok(()) => Next::Finish(Ok(())),
                    Err(error) => this.routing.route(error.into()),
                },
                StateProj::Writing { write } => {
                    let (result, letter) = ready!(write.as_mut().poll(cx));
                    this.routing.written(result, letter)
                }
                StateProj::Sleeping { sleep, then } => match ready!(sleep.as_mut().poll(cx)) {
                    Wake::Elapsed => match std::mem::replace(then, After::CallAgain) {
                        After::CallAgain => Next::Go(State::CallAgain),
                        After::Write { sink, letter } => Next::Go(State::Writing {
                            write: write(sink, letter),
                        }),
                    },
                    Wake::ShuttingDown => {
                        let attempts = this.routing.message.metadata().attempt();
                        Next::Finish(Err(HandlerError::interrupted().with_attempts(attempts)))
                    }
                },
                StateProj::CallAgain => {
                    let routing = &mut *this.routing;
                    match routing.service.as_mut() {
                        None => Next::Finish(Err(HandlerError::retryable(
                            "blocked message has no handler to call again",
                        ))),
                        Some(service) => match ready!(service.poll_ready(cx)) {
                            Err(error) => routing.route(error.into()),
                            Ok(()) => Next::Go(State::Called {
                                future: service.call(routing.message.clone()),
                            }),
                        },
                    }
                }
            };
            match next {
                Next::Finish(result) => return Poll::Ready(result),
                Next::Go(state) => this.state.set(state),
            }
        }
    }
}
