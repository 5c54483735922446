//! [`ResponseFuture`]: one message through the
//! [`ParkingService`](super::ParkingService): run, then parked if its
//! failure asks for later; or parked at once behind its key.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pin_project_lite::pin_project;

use super::keys::{ParkId, origin_of};
use super::layer::Shared;
use super::{
    DUE, ORIGIN, ORIGIN_PARTITION, ORIGIN_POSITION, PARK_ID, PARKS, ParkError, Parked,
    ParkedMessage,
};
use crate::dead_letter::envelope::{ATTEMPTS, FAILED_FIRST};
use crate::error::{ErrorClass, HandlerError, chain_for_log};
use crate::message::Message;
use crate::outcome::Outcome;

/// A park in progress. Boxed: only messages that are parked make one.
type Park = Pin<Box<dyn Future<Output = Result<Parked, ParkError>> + Send>>;

/// The wait of a copy that came back before its due time. Boxed: only such
/// copies make one.
type UntilDue = Pin<Box<tokio::time::Sleep>>;

pin_project! {
    /// The future of [`ParkingService`](super::ParkingService).
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
        job: Job,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Called { #[pin] future: F, until_due: Option<UntilDue> },
        Parking { park: Park },
    }
}

/// The message and what its park needs, apart from the pinned state.
struct Job {
    shared: Arc<Shared>,
    message: Message,
    /// Whether the message is the first parked one of its key, back.
    head: bool,
    /// Why it is being parked: `None` for a follower of its key.
    failure: Option<HandlerError>,
    delay: Duration,
    due: SystemTime,
    park_id: u64,
}

impl<F> ResponseFuture<F> {
    /// Runs `future`, the handler's for `message`, once `until_due` (if
    /// any) has passed: it is not polled before.
    pub(super) fn called(
        future: F,
        shared: Arc<Shared>,
        message: Message,
        head: bool,
        until_due: Option<Duration>,
    ) -> Self {
        Self {
            state: State::Called {
                future,
                until_due: until_due.map(|wait| Box::pin(tokio::time::sleep(wait))),
            },
            job: Job::new(shared, message, head),
        }
    }

    /// Parks `message` behind the earlier parked message of its key,
    /// without running it.
    pub(super) fn follow(shared: Arc<Shared>, message: Message, delay: Duration) -> Self {
        let mut job = Job::new(shared, message, false);
        let park = job.park(delay, None);
        Self {
            state: State::Parking { park },
            job,
        }
    }
}

impl Job {
    fn new(shared: Arc<Shared>, message: Message, head: bool) -> Self {
        Self {
            shared,
            message,
            head,
            failure: None,
            delay: Duration::ZERO,
            due: UNIX_EPOCH,
            park_id: 0,
        }
    }

    /// The handler is done with the first parked message of its key: the
    /// next may run.
    fn release_key(&self) {
        if self.head
            && let Some(key) = self.shared.key_of(&self.message)
        {
            self.shared
                .keys
                .done(&origin_of(&self.message), &key, ParkId::of(&self.message));
        }
    }

    /// Starts the park of a copy with the park headers: for its own
    /// `failure`, or (`None`) behind its key.
    fn park(&mut self, delay: Duration, failure: Option<HandlerError>) -> Park {
        let now = SystemTime::now();
        self.delay = delay;
        self.due = now + delay;
        self.park_id = self.shared.keys.next_id();
        let mut copy = self.message.clone();
        let metadata = self.message.metadata();
        let headers = copy.headers_mut();
        if let Some(failure) = &failure {
            let parks = self.shared.parking.parks(&self.message).saturating_add(1);
            let attempts = failure.attempts().max(self.message.metadata().attempt());
            headers.set(PARKS, parks.to_string());
            headers.set(ATTEMPTS, attempts.to_string());
            if headers.get(FAILED_FIRST).is_none() {
                headers.set(FAILED_FIRST, unix_millis(now).to_string());
            }
        }
        headers.set(DUE, unix_millis_rounded_up(self.due).to_string());
        headers.set(PARK_ID, self.park_id.to_string());
        // The first park names the first delivery; a copy parked again
        // keeps it, so the message keeps one identity however often it is
        // parked.
        if headers.get(ORIGIN).is_none() {
            headers.set(ORIGIN, metadata.source().to_string());
            headers.set(ORIGIN_PARTITION, metadata.partition().to_string());
            headers.set(ORIGIN_POSITION, metadata.position().to_string());
        }
        self.failure = failure;
        let shared = Arc::clone(&self.shared);
        Box::pin(async move { shared.parking.park(&copy, delay).await })
    }

