//! The polling thread: owns the consumer's poll loop, so that rebalance
//! callbacks (which block until the runtime drained) never run on a tokio
//! worker, and so that polling goes on while fetching is paused.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use intake_core::{Message, PartitionKey, SourceError};
use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::topic_partition_list::Offset;

use super::context::{KafkaContext, Shared};
use super::convert::{TopicNames, to_message};
use super::handoff::Control;
use super::watchdog::{Watchdog, stalled_at};
use crate::error::is_auth;

/// Most messages taken from librdkafka per hand-over: large enough that the
/// handoff lock is taken rarely, small enough to keep latency low.
const MAX_BATCH: usize = 512;

/// How long one `poll` waits when nothing arrives; bounds how late the
/// thread notices a stop request or a drained handoff.
const POLL_TIMEOUT: Duration = Duration::from_millis(100);

/// How long a full handoff may wait for the runtime before fetching is
/// paused. Short against `max.poll.interval.ms`; long enough that ordinary
/// bursts never pause (a pause drops librdkafka's prefetched messages).
const PAUSE_AFTER: Duration = Duration::from_millis(500);

/// How often failed asynchronous commits are sent again.
const COMMIT_RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// Bound on each broker query the watchdog makes.
const WATERMARK_TIMEOUT: Duration = Duration::from_secs(2);

pub(crate) struct Poller {
    pub(crate) consumer: Arc<BaseConsumer<KafkaContext>>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) watchdog: Watchdog,
    pub(crate) close_timeout: Duration,
    pub(crate) batch: Vec<Message>,
    pub(crate) topics: TopicNames,
    pub(crate) paused: bool,
    /// Unknown-topic errors already reported, so a deleted topic is
    /// reported once, not on every poll.
    pub(crate) reported_missing: Vec<String>,
    pub(crate) last_commit_retry: Instant,
}

impl Poller {
    pub(crate) fn run(mut self) {
        while !self.shared.stop.load(Ordering::Acquire) {
            self.apply_backpressure();
            self.poll_batch();
            let now = Instant::now();
            if now.duration_since(self.last_commit_retry) >= COMMIT_RETRY_INTERVAL {
                self.last_commit_retry = now;
                let retried = self.shared.ownership.retry_failed(&self.consumer);
                if retried > 0 {
                    tracing::debug!(partitions = retried, "retried failed kafka commits");
                }
            }
            if let Some(idle) = self.watchdog.due(now)
                && idle
            {
                self.check_for_stall();
            }
        }
        self.close();
    }

    /// Pauses every assigned partition when the handoff is full and resumes
    /// them once it drained, polling all the while.
    fn apply_backpressure(&mut self) {
        let queued = self.shared.handoff.queued();
        let changed = self.shared.assignment_changed.swap(false, Ordering::AcqRel);
        if self.paused {
            if self.shared.handoff.has_room(queued) {
                self.set_paused(false);
            } else if changed {
                // Partitions assigned while paused start fetching; hold them too.
                self.set_paused(true);
            }
        } else if self.shared.handoff.is_full(queued)
            && !self.shared.handoff.wait_for_room(PAUSE_AFTER)
        {
            self.set_paused(true);
        }
    }

    fn set_paused(&mut self, pause: bool) {
        let assignment = match self.consumer.assignment() {
            Ok(assignment) => assignment,
            Err(error) => {
                tracing::warn!(%error, "cannot read the kafka assignment to pause or resume it");
                return;
            }
        };
        self.paused = pause;
        if assignment.count() == 0 {
            return;
        }
        let result = if pause {
            self.consumer.pause(&assignment)
        } else {
            self.consumer.resume(&assignment)
        };
        match result {
            Ok(()) => tracing::debug!(
                pause,
                partitions = assignment.count(),
                "kafka fetch backpressure"
            ),
            Err(error) => tracing::warn!(%error, pause, "kafka pause/resume failed"),
        }
    }

