//! [`StreamId`]: a stream entry id, `<ms>-<seq>`, as intake's
//! [`Position`] and as a command argument.

use std::io::Write as _;

use intake_core::Position;
use redis::{RedisWrite, ToRedisArgs, ToSingleRedisArg};

/// A stream entry id, `<ms>-<seq>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct StreamId {
    pub(crate) ms: u64,
    pub(crate) seq: u64,
}

impl StreamId {
    pub(crate) const ZERO: StreamId = StreamId { ms: 0, seq: 0 };

    pub(crate) fn parse(text: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(text).ok()?;
        let (ms, seq) = text.split_once('-')?;
        Some(Self {
            ms: ms.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }

    pub(crate) fn position(self) -> Position {
        Position::StreamId {
            ms: self.ms,
            seq: self.seq,
        }
    }

    pub(crate) fn from_position(position: Position) -> Option<Self> {
        match position {
            Position::StreamId { ms, seq } => Some(Self { ms, seq }),
            _ => None,
        }
    }
}

impl StreamId {
    /// The id as `<ms>-<seq>` text in `buffer`. Hand-rolled rather than
    /// `write!`: an acknowledgement formats every id of a batch, and the
    /// formatting machinery costs several times more per number.
    pub(crate) fn format(self, buffer: &mut [u8; 41]) -> &[u8] {
        fn digits(mut value: u64, end: usize, buffer: &mut [u8; 41]) -> usize {
            let mut start = end;
            loop {
                start -= 1;
                buffer[start] = b'0' + (value % 10) as u8;
                value /= 10;
                if value == 0 {
                    return start;
                }
            }
        }
        // Both numbers fit in 20 digits; the sequence goes at the end, the
        // milliseconds before the dash.
        let seq_start = digits(self.seq, buffer.len(), buffer);
        let dash = seq_start - 1;
        buffer[dash] = b'-';
        let ms_start = digits(self.ms, dash, buffer);
        &buffer[ms_start..]
    }
}

impl ToRedisArgs for StreamId {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut buffer = [0; 41];
        out.write_arg(self.format(&mut buffer));
    }
}

impl ToSingleRedisArg for StreamId {}

/// An exclusive range start, `(<ms>-<seq>`, for `XPENDING`.
pub(crate) struct After(pub(crate) StreamId);

impl ToRedisArgs for After {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut writer = out.writer_for_next_arg();
        let _ = write!(writer, "({}-{}", self.0.ms, self.0.seq);
    }
}

impl ToSingleRedisArg for After {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_and_print_in_redis_form() {
        assert_eq!(
            StreamId::parse(b"1700000000000-7"),
            Some(StreamId {
                ms: 1_700_000_000_000,
                seq: 7
            })
        );
        assert_eq!(StreamId::parse(b"17"), None);
        assert_eq!(StreamId::parse(b"a-b"), None);
        let mut cmd = redis::cmd("XACK");
        cmd.arg(StreamId { ms: 5, seq: 9 })
            .arg(After(StreamId { ms: 5, seq: 9 }));
        let args: Vec<_> = cmd.args_iter().collect();
        assert_eq!(
            args,
            vec![
                redis::Arg::Simple(&b"XACK"[..]),
                redis::Arg::Simple(&b"5-9"[..]),
                redis::Arg::Simple(&b"(5-9"[..])
            ]
        );
    }

    #[test]
    fn ids_format_like_redis_at_the_extremes() {
        let mut buffer = [0; 41];
        for (ms, seq) in [
            (0, 0),
            (1, 10),
            (1_700_000_000_000, 7),
            (u64::MAX, u64::MAX),
        ] {
            let text = StreamId { ms, seq }.format(&mut buffer).to_vec();
            assert_eq!(text, format!("{ms}-{seq}").into_bytes());
        }
    }

    proptest::proptest! {
        #[test]
        fn any_id_text_parses_only_as_what_it_prints(text in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..48)) {
            if let Some(id) = StreamId::parse(&text) {
                let mut buffer = [0; 41];
                let printed = id.format(&mut buffer).to_vec();
                proptest::prop_assert_eq!(StreamId::parse(&printed), Some(id));
            }
        }
    }
}
