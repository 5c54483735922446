//! The producer's context: delivery reports resolve receipts, and outputs
//! refused as part of a batch are sent again alone.

use super::*;

/// The producer's context: delivery reports and client errors.
pub(super) struct PublisherContext {
    pub(super) shared: Arc<Shared>,
    /// Where outputs the broker refused as part of a batch are sent again,
    /// each alone: `None` in that producer's own context.
    pub(super) alone: Option<Alone>,
}

/// A second producer, made on first need, that sends one output per batch
/// (`batch.num.messages=1`): the broker judges each alone.
///
/// The broker refuses a whole batch when the batch is larger than the
/// topic's `max.message.bytes` (or when one of its records is invalid, the
/// others failing with `_INVALID_DIFFERENT_RECORD`), and librdkafka, unlike
/// Java's producer, does not split it: every output in it fails the same
/// way, the one too large and the ones batched with it, or a batch of small
/// outputs larger than a small limit with no output too large at all. Sent
/// again alone, only an output that is refused by itself ends as
/// [`Rejected`](PublishErrorKind::Rejected); the others are stored.
pub(super) struct Alone {
    pub(super) settings: KafkaSettings,
    pub(super) producer: std::sync::OnceLock<Option<ThreadedProducer<PublisherContext>>>,
    /// A refused batch was logged at WARN (then at DEBUG).
    pub(super) warned: AtomicBool,
}

impl Alone {
    pub(super) fn new(settings: &KafkaSettings) -> Self {
        Self {
            settings: settings.clone().set("batch.num.messages", "1"),
            producer: std::sync::OnceLock::new(),
            warned: AtomicBool::new(false),
        }
    }

    /// The producer, made now if it was not before; `None` if librdkafka
    /// refused to make it (logged).
    pub(super) fn producer(
        &self,
        shared: &Arc<Shared>,
    ) -> Option<&ThreadedProducer<PublisherContext>> {
        self.producer
            .get_or_init(|| {
                let context = PublisherContext {
                    shared: Arc::clone(shared),
                    alone: None,
                };
                self.settings
                    .client_config()
                    .create_with_context(context)
                    .inspect_err(|error| {
                        tracing::error!(brokers = %shared.brokers, %error, "the kafka producer for outputs sent alone could not be made");
                    })
                    .ok()
            })
            .as_ref()
    }

    /// Sends the output of `message` again, alone, to the partition it was
    /// placed in, with `slot` as its receipt. Gives `slot` back if it could
    /// not.
    pub(super) fn resend(
        &self,
        shared: &Arc<Shared>,
        message: &rdkafka::message::BorrowedMessage<'_>,
        slot: Arc<Slot>,
    ) -> Result<(), Arc<Slot>> {
        use rdkafka::Message as _;
        let Some(producer) = self.producer(shared) else {
            return Err(slot);
        };
        let mut record = BaseRecord::with_opaque_to(message.topic(), slot)
            .partition(message.partition())
            .payload(message.payload().unwrap_or_default());
        if let Some(key) = message.key() {
            record = record.key(key);
        }
        if let Some(timestamp) = message.timestamp().to_millis() {
            record = record.timestamp(timestamp);
        }
        if let Some(headers) = message.headers() {
            // Copied by librdkafka, names never read as UTF-8 here.
            record = record.headers(headers.detach());
        }
        producer.send(record).map_err(|(error, record)| {
            tracing::debug!(brokers = %shared.brokers, %error, "an output refused in a batch could not be sent again alone");
            record.delivery_opaque
        })
    }
}

/// Whether the broker refused `error`'s output as part of a batch, so that
/// it may be stored when sent alone.
pub(super) fn refused_in_batch(error: &KafkaError) -> bool {
    matches!(
        error,
        KafkaError::MessageProduction(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::MessageBatchTooLarge
                | RDKafkaErrorCode::InvalidDifferentRecord
        )
    )
}

impl ClientContext for PublisherContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) {
            // The idempotent producer cannot go on: every send and every
            // unconfirmed output fails as closed.
            tracing::error!(brokers = %self.shared.brokers, %error, reason, "fatal kafka producer error; make a new publisher");
        } else {
            // Connection losses and timeouts: librdkafka reconnects and
            // retries by itself, until the delivery timeout.
            tracing::warn!(brokers = %self.shared.brokers, %error, reason, "kafka producer error");
        }
    }
}

impl ProducerContext for PublisherContext {
    type DeliveryOpaque = Arc<Slot>;

    fn delivery(&self, result: &DeliveryResult<'_>, slot: Arc<Slot>) {
        use rdkafka::Message as _;
        let shared = &*self.shared;
        let slot = match (result, &self.alone) {
            // Also while closing: sending alone is how these are confirmed.
            (Err((error, message)), Some(alone)) if refused_in_batch(error) => {
                if !alone.warned.swap(true, Ordering::AcqRel) {
                    tracing::warn!(
                        brokers = %shared.brokers,
                        destination = message.topic(),
                        %error,
                        "the broker refused a batch of outputs; each is sent again alone (a topic whose max.message.bytes is below the producer's batch.size refuses batches of small outputs too: lower batch.size for it)"
                    );
                }
                // Still awaiting confirmation: the output is counted until
                // the second producer reports on it.
                match alone.resend(&self.shared, message, slot) {
                    Ok(()) => return,
                    Err(slot) => slot,
                }
            }
            _ => slot,
        };
        shared.awaiting.fetch_sub(1, Ordering::AcqRel);
        let outcome = match result {
            Ok(message) => Ok(Confirmation::at(
                u32::try_from(message.partition()).ok(),
                (message.offset() >= 0).then(|| Position::Offset(message.offset())),
            )),
            Err((error, message)) => {
                let destination = message.topic();
                tracing::debug!(brokers = %shared.brokers, destination, %error, "kafka output not confirmed");
                Err(delivery_failed(error.clone(), destination, shared))
            }
        };
        slot.complete(outcome);
        if shared.waiting.load(Ordering::Acquire) > 0 {
            shared.room.notify_waiters();
        }
    }
}
