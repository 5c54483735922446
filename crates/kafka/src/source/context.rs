//! The rdkafka context: rebalance callbacks, commit results and client
//! errors, all run on the polling thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use intake_core::backend::RevocationError;
use intake_core::{
    PartitionKey, Position,
    backend::{Revocation, SourceError, SourceEvent},
};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::metadata::Metadata;
use rdkafka::{ClientContext, TopicPartitionList};

use super::fetch_queue::Forwarding;
use super::handoff::{Control, Handoff};
use crate::error::{ConnectionFailure, Error, is_not_authorized};
use crate::ownership::Ownership;
use crate::transaction::OutputStore;

/// Messages the hand-over queue holds before fetching pauses, until a
/// consumer tells the source its `max_in_flight` (a source used on its own
/// keeps it).
pub(crate) const DEFAULT_HANDOFF_CAPACITY: usize = 2048;

/// How long a revocation waits for the runtime to drain and commit, until a
/// consumer tells the source its `revoke_timeout` (a source used on its own
/// keeps it, [within](RevokeWait::within) `max.poll.interval.ms`).
pub(crate) const DEFAULT_REVOKE_WAIT: Duration = Duration::from_secs(60);

/// What a revocation waits beyond the consumer's `revoke_timeout`: after
/// it, the runtime cancels the revoked partitions' handlers and commits
/// their watermarks with a synchronous batch, which may queue behind one
/// commit the acker holds back (`min_commit_interval`) and then takes a
/// broker round trip. The rebalance callback keeps the same time after its
/// wait for its own final commit, before `max.poll.interval.ms`.
pub(crate) const FINAL_COMMIT_MARGIN: Duration = Duration::from_secs(5);

/// How long a revocation asks the brokers whether the revoked partitions'
/// topics still exist, out of its wait for the runtime. When they do not
/// answer in time, the partitions are committed as usual.
const TOPIC_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether `metadata` (fetched for `topic`) says the topic does not exist.
pub(crate) fn topic_missing(metadata: &Metadata, topic: &str) -> bool {
    match metadata.topics().iter().find(|found| found.name() == topic) {
        None => true,
        Some(found) => {
            found.error().is_some_and(|code| {
                matches!(
                    RDKafkaErrorCode::from(code),
                    RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic
                )
            }) || found.partitions().is_empty()
        }
    }
}

/// How long the rebalance callback waits for the runtime to complete a
/// revocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RevokeWait {
    /// The wait.
    pub(crate) wait: Duration,
    /// Whether `max.poll.interval.ms` cut it short of what was wanted.
    pub(crate) clamped: bool,
}

impl RevokeWait {
    /// `wanted`, or less: the callback's wait and then its own final commit
    /// ([`FINAL_COMMIT_MARGIN`], or half the interval when that is shorter)
    /// must end before `max_poll_interval`, or the group evicts the
    /// consumer while it drains.
    pub(crate) fn within(wanted: Duration, max_poll_interval: Duration) -> Self {
        let ceiling =
            max_poll_interval.saturating_sub(FINAL_COMMIT_MARGIN.min(max_poll_interval / 2));
        Self {
            wait: wanted.min(ceiling),
            clamped: wanted > ceiling,
        }
    }

