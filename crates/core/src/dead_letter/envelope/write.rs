//! [`Envelope`]: a dead letter as its carrier holds it, written field by
//! field.

use std::borrow::Cow;
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use super::fields::{FIELDS, VERSION_TEXT};
use super::{Broker, Carrier, MAX_FIELDS, Origin, PRODUCER_PREFIX, RESERVED_PREFIX};
use crate::dead_letter::DeadLetter;

/// A dead letter as its carrier holds it: the payload, the key for the key
/// slot, the producer's headers (`intake.…` names moved under
/// [`PRODUCER_PREFIX`]) and the envelope's fields. Built for each write;
/// numbers are formatted once.
pub struct Envelope<'a> {
    letter: &'a DeadLetter,
    key_slot: bool,
    origin: Origin,
    error: Cow<'a, str>,
    /// Where the message was first delivered: a parked copy's origin, not
    /// the place the copy came back through.
    source: &'a str,
    partition: String,
    position: String,
    attempts: String,
    first: String,
    last: String,
    replays: String,
    omitted: u32,
    omitted_text: String,
    reference: Option<[String; 4]>,
    with_headers: bool,
}

impl fmt::Debug for Envelope<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Envelope")
            .field(
                "fields",
                &self.fields().map(|(name, _)| name).collect::<Vec<_>>(),
            )
            .field("headers", &self.header_count())
            .finish_non_exhaustive()
    }
}

impl<'a> Envelope<'a> {
    /// The envelope of `letter` written by a sink of `carrier`.
    ///
    /// The origin is the letter's own when it has one (a letter read back
    /// and written again keeps it), otherwise the carrier's; its source,
    /// partition and position are those of the message's first delivery
    /// ([`Metadata::parked_from`](crate::Metadata::parked_from) of a parked
    /// copy that came back). The error is cut to
    /// [`DeadLetter::ERROR_LIMIT`] bytes.
    pub fn new(letter: &'a DeadLetter, carrier: &Carrier) -> Self {
        let metadata = letter.message.metadata();
        let (source, partition, position) = match metadata.parked_from() {
            Some(first) => (&*first.source, first.partition, first.position),
            None => (
                &**metadata.source(),
                metadata.partition(),
                metadata.position(),
            ),
        };
        let origin = match &letter.origin {
            Some(origin) => Origin {
                broker: Broker::of(position, origin.broker),
                ..origin.clone()
            },
            None => Origin {
                broker: Broker::of(position, carrier.broker()),
                group: carrier.group().cloned(),
                consumer: carrier.consumer().cloned(),
            },
        };
        let reference = letter.reference.map(|sizes| {
            [
                sizes.payload_bytes,
                sizes.key_bytes,
                sizes.headers,
                sizes.header_bytes,
            ]
            .map(|size| size.to_string())
        });
        let omitted = letter.headers_omitted;
        Self {
            letter,
            key_slot: carrier.has_key_slot(),
            origin,
            error: capped_error(&letter.error, DeadLetter::ERROR_LIMIT),
            source,
            partition: partition.to_string(),
            position: position.to_string(),
            attempts: letter.attempts.to_string(),
            first: epoch_millis(letter.first_failed_at).to_string(),
            last: epoch_millis(letter.failed_at).to_string(),
            replays: letter.replays.to_string(),
            omitted,
            omitted_text: omitted.to_string(),
            reference,
            with_headers: true,
        }
    }

