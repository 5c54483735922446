//! The rdkafka context: rebalance callbacks, commit results and client
//! errors, all run on the polling thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use intake_core::source::RevocationError;
use intake_core::{PartitionKey, Revocation, SourceError, SourceEvent};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::{ClientContext, TopicPartitionList};

use super::handoff::{Control, Handoff};
use crate::error::is_auth;
use crate::ownership::Ownership;

/// State shared by the source, the polling thread, the acker and this
/// context.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) handoff: Handoff,
    pub(crate) ownership: Ownership,
    /// The consumer is closing or was dropped: rebalance callbacks no longer
    /// wait for the runtime, and nothing more is committed.
    pub(crate) closing: AtomicBool,
    /// The polling thread should stop.
    pub(crate) stop: AtomicBool,
    /// The assignment changed since the polling thread last looked: newly
    /// assigned partitions may need pausing.
    pub(crate) assignment_changed: AtomicBool,
    /// How long a revoke callback waits for the runtime to drain and commit.
    pub(crate) revoke_timeout: Duration,
    /// Whether this consumer commits offsets (not in broadcast mode).
    pub(crate) commits: bool,
    /// The brokers, for error messages.
    pub(crate) brokers: String,
    /// Partitions revoked inside the current `poll` call: the polling
    /// thread drops their messages from the batch it is assembling.
    pub(crate) revoked_in_poll: Mutex<Vec<PartitionKey>>,
    /// An authentication failure was already reported.
    auth_reported: AtomicBool,
}

impl Shared {
    pub(crate) fn new(
        capacity: usize,
        revoke_timeout: Duration,
        commits: bool,
        brokers: String,
    ) -> Self {
        Self {
            handoff: Handoff::new(capacity),
            ownership: Ownership::default(),
            closing: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            assignment_changed: AtomicBool::new(false),
            revoke_timeout,
            commits,
            brokers,
            revoked_in_poll: Mutex::new(Vec::new()),
            auth_reported: AtomicBool::new(false),
        }
    }

    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }
}

/// The consumer's rdkafka context.
pub(crate) struct KafkaContext {
    pub(crate) shared: Arc<Shared>,
}

/// The partitions of a rebalance list, as intake keys.
pub(crate) fn partition_keys(list: &TopicPartitionList) -> Vec<PartitionKey> {
    list.elements()
        .iter()
        .filter_map(|element| {
            let partition = u32::try_from(element.partition()).ok()?;
            Some(PartitionKey::new(element.topic(), partition))
        })
        .collect()
}

impl KafkaContext {
    fn on_assign(&self, list: &TopicPartitionList) {
        let partitions = partition_keys(list);
        if partitions.is_empty() || self.shared.is_closing() {
            return;
        }
        tracing::info!(partitions = ?partitions, "kafka partitions assigned");
        self.shared.ownership.acquire(&partitions);
        self.shared
            .handoff
            .push_control(Control::Event(SourceEvent::Assigned(partitions)));
    }

    fn on_revoke(&self, consumer: &BaseConsumer<Self>, list: &TopicPartitionList) {
        let partitions = partition_keys(list);
        if partitions.is_empty() {
            return;
        }
        let purged = self.shared.handoff.purge(&partitions);
        self.shared
            .revoked_in_poll
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .extend(partitions.iter().cloned());
        if self.shared.is_closing() {
            self.shared.ownership.release(&partitions);
            return;
        }
        if consumer.assignment_lost() {
            // Another consumer may already own them: give them up before the
            // runtime reports anything, so its final commit is refused.
            tracing::warn!(
                partitions = ?partitions,
                "kafka partitions lost (session timed out or fenced); their uncommitted messages will be redelivered"
            );
            self.shared.ownership.release(&partitions);
            let (revocation, _ignored) = Revocation::new(partitions);
            self.shared
                .handoff
                .push_control(Control::Event(SourceEvent::Revoked(revocation)));
            return;
        }
        tracing::info!(partitions = ?partitions, purged, "kafka partitions revoked; draining");
        let (revocation, handle) = Revocation::new(partitions.clone());
        self.shared
            .handoff
            .push_control(Control::Event(SourceEvent::Revoked(revocation)));
        let watermarks = match handle.wait_blocking(self.shared.revoke_timeout) {
            Ok(outcome) => outcome
                .partitions
                .into_iter()
                .filter_map(|revoked| Some((revoked.partition, revoked.committed?)))
                .collect(),
            Err(RevocationError::TimedOut(waited)) => {
                tracing::warn!(
                    partitions = ?partitions,
                    ?waited,
                    "the runtime did not drain revoked kafka partitions in time; releasing them at their last commit"
                );
                Vec::new()
            }
            Err(RevocationError::Abandoned) => Vec::new(),
        };
        let watermarks = if self.shared.commits {
            watermarks
        } else {
            Vec::new()
        };
        match self
            .shared
            .ownership
            .commit_and_release(consumer, &partitions, &watermarks)
        {
            Ok(0) => {}
            Ok(count) => tracing::debug!(count, "committed revoked kafka partitions"),
            Err(error) => tracing::warn!(
                %error,
                "final commit of revoked kafka partitions failed; their uncommitted messages will be redelivered"
            ),
        }
    }
}

impl ClientContext for KafkaContext {
    fn error(&self, error: KafkaError, reason: &str) {
        let code = error.rdkafka_error_code();
        if code == Some(RDKafkaErrorCode::Fatal) {
            tracing::error!(%error, reason, "fatal kafka client error");
            self.shared
                .handoff
                .push_control(Control::Error(SourceError::Fatal(
                    format!("{error}: {reason}").into(),
                )));
        } else if code.is_some_and(is_auth) {
            tracing::error!(%error, reason, "kafka broker refused the credentials");
            if !self.shared.auth_reported.swap(true, Ordering::AcqRel) {
                self.shared
                    .handoff
                    .push_control(Control::Error(SourceError::Unauthorized {
                        endpoint: self.shared.brokers.clone(),
                        source: format!("{error}: {reason}").into(),
                    }));
            }
        } else {
            // Connection losses and timeouts: librdkafka reconnects by itself.
            tracing::warn!(%error, reason, "kafka client error");
        }
    }
}

impl ConsumerContext for KafkaContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(list) => self.on_assign(list),
            Rebalance::Revoke(list) => self.on_revoke(consumer, list),
            Rebalance::Error(error) => tracing::warn!(%error, "kafka rebalance error"),
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, _rebalance: &Rebalance<'_>) {
        self.shared
            .assignment_changed
            .store(true, Ordering::Release);
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if let Err(error) = &result {
            // The polling thread sends it again unless a newer commit
            // supersedes it.
            tracing::warn!(%error, partitions = offsets.count(), "kafka offset commit failed; will retry");
        }
        self.shared
            .ownership
            .record_commit_result(result.is_ok(), offsets);
    }
}