    /// The wait for a consumer with `revoke_timeout`: that, plus
    /// [`FINAL_COMMIT_MARGIN`] for the runtime's final commit,
    /// [within](Self::within) `max_poll_interval`.
    pub(crate) fn for_consumer(revoke_timeout: Duration, max_poll_interval: Duration) -> Self {
        Self::within(
            revoke_timeout.saturating_add(FINAL_COMMIT_MARGIN),
            max_poll_interval,
        )
    }
}

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
    /// How long a revoke callback waits for the runtime to drain and
    /// commit, in nanoseconds ([`Shared::revoke_wait`]).
    revoke_wait: AtomicU64,
    /// The consumer's `max.poll.interval.ms`, which bounds that wait.
    pub(crate) max_poll_interval: Duration,
    /// Whether this consumer commits offsets (not in broadcast mode).
    pub(crate) commits: bool,
    /// The brokers, for error messages (credentials hidden).
    pub(crate) brokers: String,
    /// Partitions revoked inside the current `poll` call: the polling
    /// thread drops their messages from the batch it is assembling.
    pub(crate) revoked_in_poll: Mutex<Vec<PartitionKey>>,
    /// An authentication failure was already reported.
    auth_reported: AtomicBool,
    /// The last TLS or authentication failure librdkafka reported on a
    /// broker connection, with its account: what a build that timed out
    /// says instead of "timed out", and what turns "all brokers are down"
    /// into an error the user must act on.
    connection_failure: Mutex<Option<(ConnectionFailure, String)>>,
    /// Whether `connection_failure` holds one: read per polled batch, so
    /// that the lock is taken only when there is something to forget.
    connection_failed: AtomicBool,
    /// Unreachable from librdkafka's "all brokers down" until the polling
    /// thread hears from a broker again (a message, or its metadata probe),
    /// for readiness: librdkafka reconnects on its own and the runtime sees
    /// no error meanwhile.
    pub(crate) reachability: intake_core::backend::Reachability,
    /// In an exactly-once pipeline, the outputs waiting for their
    /// transaction. Offsets are then committed only inside transactions,
    /// never by the rebalance callback: an offset committed without its
    /// inputs' outputs would lose them.
    pub(crate) exactly_once: Option<Arc<OutputStore>>,
    /// The watchdog's stall checks begun and ended: a check asks the
    /// brokers (committed offsets, watermarks) and may wait on them.
    pub(crate) stall_checks_begun: AtomicU64,
    pub(crate) stall_checks_ended: AtomicU64,
    /// The polling thread's message queue, to which the rebalance callback
    /// forwards the partitions it assigns (see `fetch_queue`).
    pub(crate) forwarding: Forwarding,
}

impl Shared {
    /// The state of a consumer that commits offsets (`commits`, not in
    /// broadcast mode), with the defaults of a source used on its own.
    pub(crate) fn new(commits: bool, brokers: String, max_poll_interval: Duration) -> Self {
        let shared = Self {
            handoff: Handoff::new(DEFAULT_HANDOFF_CAPACITY),
            ownership: Ownership::default(),
            closing: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            assignment_changed: AtomicBool::new(false),
            revoke_wait: AtomicU64::new(0),
            max_poll_interval,
            commits,
            brokers,
            revoked_in_poll: Mutex::new(Vec::new()),
            auth_reported: AtomicBool::new(false),
            connection_failure: Mutex::new(None),
            connection_failed: AtomicBool::new(false),
            reachability: intake_core::backend::Reachability::new(),
            exactly_once: None,
            stall_checks_begun: AtomicU64::new(0),
            stall_checks_ended: AtomicU64::new(0),
            forwarding: Forwarding::default(),
        };
        shared.set_revoke_wait(RevokeWait::within(DEFAULT_REVOKE_WAIT, max_poll_interval).wait);
        shared
    }

    /// How long a revoke callback waits for the runtime to drain and commit.
    pub(crate) fn revoke_wait(&self) -> Duration {
        Duration::from_nanos(self.revoke_wait.load(Ordering::Relaxed))
    }

    /// Sets [`revoke_wait`](Self::revoke_wait) (at most 584 years).
    pub(crate) fn set_revoke_wait(&self, wait: Duration) {
        let nanos = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        self.revoke_wait.store(nanos, Ordering::Relaxed);
    }

    /// Forgets a recorded TLS or authentication failure: messages arrived
    /// since, so some broker accepted the client, and an outage later must
    /// not be blamed on it.
    pub(crate) fn forget_connection_failure(&self) {
        if self.connection_failed.swap(false, Ordering::AcqRel) {
            *self
                .connection_failure
                .lock()
                .unwrap_or_else(|poison| poison.into_inner()) = None;
        }
    }

