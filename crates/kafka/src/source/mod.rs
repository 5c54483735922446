//! [`KafkaSource`]: deliveries and rebalances from a Kafka consumer group.
//!
//! A thread of its own polls the rdkafka consumer and hands messages to
//! [`Source::next`] through a bounded queue. It reads messages in batches
//! from a queue of the source's own, to which every assigned partition is
//! forwarded, and serves rebalances on the consumer's main queue (see
//! `fetch_queue`). When the runtime falls behind and
//! the queue fills up, the thread pauses every assigned partition and keeps
//! polling (so `max.poll.interval.ms` is honoured and rebalances are served),
//! then resumes once the queue drained. Revocations block the rebalance
//! callback on that thread, never a tokio worker, until the runtime drained
//! and committed the partitions.
//!
//! The runtime pauses one partition over its uncommitted window
//! ([`Source::pause`]): its queued messages are taken back at once, and the
//! polling thread pauses it in librdkafka and leaves it paused through its
//! own backpressure and its watchdog, until the runtime resumes it or the
//! partition is revoked or assigned afresh (see `handoff`).

mod builder;
pub(crate) mod context;
mod convert;
mod earliest;
mod fetch_queue;
pub(crate) mod handoff;
mod poller;
mod reconnect;
mod stall_check;
mod watchdog;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use intake_core::{
    Message,
    backend::{Limits, Source, SourceError, SourceEvent},
};
use rdkafka::consumer::BaseConsumer;
use tokio::sync::oneshot;

pub use builder::KafkaSourceBuilder;

use self::context::{FINAL_COMMIT_MARGIN, KafkaContext, RevokeWait, Shared};
use self::convert::Record;
use self::handoff::Taken;
use crate::acker::KafkaAcker;
use crate::dead_letter::KafkaDeadLetterSinkBuilder;
use crate::settings::KafkaSettings;
use crate::transaction::Transactor;

/// A Kafka consumer as an intake [`Source`].
///
/// Build one with [`KafkaSource::builder`]; take its acker with
/// [`KafkaSource::acker`] and its dead-letter sink with
/// [`KafkaSource::dead_letter_sink`]. Partition = topic-partition, position =
/// [`Position::Offset`](intake_core::Position::Offset).
///
/// Dropping the source without [`close`](Source::close) leaves the group
/// without a final commit: what was not committed is delivered again to the
/// partitions' next owner.
pub struct KafkaSource {
    shared: Arc<Shared>,
    /// The polling thread owns the consumer; this handle lets the acker
    /// reach it while it lives.
    consumer: Weak<BaseConsumer<KafkaContext>>,
    min_commit_interval: Duration,
    /// The dead-letter sink of this source's brokers, group and topics.
    dead_letters: KafkaDeadLetterSinkBuilder,
    group_id: String,
    /// Resolves when the polling thread has left the group.
    stopped: Option<oneshot::Receiver<()>>,
    /// Records taken from the handoff, made messages here: on the runtime's
    /// thread, which frees them (see `convert`).
    taken: Vec<Record>,
    /// The transactional producer of an exactly-once pipeline.
    transactor: Option<Arc<Transactor>>,
}

impl std::fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource")
            .field("group_id", &self.group_id)
            .field("brokers", &self.shared.brokers)
            .finish_non_exhaustive()
    }
}

impl KafkaSource {
    /// Starts a builder for a source on the brokers of `settings`.
    pub fn builder(settings: KafkaSettings) -> KafkaSourceBuilder {
        KafkaSourceBuilder::new(settings)
    }

    /// The acker that commits this source's offsets (of a source built
    /// [`exactly_once`](KafkaSourceBuilder::exactly_once), in transactions
    /// with the kept outputs; every acker of it shares the one producer).
    pub fn acker(&self) -> KafkaAcker {
        KafkaAcker::new(
            self.consumer.clone(),
            self.shared.clone(),
            self.min_commit_interval,
            self.transactor.clone(),
        )
    }

