//! [`TraceParent`]: the W3C `traceparent` header, parsed without allocating.

/// The header that carries W3C trace context.
pub const TRACEPARENT: &str = "traceparent";

/// A valid W3C `traceparent` value: `version-traceid-parentid-flags`, e.g.
/// `00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceParent<'a> {
    /// 32 lowercase hex digits, not all zero.
    pub trace_id: &'a str,
    /// The caller's span: 16 lowercase hex digits, not all zero.
    pub parent_id: &'a str,
    /// The trace flags; bit 0 is "sampled".
    pub flags: u8,
}

impl<'a> TraceParent<'a> {
    /// Parses a header value; `None` if it is not valid W3C trace context
    /// (an invalid header is ignored, as the specification asks).
    pub fn parse(value: &'a [u8]) -> Option<Self> {
        let value = std::str::from_utf8(value).ok()?.trim();
        let mut parts = value.splitn(5, '-');
        let version = parts.next()?;
        let trace_id = parts.next()?;
        let parent_id = parts.next()?;
        let flags = parts.next()?;
        let rest = parts.next();
        if !is_hex(version, 2) || version == "ff" || !is_hex(flags, 2) {
            return None;
        }
        // Version 00 has exactly four fields; later versions may append more.
        if version == "00" && rest.is_some() {
            return None;
        }
        if !is_hex(trace_id, 32)
            || is_zero(trace_id)
            || !is_hex(parent_id, 16)
            || is_zero(parent_id)
        {
            return None;
        }
        Some(Self {
            trace_id,
            parent_id,
            flags: u8::from_str_radix(flags, 16).ok()?,
        })
    }

    /// Whether the caller sampled this trace.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

fn is_hex(field: &str, len: usize) -> bool {
    field.len() == len
        && field
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn is_zero(field: &str) -> bool {
    field.bytes().all(|b| b == b'0')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_header_yields_trace_and_parent_ids() {
        let parsed = TraceParent::parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        assert_eq!(
            parsed,
            Some(TraceParent {
                trace_id: "4bf92f3577b34da6a3ce929d0e0e4736",
                parent_id: "00f067aa0ba902b7",
                flags: 1,
            })
        );
        assert!(parsed.is_some_and(|p| p.sampled()));
    }

    #[test]
    fn invalid_headers_are_ignored() {
        for bad in [
            &b""[..],
            b"garbage",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            b"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            b"\xff\xfe",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{}", bad.escape_ascii());
        }
    }

    #[test]
    fn a_later_version_may_carry_more_fields() {
        let parsed =
            TraceParent::parse(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what");
        assert!(parsed.is_some_and(|p| !p.sampled()));
    }
}
