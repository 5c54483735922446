//! The polling thread: owns the consumer's poll loop, so that rebalance
//! callbacks (which block until the runtime drained) never run on a tokio
//! worker, and so that polling goes on while fetching is paused. Each round
//! serves the main queue's events, then reads a batch of messages from the
//! source's message queue (`fetch_queue`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use intake_core::{PartitionKey, backend::SourceError};
use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::topic_partition_list::Offset;

use super::context::{KafkaContext, Shared};
use super::convert::{Converter, Record};
use super::earliest::EarliestTopics;
use super::fetch_queue::FetchQueue;
use super::handoff::{Control, HoldChange};
use super::stall_check::{StallCheck, Watched};
use super::watchdog::{OffsetReset, Watchdog};
use crate::error::{Error, is_not_authorized};

mod pause;
mod stall;

/// Most messages taken from librdkafka per hand-over: large enough that the
/// handoff lock is taken rarely, small enough to keep latency low.
pub(super) const MAX_BATCH: usize = 512;

/// How long one `poll` waits when nothing arrives; bounds how late the
/// thread notices a stop request or a drained handoff.
const POLL_TIMEOUT: Duration = Duration::from_millis(100);

/// How long a full handoff may wait for the runtime before fetching is
/// paused. Short against `max.poll.interval.ms`; long enough that ordinary
/// bursts never pause (a pause drops librdkafka's prefetched messages).
const PAUSE_AFTER: Duration = Duration::from_millis(500);

/// How often the polling thread forwards every assigned partition to its
/// message queue again, should a fetcher have restarted without an
/// assignment (see `fetch_queue`).
const FORWARD_AGAIN: Duration = Duration::from_secs(1);

/// Most events (rebalances, commit results, errors) served from the main
/// queue between two batches of messages.
const EVENTS_PER_ROUND: usize = 16;

/// How often the polling thread asks whether a broker answers again while
/// none does.
const REACHABILITY_PROBE: Duration = Duration::from_secs(1);

/// How long that question waits for an answer: the polling thread polls
/// nothing meanwhile, and with every broker down there is nothing to poll.
const REACHABILITY_PROBE_TIMEOUT: Duration = Duration::from_millis(500);

pub(crate) struct Poller {
    pub(crate) consumer: Arc<BaseConsumer<KafkaContext>>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) watchdog: Watchdog,
    /// The watchdog's broker queries, on a thread of their own; `None`
    /// with the watchdog off.
    pub(crate) stall_check: Option<StallCheck>,
    /// Counts assignment changes the polling thread has seen: an answer of
    /// the checker to an earlier assignment is dropped.
    pub(crate) assignment_epoch: u64,
    pub(crate) close_timeout: Duration,
    pub(crate) batch: Vec<Record>,
    pub(crate) converter: Converter,
    pub(crate) paused: bool,
    /// Unknown-topic errors already logged, so a deleted topic is logged at
    /// error level once, not on every metadata refresh.
    pub(crate) reported_missing: Vec<String>,
    /// Where a partition without a committed offset starts.
    pub(crate) reset: OffsetReset,
    /// The return topics, which start at their beginning whatever `reset`
    /// says; held as long as the consumer lives.
    pub(crate) earliest: EarliestTopics,
    /// When the brokers were last asked whether one answers again, while
    /// none did (see [`Poller::probe_reachability`]).
    pub(crate) last_reachability_probe: Instant,
}