    /// A builder for the dead-letter sink of this source: its brokers and
    /// settings (TLS, SASL, the reconnect policy; none of the consumer's
    /// own), its group and its topics, so that dead letters go to
    /// `<topic>.<group>.dlq` and [`build`](KafkaDeadLetterSinkBuilder::build)
    /// refuses a topic template that names a topic this source reads. In
    /// broadcast mode the group is the one given to
    /// [`group`](KafkaSourceBuilder::group) (or `intake`), without the
    /// instance's suffix: the instances share their dead-letter topics.
    pub fn dead_letter_sink(&self) -> KafkaDeadLetterSinkBuilder {
        self.dead_letters.clone()
    }

    /// A probe of this source's group lag on the brokers (high watermark −
    /// committed offset per partition of its topics), on a client of its
    /// own with the source's settings (TLS, SASL).
    ///
    /// # Errors
    ///
    /// Settings librdkafka refuses ([`Error::Config`](crate::Error::Config)).
    pub fn lag_probe(&self) -> Result<crate::KafkaLagProbe, crate::Error> {
        self.dead_letters.lag_probe(&self.group_id)
    }

    /// The consumer group id (generated in broadcast mode).
    pub fn group_id(&self) -> &str {
        &self.group_id
    }

    fn request_stop(&self) {
        self.shared.closing.store(true, Ordering::Release);
        self.shared.stop.store(true, Ordering::Release);
        // Releases a rebalance callback that waits on a queued revocation.
        self.shared.handoff.abandon();
    }
}

impl Source for KafkaSource {
    /// The consumer's budget sizes the hand-over queue: the polling thread
    /// pauses fetching once `max_in_flight` messages or half of
    /// `max_in_flight_bytes` wait for the runtime (so with the runtime's own
    /// budget and librdkafka's prefetch, `queued.max.messages.kbytes`,
    /// memory stays bounded in messages and bytes). Until then (a source
    /// used without the runtime) the queue holds 2048 messages, unbounded in
    /// bytes.
    ///
    /// A revocation's rebalance callback waits for the runtime the
    /// consumer's `revoke_timeout` plus 5 s for the runtime's final commit,
    /// but ends early enough to make its own final commit before
    /// `max.poll.interval.ms` (5 s before it, or at half of it when it is
    /// under 10 s), or the group would evict the consumer while it drains;
    /// a warning says when that cuts the wait short. Until then the
    /// callback waits 60 s, within the same bound.
    fn set_limits(&mut self, limits: Limits) {
        self.shared
            .handoff
            .set_capacity(limits.max_in_flight, limits.max_in_flight_bytes / 2);
        let revoke = RevokeWait::for_consumer(limits.revoke_timeout, self.shared.max_poll_interval);
        if revoke.clamped {
            tracing::warn!(
                revoke_timeout = ?limits.revoke_timeout,
                final_commit_margin = ?FINAL_COMMIT_MARGIN,
                max_poll_interval = ?self.shared.max_poll_interval,
                waits = ?revoke.wait,
                "the consumer's revoke_timeout and the final commit do not fit in the kafka consumer's max.poll.interval.ms; a revocation waits less for the runtime (raise max.poll.interval.ms or lower revoke_timeout)"
            );
        }
        self.shared.set_revoke_wait(revoke.wait);
    }

    async fn next(
        &mut self,
        deliveries: &mut Vec<Message>,
        max: usize,
    ) -> Result<SourceEvent, SourceError> {
        // Cancel safety: everything taken from librdkafka sits in the handoff
        // until `take` moves it out, and it reaches `deliveries` in the same
        // poll (no await in between); only the wait is dropped.
        loop {
            match self.shared.handoff.take(&mut self.taken, max) {
                Taken::Delivered => {
                    deliveries.extend(self.taken.drain(..).map(Record::into_message));
                    return Ok(SourceEvent::Delivered);
                }
                Taken::Event(event) => return Ok(event),
                Taken::Error(error) => return Err(error),
                Taken::Finished => {
                    return Err(SourceError::Fatal(
                        "the kafka polling thread stopped; the source was closed".into(),
                    ));
                }
                Taken::Empty => self.shared.handoff.wait(max).await,
            }
        }
    }

