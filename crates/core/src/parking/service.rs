//! [`ParkingService`]: decides for each message whether it runs or is
//! parked behind an earlier one of its key.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use tower::Service;

use super::ResponseFuture;
use super::future::until_due;
use super::keys::Admission;
use super::layer::Shared;
use crate::dead_letter::envelope::ATTEMPTS;
use crate::error::HandlerError;
use crate::message::Message;

/// Parks the failures of `S` that ask to be retried later. See the
/// [module docs](super).
#[derive(Clone)]
pub struct ParkingService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> ParkingService<S> {
    pub(super) fn from_shared(inner: S, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for ParkingService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParkingService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S> Service<Message> for ParkingService<S>
where
    S: Service<Message, Response = ()>,
    S::Error: Into<HandlerError>,
{
    type Response = ();
    type Error = HandlerError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut message: Message) -> Self::Future {
        carry_attempts(&mut message);
        let shared = Arc::clone(&self.shared);
        let admission = match message.key() {
            Some(key) if shared.keep_key_order && shared.keys.len() > 0 => {
                shared
                    .keys
                    .admit(&message, key, shared.overdue_after, SystemTime::now())
            }
            _ => Admission::Run,
        };
        let head = match admission {
            Admission::Follow { delay } => return ResponseFuture::follow(shared, message, delay),
            Admission::Run => false,
            Admission::Head(_) => true,
        };
        let until_due = until_due(&message, shared.max_early_wait);
        let future = self.inner.call(message.clone());
        ResponseFuture::called(future, shared, message, head, until_due)
    }
}

/// A message that comes back from a park carries the attempts made before
/// it was parked: the handler sees the attempt it is on across hops.
fn carry_attempts(message: &mut Message) {
    let Some(made) = message
        .headers()
        .get_str(ATTEMPTS)
        .and_then(|attempts| attempts.parse::<u32>().ok())
    else {
        return;
    };
    let attempt = message.metadata().attempt().max(made.saturating_add(1));
    message.metadata_mut().set_attempt(attempt);
}