    /// Polls until a timeout, an event or a full batch, then hands the batch
    /// over.
    fn poll_batch(&mut self) {
        let mut timeout = POLL_TIMEOUT;
        while self.batch.len() < MAX_BATCH {
            match self.consumer.poll(timeout) {
                Some(Ok(message)) => match to_message(&message, &mut self.topics) {
                    Some(converted) => self.batch.push(converted),
                    None => tracing::error!(
                        topic = message_topic(&message),
                        "kafka message with a negative partition number skipped"
                    ),
                },
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
        self.drop_revoked();
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
            KafkaError::MessageConsumption(code) if is_auth(code) => {
                self.shared
                    .handoff
                    .push_control(Control::Error(SourceError::Unauthorized {
                        endpoint: self.shared.brokers.clone(),
                        source: Box::new(error),
                    }));
            }
            other => tracing::warn!(error = %other, "kafka consumer error; librdkafka retries"),
        }
    }

    fn report_missing_topic(&mut self, error: KafkaError) {
        let subscription = self.consumer.subscription().ok();
        let topics: Vec<String> = subscription
            .iter()
            .flat_map(|list| list.elements())
            .map(|element| element.topic().to_owned())
            .collect();
        let missing = topics.join(", ");
        if self.reported_missing.contains(&missing) {
            return;
        }
        tracing::error!(%error, topics = %missing, "a subscribed kafka topic does not exist");
        self.reported_missing.push(missing.clone());
        self.shared
            .handoff
            .push_control(Control::Error(SourceError::NotFound {
                kind: "topic",
                name: missing,
                hint: format!(
                    "{error}; create the topic on {} (or stop consuming it)",
                    self.shared.brokers
                ),
            }));
    }

    /// The watchdog's check: called after an interval without messages.
    fn check_for_stall(&mut self) {
        if self.paused || self.shared.handoff.queued() > 0 {
            return;
        }
        let Ok(positions) = self.consumer.position() else {
            return;
        };
        let mut stalled = TopicPartitionList::new();
        for element in positions.elements() {
            let Offset::Offset(next) = element.offset() else {
                continue;
            };
            let high = match self.consumer.fetch_watermarks(
                element.topic(),
                element.partition(),
                WATERMARK_TIMEOUT,
            ) {
                Ok((_, high)) => high,
                Err(_) => continue,
            };
            if let Some(resume_at) = stalled_at(Some(next), high) {
                // Adding to a list of this consumer's own partitions cannot fail.
                let _ = stalled.add_partition_offset(
                    element.topic(),
                    element.partition(),
                    Offset::Offset(resume_at),
                );
            }
        }
        if stalled.count() == 0 {
            return;
        }
        tracing::warn!(
            partitions = ?stalled.elements().iter().map(|e| (e.topic().to_owned(), e.partition())).collect::<Vec<_>>(),
            "kafka consumer stalled behind the high watermark; restarting its fetchers"
        );
        if let Err(error) = self.consumer.resume(&stalled) {
            tracing::warn!(%error, "watchdog resume failed");
        }
        if let Err(error) = self.consumer.seek_partitions(stalled, Duration::ZERO) {
            tracing::warn!(%error, "watchdog seek failed");
        }
    }

    /// Leaves the group. Rebalance callbacks no longer wait (`closing` is
    /// set); messages polled meanwhile stay uncommitted and are redelivered
    /// to the next owner.
    fn close(&mut self) {
        self.shared.closing.store(true, Ordering::Release);
        self.batch.clear();
        if let Err(error) = self.consumer.close_queue() {
            tracing::warn!(%error, "closing the kafka consumer failed");
        } else {
            let deadline = Instant::now() + self.close_timeout;
            while !self.consumer.closed() && Instant::now() < deadline {
                let _ = self.consumer.poll(POLL_TIMEOUT);
            }
            if !self.consumer.closed() {
                tracing::warn!(timeout = ?self.close_timeout, "the kafka consumer did not close in time");
            }
        }
        self.shared.ownership.release_all();
        self.shared.handoff.finish();
    }
}

fn message_topic(message: &rdkafka::message::BorrowedMessage<'_>) -> String {
    use rdkafka::Message as _;
    message.topic().to_owned()
}