    /// Always pauses: the partition's messages waiting in the hand-over
    /// queue are taken back (none reaches the runtime after the pause), and
    /// the polling thread pauses the partition in librdkafka before its
    /// next poll; when it resumes, it fetches again from the first message
    /// taken back, so none is lost or delivered twice. The pause holds
    /// through the source's own backpressure (which pauses and resumes the
    /// whole assignment) and its watchdog (which restarts partitions behind
    /// their high watermark), and ends with the assignment: a partition
    /// revoked, or assigned afresh, is fetched again without a
    /// [`resume`](Source::resume).
    fn pause(&mut self, partition: &intake_core::PartitionKey) -> bool {
        self.shared.handoff.hold(partition);
        true
    }

    /// Fetches `partition` again (on the polling thread, before its next
    /// poll); nothing if it is not paused (revoked or assigned afresh
    /// since).
    fn resume(&mut self, partition: &intake_core::PartitionKey) {
        self.shared.handoff.release(partition);
    }

    /// Unreachable from librdkafka's "all brokers down" until a broker
    /// answers again (librdkafka reconnects on its own).
    fn reachability(&self) -> Option<intake_core::backend::Reachability> {
        Some(self.shared.reachability.clone())
    }

    async fn close(&mut self) -> Result<(), SourceError> {
        self.request_stop();
        if let Some(stopped) = self.stopped.take() {
            // An error means the thread is gone already.
            let _ = stopped.await;
        }
        Ok(())
    }
}

impl Drop for KafkaSource {
    fn drop(&mut self) {
        // The polling thread leaves the group on its own; not joined here, so
        // dropping never blocks an async task.
        self.request_stop();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rdkafka::consumer::Consumer;
    use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

    use super::*;

    /// A mock cluster with `topic` (one partition), its producer, and a
    /// source on it whose watchdog looks every 500 ms.
    async fn watched(topic: &str) -> (FutureProducer, KafkaSource) {
        let producer: FutureProducer = rdkafka::ClientConfig::new()
            .set("test.mock.num.brokers", "1")
            .create()
            .expect("mock cluster");
        let brokers = {
            let mock = producer.client().mock_cluster().expect("mock cluster");
            mock.create_topic(topic, 1, 1).expect("topic");
            mock.bootstrap_servers()
        };
        let settings = KafkaSettings::new(brokers)
            .set("session.timeout.ms", "6000")
            .set("heartbeat.interval.ms", "500");
        let source = KafkaSource::builder(settings)
            .group(format!("{topic}-group"))
            .topic(topic)
            .watchdog_interval(Duration::from_millis(500))
            .build()
            .await
            .expect("source");
        (producer, source)
    }

    async fn produce(producer: &FutureProducer, topic: &str, payload: &str) {
        producer
            .send(
                FutureRecord::<[u8], [u8]>::to(topic).payload(payload.as_bytes()),
                Duration::from_secs(10),
            )
            .await
            .expect("produce");
    }

    /// The next message of `source`, waiting up to 30 s.
    async fn receive_one(source: &mut KafkaSource) -> Option<Message> {
        let mut received = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while received.is_empty() && tokio::time::Instant::now() < deadline {
            let _ =
                tokio::time::timeout(Duration::from_secs(1), source.next(&mut received, 1)).await;
        }
        received.pop()
    }

    /// Pauses the source's partitions behind the poller's back, once it has
    /// `partitions` of them.
    async fn pause_behind_the_pollers_back(source: &KafkaSource, partitions: usize) {
        let consumer = source.consumer.upgrade().expect("consumer");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let assignment = consumer.assignment().expect("assignment");
            if assignment.count() == partitions {
                consumer.pause(&assignment).expect("pause");
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "never assigned");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A fetcher stopped behind the poller's back (as a lost wakeup or a
    /// stale pause would) is found by the watchdog and restarted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_watchdog_restarts_a_fetcher_that_stopped_while_the_broker_has_data() {
        let (producer, mut source) = watched("stall").await;
        produce(&producer, "stall", "first").await;
        let first = receive_one(&mut source).await.expect("the first message");
        assert_eq!(first.payload().as_ref(), b"first");

        pause_behind_the_pollers_back(&source, 1).await;
        produce(&producer, "stall", "second").await;
        let second = receive_one(&mut source)
            .await
            .expect("the stalled partition was restarted");
        assert_eq!(second.payload().as_ref(), b"second");
        source.close().await.expect("close");
    }

    /// A fetcher restarted without a rebalance callback (an assignment
    /// behind the poller's back stops and starts it, and the stop clears
    /// its partition's forward to the source's queue) delivers again: the
    /// polling thread forwards the whole assignment again once a second.
    /// Without that, the partition's messages would wait in its own fetch
    /// queue, which nobody reads (rust-rdkafka's issue 535).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_partition_whose_fetcher_restarted_without_a_rebalance_delivers_again() {
        let (producer, mut source) = watched("restarted").await;
        produce(&producer, "restarted", "first").await;
        let first = receive_one(&mut source).await.expect("the first message");
        assert_eq!(first.payload().as_ref(), b"first");

        let consumer = source.consumer.upgrade().expect("consumer");
        let mut list = rdkafka::TopicPartitionList::new();
        list.add_partition_offset("restarted", 0, rdkafka::Offset::Offset(1))
            .expect("offset");
        consumer.assign(&list).expect("assign");
        drop(consumer);
        produce(&producer, "restarted", "second").await;
        let second = receive_one(&mut source)
            .await
            .expect("the restarted partition delivers again");
        assert_eq!(second.payload().as_ref(), b"second");
        source.close().await.expect("close");
    }