impl Poller {
    /// Polls until asked to stop, leaves the group, and hands back the
    /// consumer for its owner to drop.
    pub(crate) fn run(mut self) -> Arc<BaseConsumer<KafkaContext>> {
        let shared = self.shared.clone();
        // Dropped before the consumer is handed back (a local, and the
        // consumer leaves with the return value), panic or not.
        let mut fetch = FetchQueue::install(
            self.consumer.client().native_ptr(),
            &shared.forwarding,
            MAX_BATCH,
        );
        if fetch.is_none() {
            tracing::warn!("librdkafka gave no consumer queue; messages are polled one at a time");
        }
        let mut forwarded_at = Instant::now();
        let mut forwarded_epoch = self.assignment_epoch;
        while !self.shared.stop.load(Ordering::Acquire) {
            self.apply_backpressure();
            self.apply_holds();
            match fetch.as_mut() {
                Some(fetch) => {
                    if forwarded_epoch != self.assignment_epoch
                        || forwarded_at.elapsed() >= FORWARD_AGAIN
                    {
                        self.forward_again(fetch);
                        forwarded_at = Instant::now();
                        forwarded_epoch = self.assignment_epoch;
                    }
                    self.read_batch(fetch);
                }
                None => self.poll_batch(),
            }
            self.probe_reachability();
            self.take_stall_answer();
            if let Some(idle) = self.watchdog.due(Instant::now())
                && idle
            {
                self.ask_for_stall_check();
            }
        }
        self.close();
        drop(fetch);
        self.consumer
    }

    /// Forwards every assigned partition to the message queue again (see
    /// `fetch_queue`): a lookup of the assignment and a forward per
    /// partition, once a second and after each assignment change.
    fn forward_again(&self, fetch: &FetchQueue<'_>) {
        match self.consumer.assignment() {
            Ok(assignment) => fetch.forward(self.consumer.client().native_ptr(), &assignment),
            Err(error) => {
                tracing::debug!(%error, "cannot read the kafka assignment to forward it again")
            }
        }
    }