    /// The letter this envelope is for.
    pub fn letter(&self) -> &'a DeadLetter {
        self.letter
    }

    /// The payload to write: the original's (empty in a reference letter).
    pub fn payload(&self) -> &'a Bytes {
        self.letter.message.payload()
    }

    /// The key for the record's key slot: the original key on a carrier
    /// with one, `None` on a carrier without (the key is then a field).
    pub fn key(&self) -> Option<&'a Bytes> {
        self.letter.message.key().filter(|_| self.key_slot)
    }

    /// The producer's headers as carried: in their order, a name in the
    /// `intake.` namespace under [`PRODUCER_PREFIX`]; none in a reduced
    /// letter.
    pub fn headers(&self) -> impl Iterator<Item = (Cow<'a, str>, &'a Bytes)> + use<'a> {
        let headers = self.letter.message.headers();
        let shown = if self.with_headers { headers.len() } else { 0 };
        headers
            .iter()
            .take(shown)
            .map(|header| (carried_name(&header.name), &header.value))
    }

    /// How many producer headers [`headers`](Self::headers) yields.
    pub fn header_count(&self) -> usize {
        match self.with_headers {
            true => self.letter.message.headers().len(),
            false => 0,
        }
    }

    /// The envelope's fields, in a fixed order; optional ones only when
    /// they have a value.
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, &[u8])> + '_ {
        let letter = self.letter;
        let key = letter.message.key().filter(|_| !self.key_slot);
        let reference = self.reference.as_ref();
        let values: [Option<&[u8]>; MAX_FIELDS] = [
            Some(VERSION_TEXT.as_bytes()),
            Some(self.origin.broker.as_str().as_bytes()),
            Some(self.source.as_bytes()),
            Some(self.partition.as_bytes()),
            Some(self.position.as_bytes()),
            self.origin.group.as_deref().map(str::as_bytes),
            self.origin.consumer.as_deref().map(str::as_bytes),
            key.map(|key| &key[..]),
            Some(letter.class.as_str().as_bytes()),
            Some(self.error.as_bytes()),
            Some(self.attempts.as_bytes()),
            Some(self.first.as_bytes()),
            Some(self.last.as_bytes()),
            Some(self.replays.as_bytes()),
            (self.omitted > 0).then_some(self.omitted_text.as_bytes()),
            reference.map(|sizes| sizes[0].as_bytes()),
            reference.map(|sizes| sizes[1].as_bytes()),
            reference.map(|sizes| sizes[2].as_bytes()),
            reference.map(|sizes| sizes[3].as_bytes()),
        ];
        FIELDS
            .into_iter()
            .zip(values)
            .filter_map(|(name, value)| value.map(|value| (name, value)))
    }

    /// How many fields [`fields`](Self::fields) yields.
    pub fn field_count(&self) -> usize {
        self.fields().count()
    }

    /// The producer's headers, then the envelope's fields: everything a
    /// carrier without a key slot or payload of its own needs besides the
    /// payload, as `(name, value)` pairs.
    pub fn pairs(&self) -> impl Iterator<Item = (Cow<'a, str>, &[u8])> + '_ {
        self.headers()
            .map(|(name, value)| (name, &value[..]))
            .chain(
                self.fields()
                    .map(|(name, value)| (Cow::Borrowed(name), value)),
            )
    }

    /// The reduced letter for a carrier that cannot take this one: no
    /// producer headers (their number in [`HEADERS_OMITTED`](super::HEADERS_OMITTED)) and the error
    /// cut to `error_limit` bytes. Origin, times and payload stay whole.
    pub fn reduced(mut self, error_limit: usize) -> Self {
        if self.with_headers {
            self.with_headers = false;
            let headers = self.letter.message.headers().len();
            self.count_omitted(headers);
        }
        self.cap_error(error_limit);
        self
    }

    /// Cuts the error to `limit` bytes (with a note of how much was cut),
    /// for a carrier with less room than [`DeadLetter::ERROR_LIMIT`].
    pub fn cap_error(&mut self, limit: usize) {
        if self.error.len() > limit {
            self.error = Cow::Owned(capped_error(&self.error, limit).into_owned());
        }
    }

    /// Counts `headers` producer headers the carrier could not take (a name
    /// it cannot carry) in [`HEADERS_OMITTED`](super::HEADERS_OMITTED).
    pub fn count_omitted(&mut self, headers: usize) {
        if headers == 0 {
            return;
        }
        // Saturates: a count past `u32::MAX` still says "that many or more".
        let headers = u32::try_from(headers).unwrap_or(u32::MAX);
        self.omitted = self.omitted.saturating_add(headers);
        self.omitted_text = self.omitted.to_string();
    }

    /// Whether this is a reduced letter.
    pub fn is_reduced(&self) -> bool {
        !self.with_headers
    }
}

/// The name a producer's header is carried under.
fn carried_name(name: &str) -> Cow<'_, str> {
    match name.starts_with(RESERVED_PREFIX) {
        true => Cow::Owned(format!("{PRODUCER_PREFIX}{name}")),
        false => Cow::Borrowed(name),
    }
}

/// Milliseconds since the Unix epoch; 0 for earlier times.
fn epoch_millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    })
}

/// The longest note [`capped_error`] appends: `… (` and ` bytes cut)` around
/// the decimal count.
const CUT_NOTE_BYTES: usize = "… (".len() + 20 + " bytes cut)".len();

/// `error` in at most `limit` bytes: cut at a character boundary, with a
/// note of how much was cut. An error already within the limit is left as
/// it is, so capping twice changes nothing.
pub(crate) fn capped_error(error: &str, limit: usize) -> Cow<'_, str> {
    if error.len() <= limit {
        return Cow::Borrowed(error);
    }
    let mut end = limit.saturating_sub(CUT_NOTE_BYTES);
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    let cut = error.len() - end;
    Cow::Owned(format!("{}… ({cut} bytes cut)", &error[..end]))
}
