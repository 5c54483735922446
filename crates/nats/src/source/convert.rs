//! A JetStream delivery as an intake [`Message`]: where it came from is read
//! from its `$JS.ACK` reply subject, which the server writes for every
//! delivery: stream, consumer, delivery count, stream sequence, consumer
//! sequence, publish time, pending count.
//!
//! - payload: the message's payload (empty for a message without one;
//!   NATS has no "missing" payload apart from an empty one);
//! - key: the subject, which is what NATS producers route by;
//! - headers: the NATS headers, each value once per occurrence (async-nats
//!   keeps them in a map, so their order is the map's, not the wire's);
//! - partition: 0, or the number in the subject token chosen with
//!   `partition_token` (NATS's own deterministic partitioning writes one);
//! - position: the stream sequence;
//! - attempt: the server's delivery count;
//! - timestamp: when the server stored the message.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use async_nats::Subject;
use bytes::Bytes;
use intake_core::{Headers, Message, Metadata, Position, SourceName};

/// What the `$JS.ACK` reply subject of a delivery says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AckInfo {
    pub(crate) delivered: u64,
    pub(crate) stream_sequence: u64,
    pub(crate) published_nanos: u64,
}

/// Reads a `$JS.ACK` subject: the original 9-token form
/// (`$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>`)
/// or the form with domain and account hash after `ACK` (11 tokens or
/// more). `None` for anything else.
///
/// Bytes, not `str::split` and `str::parse`: it runs once per delivery, and
/// the generic versions took a third of the source's time in a profile.
pub(crate) fn parse_ack_subject(reply: &str) -> Option<AckInfo> {
    let rest = reply.strip_prefix("$JS.ACK.")?.as_bytes();
    let mut tokens: [&[u8]; 10] = [&[]; 10];
    let mut count = 0;
    for token in rest.split(|byte| *byte == b'.') {
        if count == tokens.len() {
            break;
        }
        tokens[count] = token;
        count += 1;
    }
    let numbers = match count {
        7 => &tokens[2..7],
        9 | 10 => &tokens[4..9],
        _ => return None,
    };
    let [delivered, sequence, _consumer_sequence, published, _pending] = numbers else {
        return None;
    };
    Some(AckInfo {
        delivered: decimal(delivered)?,
        stream_sequence: decimal(sequence)?,
        published_nanos: decimal(published)?,
    })
}

/// A non-empty run of ASCII digits that fits a `u64`.
fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |value, byte| {
        let digit = byte.checked_sub(b'0').filter(|digit| *digit <= 9)?;
        value.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// Why a message on the source's inbox is not a delivery it can hand on.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum NotADelivery {
    /// No `$JS.ACK` reply subject (nothing could acknowledge it).
    NoAckSubject,
    /// A stream sequence past what a [`Position`] holds (2^63).
    SequenceOutOfRange(u64),
}

/// A delivery, converted.
#[derive(Debug)]
pub(crate) struct Delivery {
    pub(crate) message: Message,
    pub(crate) sequence: u64,
    pub(crate) delivered: u32,
    pub(crate) reply: Subject,
}

/// Turns deliveries of one stream into messages.
#[derive(Clone, Debug)]
pub(crate) struct Converter {
    stream: SourceName,
    partition_token: Option<usize>,
}

impl Converter {
    pub(crate) fn new(stream: &str, partition_token: Option<usize>) -> Self {
        Self {
            stream: stream.into(),
            partition_token,
        }
    }

    /// The partition of a message on `subject`.
    pub(crate) fn partition(&self, subject: &str) -> u32 {
        self.partition_token
            .and_then(|index| subject.split('.').nth(index))
            .and_then(|token| token.parse().ok())
            .unwrap_or(0)
    }

