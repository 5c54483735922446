//! Names of the headers intake reads from deliveries.
//!
//! AMQP message properties that handlers commonly need appear among a
//! message's headers under an `amqp.` name; the headers table of the
//! delivery appears as it is. Dead letters carry the envelope of
//! [`intake_core::dead_letter::envelope`], the same names as on every
//! backend.

/// The `message-id` property.
pub const MESSAGE_ID: &str = "amqp.message-id";
/// The `correlation-id` property.
pub const CORRELATION_ID: &str = "amqp.correlation-id";
/// The `content-type` property.
pub const CONTENT_TYPE: &str = "amqp.content-type";
/// Set by quorum queues: how often the message was returned before.
pub const DELIVERY_COUNT: &str = "x-delivery-count";

/// On a dead letter an [`AmqpDeadLetterSink`](crate::AmqpDeadLetterSink)
/// wrote: the id its sink gave it (the sink's random instance and a
/// counter). The [`AmqpDeadLetterStore`](crate::AmqpDeadLetterStore) makes
/// the letter's id with it, so that two letters never share one; reading a
/// letter back ([`read_dead_letter`](crate::read_dead_letter)) leaves it
/// out of the letter's headers.
pub const LETTER_ID: &str = "intake.amqp.letter-id";

/// The most bytes of the error a reduced dead letter keeps (one whose
/// headers had to be left out to fit a frame; see
/// [`AmqpDeadLetterSink`](crate::AmqpDeadLetterSink)), cut at a character
/// boundary. The envelope's own fields are named in
/// [`intake_core::dead_letter::envelope`].
pub const DEAD_LETTER_ERROR_REDUCED_BYTES: usize = 1024;
