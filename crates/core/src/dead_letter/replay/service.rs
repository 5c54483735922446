//! [`ReplayService`]: the service that hands its handler the original
//! message of each dead letter.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use tower::Service;
use tracing::Instrument;

use super::{Config, DryRunCounted, ReplayCounters, ReplayFuture, ReplayRefused};
use crate::dead_letter::DeadLetter;
use crate::dead_letter::envelope::{FAILED_FIRST, REPLAYS};
use crate::error::HandlerError;
use crate::message::Message;

/// Hands `S` the original message of each dead letter it receives. See the
/// [module docs](super).
#[derive(Clone, Debug)]
pub struct ReplayService<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> ReplayService<S> {
    pub(super) fn new(inner: S, config: Arc<Config>) -> Self {
        Self { inner, config }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The counters this service counts in.
    pub fn counters(&self) -> ReplayCounters {
        self.config.counters.clone()
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S> Service<Message> for ReplayService<S>
where
    S: Service<Message, Response = ()>,
    S::Error: Into<HandlerError>,
{
    type Response = ();
    type Error = HandlerError;
    type Future = ReplayFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, record: Message) -> Self::Future {
        let config = &*self.config;
        let counters = &config.counters;
        let key_slot = record.key().filter(|_| config.key_slot).cloned();
        let letter = match DeadLetter::read(key_slot, record.payload().clone(), record.headers()) {
            Ok(letter) => letter,
            Err(error) => {
                counters.unreadable();
                return refused(&record, config, ReplayRefused::Unreadable(error));
            }
        };
        if letter.reference.is_some() {
            counters.reference();
            return refused(&record, config, ReplayRefused::Reference);
        }
        if letter.replays >= config.max_replays {
            counters.over_limit();
            let limit = ReplayRefused::ReplayLimit {
                replays: letter.replays,
                max_replays: config.max_replays,
            };
            return refused(&record, config, limit);
        }
        counters.replayed(letter.class);
        if config.dry_run {
            return ReplayFuture::done(Err(HandlerError::ignore(DryRunCounted)));
        }

        let replays = letter.replays.saturating_add(1);
        let mut message = letter.message;
        message
            .metadata_mut()
            .set_attempt(record.metadata().attempt());
        let headers = message.headers_mut();
        headers.set(REPLAYS, replays.to_string());
        headers.set(
            FAILED_FIRST,
            epoch_millis(letter.first_failed_at).to_string(),
        );

        let held = record.metadata();
        let span = tracing::debug_span!(
            "replay",
            dead_letter.source = %held.source(),
            dead_letter.partition = held.partition(),
            dead_letter.position = %held.position(),
            replays,
        );
        span.in_scope(|| {
            let origin = message.metadata();
            tracing::debug!(
                source = %origin.source(),
                partition = origin.partition(),
                position = %origin.position(),
                class = letter.class.as_str(),
                "replaying a dead letter",
            );
        });
        ReplayFuture::replaying(self.inner.call(message).instrument(span), counters.clone())
    }
}

/// The outcome of a record that is not handed to the handler: counted by a
/// dry run, refused otherwise.
fn refused<F>(record: &Message, config: &Config, refusal: ReplayRefused) -> ReplayFuture<F> {
    if config.dry_run {
        return ReplayFuture::done(Err(HandlerError::ignore(DryRunCounted)));
    }
    let held = record.metadata();
    match &refusal {
        ReplayRefused::Unreadable(error) => tracing::warn!(
            dead_letter.source = %held.source(),
            dead_letter.partition = held.partition(),
            dead_letter.position = %held.position(),
            error = %error,
            "a record of the dead-letter destination is no readable dead letter; not replayed",
        ),
        _ => tracing::warn!(
            dead_letter.source = %held.source(),
            dead_letter.partition = held.partition(),
            dead_letter.position = %held.position(),
            reason = %refusal,
            "a dead letter is not replayed",
        ),
    }
    ReplayFuture::done(Err(HandlerError::permanent(refusal)))
}

/// Milliseconds since the Unix epoch, as the envelope writes times; 0 for
/// earlier times.
fn epoch_millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    })
}
