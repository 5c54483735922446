//! [`read`]: a dead letter read back from what its carrier holds.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use super::fields::{FIELDS, VERSION_TEXT};
use super::{
    ATTEMPTS, Broker, ERROR_CLASS, ERROR_MESSAGE, EnvelopeError, FAILED_FIRST, FAILED_LAST,
    HEADERS_OMITTED, MAX_FIELDS, ORIGIN_BROKER, ORIGIN_CONSUMER, ORIGIN_GROUP, ORIGIN_KEY,
    ORIGIN_PARTITION, ORIGIN_POSITION, ORIGIN_SOURCE, Origin, PRODUCER_PREFIX,
    REFERENCE_HEADER_BYTES, REFERENCE_HEADERS, REFERENCE_KEY_BYTES, REFERENCE_PAYLOAD_BYTES,
    REPLAYS, VERSION,
};
use crate::dead_letter::{DeadLetter, PayloadReference};
use crate::error::ErrorClass;
use crate::message::{Headers, Message, Metadata, payload_preview};

/// The fields found among a carrier's headers, by their index in [`FIELDS`].
struct Found<'h> {
    values: [Option<&'h Bytes>; MAX_FIELDS],
}

impl<'h> Found<'h> {
    fn index(field: &'static str) -> usize {
        FIELDS
            .iter()
            .position(|known| *known == field)
            .unwrap_or(MAX_FIELDS)
    }

