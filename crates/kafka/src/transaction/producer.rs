//! [`Transactor`]: the transactional producer of one consumer instance, and
//! the transaction that commits a watermark batch.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use intake_core::BoxError;
use intake_core::publish::Output;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

use super::error::TransactionError;
use super::limits;
use crate::error::Error;
use crate::settings::KafkaSettings;

/// How long a send waits before it tries again when librdkafka's queue is
/// full (the blocking thread has nothing else to do meanwhile).
const QUEUE_FULL_PAUSE: Duration = Duration::from_millis(1);

/// How long a send asks the brokers for a topic's partitions when
/// librdkafka does not know the partition an output names.
const METADATA_TIMEOUT: Duration = Duration::from_secs(5);

/// Bytes a record's timestamp and offset deltas may take beyond the first
/// record's (a varint each: offset deltas to 2 bytes within 8,192 records,
/// timestamp deltas to 4 within a day).
const LATER_RECORD_MARGIN: usize = 6;

/// The transactional producer of one consumer instance.
pub(crate) struct Transactor {
    producer: ThreadedProducer<DefaultProducerContext>,
    transactional_id: String,
    /// Bounds each transaction: its sends, its offsets and its commit.
    timeout: Duration,
    /// Set once this producer may commit nothing more (fenced, or fatal),
    /// with the reason: every later transaction is refused at once.
    broken: Mutex<Option<String>>,
    /// The source was told this producer broke (once is enough).
    reported: AtomicBool,
}

impl std::fmt::Debug for Transactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transactor")
            .field("transactional_id", &self.transactional_id)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// A failure inside a transaction, before it is sorted into a
/// [`TransactionError`].
enum Failure {
    Kafka(KafkaError),
    Other(BoxError),
}

impl From<KafkaError> for Failure {
    fn from(error: KafkaError) -> Self {
        Self::Kafka(error)
    }
}

impl Transactor {
    /// Creates the producer and registers its `transactional.id` with the
    /// broker (`init_transactions`, bounded by `timeout`), which fences any
    /// earlier producer of the same id and aborts the transaction it left
    /// open. Blocks: call it on a blocking thread.
    pub(crate) fn start(
        settings: &KafkaSettings,
        transactional_id: &str,
        timeout: Duration,
    ) -> Result<Self, Error> {
        let brokers = settings.endpoint();
        let started = Instant::now();
        let producer: ThreadedProducer<DefaultProducerContext> = settings
            .client_config()
            .create()
            .map_err(|error| Error::from_kafka(error, &brokers, Duration::ZERO))?;
        producer
            .init_transactions(timeout)
            .map_err(|error| Error::from_kafka(error, &brokers, started.elapsed()))?;
        tracing::info!(transactional_id, %brokers, "kafka transactional producer ready");
        Ok(Self {
            producer,
            transactional_id: transactional_id.to_owned(),
            timeout,
            broken: Mutex::new(None),
            reported: AtomicBool::new(false),
        })
    }

    /// The producer's `transactional.id`.
    pub(crate) fn transactional_id(&self) -> &str {
        &self.transactional_id
    }

    /// Whether this is the first time a caller asks to report that the
    /// producer broke.
    pub(crate) fn first_report(&self) -> bool {
        !self.reported.swap(true, Ordering::AcqRel)
    }

    fn broken(&self) -> Option<String> {
        self.broken
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .clone()
    }

    fn break_with(&self, error: &TransactionError) {
        let mut broken = self
            .broken
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if broken.is_none() {
            *broken = Some(match std::error::Error::source(error) {
                Some(cause) => intake_core::ErrorChain::new(cause).to_string(),
                None => error.to_string(),
            });
        }
    }