    /// The handler failed with `error`: parked if it asks for later and
    /// may be, otherwise passed on.
    fn failed(&mut self, error: HandlerError) -> Result<Park, HandlerError> {
        let Some(delay) = error.retry_after() else {
            if matches!(error.class(), ErrorClass::Permanent | ErrorClass::Ignore) {
                self.release_key();
            }
            return Err(error);
        };
        let parks = self.shared.parking.parks(&self.message);
        if parks >= self.shared.max_parks {
            let metadata = self.message.metadata();
            tracing::warn!(
                source = %metadata.source(),
                partition = metadata.partition(),
                position = %metadata.position(),
                parks,
                error = %chain_for_log(&error),
                "a message parked as often as allowed asks for later again: it fails for good",
            );
            self.release_key();
            let attempts = error.attempts().max(metadata.attempt());
            return Err(error
                .reclassify(ErrorClass::Permanent)
                .with_attempts(attempts));
        }
        Ok(self.park(delay, Some(error)))
    }

    /// The park ended: the outcome the runtime sees.
    fn parked(&mut self, result: Result<Parked, ParkError>) -> HandlerError {
        let metadata = self.message.metadata();
        let parked = match result {
            Ok(parked) => parked,
            Err(park_error) => {
                tracing::warn!(
                    source = %metadata.source(),
                    partition = metadata.partition(),
                    position = %metadata.position(),
                    error = %chain_for_log(&park_error),
                    "the message could not be parked; it is retried as a failure",
                );
                return match self.failure.take() {
                    Some(failure) => failure,
                    None => HandlerError::retryable(park_error),
                };
            }
        };
        let parked_as = match parked {
            Parked::Moved => ParkId::Moved(self.park_id),
            Parked::HandedBack => ParkId::Delivery {
                partition: metadata.partition(),
                position: metadata.position(),
            },
        };
        if let Some(key) = self.shared.key_of(&self.message) {
            self.shared.keys.parked(
                &origin_of(&self.message),
                &key,
                ParkId::of(&self.message),
                parked_as,
                self.due,
                self.delay,
            );
        }
        tracing::debug!(
            source = %metadata.source(),
            partition = metadata.partition(),
            position = %metadata.position(),
            delay = ?self.delay,
            behind_its_key = self.failure.is_none(),
            "message parked",
        );
        let attempts = self
            .failure
            .as_ref()
            .map_or(0, HandlerError::attempts)
            .max(metadata.attempt());
        let outcome = ParkedMessage {
            delay: self.delay,
            failure: self.failure.take(),
        };
        match parked {
            Parked::Moved => {
                HandlerError::settled(Outcome::Parked, outcome).with_attempts(attempts)
            }
            // Retryable, for the runtime to hand it back with the delay.
            Parked::HandedBack => HandlerError::retryable(outcome)
                .with_retry_after(self.delay)
                .without_backoff()
                .with_attempts(attempts)
                .settle(Outcome::Parked),
        }
    }
}

/// How long `message`, a copy back from a park, is to wait for the due time
/// it carries: `None` when it is due (or carries none), or when it is due
/// further ahead than `max_wait` (clocks that disagree between hosts, not
/// a broker's early expiry), which is logged and runs as it comes.
pub(super) fn until_due(message: &Message, max_wait: Duration) -> Option<Duration> {
    let due_millis: u64 = message.headers().get_str(DUE)?.parse().ok()?;
    let due = UNIX_EPOCH.checked_add(Duration::from_millis(due_millis))?;
    let wait = due
        .duration_since(SystemTime::now())
        .ok()
        .filter(|wait| !wait.is_zero())?;
    if wait <= max_wait {
        return Some(wait);
    }
    let metadata = message.metadata();
    tracing::warn!(
        source = %metadata.source(),
        partition = metadata.partition(),
        position = %metadata.position(),
        early = ?wait,
        max_early_wait = ?max_wait,
        "a parked copy came back long before its due time (do the clocks of the hosts \
         that park and consume agree?); it runs now",
    );
    None
}

fn unix_millis(time: SystemTime) -> u128 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis())
}

/// The due time in whole milliseconds, never before the instant itself: a
/// copy held until it is due runs no sooner than its delay.
fn unix_millis_rounded_up(time: SystemTime) -> u128 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        since.as_millis() + u128::from(since.subsec_nanos() % 1_000_000 != 0)
    })
}

impl<F, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<(), E>>,
    E: Into<HandlerError>,
{
    type Output = Result<(), HandlerError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Called { future, until_due } => {
                    if let Some(wait) = until_due {
                        ready!(wait.as_mut().poll(cx));
                        *until_due = None;
                    }
                    match ready!(future.poll(cx)) {
                        Ok(()) => {
                            this.job.release_key();
                            return Poll::Ready(Ok(()));
                        }
                        Err(error) => match this.job.failed(error.into()) {
                            Ok(park) => this.state.set(State::Parking { park }),
                            Err(error) => return Poll::Ready(Err(error)),
                        },
                    }
                }
                StateProj::Parking { park } => {
                    let result = ready!(park.as_mut().poll(cx));
                    return Poll::Ready(Err(this.job.parked(result)));
                }
            }
        }
    }
}
