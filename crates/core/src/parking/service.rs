//! [`ParkingService`]: decides for each message whether it runs or is
//! parked behind an earlier one of its key.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use tower::Service;

use super::future::until_due;
use super::keys::Admission;
use super::layer::Shared;
use super::{ResponseFuture, first_delivery_of, is_park_header};
use crate::dead_letter::envelope::ATTEMPTS;
use crate::error::HandlerError;
use crate::message::{Headers, Message};

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
        let shared = Arc::clone(&self.shared);
        let returned = shared.parking.is_returned_copy(&message);
        if returned {
            carry_attempts(&mut message);
        } else {
            drop_park_headers(&mut message);
        }
        let admission = match shared.keys.len() {
            0 => Admission::Run,
            _ => match shared.key_of(&message) {
                Some(key) => {
                    shared
                        .keys
                        .admit(&message, &key, shared.overdue_after, SystemTime::now())
                }
                None => Admission::Run,
            },
        };
        let head = match admission {
            Admission::Follow { delay } => return ResponseFuture::follow(shared, message, delay),
            Admission::Run => false,
            Admission::Head(_) => true,
        };
        let (until_due, handled) = if returned {
            (
                until_due(&message, shared.max_early_wait),
                as_first_delivered(&message),
            )
        } else {
            (None, message.clone())
        };
        let future = self.inner.call(handled);
        ResponseFuture::called(future, shared, message, head, until_due)
    }
}

/// `copy`, a parked copy that came back, as the layers and handler inside
/// see it: with where it was first delivered
/// ([`parked_from`](crate::Metadata::parked_from)), so that whatever
/// identifies a message (an exactly-once marker) sees the same message
/// however often it was parked.
fn as_first_delivered(copy: &Message) -> Message {
    let mut handled = copy.clone();
    if let Some(first) = first_delivery_of(copy) {
        handled.metadata_mut().set_parked_from(Some(first));
    }
    handled
}

/// Drops the park headers of `message`, which is no copy its parking gave
/// back: a producer wrote them. Costs a scan of the headers; a copy only
/// when there is one to drop.
fn drop_park_headers(message: &mut Message) {
    if !message
        .headers()
        .iter()
        .any(|header| is_park_header(&header.name))
    {
        return;
    }
    let metadata = message.metadata();
    tracing::debug!(
        source = %metadata.source(),
        partition = metadata.partition(),
        position = %metadata.position(),
        "park headers on a message that is no parked copy are ignored",
    );
    let kept: Headers = message
        .headers()
        .iter()
        .filter(|header| !is_park_header(&header.name))
        .map(|header| (header.name.clone(), header.value.clone()))
        .collect();
    *message.headers_mut() = kept;
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