    /// The last TLS or authentication failure on a broker connection.
    pub(crate) fn connection_failure(&self) -> Option<(ConnectionFailure, String)> {
        self.connection_failure
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .clone()
    }

    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Gives `partitions` up without committing, and drops the outputs of
    /// an exactly-once pipeline kept for them: their next owner handles
    /// their uncommitted inputs again.
    fn release(&self, partitions: &[PartitionKey]) {
        self.ownership.release(partitions);
        if let Some(outputs) = &self.exactly_once {
            outputs.forget(partitions);
        }
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
        // A pause of the runtime's ends with the assignment: a partition
        // assigned afresh is fetched, and the runtime hears it is new.
        self.shared.handoff.end_holds(&partitions);
        self.shared.ownership.acquire(&partitions);
        if let Some(outputs) = &self.shared.exactly_once {
            // Whatever was kept for them before is not this assignment's.
            outputs.forget(&partitions);
        }
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
        if consumer.assignment_lost() {
            // Another consumer may already own them: give them up before the
            // runtime reports anything, so none of its commits goes through.
            tracing::warn!(
                partitions = ?partitions,
                "kafka partitions lost (session timed out or fenced); their uncommitted messages will be redelivered"
            );
            self.shared.release(&partitions);
            if !self.shared.is_closing() {
                let (revocation, _ignored) = Revocation::new(partitions);
                self.shared
                    .handoff
                    .push_control(Control::Event(SourceEvent::Revoked(revocation)));
            }
            return;
        }
        let started = Instant::now();
        if self.shared.commits {
            self.forget_deleted_topics(consumer, &partitions);
        }
        if self.shared.is_closing() {
            // The runtime made its final commit before closing (or is gone);
            // only an attempt the broker did not confirm is left to send.
            self.commit_and_release(consumer, &partitions, &[]);
            return;
        }
        tracing::info!(partitions = ?partitions, purged, "kafka partitions revoked; draining");
        let (revocation, handle) = Revocation::new(partitions.clone());
        self.shared
            .handoff
            .push_control(Control::Event(SourceEvent::Revoked(revocation)));
        // The runtime drains the partitions and commits their watermarks
        // with a synchronous batch before it completes the revocation; what
        // that batch got confirmed is not committed again below.
        let watermarks: Vec<(PartitionKey, Position)> = match handle
            .wait_blocking(self.shared.revoke_wait().saturating_sub(started.elapsed()))
        {
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
        self.commit_and_release(consumer, &partitions, &watermarks);
    }

    /// Asks the brokers whether the topics of `partitions` still exist, and
    /// has the partitions of those that do not [never committed
    /// again](Ownership::forget_deleted): not by the runtime's revocation
    /// batch, not by the final commit below. Called before the runtime
    /// hears of the revocation, so before a topic deleted and created again
    /// can be mistaken for the old one by anything this consumer commits.
    fn forget_deleted_topics(&self, consumer: &BaseConsumer<Self>, partitions: &[PartitionKey]) {
        let mut topics: Vec<&str> = partitions.iter().map(|key| &*key.source).collect();
        topics.sort_unstable();
        topics.dedup();
        let deadline = Instant::now() + TOPIC_CHECK_TIMEOUT;
        for topic in topics {
            let remaining = deadline.saturating_duration_since(Instant::now());
            match consumer.fetch_metadata(Some(topic), remaining) {
                Ok(metadata) if topic_missing(&metadata, topic) => {
                    tracing::warn!(
                        topic,
                        "a revoked kafka topic was deleted; its offsets are not committed (they went with it, and could land on a topic created again under its name)"
                    );
                    let deleted: Vec<PartitionKey> = partitions
                        .iter()
                        .filter(|key| &*key.source == topic)
                        .cloned()
                        .collect();
                    self.shared.ownership.forget_deleted(&deleted);
                }
                Ok(_) => {}
                Err(error) => tracing::debug!(
                    %error,
                    topic,
                    "could not ask whether a revoked kafka topic still exists; committing it as usual"
                ),
            }
        }
    }

    /// Commits what the broker has not confirmed for `partitions` (nothing
    /// in broadcast mode) and gives them up.
    fn commit_and_release(
        &self,
        consumer: &BaseConsumer<Self>,
        partitions: &[PartitionKey],
        watermarks: &[(PartitionKey, Position)],
    ) {
        if !self.shared.commits || self.shared.exactly_once.is_some() {
            // In an exactly-once pipeline the runtime's revocation batch
            // committed in a transaction what could be; what it could not
            // is handled again by the next owner.
            self.shared.release(partitions);
            return;
        }
        match self
            .shared
            .ownership
            .commit_and_release(consumer, partitions, watermarks)
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
    /// librdkafka's errors about the client as a whole. Most pass by
    /// themselves (librdkafka reconnects); a refused certificate or
    /// credentials on one broker of many is one of those too (a broker
    /// rotating its certificate, a SCRAM user being created on the last
    /// node). Only when every broker is down and the last failure was such
    /// a refusal does the source stop: then nothing will pass without the
    /// user fixing the settings.
    fn error(&self, error: KafkaError, reason: &str) {
        let code = error.rdkafka_error_code();
        if code == Some(RDKafkaErrorCode::AllBrokersDown) {
            self.shared.reachability.unreachable();
        }
        if code == Some(RDKafkaErrorCode::Fatal) {
            tracing::error!(%error, reason, "fatal kafka client error");
            self.shared
                .handoff
                .push_control(Control::Error(SourceError::Fatal(
                    format!("{error}: {reason}").into(),
                )));
        } else if let Some(failure) = code.and_then(ConnectionFailure::of) {
            tracing::warn!(%error, reason, "a kafka broker connection failed its TLS handshake or authentication");
            *self
                .shared
                .connection_failure
                .lock()
                .unwrap_or_else(|poison| poison.into_inner()) = Some((failure, reason.to_owned()));
            self.shared.connection_failed.store(true, Ordering::Release);
        } else if code == Some(RDKafkaErrorCode::AllBrokersDown)
            && let Some((failure, last)) = self.shared.connection_failure()
        {
            tracing::error!(reason = %last, "every kafka broker is down and the last refused the connection");
            if !self.shared.auth_reported.swap(true, Ordering::AcqRel) {
                let refused = failure.into_error(&self.shared.brokers, last.into());
                self.shared
                    .handoff
                    .push_control(Control::Error(refused.into()));
            }
        } else if code.is_some_and(is_not_authorized) {
            tracing::error!(%error, reason, "kafka broker refused the request");
            if !self.shared.auth_reported.swap(true, Ordering::AcqRel) {
                self.shared.handoff.push_control(Control::Error(
                    Error::Unauthorized {
                        brokers: self.shared.brokers.clone(),
                        source: format!("{error}: {reason}").into(),
                    }
                    .into(),
                ));
            }
        } else {
            // Connection losses and timeouts: librdkafka reconnects by itself.
            tracing::warn!(%error, reason, "kafka client error");
        }
    }
}

impl ConsumerContext for KafkaContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(list) = rebalance {
            // Before rdkafka assigns them, so before their fetchers start:
            // none of their messages reaches the main queue.
            self.shared
                .forwarding
                .forward(consumer.client().native_ptr(), list);
        }
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::handoff::Taken;

    fn context() -> KafkaContext {
        KafkaContext {
            shared: Arc::new(Shared::new(
                true,
                "a:9093,b:9093".into(),
                Duration::from_secs(300),
            )),
        }
    }

    fn next_error(context: &KafkaContext) -> Option<SourceError> {
        match context.shared.handoff.take(&mut Vec::new(), 8) {
            Taken::Error(error) => Some(error),
            _ => None,
        }
    }

    #[test]
    fn a_refused_handshake_on_one_broker_is_logged_not_fatal() {
        let context = context();
        context.error(
            KafkaError::Global(RDKafkaErrorCode::SSL),
            "ssl://b:9093/2: SSL handshake failed: certificate verify failed",
        );
        context.error(
            KafkaError::Global(RDKafkaErrorCode::Authentication),
            "sasl_ssl://b:9093/2: SASL authentication error",
        );
        assert!(
            next_error(&context).is_none(),
            "the other brokers may serve"
        );
    }

    #[test]
    fn every_broker_down_after_a_refused_handshake_is_an_error_to_act_on() {
        let context = context();
        context.error(
            KafkaError::Global(RDKafkaErrorCode::SSL),
            "ssl://b:9093/2: SSL handshake failed: certificate verify failed",
        );
        context.error(
            KafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
            "2/2 brokers are down",
        );
        match next_error(&context) {
            Some(SourceError::Unauthorized { source, .. }) => {
                let account = source.source().map(ToString::to_string);
                assert!(
                    account.is_some_and(|account| account.contains("certificate verify failed")),
                    "{source:?}"
                );
            }
            other => panic!("expected Unauthorized, got {other:?}"),
        }
        context.error(
            KafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
            "2/2 brokers are down",
        );
        assert!(next_error(&context).is_none(), "reported once");
    }

    #[test]
    fn a_refusal_followed_by_messages_is_forgotten() {
        let context = context();
        context.error(
            KafkaError::Global(RDKafkaErrorCode::SSL),
            "ssl://b:9093/2: SSL handshake failed",
        );
        context.shared.forget_connection_failure();
        context.error(
            KafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
            "2/2 brokers are down",
        );
        assert!(
            next_error(&context).is_none(),
            "a later outage is not the old refusal"
        );
    }

    #[test]
    fn every_broker_down_without_a_refusal_passes_by_itself() {
        let context = context();
        context.error(
            KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure),
            "connection refused",
        );
        context.error(
            KafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
            "2/2 brokers are down",
        );
        assert!(next_error(&context).is_none(), "librdkafka reconnects");
    }