    /// Serves the main queue's events (rebalances, commit results, errors),
    /// then reads a batch of messages from the message queue, waiting up to
    /// [`POLL_TIMEOUT`] for one unless events are left; an event arriving
    /// meanwhile ends the wait. The batch is handed over after the events,
    /// so that a revocation served here drops its partitions' messages.
    fn read_batch(&mut self, fetch: &mut FetchQueue<'_>) {
        let mut served = 0;
        while served < EVENTS_PER_ROUND && fetch.events_waiting() {
            served += 1;
            match self.consumer.poll(Duration::ZERO) {
                // Fetched before its partition was forwarded (none is, as
                // partitions are forwarded before they are assigned): in
                // order, ahead of the partition's forwarded messages.
                Some(Ok(message)) => push_converted(&mut self.converter, &mut self.batch, &message),
                Some(Err(error)) => self.on_error(error),
                None => {}
            }
        }
        let timeout = if fetch.events_waiting() || !self.batch.is_empty() {
            Duration::ZERO
        } else {
            POLL_TIMEOUT
        };
        let mut errors = Vec::new();
        let (converter, batch) = (&mut self.converter, &mut self.batch);
        fetch.read(timeout, MAX_BATCH - batch.len(), |message| {
            if message.err != rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                errors.push(match message.err {
                    rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__PARTITION_EOF => {
                        KafkaError::PartitionEOF(message.partition)
                    }
                    code => KafkaError::MessageConsumption(code.into()),
                });
                return;
            }
            match converter.convert_native(message) {
                Some(converted) => batch.push(converted),
                None => tracing::error!(
                    topic = %String::from_utf8_lossy(super::convert::topic_name(message)),
                    "kafka message with a negative partition number skipped"
                ),
            }
        });
        for error in errors {
            self.on_error(error);
        }
        self.hand_over();
    }

    /// While every broker is down (librdkafka said so), asks for the
    /// cluster's metadata once a [`REACHABILITY_PROBE`] interval: an answer
    /// means a broker is back, which an idle consumer would otherwise not
    /// learn until a message arrived. Costs nothing while brokers answer.
    fn probe_reachability(&mut self) {
        if self.shared.reachability.unreachable_for().is_none()
            || self.last_reachability_probe.elapsed() < REACHABILITY_PROBE
        {
            return;
        }
        self.last_reachability_probe = Instant::now();
        if self
            .consumer
            .fetch_metadata(None, REACHABILITY_PROBE_TIMEOUT)
            .is_ok()
        {
            tracing::info!(brokers = %self.shared.brokers, "a kafka broker answers again");
            self.shared.reachability.reachable();
        }
    }

    /// Polls the main queue until a timeout, an event or a full batch, then
    /// hands the batch over: without a message queue of the source's own.
    fn poll_batch(&mut self) {
        let mut timeout = POLL_TIMEOUT;
        while self.batch.len() < MAX_BATCH {
            match self.consumer.poll(timeout) {
                Some(Ok(message)) => push_converted(&mut self.converter, &mut self.batch, &message),
                Some(Err(error)) => {
                    self.on_error(error);
                    break;
                }
                // A timeout, or an event (a rebalance) was served: the batch
                // ends here so that its messages never straddle a rebalance.
                None => break,
            }
            timeout = Duration::ZERO;
        }
        self.hand_over();
    }

    /// Hands the batch over, without the messages of partitions revoked
    /// while it was read.
    fn hand_over(&mut self) {
        self.drop_revoked();
        if !self.batch.is_empty() {
            self.shared.forget_connection_failure();
            self.shared.reachability.reachable();
        }
        self.watchdog.record(self.batch.len());
        self.shared.handoff.push_messages(&mut self.batch);
    }

    /// Drops messages of partitions revoked during this batch's polls: the
    /// rebalance callback already purged the handoff, and these would
    /// otherwise reach the runtime after it was told of the revocation.
    fn drop_revoked(&mut self) {
        let mut revoked = self
            .shared
            .revoked_in_poll
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if revoked.is_empty() {
            return;
        }
        self.batch.retain(|message| {
            let metadata = message.metadata();
            !revoked.iter().any(|key: &PartitionKey| {
                key.partition == metadata.partition() && *key.source == **metadata.source()
            })
        });
        revoked.clear();
    }

    fn on_error(&mut self, error: KafkaError) {
        match error {
            KafkaError::PartitionEOF(_) => {}
            KafkaError::MessageConsumptionFatal(code) => {
                tracing::error!(%code, "fatal kafka consumer error");
                self.shared
                    .handoff
                    .push_control(Control::Error(SourceError::Fatal(Box::new(error))));
            }
            KafkaError::MessageConsumption(
                RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic,
            ) => self.report_missing_topic(error),
            KafkaError::MessageConsumption(code) if is_not_authorized(code) => {
                self.shared.handoff.push_control(Control::Error(
                    Error::Unauthorized {
                        brokers: self.shared.brokers.clone(),
                        source: Box::new(error),
                    }
                    .into(),
                ));
            }
            other => tracing::warn!(error = %other, "kafka consumer error; librdkafka retries"),
        }
    }

    /// A subscribed topic Kafka says does not exist (after librdkafka's
    /// `topic.metadata.propagation.max.ms`). At build time that is an
    /// error to act on (`Error::UnknownTopic`); while running it is
    /// usually a topic being deleted and created again, or not created yet
    /// by a deploy: a transient error, so the runtime keeps the consumer and
    /// backs off, and librdkafka assigns the topic's partitions (from their
    /// start: the group's offsets went with the old topic) once it exists.
    /// Logged at error level the first time, so a topic deleted for good is
    /// seen.
    fn report_missing_topic(&mut self, error: KafkaError) {
        let subscription = self.consumer.subscription().ok();
        let topics: Vec<String> = subscription
            .iter()
            .flat_map(|list| list.elements())
            .map(|element| element.topic().to_owned())
            .collect();
        let missing = topics.join(", ");
        if !self.reported_missing.contains(&missing) {
            tracing::error!(%error, topics = %missing, "a subscribed kafka topic does not exist; waiting for it to be created");
            self.reported_missing.push(missing.clone());
        }
        self.shared
            .handoff
            .push_control(Control::Error(SourceError::Transient(
                format!(
                    "subscribed topic `{missing}` does not exist on {} ({error}); waiting for it \
                     to be created (delete the subscription if it is gone for good)",
                    self.shared.brokers
                )
                .into(),
            )));
    }

    /// Leaves the group, bounded by the close timeout. Rebalance callbacks
    /// no longer wait for the runtime (`closing` is set): the revoke
    /// callback commits what the broker has not confirmed and releases the
    /// partitions; messages polled meanwhile stay uncommitted and go to the
    /// next owner.
    ///
    /// It unsubscribes rather than closes: librdkafka's close runs when the
    /// consumer is dropped (rdkafka closes it there unconditionally, and a
    /// second close is reported as an error), and after leaving the group it
    /// has nothing left to wait for.
    fn close(&mut self) {
        self.shared.closing.store(true, Ordering::Release);
        self.batch.clear();
        self.consumer.unsubscribe();
        let deadline = Instant::now() + self.close_timeout;
        loop {
            let assigned = self
                .consumer
                .assignment()
                .map_or(0, |assignment| assignment.count());
            if assigned == 0 {
                break;
            }
            if Instant::now() >= deadline {
                tracing::warn!(timeout = ?self.close_timeout, "the kafka consumer did not leave its group in time");
                break;
            }
            let _ = self.consumer.poll(POLL_TIMEOUT);
        }
        self.shared.ownership.release_all();
        self.shared.handoff.finish();
    }
}

