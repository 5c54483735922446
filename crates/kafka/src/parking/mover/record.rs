//! A record the mover took from a retry topic: its due time, its origin
//! partition and the headers it goes back with.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use intake_core::Headers;
use intake_core::parking::{DUE, ORIGIN_PARTITION};
use rdkafka::Message as _;
use rdkafka::message::{BorrowedMessage, Header, OwnedHeaders};

use crate::parking::LEGACY_ORIGIN_PARTITION;
use crate::parking::tiers::Tiers;

/// A record taken from a retry topic. Its headers are read through
/// librdkafka's C accessors ([`read_headers`](crate::record_headers::read_headers)):
/// rdkafka's own header iterator panics on a name that is not UTF-8, which
/// any producer with write access to a retry topic can write.
pub(super) struct ParkedRecord {
    pub(super) topic: String,
    pub(super) partition: i32,
    pub(super) offset: i64,
    pub(super) key: Option<Vec<u8>>,
    pub(super) payload: Option<Vec<u8>>,
    /// Names lossily (bytes that are not UTF-8 become U+FFFD), values as
    /// they are (a header without a value as an empty one).
    pub(super) headers: Headers,
}

impl ParkedRecord {
    pub(super) fn of(message: &BorrowedMessage<'_>) -> Self {
        Self {
            topic: message.topic().to_owned(),
            partition: message.partition(),
            offset: message.offset(),
            key: message.key().map(<[u8]>::to_vec),
            payload: message.payload().map(<[u8]>::to_vec),
            headers: crate::record_headers::read_headers(message),
        }
    }
}

/// The due time a record carries, `None` when it carries none that is a
/// time (missing, not a number, beyond what the clock holds).
pub(super) fn due_of(record: &ParkedRecord) -> Option<SystemTime> {
    let millis: u64 = record.headers.get_str(DUE)?.parse().ok()?;
    UNIX_EPOCH.checked_add(Duration::from_millis(millis))
}

/// When the head `record` of a partition of tier `tier` is looked at again:
/// its due time, but no later than the tier's hold from `now`, so a record
/// that asks for more never stalls the ones behind it; `now` for a record
/// without a due time, which goes back at once.
pub(super) fn wake_at(
    record: &ParkedRecord,
    tiers: &Tiers,
    tier: usize,
    now: SystemTime,
) -> SystemTime {
    match due_of(record) {
        Some(due) => now
            .checked_add(tiers.hold(tier))
            .map_or(due, |limit| due.min(limit)),
        None => {
            tracing::warn!(
                topic = %record.topic,
                partition = record.partition,
                offset = record.offset,
                "a parked record without a due time; moved back at once"
            );
            now
        }
    }
}

/// The origin partition a record names, if it is a partition number: the
/// core's [`ORIGIN_PARTITION`] (the partition of the message's first
/// delivery, kept by every park), else [`LEGACY_ORIGIN_PARTITION`], which
/// earlier versions wrote.
pub(super) fn origin_partition(record: &ParkedRecord) -> Option<i32> {
    let named = |name: &str| {
        record
            .headers
            .get_str(name)?
            .parse::<i32>()
            .ok()
            .filter(|partition| *partition >= 0)
    };
    named(ORIGIN_PARTITION).or_else(|| named(LEGACY_ORIGIN_PARTITION))
}