    /// One transaction: `outputs` in order, the consumer's `offsets` (with
    /// its group metadata, so that a consumer of an older generation is
    /// refused), then the commit. Blocks for several broker round trips,
    /// at most the producer's timeout plus an abort's: call it on a
    /// blocking thread, under the ownership lock.
    ///
    /// On an error nothing of the transaction counts: it was aborted, or
    /// this producer is [broken](TransactionError::is_fatal) and the broker
    /// aborts it when the transaction times out or a new producer of the
    /// same id starts.
    ///
    /// `small` names the destinations that refuse batches smaller than
    /// librdkafka builds, with their `max.message.bytes`: the outputs to
    /// one of them are flushed whenever a batch's worth is queued, so that
    /// no batch librdkafka builds for them is refused for its size.
    pub(crate) fn commit<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        outputs: Vec<Output>,
        offsets: &TopicPartitionList,
        small: &[(Arc<str>, usize)],
    ) -> Result<(), TransactionError> {
        if let Some(reason) = self.broken() {
            return Err(TransactionError::Fenced {
                transactional_id: self.transactional_id.clone(),
                source: format!("refused earlier: {reason}").into(),
            });
        }
        let deadline = Instant::now() + self.timeout;
        let Some(group) = consumer.group_metadata() else {
            return Err(TransactionError::Aborted {
                transactional_id: self.transactional_id.clone(),
                source: "the consumer has no group membership to commit offsets for".into(),
            });
        };
        if let Err(error) = self.producer.begin_transaction() {
            // Nothing began, so there is nothing to abort.
            return Err(self.sorted(Failure::Kafka(error), false));
        }
        let mut queued = vec![0; small.len()];
        let outcome = outputs
            .into_iter()
            .try_for_each(|output| {
                self.make_room(&output, small, &mut queued, deadline)?;
                self.send(output, deadline)
            })
            .and_then(|()| {
                self.producer
                    .send_offsets_to_transaction(offsets, &group, remaining(deadline))
                    .map_err(Failure::Kafka)
            })
            // rdkafka flushes before it commits, so outputs still
            // undelivered at the deadline (a destination missing) fail the
            // flush, and the transaction, still open, is aborted.
            .and_then(|()| self.commit_until(deadline));
        match outcome {
            Ok(()) => Ok(()),
            Err(failure) => Err(self.sorted(failure, true)),
        }
    }

    /// Before `output` is sent: if its destination is one of `small` and
    /// the outputs queued to it since the last flush, with it, would make a
    /// batch larger than the destination accepts, flushes first.
    fn make_room(
        &self,
        output: &Output,
        small: &[(Arc<str>, usize)],
        queued: &mut [usize],
        deadline: Instant,
    ) -> Result<(), Failure> {
        let Some(index) = small
            .iter()
            .position(|(topic, _)| **topic == *output.destination())
        else {
            return Ok(());
        };
        let limit = small[index].1;
        // The framing of a record further into a batch (its timestamp and
        // offset deltas) takes a few bytes more than the first's.
        let bytes = limits::batch_bytes(output) + LATER_RECORD_MARGIN;
        if queued[index] > 0 && limits::BATCH_OVERHEAD + queued[index] + bytes > limit {
            self.producer.flush(remaining(deadline))?;
            queued.fill(0);
        }
        queued[index] += bytes;
        Ok(())
    }

    /// Hands one output to librdkafka, waiting for room in its queue until
    /// `deadline`: into the partition it names, if it names one, else into
    /// its key's (as [`KafkaPublisher`](crate::KafkaPublisher) does).
    fn send(&self, output: Output, deadline: Instant) -> Result<(), Failure> {
        let partition = output.partition();
        let (destination, payload, key, headers) = output.into_parts();
        let mut record = BaseRecord::<[u8], [u8]>::to(&destination).payload(payload.as_ref());
        if let Some(partition) = partition {
            // Above i32::MAX no Kafka partition exists: librdkafka refuses
            // it as an unknown partition, like any other it does not know.
            record = record.partition(i32::try_from(partition).unwrap_or(i32::MAX));
        }
        if let Some(key) = &key {
            record = record.key(key.as_ref());
        }
        if !headers.is_empty() {
            record = record.headers(headers.iter().fold(
                OwnedHeaders::new_with_capacity(headers.len()),
                |kafka, header| {
                    kafka.insert(Header {
                        key: &header.name,
                        value: Some(header.value.as_ref()),
                    })
                },
            ));
        }
        let mut refreshed = false;
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned))
                    if Instant::now() < deadline =>
                {
                    record = returned;
                    std::thread::sleep(QUEUE_FULL_PAUSE);
                }
                Err((
                    KafkaError::MessageProduction(RDKafkaErrorCode::UnknownPartition),
                    returned,
                )) if !refreshed && Instant::now() < deadline => {
                    // The layer found the partition in the topic's count,
                    // read lately; librdkafka's own view may be older (it
                    // reads a topic's metadata every
                    // topic.metadata.refresh.interval.ms, 5 min): partitions
                    // added since. A metadata answer updates that view.
                    refreshed = true;
                    record = returned;
                    if let Err(error) = self.producer.client().fetch_metadata(
                        Some(&destination),
                        remaining(deadline).min(METADATA_TIMEOUT),
                    ) {
                        tracing::debug!(%error, topic = %destination, "kafka topic metadata not read again");
                    }
                }
                Err((error, _)) => return Err(Failure::Kafka(error)),
            }
        }
    }

    /// Commits, asking again while librdkafka says the outcome is not known
    /// yet (a retriable error), until `deadline`.
    fn commit_until(&self, deadline: Instant) -> Result<(), Failure> {
        loop {
            match self.producer.commit_transaction(remaining(deadline)) {
                Ok(()) => return Ok(()),
                Err(KafkaError::Transaction(error))
                    if error.is_retriable() && Instant::now() < deadline =>
                {
                    tracing::debug!(%error, "kafka transaction commit not confirmed yet; asking again");
                }
                Err(KafkaError::Transaction(error)) if error.is_retriable() => {
                    // The commit may still succeed on the broker: aborting
                    // now is not allowed, and committing more on top of an
                    // unknown outcome would be guessing.
                    return Err(Failure::Other(
                        format!(
                            "the commit's outcome is unknown after the operation timeout: {error}"
                        )
                        .into(),
                    ));
                }
                Err(error) => return Err(Failure::Kafka(error)),
            }
        }
    }

    /// Sorts a failure: a fence or a fatal error breaks this producer for
    /// good; anything else aborts the transaction (when `began`) and lets
    /// the runtime try again.
    fn sorted(&self, failure: Failure, began: bool) -> TransactionError {
        let transactional_id = self.transactional_id.clone();
        let error = match failure {
            Failure::Other(source) => TransactionError::Fatal {
                transactional_id,
                source,
            },
            Failure::Kafka(error) if is_fenced(&error) => TransactionError::Fenced {
                transactional_id,
                source: Box::new(error),
            },
            Failure::Kafka(error) if is_fatal(&error) => TransactionError::Fatal {
                transactional_id,
                source: Box::new(error),
            },
            Failure::Kafka(error) => {
                if began && let Err(abort) = self.producer.abort_transaction(self.timeout) {
                    let source: BoxError =
                        format!("{error}; aborting the transaction failed too: {abort}").into();
                    let error = TransactionError::Fatal {
                        transactional_id,
                        source,
                    };
                    self.break_with(&error);
                    return error;
                }
                return TransactionError::Aborted {
                    transactional_id,
                    source: Box::new(error),
                };
            }
        };
        // A transaction begun by a producer that is still usable (another
        // member took its group.instance.id) is aborted, so its outputs are
        // not left to hold back `read_committed` readers until it times
        // out; a fatal producer cannot abort, and its successor's
        // `init_transactions` does.
        if began && !matches!(&error, TransactionError::Fatal { .. }) {
            let _ = self.producer.abort_transaction(self.timeout);
        }
        self.break_with(&error);
        error
    }
}

/// Whether `error` says another instance took over for good: this
/// producer's epoch was fenced by a newer producer of its
/// `transactional.id`, or another member took this consumer's
/// `group.instance.id` (static membership).
///
/// A generation that moved on (`ILLEGAL_GENERATION`) or a membership the
/// coordinator no longer knows (`UNKNOWN_MEMBER_ID`) is not a fence: under
/// `cooperative-sticky` or KIP-848 the generation moves at every rebalance,
/// also for members that keep their partitions, and a member that fell out
/// of the group joins it again. librdkafka makes them abortable (as Java's
/// client does): the transaction is aborted and the next one carries the
/// consumer's current group metadata. The broker still refuses the offsets
/// of a member that lost its partitions, so nothing of a zombie commits.
fn is_fenced(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::Fenced
                | RDKafkaErrorCode::InvalidProducerEpoch
                | RDKafkaErrorCode::FencedInstanceId
        )
    )
}

/// Whether librdkafka says the producer cannot go on.
fn is_fatal(error: &KafkaError) -> bool {
    match error {
        KafkaError::Transaction(error) => error.is_fatal(),
        other => other.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal),
    }
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}
