//! Letter ids as entry ids (`1700000000000-0`), and the ids next to one.

use intake_core::dead_letter::store::{LetterId, StoreError};

use crate::stream_id::StreamId;

pub(super) fn letter_id(id: StreamId) -> LetterId {
    LetterId::new(format!("{}-{}", id.ms, id.seq))
}

pub(super) fn stream_id(id: &LetterId) -> Result<StreamId, StoreError> {
    StreamId::parse(id.as_str().as_bytes()).ok_or_else(|| StoreError::InvalidId {
        id: id.as_str().to_owned(),
        expected: "a stream entry id, such as 1700000000000-0",
    })
}

/// The last id before `id`, `None` before the first.
pub(super) fn predecessor(id: StreamId) -> Option<StreamId> {
    match id.seq.checked_sub(1) {
        Some(seq) => Some(StreamId { ms: id.ms, seq }),
        None => id
            .ms
            .checked_sub(1)
            .map(|ms| StreamId { ms, seq: u64::MAX }),
    }
}

/// The first id after `id`, `None` past the last id a stream can hold.
/// (`XRANGE`'s exclusive `(` start needs Redis 6.2; this works on any.)
pub(super) fn successor(id: StreamId) -> Option<StreamId> {
    match id.seq.checked_add(1) {
        Some(seq) => Some(StreamId { ms: id.ms, seq }),
        None => id.ms.checked_add(1).map(|ms| StreamId { ms, seq: 0 }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_successor_of_an_id_carries_into_the_milliseconds() {
        let id = |ms, seq| StreamId { ms, seq };
        assert_eq!(successor(id(5, 1)), Some(id(5, 2)));
        assert_eq!(successor(id(5, u64::MAX)), Some(id(6, 0)));
        assert_eq!(successor(id(u64::MAX, u64::MAX)), None);
        assert_eq!(predecessor(id(5, 2)), Some(id(5, 1)));
        assert_eq!(predecessor(id(6, 0)), Some(id(5, u64::MAX)));
        assert_eq!(predecessor(id(0, 0)), None);
    }

    #[test]
    fn an_id_of_another_form_is_refused() {
        for id in ["41", "a-b", "", "1-2-3"] {
            assert!(
                matches!(
                    stream_id(&LetterId::new(id)),
                    Err(StoreError::InvalidId { .. })
                ),
                "{id}"
            );
        }
        assert_eq!(
            stream_id(&LetterId::new("1700000000000-7")).ok(),
            Some(StreamId {
                ms: 1_700_000_000_000,
                seq: 7
            })
        );
    }
}