    pub(crate) fn convert(&self, message: async_nats::Message) -> Result<Delivery, NotADelivery> {
        let reply = message.reply.ok_or(NotADelivery::NoAckSubject)?;
        let info = parse_ack_subject(&reply).ok_or(NotADelivery::NoAckSubject)?;
        let position = i64::try_from(info.stream_sequence)
            .map_err(|_| NotADelivery::SequenceOutOfRange(info.stream_sequence))?;
        let delivered = u32::try_from(info.delivered).unwrap_or(u32::MAX);
        let partition = self.partition(&message.subject);
        let mut metadata =
            Metadata::new(self.stream.clone(), partition, Position::Offset(position))
                .with_attempt(delivered);
        metadata.set_timestamp(UNIX_EPOCH.checked_add(Duration::from_nanos(info.published_nanos)));
        let headers = match &message.headers {
            Some(map) if !map.is_empty() => headers(map),
            _ => Headers::new(),
        };
        // The subject's own buffer becomes the key: async-nats gives each
        // delivery a subject of its own, so this moves it, no copy.
        let key = Bytes::from(message.subject.into_string());
        let converted = Message::from_parts(message.payload, Some(key), headers, metadata);
        Ok(Delivery {
            message: converted,
            sequence: info.stream_sequence,
            delivered,
            reply,
        })
    }
}

/// NATS headers as intake headers; a name given several values appears
/// once per value.
pub(crate) fn headers(map: &async_nats::HeaderMap) -> Headers {
    map.iter()
        .flat_map(|(name, values)| {
            let name: Arc<str> = Arc::from(name.as_ref() as &str);
            values.iter().map(move |value| {
                (
                    name.clone(),
                    Bytes::copy_from_slice(value.as_str().as_bytes()),
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn both_ack_subject_forms_are_read() {
        let v1 = parse_ack_subject("$JS.ACK.orders.billing.3.100.7.1700000000000000000.42");
        assert_eq!(
            v1,
            Some(AckInfo {
                delivered: 3,
                stream_sequence: 100,
                published_nanos: 1_700_000_000_000_000_000
            })
        );
        let v2 = parse_ack_subject("$JS.ACK.hub.hash.orders.billing.2.50.9.1700000000000000000.0");
        assert_eq!(
            v2.map(|info| (info.delivered, info.stream_sequence)),
            Some((2, 50))
        );
        let v2_token =
            parse_ack_subject("$JS.ACK.hub.hash.orders.billing.2.50.9.1700000000000000000.0.x");
        assert_eq!(v2_token.map(|info| info.stream_sequence), Some(50));
        assert_eq!(parse_ack_subject("$JS.ACK.orders.billing.3.100"), None);
        assert_eq!(
            parse_ack_subject("$JS.ACK.orders.billing.3..7.1700000000000000000.42"),
            None,
            "an empty number"
        );
        assert_eq!(
            parse_ack_subject("$JS.ACK.orders.billing.3.+100.7.1700000000000000000.42"),
            None,
            "a sign is no digit"
        );
        assert_eq!(
            parse_ack_subject("$JS.ACK.orders.billing.3.18446744073709551616.7.1.42"),
            None,
            "past u64"
        );
        assert_eq!(parse_ack_subject("_INBOX.abc"), None);
    }

    #[test]
    fn the_partition_is_the_chosen_token_when_it_is_a_number() {
        let converter = Converter::new("orders", Some(1));
        assert_eq!(converter.partition("orders.7.customer-1"), 7);
        assert_eq!(converter.partition("orders.x.customer-1"), 0);
        assert_eq!(converter.partition("orders"), 0);
        assert_eq!(Converter::new("orders", None).partition("orders.7"), 0);
    }

    proptest! {
        #[test]
        fn any_reply_subject_is_read_or_refused_without_panic(reply in ".{0,200}") {
            let _ = parse_ack_subject(&reply);
        }

        #[test]
        fn any_ack_subject_of_numbers_is_read_back(
            delivered in any::<u64>(),
            sequence in any::<u64>(),
            nanos in any::<u64>(),
        ) {
            let reply = format!("$JS.ACK.s.c.{delivered}.{sequence}.1.{nanos}.0");
            prop_assert_eq!(
                parse_ack_subject(&reply),
                Some(AckInfo { delivered, stream_sequence: sequence, published_nanos: nanos })
            );
        }
    }
}