/// Runs `poll` (the polling thread's whole life) and turns a panic in it
/// into the source's last word: a fatal error, then the end of the stream.
/// Without it the thread would die silently, the handoff would never finish
/// and `Source::next` would wait forever. The partitions are given up, so
/// nothing more is committed for them by this consumer; the next owner reads
/// from the committed offsets.
pub(crate) fn guard_polling<T>(shared: &Shared, poll: impl FnOnce() -> T) -> Option<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(poll)) {
        Ok(value) => Some(value),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|text| (*text).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_owned());
            tracing::error!(panic = %what, "the kafka polling thread panicked; the source stops");
            shared.closing.store(true, Ordering::Release);
            shared.ownership.release_all();
            shared
                .handoff
                .push_control(Control::Error(SourceError::Fatal(
                    format!(
                        "the kafka polling thread panicked ({what}); restart the consumer, and \
                         report the panic to intake with the record that caused it"
                    )
                    .into(),
                )));
            shared.handoff.finish();
            None
        }
    }
}

/// Converts `message` into `batch`, or logs why not.
fn push_converted(
    converter: &mut Converter,
    batch: &mut Vec<Record>,
    message: &rdkafka::message::BorrowedMessage<'_>,
) {
    match converter.convert(message) {
        Some(converted) => batch.push(converted),
        None => tracing::error!(
            topic = message_topic(message),
            "kafka message with a negative partition number skipped"
        ),
    }
}

fn message_topic(message: &rdkafka::message::BorrowedMessage<'_>) -> String {
    use rdkafka::Message as _;
    message.topic().to_owned()
}

#[cfg(test)]
mod tests {
    use intake_core::backend::SourceEvent;

    use super::*;
    use crate::source::handoff::Taken;

    #[tokio::test]
    async fn a_panic_of_the_polling_thread_is_a_fatal_source_error_not_a_hang() {
        let shared = Arc::new(Shared::new(
            true,
            "127.0.0.1:9092".into(),
            Duration::from_secs(300),
        ));
        let polled = {
            let shared = shared.clone();
            std::thread::spawn(move || {
                guard_polling(&shared, || -> () { panic!("header name is not UTF-8") })
            })
            .join()
            .expect("the guard catches the panic")
        };
        assert!(polled.is_none());

        let mut out = Vec::new();
        match shared.handoff.take(&mut out, 8) {
            Taken::Error(SourceError::Fatal(cause)) => {
                assert!(cause.to_string().contains("header name is not UTF-8"));
            }
            Taken::Event(SourceEvent::Delivered) => panic!("expected the fatal error"),
            _ => panic!("expected the fatal error first"),
        }
        assert!(matches!(shared.handoff.take(&mut out, 8), Taken::Finished));
    }
}
