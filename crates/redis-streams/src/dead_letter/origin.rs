//! The stream a letter is a dead letter of: a parked copy that came back
//! through its group's return stream is one of the entry it was first
//! delivered as, when its park fields may be followed (see
//! [`RedisDeadLetterSink`]).

use intake_core::parking::{ORIGIN, first_delivery_of};
use intake_core::{DeadLetter, FirstDelivery};

use super::RedisDeadLetterSink;

impl RedisDeadLetterSink {
    /// Whether `source` is where the parked messages of `origin` come back
    /// for this sink's group.
    pub(super) fn is_return_stream_of(&self, source: &str, origin: &str) -> bool {
        let destination = &self.destination;
        match destination
            .returns
            .iter()
            .find(|(stream, _)| stream == origin)
        {
            Some((_, returned)) => returned == source,
            None => destination.group.as_deref().is_some_and(|group| {
                source
                    .strip_prefix(origin)
                    .and_then(|rest| rest.strip_prefix(':'))
                    .and_then(|rest| rest.strip_prefix(group))
                    == Some(crate::RedisParking::RETURNED_SUFFIX)
            }),
        }
    }

    /// The stream `letter` is a dead letter of, when that is not the stream
    /// it was consumed from (a parked copy back through a return stream),
    /// with where it was first delivered if that is known.
    pub(super) fn origin_of<'a>(&self, letter: &'a DeadLetter) -> Option<Origin<'a>> {
        let message = &letter.message;
        let consumed: &str = message.metadata().source();
        // The parking layer believed the copy's fields already.
        if let Some(first) = message.metadata().parked_from() {
            let origin: &str = &first.source;
            return (origin != consumed && self.destination.consumed.contains(origin)).then(|| {
                Origin {
                    stream: origin,
                    first: Some(first.clone()),
                }
            });
        }
        let origin = message.headers().get(ORIGIN)?;
        // The field comes from whoever wrote the entry: it is followed only
        // on an entry of its origin's return stream, where only the mover
        // writes, and only to a stream this consumer reads (which also
        // bounds its length).
        let known = std::str::from_utf8(origin).ok().filter(|origin| {
            *origin != consumed
                && self.destination.consumed.contains(*origin)
                && self.is_return_stream_of(consumed, origin)
        });
        let Some(origin) = known else {
            tracing::debug!(
                stream = consumed,
                origin_bytes = origin.len(),
                "the entry's park origin is not followed (no other stream this consumer \
                 reads, or the entry is not in that stream's return stream); \
                 dead-lettering it as an entry of the stream it was consumed from"
            );
            return None;
        };
        let first = first_delivery_of(message)
            .filter(|first| &*first.source == origin && first.partition == 0);
        Some(Origin {
            stream: origin,
            first,
        })
    }
}

/// The stream a parked copy is a dead letter of, and where it was first
/// delivered when its fields say.
pub(super) struct Origin<'a> {
    pub(super) stream: &'a str,
    pub(super) first: Option<FirstDelivery>,
}
