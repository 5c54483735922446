//! The stream's entries as the store sees them: an entry read back as a
//! stored letter, a letter's id as a stream sequence, the subjects a
//! filter selects, and the server's answers that mean "no such entry".

use async_nats::jetstream::{self, ErrorCode};
use bytes::Bytes;
use intake_core::Headers;
use intake_core::dead_letter::store::{LetterId, StoreError, StoredLetter};

use crate::dead_letter::NATS_HEADER_PREFIX;

/// The answers to a delete of a sequence the stream does not hold.
pub(super) const NOT_THERE: [ErrorCode; 4] = [
    ErrorCode::NO_MESSAGE_FOUND,
    ErrorCode::SEQUENCE_NOT_FOUND,
    ErrorCode::STREAM_MESSAGE_DELETE_FAILED,
    ErrorCode::STREAM_NOT_FOUND,
];

/// Whether a message get found nothing: no such sequence, nothing after
/// it on the subject, or no stream at all.
pub(super) fn gone(kind: jetstream::stream::RawMessageErrorKind) -> bool {
    match kind {
        jetstream::stream::RawMessageErrorKind::NoMessageFound => true,
        jetstream::stream::RawMessageErrorKind::JetStream(error) => {
            error.error_code() == ErrorCode::STREAM_NOT_FOUND
        }
        _ => false,
    }
}

/// An entry as the sink wrote it: payload, and headers with the original
/// `Nats-…` headers under their own names again.
pub(super) fn stored(message: jetstream::message::StreamMessage) -> StoredLetter {
    let mut headers = Headers::new();
    for (name, values) in message.headers.iter() {
        let name: &str = name.as_ref();
        let name = name.strip_prefix(NATS_HEADER_PREFIX).unwrap_or(name);
        for value in values {
            headers.insert(
                name.to_owned(),
                Bytes::copy_from_slice(value.as_str().as_bytes()),
            );
        }
    }
    StoredLetter::read(
        LetterId::new(message.sequence.to_string()),
        None,
        message.payload,
        &headers,
    )
}

pub(super) fn sequence_of(id: &LetterId) -> Result<u64, StoreError> {
    id.as_str()
        .parse::<u64>()
        .ok()
        .filter(|sequence| *sequence > 0)
        .ok_or_else(|| StoreError::InvalidId {
            id: id.as_str().to_owned(),
            expected: "a stream sequence, such as 41",
        })
}

/// Whether `subject` is one `filter` (a subject that may hold `*` and `>`
/// tokens) selects.
pub(super) fn subject_matches(filter: &str, subject: &str) -> bool {
    let mut subject = subject.split('.');
    for token in filter.split('.') {
        match (token, subject.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (token, Some(given)) if token == given => {}
            _ => return false,
        }
    }
    subject.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_selects_subjects_token_by_token() {
        assert!(subject_matches("ORDERS.billing.dlq", "ORDERS.billing.dlq"));
        assert!(!subject_matches("ORDERS.billing.dlq", "ORDERS.audit.dlq"));
        assert!(subject_matches("ORDERS.*.dlq", "ORDERS.audit.dlq"));
        assert!(!subject_matches("ORDERS.*.dlq", "ORDERS.a.b.dlq"));
        assert!(subject_matches("ORDERS.>", "ORDERS.a.b.dlq"));
        assert!(!subject_matches("ORDERS.>", "ORDERS"));
        assert!(!subject_matches("ORDERS.billing", "ORDERS.billing.dlq"));
    }

    #[test]
    fn an_id_is_a_positive_stream_sequence() {
        for id in ["", "0", "-1", "1-0", "x"] {
            assert!(
                matches!(
                    sequence_of(&LetterId::new(id)),
                    Err(StoreError::InvalidId { .. })
                ),
                "{id}"
            );
        }
        assert_eq!(sequence_of(&LetterId::new("41")).ok(), Some(41));
    }
}
