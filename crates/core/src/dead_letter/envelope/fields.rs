//! The envelope's field names, and the namespace they live in.

/// The envelope's version, `1`. A reader refuses a letter of a version it
/// does not know rather than misread it.
pub const VERSION: &str = "intake.dlq.version";
/// The broker the message was consumed from: `kafka`, `redis`, `amqp` or
/// `memory` ([`Broker`](super::Broker)); it says how to read the position.
pub const ORIGIN_BROKER: &str = "intake.origin.broker";
/// The topic, stream or queue the message was consumed from.
pub const ORIGIN_SOURCE: &str = "intake.origin.source";
/// Its partition, in decimal (Redis: 0; AMQP: the channel epoch).
pub const ORIGIN_PARTITION: &str = "intake.origin.partition";
/// Its position in the partition, as the broker prints it: a Kafka or
/// memory offset (`41`), a Redis entry id (`1700000000000-0`), an AMQP
/// delivery tag (`7`).
pub const ORIGIN_POSITION: &str = "intake.origin.position";
/// The consumer group that gave up on it (absent where there is none: AMQP,
/// Redis broadcast mode).
pub const ORIGIN_GROUP: &str = "intake.origin.group";
/// The consumer that gave up on it, where the backend names one (Redis).
pub const ORIGIN_CONSUMER: &str = "intake.origin.consumer";
/// Its key, raw, on carriers without a key slot (Redis, AMQP); absent when
/// it had none. On Kafka and the memory broker the record key is the key.
pub const ORIGIN_KEY: &str = "intake.origin.key";
/// The class of the last failure: `permanent` or `retryable` (retries used
/// up), as [`ErrorClass::as_str`](crate::ErrorClass::as_str) prints it.
pub const ERROR_CLASS: &str = "intake.error.class";
/// The last failure's text, at most
/// [`DeadLetter::ERROR_LIMIT`](crate::dead_letter::DeadLetter::ERROR_LIMIT)
/// bytes.
pub const ERROR_MESSAGE: &str = "intake.error.message";
/// Attempts made before giving up, in decimal.
pub const ATTEMPTS: &str = "intake.attempts";
/// When the message first failed for good, in milliseconds since the Unix
/// epoch: the incoming message's own `intake.failed.first` when it carries
/// one (a replayed message), otherwise the same as [`FAILED_LAST`].
pub const FAILED_FIRST: &str = "intake.failed.first";
/// When it was given up this time, in milliseconds since the Unix epoch.
pub const FAILED_LAST: &str = "intake.failed.last";
/// How often the message was replayed from a dead-letter destination: the
/// incoming message's own `intake.replays`, 0 without one.
pub const REPLAYS: &str = "intake.replays";
/// How many of the original headers the letter leaves out (a reduced
/// letter: see `docs/DEAD-LETTERS.md`); absent when none are.
pub const HEADERS_OMITTED: &str = "intake.headers.omitted";
/// On a [reference letter](crate::dead_letter::PayloadReference): the payload's length.
pub const REFERENCE_PAYLOAD_BYTES: &str = "intake.reference.payload_bytes";
/// On a reference letter: the key's length (0 without a key).
pub const REFERENCE_KEY_BYTES: &str = "intake.reference.key_bytes";
/// On a reference letter: how many headers the message had.
pub const REFERENCE_HEADERS: &str = "intake.reference.headers";
/// On a reference letter: the headers' names and values, in bytes.
pub const REFERENCE_HEADER_BYTES: &str = "intake.reference.header_bytes";

/// The namespace of the envelope's names. A producer's header in it is
/// carried under [`PRODUCER_PREFIX`].
pub const RESERVED_PREFIX: &str = "intake.";
/// A producer's header named `intake.…` is carried as
/// `intake.producer.intake.…` and restored on read.
pub const PRODUCER_PREFIX: &str = "intake.producer.";

/// The version this intake writes and reads.
pub const CURRENT_VERSION: u32 = 1;

/// Every field of the envelope, in the order a sink writes them.
pub(super) const FIELDS: [&str; 19] = [
    VERSION,
    ORIGIN_BROKER,
    ORIGIN_SOURCE,
    ORIGIN_PARTITION,
    ORIGIN_POSITION,
    ORIGIN_GROUP,
    ORIGIN_CONSUMER,
    ORIGIN_KEY,
    ERROR_CLASS,
    ERROR_MESSAGE,
    ATTEMPTS,
    FAILED_FIRST,
    FAILED_LAST,
    REPLAYS,
    HEADERS_OMITTED,
    REFERENCE_PAYLOAD_BYTES,
    REFERENCE_KEY_BYTES,
    REFERENCE_HEADERS,
    REFERENCE_HEADER_BYTES,
];

/// The most fields an envelope has: a sink that counts what it passes to
/// its broker (Redis's script arguments) can reserve room for them.
pub const MAX_FIELDS: usize = FIELDS.len();

/// [`CURRENT_VERSION`] as the envelope carries it.
pub(super) const VERSION_TEXT: &str = "1";