    /// A partition that never yielded a message has no position: the
    /// watchdog judges it from where it should have started (here, no
    /// committed offset and `earliest`: the low watermark).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_watchdog_starts_a_partition_that_never_fetched() {
        let (producer, mut source) = watched("unstarted").await;
        pause_behind_the_pollers_back(&source, 1).await;
        produce(&producer, "unstarted", "first").await;
        let first = receive_one(&mut source)
            .await
            .expect("the unstarted partition was started");
        assert_eq!(first.payload().as_ref(), b"first");
        source.close().await.expect("close");
    }

    /// C14 / L9: the watchdog's broker queries (committed offsets, each
    /// partition's watermarks, up to 2 s each) never hold up the polling
    /// thread. A mock cluster of two brokers: partition 0 led by broker 1,
    /// partitions 1 to 8 by broker 2, which then answers nothing for 60 s
    /// (every response delayed). A stall check that began after that waits
    /// for broker 2's watermarks until its timeout; a message
    /// produced to partition 0 meanwhile must arrive while that check is
    /// still asking, not after it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn polling_goes_on_while_a_watermark_query_hangs() {
        const TOPIC: &str = "hung-watermarks";
        const GROUP: &str = "hung-watermarks-group";
        let producer: FutureProducer = rdkafka::ClientConfig::new()
            .set("test.mock.num.brokers", "2")
            .create()
            .expect("mock cluster");
        let mock = producer.client().mock_cluster().expect("mock cluster");
        mock.create_topic(TOPIC, 9, 1).expect("topic");
        mock.partition_leader(TOPIC, 0, Some(1)).expect("leader");
        for partition in 1..9 {
            mock.partition_leader(TOPIC, partition, Some(2))
                .expect("leader");
        }
        mock.coordinator(rdkafka::mocking::MockCoordinator::Group(GROUP.into()), 1)
            .expect("coordinator");
        let settings = KafkaSettings::new(mock.bootstrap_servers())
            .set("session.timeout.ms", "6000")
            .set("heartbeat.interval.ms", "500")
            // A watermark query waits behind the connection's fetch long
            // poll (a broker answers one request of a connection at a
            // time): short polls keep the checks before the hang quick.
            .set("fetch.wait.max.ms", "10");
        let mut source = KafkaSource::builder(settings)
            .group(GROUP)
            .topic(TOPIC)
            .watchdog_interval(Duration::from_millis(300))
            .build()
            .await
            .expect("source");
        let to_partition_0 = |payload: &'static str| {
            producer.send(
                FutureRecord::<[u8], [u8]>::to(TOPIC)
                    .partition(0)
                    .payload(payload.as_bytes()),
                Duration::from_secs(10),
            )
        };
        to_partition_0("first").await.expect("produce");
        let first = receive_one(&mut source).await.expect("the first message");
        assert_eq!(first.payload().as_ref(), b"first");

        mock.broker_round_trip_time(2, Duration::from_secs(60))
            .expect("broker 2 stops answering");
        let shared = source.shared.clone();
        let begun_before = shared.stall_checks_begun.load(Ordering::Acquire);
        // A check that began once broker 2 stopped answering, still asking.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let hung = loop {
            let begun = shared.stall_checks_begun.load(Ordering::Acquire);
            if begun > begun_before && shared.stall_checks_ended.load(Ordering::Acquire) < begun {
                break begun;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no stall check began within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        to_partition_0("second").await.expect("produce");
        let second = receive_one(&mut source)
            .await
            .expect("the second message arrives");
        let ended = shared.stall_checks_ended.load(Ordering::Acquire);
        assert_eq!(second.payload().as_ref(), b"second");
        assert!(
            ended < hung,
            "the second message arrived only after the stall check that was asking broker 2 ended (check {hung}, {ended} ended): polling waited on the watermark queries"
        );
        mock.broker_round_trip_time(2, Duration::ZERO)
            .expect("broker 2 answers again");
        source.close().await.expect("close");
    }

    /// Produces `count` messages to `topic` and waits for the broker to
    /// confirm them.
    async fn produce_many(producer: &FutureProducer, topic: &str, count: usize) {
        let deliveries: Vec<_> = (0..count)
            .map(|number| {
                let payload = number.to_string();
                producer
                    .send_result(FutureRecord::<[u8], [u8]>::to(topic).payload(payload.as_bytes()))
                    .expect("queued")
            })
            .collect();
        for delivery in deliveries {
            delivery.await.expect("delivered").expect("confirmed");
        }
    }

    /// Waits (up to 30 s) until the hand-over queue holds at least
    /// `messages`.
    async fn wait_for_fill(source: &KafkaSource, messages: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while source.shared.handoff.fill().messages < messages {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the queue never filled"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// C7: a partition paused by the runtime stays paused in librdkafka
    /// through the source's own backpressure (which pauses and resumes the
    /// whole assignment) and its watchdog (which restarts a partition behind
    /// its high watermark): the handoff leaves out only what was fetched
    /// before the polling thread paused it, not a fetch after each resume.
    /// Resumed, it delivers every remaining offset once, in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_paused_partition_is_not_fetched_again_by_backpressure_or_the_watchdog() {
        const TOPIC: &str = "held";
        const RECORDS: i64 = 3000;
        let producer: FutureProducer = rdkafka::ClientConfig::new()
            .set("test.mock.num.brokers", "1")
            .create()
            .expect("mock cluster");
        let mock = producer.client().mock_cluster().expect("mock cluster");
        mock.create_topic(TOPIC, 2, 1).expect("topic");
        for partition in 0..2 {
            let sends: Vec<_> = (0..RECORDS)
                .map(|offset| {
                    let payload = offset.to_string();
                    producer
                        .send_result(
                            FutureRecord::<[u8], [u8]>::to(TOPIC)
                                .partition(partition)
                                .payload(payload.as_bytes()),
                        )
                        .expect("queued")
                })
                .collect();
            for sent in sends {
                sent.await.expect("delivered").expect("confirmed");
            }
        }
        let settings = KafkaSettings::new(mock.bootstrap_servers())
            .set("session.timeout.ms", "6000")
            .set("heartbeat.interval.ms", "500");
        let mut source = KafkaSource::builder(settings)
            .group("held-group")
            .topic(TOPIC)
            .watchdog_interval(Duration::from_millis(300))
            .build()
            .await
            .expect("source");
        source.set_limits(Limits::new(8, 64 << 20, Duration::from_secs(10)));
        let held = intake_core::PartitionKey::new(TOPIC, 0);
        let mut taken: [Vec<i64>; 2] = [Vec::new(), Vec::new()];
        let mut buffer = Vec::new();
        let mut take = async |source: &mut KafkaSource, taken: &mut [Vec<i64>; 2]| {
            let _ =
                tokio::time::timeout(Duration::from_millis(200), source.next(&mut buffer, 8)).await;
            for message in buffer.drain(..) {
                let intake_core::Position::Offset(offset) = message.metadata().position() else {
                    panic!("an offset");
                };
                taken[message.metadata().partition() as usize].push(offset);
            }
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while taken[0].is_empty() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "partition 0 never delivered"
            );
            take(&mut source, &mut taken).await;
        }
        assert!(source.pause(&held));
        let paused_at = taken[0].len();
        // Three times the queue stays full past the polling thread's
        // patience (it pauses everything), then drains (it resumes).
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(800)).await;
            for _ in 0..100 {
                take(&mut source, &mut taken).await;
                if source.shared.handoff.fill().messages == 0 {
                    break;
                }
            }
        }
        while taken[1].last() != Some(&(RECORDS - 1)) {
            assert!(
                tokio::time::Instant::now() < deadline + Duration::from_secs(30),
                "partition 1 never ended"
            );
            take(&mut source, &mut taken).await;
        }
        // Idle, for several of the watchdog's checks.
        for _ in 0..10 {
            take(&mut source, &mut taken).await;
        }
        assert_eq!(
            taken[0].len(),
            paused_at,
            "nothing of partition 0 while paused"
        );
        let left_out = source.shared.handoff.left_out();
        assert!(
            left_out <= 2 * super::poller::MAX_BATCH as u64,
            "{left_out} messages of the paused partition were fetched and left out: it was fetched again while paused"
        );

        source.resume(&held);
        while taken[0].last() != Some(&(RECORDS - 1)) {
            assert!(
                tokio::time::Instant::now() < deadline + Duration::from_secs(60),
                "partition 0 never ended"
            );
            take(&mut source, &mut taken).await;
        }
        for (partition, offsets) in taken.iter().enumerate() {
            assert_eq!(
                offsets,
                &(0..RECORDS).collect::<Vec<_>>(),
                "partition {partition}: every offset once, in order"
            );
        }
        source.close().await.expect("close");
    }

    /// Once the consumer told the source its limits, the hand-over queue
    /// holds about `max_in_flight` messages before fetching pauses (plus
    /// what one poll took from librdkafka), not the 2048 of a source used
    /// without the runtime.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_hand_over_queue_is_sized_from_the_consumers_max_in_flight() {
        let (producer, mut source) = watched("sized").await;
        source.set_limits(Limits::new(8, 64 << 20, Duration::from_secs(10)));
        produce_many(&producer, "sized", 3000).await;
        assert_eq!(
            source.shared.revoke_wait(),
            Duration::from_secs(10) + FINAL_COMMIT_MARGIN
        );
        wait_for_fill(&source, 8).await;
        // Long enough for the poller to give up waiting for room and pause
        // (it waits 500 ms), and for anything it still polls to arrive.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let held = source.shared.handoff.fill().messages;
        assert!(held < 8 + super::poller::MAX_BATCH, "{held} messages held");
        source.close().await.expect("close");
    }
}
