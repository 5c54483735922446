//! Names of the headers intake reads from deliveries and writes to dead
//! letters.
//!
//! AMQP message properties that handlers commonly need appear among a
//! message's headers under an `amqp.` name; the headers table of the
//! delivery appears as it is. Dead letters carry their origin under
//! `x-intake-` names.

/// The `message-id` property.
pub const MESSAGE_ID: &str = "amqp.message-id";
/// The `correlation-id` property.
pub const CORRELATION_ID: &str = "amqp.correlation-id";
/// The `content-type` property.
pub const CONTENT_TYPE: &str = "amqp.content-type";
/// Set by quorum queues: how often the message was returned before.
pub const DELIVERY_COUNT: &str = "x-delivery-count";

/// Dead letter: the queue the message was consumed from.
pub const DEAD_LETTER_SOURCE: &str = "x-intake-source";
/// Dead letter: the channel epoch (intake's partition number) it arrived on.
pub const DEAD_LETTER_PARTITION: &str = "x-intake-partition";
/// Dead letter: its delivery tag on that channel.
pub const DEAD_LETTER_POSITION: &str = "x-intake-position";
/// Dead letter: its routing key.
pub const DEAD_LETTER_ROUTING_KEY: &str = "x-intake-routing-key";
/// Dead letter: the last error, as text.
pub const DEAD_LETTER_ERROR: &str = "x-intake-error";
/// Dead letter: attempts made before giving up.
pub const DEAD_LETTER_ATTEMPTS: &str = "x-intake-attempts";
/// Dead letter: when it was given up, in milliseconds since the Unix epoch.
pub const DEAD_LETTER_FAILED_AT_MS: &str = "x-intake-failed-at-ms";
/// Dead letter: how many of the original headers were left out because,
/// with them, the dead letter's headers would not fit in one frame of the
/// connection (`frame_max`). Set only on such dead letters, which also
/// carry the error cut to [`DEAD_LETTER_ERROR_REDUCED_BYTES`].
pub const DEAD_LETTER_HEADERS_LEFT_OUT: &str = "x-intake-headers-left-out";

/// The most bytes of the error a dead letter keeps when its headers had to
/// be reduced to fit a frame (cut at a character boundary).
pub const DEAD_LETTER_ERROR_REDUCED_BYTES: usize = 1024;

/// Dead letter: a header of the original whose name is in intake's own
/// namespace (`x-intake-…`) is kept under this prefix
/// (`x-intake-producer.x-intake-source`), so that nothing a producer wrote
/// can pass for the origin.
pub const DEAD_LETTER_PRODUCER_PREFIX: &str = "x-intake-producer.";