    #[test]
    fn a_revocation_waits_the_revoke_timeout_and_a_margin_for_the_final_commit() {
        let wait = RevokeWait::for_consumer(Duration::from_secs(10), Duration::from_secs(300));
        assert_eq!(
            wait,
            RevokeWait {
                wait: Duration::from_secs(10) + FINAL_COMMIT_MARGIN,
                clamped: false
            }
        );
    }

    #[test]
    fn the_wait_leaves_the_callback_its_final_commit_within_the_poll_interval() {
        let wait = RevokeWait::for_consumer(Duration::from_secs(10), Duration::from_secs(12));
        assert_eq!(wait.wait, Duration::from_secs(12) - FINAL_COMMIT_MARGIN);
        assert!(wait.clamped);
        // An interval shorter than twice the margin: half of it is left.
        let wait = RevokeWait::for_consumer(Duration::from_secs(10), Duration::from_secs(4));
        assert_eq!(wait.wait, Duration::from_secs(2));
        assert!(wait.clamped);
        let wait = RevokeWait::within(Duration::MAX, Duration::ZERO);
        assert_eq!(wait.wait, Duration::ZERO);
    }

    #[test]
    fn a_source_on_its_own_waits_the_default_within_the_poll_interval() {
        let shared = Shared::new(true, "b:9092".into(), Duration::from_secs(300));
        assert_eq!(shared.revoke_wait(), DEFAULT_REVOKE_WAIT);
        assert_eq!(shared.handoff.capacity(), DEFAULT_HANDOFF_CAPACITY);
        let shared = Shared::new(true, "b:9092".into(), Duration::from_secs(30));
        assert_eq!(
            shared.revoke_wait(),
            Duration::from_secs(30) - FINAL_COMMIT_MARGIN
        );
    }
}
