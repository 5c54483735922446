//! [`Staging`]: entries decoded and waiting for a call of the source, and
//! those it writes to the dead-letter stream instead.

use std::collections::VecDeque;

use intake_core::{DeadLetter, Message};

use crate::dead_letter::RedisDeadLetterSink;
use crate::error::Error;

/// An entry that goes to the dead-letter stream instead of the handler.
pub(super) struct Poison {
    pub(super) letter: DeadLetter,
    /// Whether the entry had a payload field (the copy holds exactly the
    /// original fields).
    pub(super) with_payload: bool,
}

/// Decoded entries waiting to be handed out, and those to dead-letter.
#[derive(Default)]
pub(super) struct Staging {
    pub(super) ready: VecDeque<Message>,
    /// Left here until its write finished, so that a call dropped midway
    /// loses none: the next call writes it (again: the write is
    /// idempotent).
    pub(super) poison: VecDeque<Poison>,
}

impl Staging {
    /// Moves up to `max` waiting messages into `deliveries`; whether any.
    pub(super) fn hand_out(&mut self, deliveries: &mut Vec<Message>, max: usize) -> bool {
        let count = self.ready.len().min(max);
        deliveries.extend(self.ready.drain(..count));
        count > 0
    }

    /// Writes the poison entries to the dead-letter stream. An entry whose
    /// write fails is dropped from here under [`OnFailure::LeavePending`]
    /// (it stays pending, to be claimed and tried again later), and kept
    /// at the front under [`OnFailure::Stop`], with the error returned: the
    /// next call tries again first.
    pub(super) async fn dead_letter(
        &mut self,
        sink: &RedisDeadLetterSink,
        on_failure: OnFailure,
    ) -> Result<(), Error> {
        while let Some(poison) = self.poison.front() {
            let written = match (
                sink.write_letter(&poison.letter, poison.with_payload).await,
                on_failure,
            ) {
                (Err(error), OnFailure::Stop) => {
                    let metadata = poison.letter.message.metadata();
                    sink.counters().add_dead_letter_failures(1);
                    tracing::error!(
                        stream = %metadata.source(),
                        position = %metadata.position(),
                        %error,
                        "could not dead-letter the entry; reading stops here until it can (a \
                         broadcast entry has no pending list to come back from)"
                    );
                    return Err(error);
                }
                (written, _) => written,
            };
            let Some(poison) = self.poison.pop_front() else {
                break;
            };
            let metadata = poison.letter.message.metadata();
            match written {
                Ok(None) => tracing::debug!(
                    stream = %metadata.source(),
                    position = %metadata.position(),
                    "entry already acknowledged (by an earlier write whose reply was lost); \
                     no second dead letter"
                ),
                Ok(Some(id)) => {
                    sink.counters().add_dead_lettered(1);
                    tracing::warn!(
                    stream = %metadata.source(),
                    position = %metadata.position(),
                    dead_letter_id = %id.position(),
                    error = %poison.letter.error,
                    "entry dead-lettered by the source"
                    );
                }
                Err(error) => {
                    sink.counters().add_dead_letter_failures(1);
                    tracing::error!(
                    stream = %metadata.source(),
                    position = %metadata.position(),
                    %error,
                    "could not dead-letter the entry; it stays pending and is retried after \
                     claim_min_idle"
                    );
                }
            }
        }
        Ok(())
    }
}

/// What [`Staging::dead_letter`] does with an entry whose write failed.
#[derive(Clone, Copy, Debug)]
pub(super) enum OnFailure {
    /// Drop it here: it stays pending in the group, and a claim brings it
    /// back.
    LeavePending,
    /// Keep it, and stop the read with the error: nothing else holds it.
    Stop,
}