    fn optional(&self, field: &'static str) -> Option<&'h Bytes> {
        self.values.get(Self::index(field)).copied().flatten()
    }

    fn required(&self, field: &'static str) -> Result<&'h Bytes, EnvelopeError> {
        self.optional(field).ok_or(EnvelopeError::Missing { field })
    }

    fn text(&self, field: &'static str) -> Result<Option<&'h str>, EnvelopeError> {
        self.optional(field)
            .map(|value| {
                std::str::from_utf8(value).map_err(|_| malformed(field, value, "UTF-8 text"))
            })
            .transpose()
    }

    fn required_text(&self, field: &'static str) -> Result<&'h str, EnvelopeError> {
        self.text(field)?.ok_or(EnvelopeError::Missing { field })
    }

    fn number<N: std::str::FromStr>(
        &self,
        field: &'static str,
        expected: &'static str,
    ) -> Result<Option<N>, EnvelopeError> {
        self.optional(field)
            .map(|value| {
                std::str::from_utf8(value)
                    .ok()
                    .and_then(|text| text.parse().ok())
                    .ok_or_else(|| malformed(field, value, expected))
            })
            .transpose()
    }

    fn required_number<N: std::str::FromStr>(
        &self,
        field: &'static str,
        expected: &'static str,
    ) -> Result<N, EnvelopeError> {
        self.number(field, expected)?
            .ok_or(EnvelopeError::Missing { field })
    }

    fn time(&self, field: &'static str) -> Result<SystemTime, EnvelopeError> {
        let value = self.required(field)?;
        let millis: u64 = self.required_number(field, "milliseconds since the Unix epoch")?;
        UNIX_EPOCH
            .checked_add(Duration::from_millis(millis))
            .ok_or_else(|| malformed(field, value, "a time this system can represent"))
    }
}

fn malformed(field: &'static str, value: &[u8], expected: &'static str) -> EnvelopeError {
    EnvelopeError::Malformed {
        field,
        value: payload_preview(value, 64),
        expected,
    }
}

/// Reads a dead letter back from what its carrier holds: the record's key
/// slot (`None` on a carrier without one: Redis, AMQP), the payload, and the
/// headers or fields besides the payload, in the carrier's order.
///
/// The message comes back with its payload, key, producer headers (restored
/// names) and metadata (source, partition, position; the attempt is the
/// letter's attempts; no timestamp), and the letter with its error, class,
/// attempts, times, replays, reference, [`Origin`] and omitted-header count.
/// Names in the `intake.` namespace this version does not know are kept
/// among the headers.
///
/// # Errors
///
/// [`EnvelopeError`] naming the field that is missing, malformed or
/// repeated, or the version this intake cannot read.
pub fn read(
    key_slot: Option<Bytes>,
    payload: Bytes,
    carried: &Headers,
) -> Result<DeadLetter, EnvelopeError> {
    let mut found = Found {
        values: [None; MAX_FIELDS],
    };
    let mut headers: Vec<(Arc<str>, Bytes)> = Vec::with_capacity(carried.len());
    for header in carried {
        let name = &*header.name;
        if let Some(original) = name.strip_prefix(PRODUCER_PREFIX) {
            headers.push((Arc::from(original), header.value.clone()));
            continue;
        }
        match FIELDS.iter().position(|field| *field == name) {
            Some(index) => {
                if found.values[index].replace(&header.value).is_some() {
                    return Err(EnvelopeError::Duplicate {
                        field: FIELDS[index],
                    });
                }
            }
            None => headers.push((header.name.clone(), header.value.clone())),
        }
    }

    let version = found.required(VERSION)?;
    if version.as_ref() != VERSION_TEXT.as_bytes() {
        return Err(EnvelopeError::UnsupportedVersion {
            version: payload_preview(version, 64),
        });
    }
    let broker_name = found.required_text(ORIGIN_BROKER)?;
    let broker = Broker::from_name(broker_name).ok_or_else(|| {
        malformed(
            ORIGIN_BROKER,
            broker_name.as_bytes(),
            "`kafka`, `redis`, `amqp` or `memory`",
        )
    })?;
    let source = found.required_text(ORIGIN_SOURCE)?;
    let partition: u32 = found.required_number(ORIGIN_PARTITION, "a partition number")?;
    let position_text = found.required_text(ORIGIN_POSITION)?;
    let position = broker.position(position_text).ok_or_else(|| {
        malformed(
            ORIGIN_POSITION,
            position_text.as_bytes(),
            match broker {
                Broker::Redis => "a stream entry id",
                Broker::Amqp => "a delivery tag",
                Broker::Kafka | Broker::Memory | Broker::Nats => "an offset",
            },
        )
    })?;
    let class_name = found.required_text(ERROR_CLASS)?;
    let class = error_class(class_name).ok_or_else(|| {
        malformed(
            ERROR_CLASS,
            class_name.as_bytes(),
            "`permanent`, `retryable`, `ignore` or `interrupted`",
        )
    })?;
    let error = found.required_text(ERROR_MESSAGE)?;
    let attempts: u32 = found.required_number(ATTEMPTS, "an attempt count")?;
    let first_failed_at = found.time(FAILED_FIRST)?;
    let failed_at = found.time(FAILED_LAST)?;
    let replays: u32 = found.required_number(REPLAYS, "a replay count")?;
    let headers_omitted: u32 = found
        .number(HEADERS_OMITTED, "a header count")?
        .unwrap_or(0);
    let reference = read_reference(&found)?;
    let origin = Origin {
        broker,
        group: found.text(ORIGIN_GROUP)?.map(Arc::from),
        consumer: found.text(ORIGIN_CONSUMER)?.map(Arc::from),
    };
    let key = found.optional(ORIGIN_KEY).cloned().or(key_slot);

    let metadata = Metadata::new(source.into(), partition, position).with_attempt(attempts);
    let mut message =
        Message::new(payload, metadata).with_headers(headers.into_iter().collect::<Headers>());
    if let Some(key) = key {
        message = message.with_key(key);
    }
    Ok(DeadLetter {
        message,
        error: error.to_owned(),
        class,
        attempts,
        first_failed_at,
        failed_at,
        replays,
        reference,
        origin: Some(origin),
        headers_omitted,
    })
}

/// The reference sizes, when the letter is a reference letter: all four
/// fields or none.
fn read_reference(found: &Found<'_>) -> Result<Option<PayloadReference>, EnvelopeError> {
    let sizes = [
        REFERENCE_PAYLOAD_BYTES,
        REFERENCE_KEY_BYTES,
        REFERENCE_HEADERS,
        REFERENCE_HEADER_BYTES,
    ];
    if sizes.iter().all(|field| found.optional(field).is_none()) {
        return Ok(None);
    }
    let size = |field| found.required_number::<usize>(field, "a size in bytes");
    Ok(Some(PayloadReference {
        payload_bytes: size(REFERENCE_PAYLOAD_BYTES)?,
        key_bytes: size(REFERENCE_KEY_BYTES)?,
        headers: found.required_number(REFERENCE_HEADERS, "a header count")?,
        header_bytes: size(REFERENCE_HEADER_BYTES)?,
    }))
}

fn error_class(name: &str) -> Option<ErrorClass> {
    [
        ErrorClass::Permanent,
        ErrorClass::Retryable,
        ErrorClass::Ignore,
        ErrorClass::Interrupted,
    ]
    .into_iter()
    .find(|class| class.as_str() == name)
}

/// What an incoming message says of an earlier dead-lettering (a message
/// replayed from a dead-letter destination): when it first failed, and how
/// often it was replayed.
pub(in crate::dead_letter) fn earlier_failure(message: &Message) -> (Option<SystemTime>, u32) {
    let headers = message.headers();
    let number = |name| {
        headers
            .get_str(name)
            .and_then(|text| text.parse::<u64>().ok())
    };
    let first = number(FAILED_FIRST)
        .and_then(|millis| UNIX_EPOCH.checked_add(Duration::from_millis(millis)));
    let replays = number(REPLAYS).map_or(0, |replays| u32::try_from(replays).unwrap_or(u32::MAX));
    (first, replays)
}
