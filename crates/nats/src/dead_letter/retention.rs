//! What the consumed stream's retention allows a letter to say of its
//! original: where it stays (limits retention), or that it is deleted once
//! terminated (work-queue, interest), which refuses a reference letter.

use async_nats::jetstream;
use intake_core::DeadLetter;
use intake_core::backend::DeadLetterError;

use super::NatsDeadLetterSink;

/// Whether the consumed stream keeps a message once it is terminated: what
/// a reference letter relies on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OriginRetention {
    /// Limits retention: kept until the stream's limits remove it.
    Keeps,
    /// Work-queue or interest retention (named), or a retention the sink
    /// could not read: deleted once acknowledged or terminated, as far as
    /// the sink knows.
    Deletes(&'static str),
}

impl OriginRetention {
    pub(super) fn of(retention: jetstream::stream::RetentionPolicy) -> Self {
        match retention {
            jetstream::stream::RetentionPolicy::Limits => Self::Keeps,
            jetstream::stream::RetentionPolicy::WorkQueue => Self::Deletes("work-queue"),
            jetstream::stream::RetentionPolicy::Interest => Self::Deletes("interest"),
        }
    }

    pub(super) fn unknown(stream: &str, error: &dyn std::fmt::Display) -> Self {
        tracing::warn!(
            %stream,
            %error,
            "could not read the consumed stream's retention: reference letters for its messages \
             are refused (their original may be deleted once terminated)"
        );
        Self::Deletes("unknown")
    }
}

/// `error` followed by `note`, in at most [`DeadLetter::ERROR_LIMIT`]
/// bytes: the error is cut (at a character boundary) to make room.
fn with_note(error: &str, note: &str) -> String {
    let room = DeadLetter::ERROR_LIMIT.saturating_sub(note.len() + 1);
    let mut end = error.len().min(room);
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    format!("{} {note}", &error[..end])
}

impl NatsDeadLetterSink {
    /// `letter`, of a message of the consumed stream, with a note (first,
    /// so that the reduced letter's cut keeps it) of where the original
    /// headers it leaves out are: with the original while the stream's
    /// limits keep it, or lost on a stream that deletes it once terminated.
    pub(super) fn reduced_note(&self, letter: &DeadLetter) -> Option<DeadLetter> {
        let metadata = letter.message.metadata();
        if letter.origin.is_some() || metadata.source() != &self.source_stream {
            return None;
        }
        let note = match self.origin_retention {
            OriginRetention::Keeps => format!(
                "[a reduced letter: the original headers did not fit; they stay with the original \
                 in stream `{}` at sequence {} while the stream's limits keep it]",
                self.source_stream,
                metadata.position()
            ),
            OriginRetention::Deletes(retention) => format!(
                "[a reduced letter: the original headers did not fit and are not kept anywhere: \
                 the stream's retention ({retention}) deletes the original once it is terminated]"
            ),
        };
        let mut noted = letter.clone();
        noted.error = format!("{note} {}", letter.error);
        Some(noted)
    }

    /// A reference letter for a message of the consumed stream, as it may
    /// be written: with a note of where its original stays, on a stream
    /// that keeps it; refused on one that deletes it once terminated.
    pub(super) fn reference(
        &self,
        letter: &DeadLetter,
    ) -> Result<Option<DeadLetter>, DeadLetterError> {
        let metadata = letter.message.metadata();
        if letter.reference.is_none()
            || letter.origin.is_some()
            || metadata.source() != &self.source_stream
        {
            return Ok(None);
        }
        match self.origin_retention {
            OriginRetention::Keeps => {
                let mut noted = letter.clone();
                noted.error = with_note(
                    &letter.error,
                    &format!(
                        "[a reference letter: the letter did not fit the dead-letter subject; the \
                         original stays in stream `{}` at sequence {} while the stream's limits keep it]",
                        self.source_stream,
                        metadata.position()
                    ),
                );
                Ok(Some(noted))
            }
            OriginRetention::Deletes(retention) => {
                tracing::error!(
                    stream = %self.source_stream,
                    position = %metadata.position(),
                    retention,
                    "a reference letter is refused: the stream deletes the original once it is \
                     terminated, so the payload would be nowhere; the message stays in the stream"
                );
                Err(DeadLetterError::rejected(format!(
                    "a reference letter for sequence {} of stream `{}` is refused: its retention \
                     ({retention}) deletes the original once it is terminated, and the letter \
                     itself does not fit",
                    metadata.position(),
                    self.source_stream
                )))
            }
        }
    }
}