/// The record's headers, in order, without the old origin partition header
/// when it goes back (the message returns with the headers it was parked
/// with; the core's header stays, the parking layer reads it).
pub(super) fn copy_headers(record: &ParkedRecord, back: bool) -> OwnedHeaders {
    record
        .headers
        .iter()
        .filter(|header| !(back && &*header.name == LEGACY_ORIGIN_PARTITION))
        .fold(
            OwnedHeaders::new_with_capacity(record.headers.len()),
            |copy, header| {
                copy.insert(Header {
                    key: &header.name,
                    value: Some(header.value.as_ref()),
                })
            },
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(headers: &[(&str, &str)]) -> ParkedRecord {
        ParkedRecord {
            topic: "orders.billing.retry.1s".into(),
            partition: 0,
            offset: 7,
            key: Some(b"key".to_vec()),
            payload: Some(b"payload".to_vec()),
            headers: headers
                .iter()
                .map(|(name, value)| (*name, bytes::Bytes::copy_from_slice(value.as_bytes())))
                .collect(),
        }
    }

    fn tiers() -> Tiers {
        Tiers::new(vec![Duration::from_secs(1), Duration::from_secs(10)]).expect("valid")
    }

    #[test]
    fn a_record_without_a_usable_due_time_is_due_at_once() {
        let now = SystemTime::now();
        for headers in [vec![], vec![(DUE, "soon")], vec![(DUE, "-5")]] {
            let record = record(&headers);
            assert_eq!(due_of(&record), None);
            assert_eq!(wake_at(&record, &tiers(), 0, now), now);
        }
    }

    #[test]
    fn a_head_is_held_until_due_but_no_longer_than_its_tier_allows() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let due_in = |secs: u64| {
            let due = now + Duration::from_secs(secs);
            let millis = due.duration_since(UNIX_EPOCH).expect("after").as_millis();
            record(&[(DUE, &millis.to_string())])
        };
        assert_eq!(
            wake_at(&due_in(3), &tiers(), 0, now),
            now + Duration::from_secs(3)
        );
        // Far in the future (or hostile): held for the next tier, then
        // written to the tail again.
        assert_eq!(
            wake_at(&due_in(86_400), &tiers(), 0, now),
            now + Duration::from_secs(10)
        );
        assert_eq!(
            wake_at(&due_in(86_400), &tiers(), 1, now),
            now + Duration::from_secs(10)
        );
    }

    #[test]
    fn going_back_drops_the_old_origin_partition_header_and_keeps_the_rest_in_order() {
        let record = record(&[
            ("a", "1"),
            (LEGACY_ORIGIN_PARTITION, "2"),
            (ORIGIN_PARTITION, "2"),
            ("b", "2"),
            ("a", "3"),
        ]);
        assert_eq!(origin_partition(&record), Some(2));
        let back = copy_headers(&record, true);
        let names: Vec<(&str, Option<&[u8]>)> = rdkafka::message::Headers::iter(&back)
            .map(|header| (header.key, header.value))
            .collect();
        assert_eq!(
            names,
            [
                ("a", Some(&b"1"[..])),
                (ORIGIN_PARTITION, Some(&b"2"[..])),
                ("b", Some(&b"2"[..])),
                ("a", Some(&b"3"[..]))
            ]
        );
        assert_eq!(
            rdkafka::message::Headers::count(&copy_headers(&record, false)),
            5
        );
    }

    #[test]
    fn the_cores_origin_partition_wins_over_the_old_header() {
        assert_eq!(
            origin_partition(&record(&[
                (LEGACY_ORIGIN_PARTITION, "1"),
                (ORIGIN_PARTITION, "2")
            ])),
            Some(2)
        );
        assert_eq!(
            origin_partition(&record(&[(LEGACY_ORIGIN_PARTITION, "1")])),
            Some(1)
        );
        assert_eq!(
            origin_partition(&record(&[
                (ORIGIN_PARTITION, "x"),
                (LEGACY_ORIGIN_PARTITION, "1")
            ])),
            Some(1),
            "an unusable core header falls back to the old one"
        );
    }

    #[test]
    fn an_origin_partition_that_is_no_partition_number_is_ignored() {
        for value in ["-1", "x", "99999999999"] {
            assert_eq!(
                origin_partition(&record(&[(ORIGIN_PARTITION, value)])),
                None
            );
            assert_eq!(
                origin_partition(&record(&[(LEGACY_ORIGIN_PARTITION, value)])),
                None
            );
        }
    }
}
