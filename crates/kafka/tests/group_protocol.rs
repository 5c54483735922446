//! KIP-848's consumer group protocol (`GroupProtocol::Consumer`) where it
//! differs from the classic one: commits refused for a stale member epoch
//! (librdkafka's mock cluster, which serves the protocol and injects the
//! refusal), and a member that passes `max.poll.interval.ms` (Apache Kafka
//! 4.1 on 127.0.0.1:9092, `.ci/services/kafka.sh`).

mod support;

use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use intake_core::backend::testkit::Backend;
use intake_core::backend::testkit::harness::{id_of, numbered};
use intake_core::backend::{
    AckBatch, AckError, Acker, PartitionAck, RevocationOutcome, Source, SourceError, SourceEvent,
};
use intake_core::{PartitionKey, Position};
use intake_kafka::GroupProtocol;
use intake_kafka::rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

use support::{KafkaBackend, unique};

const PATIENCE: Duration = Duration::from_secs(30);

/// A stall of the polling thread a test asks for: on the next event of
/// intake's logged on a polling thread that mentions the text (a topic of
/// the test's own), the thread sleeps this long, as a thread that blocks in
/// a log sink does.
static STALL: Mutex<Option<(String, Duration)>> = Mutex::new(None);

/// Set once librdkafka said the application passed `max.poll.interval.ms`.
static PASSED_MAX_POLL: AtomicBool = AtomicBool::new(false);

/// The layer that applies [`STALL`] and sees [`PASSED_MAX_POLL`].
struct Stall;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Stall {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        struct Text<'a>(&'a mut String);
        impl tracing::field::Visit for Text<'_> {
            fn record_debug(&mut self, _: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                let _ = write!(self.0, "{value:?} ");
            }
        }
        let target = event.metadata().target();
        let ours = target.starts_with("intake_kafka");
        if !(ours || target == "librdkafka") {
            return;
        }
        let mut text = String::new();
        event.record(&mut Text(&mut text));
        if text.contains("maximum poll interval") {
            PASSED_MAX_POLL.store(true, Ordering::Release);
        }
        if !ours || std::thread::current().name() != Some("intake-kafka-poll") {
            return;
        }
        let stall = {
            let mut armed = STALL.lock().unwrap_or_else(|poison| poison.into_inner());
            match &*armed {
                Some((mentioned, _)) if text.contains(mentioned.as_str()) => armed.take(),
                _ => None,
            }
        };
        if let Some((_, stall)) = stall {
            std::thread::sleep(stall);
        }
    }
}

/// Logs as `support::init_tracing` does, with [`Stall`] seeing every
/// event (librdkafka's debug lines included, through `tracing-log`).
fn init_tracing() {
    let shown = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_test_writer()
                .with_filter(shown),
        )
        .with(Stall)
        .try_init();
}

/// A batch committing `partition` up to `watermark`, waited for.
fn batch(partition: &PartitionKey, watermark: i64) -> AckBatch {
    let mut ack = PartitionAck::new(partition.clone());
    ack.watermark = Some(Position::Offset(watermark));
    AckBatch {
        partitions: vec![ack],
        sync: true,
    }
}

/// The offset `group` committed on partition 0 of `topic`.
async fn committed(kafka: &KafkaBackend, topic: &str, group: &str) -> Option<i64> {
    let offsets = kafka.offsets(topic, group).await.expect("offsets");
    offsets
        .into_iter()
        .find(|(partition, _, _)| *partition == 0)
        .and_then(|(_, committed, _)| committed)
}

/// Under KIP-848 the broker refuses a commit that carries an older member
/// epoch than the member's (`STALE_MEMBER_EPOCH`): the epoch moved with a
/// heartbeat the client had not read when it sent the commit. librdkafka
/// 2.12 does not send a manual commit again (it asks for the next heartbeat
/// at once, `rd_kafka_cgrp_op_handle_OffsetCommit`), so the refusal reaches
/// the acker while the partition is still this member's. The acker sends
/// it again at once, a few times, rather than wait for the runtime's next
/// batch and a backoff (and, in a revocation, rather than leave the
/// partition's finished messages to its next owner).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_refused_for_a_stale_member_epoch_is_sent_again_at_once() {
    init_tracing();
    let kafka = KafkaBackend::mock().with_protocol(GroupProtocol::Consumer);
    let topic = kafka.create_source(1).await.expect("topic");
    let group = unique("g");
    kafka
        .produce(&topic, numbered(0, 4))
        .await
        .expect("produce");
    let mut source = kafka.source(&topic, &group).build().await.expect("source");
    let mut acker = source.acker();
    let taken = support::take(&mut source, 4, 16, PATIENCE).await;
    assert_eq!(taken.messages.len(), 4, "assigned under KIP-848 and read");
    let partition = PartitionKey::new(topic.as_str(), 0);

    kafka.refuse_next(
        RDKafkaApiKey::OffsetCommit,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_STALE_MEMBER_EPOCH],
    );
    let outcome = acker.ack(&batch(&partition, 1)).await;
    assert!(
        outcome.is_ok(),
        "a stale member epoch is a refusal of this commit, not of the member: {outcome:?}"
    );
    assert_eq!(committed(&kafka, &topic, &group).await, Some(2));

    // Refused every time: reported as the broker's refusal, which the
    // runtime sends again with its next batch (docs/CONTRACT.md §3).
    kafka.refuse_next(
        RDKafkaApiKey::OffsetCommit,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_STALE_MEMBER_EPOCH; 8],
    );
    let outcome = acker.ack(&batch(&partition, 2)).await;
    assert!(matches!(outcome, Err(AckError::Broker(_))), "{outcome:?}");
    kafka.clear_refusals(RDKafkaApiKey::OffsetCommit);
    let outcome = acker.ack(&batch(&partition, 3)).await;
    assert!(outcome.is_ok(), "{outcome:?}");
    assert_eq!(committed(&kafka, &topic, &group).await, Some(4));
    intake_core::backend::Source::close(&mut source)
        .await
        .expect("close");
}

support::per_group_protocol!(
    /// A member whose polling thread stops for longer than
    /// `max.poll.interval.ms` (3 s here) is put out of the group by
    /// librdkafka, and joins again when the thread polls again: it is
    /// assigned its partition again and delivers what was produced
    /// meanwhile. intake polls on a thread of its own and bounds its own
    /// waits there (a revocation's, see `RevokeWait`), so only a thread
    /// that stalls (a blocking log sink, a process descheduled or paused)
    /// passes the interval; a stall is what this test makes.
    ///
    /// Under KIP-848's protocol librdkafka 2.12 may instead fail the member
    /// for good (`INVALID_REQUEST`, fatal), librdkafka issue #5541, fixed
    /// in 2.15.0: it sends the leave heartbeat at once, and when its answer
    /// is read before the member acts on its rejoin it heartbeats at epoch 0
    /// without a full request. That race is not forced here (librdkafka's
    /// own test forces it by stalling its main thread in a log callback,
    /// which rdkafka's queued logs cannot reach): the test accepts a fatal
    /// source error under the consumer protocol with librdkafka before
    /// 2.15, reported as such (never a stall), and says which it saw.
    a_member_past_max_poll_interval_joins_again => member_past_max_poll_interval
);

async fn member_past_max_poll_interval(test: &str, protocol: GroupProtocol) {
    init_tracing();
    let Some(kafka) = KafkaBackend::real(test) else {
        return;
    };
    let max_poll = Duration::from_secs(3);
    let mut settings = vec![("max.poll.interval.ms", "3000")];
    if protocol == GroupProtocol::Classic {
        // librdkafka wants max.poll.interval.ms >= session.timeout.ms.
        settings.push(("session.timeout.ms", "3000"));
    }
    let kafka = kafka.with_protocol(protocol).with_settings(&settings);
    let topic = kafka.create_source(1).await.expect("topic");
    let group = kafka.new_group("g-maxpoll").await;
    let mut source = kafka.source(&topic, &group).build().await.expect("source");
    let mut buffer = Vec::new();

    // Assigned, and polling steadily.
    let deadline = Instant::now() + PATIENCE;
    loop {
        assert!(
            Instant::now() < deadline,
            "not assigned within {PATIENCE:?}"
        );
        let next = tokio::time::timeout(Duration::from_secs(1), source.next(&mut buffer, 16));
        if let Ok(Ok(SourceEvent::Assigned(_))) = next.await {
            break;
        }
    }
    // The polling thread logs the pause of the partition, and stalls there
    // past max.poll.interval.ms.
    PASSED_MAX_POLL.store(false, Ordering::Release);
    *STALL.lock().unwrap_or_else(|poison| poison.into_inner()) =
        Some((topic.clone(), max_poll + Duration::from_millis(1_500)));
    let partition = PartitionKey::new(topic.as_str(), 0);
    assert!(source.pause(&partition), "the partition is paused");
    let deadline = Instant::now() + PATIENCE;
    while STALL
        .lock()
        .unwrap_or_else(|poison| poison.into_inner())
        .is_some()
    {
        assert!(
            Instant::now() < deadline,
            "the polling thread never logged the pause"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    source.resume(&partition);
    kafka
        .produce(&topic, numbered(0, 20))
        .await
        .expect("produce");

    let mut delivered = std::collections::BTreeSet::new();
    let mut revoked = 0;
    let mut fatal = None;
    let deadline = Instant::now() + PATIENCE;
    while delivered.len() < 20 && Instant::now() < deadline {
        let next = tokio::time::timeout(Duration::from_secs(1), source.next(&mut buffer, 16));
        match next.await {
            Ok(Ok(SourceEvent::Delivered)) => {
                for message in buffer.drain(..) {
                    delivered.insert(id_of(&message).expect("a numbered message"));
                }
            }
            Ok(Ok(SourceEvent::Revoked(revocation))) => {
                revoked += 1;
                revocation.complete(RevocationOutcome::default());
            }
            Ok(Ok(_)) | Err(_) => {}
            Ok(Err(SourceError::Fatal(error))) => {
                fatal = Some(support::error_chain(&*error));
                break;
            }
            Ok(Err(error)) => tracing::warn!(%error, "source error"),
        }
    }
    assert!(
        PASSED_MAX_POLL.load(Ordering::Acquire),
        "librdkafka never said the member passed max.poll.interval.ms: the stall did not happen"
    );
    let (version, name) = intake_kafka::rdkafka::util::get_rdkafka_version();
    match fatal {
        // librdkafka issue #5541 (fixed in 2.15.0, 0x020f0000).
        Some(error) if protocol == GroupProtocol::Consumer && version < 0x020f_0000 => {
            eprintln!(
                "{test}: librdkafka {name} failed the member for good after max.poll.interval.ms \
                 (librdkafka issue #5541, fixed in 2.15.0); the source reported it: {error}"
            );
        }
        Some(error) => panic!("{test}: the member failed for good under {protocol}: {error}"),
        None => {
            assert_eq!(
                delivered.len(),
                20,
                "under {protocol} the member did not join again and deliver (revoked {revoked} times)"
            );
            eprintln!(
                "{test}: librdkafka {name} put the member out ({revoked} revocations) and it joined again"
            );
        }
    }
    let _ = source.close().await;
}

/// librdkafka on its own, through its C interface as its own regression
/// test (`tests/0147-consumer_group_consumer_mock.c`,
/// `do_test_max_poll_interval_rejoin_consume`, added with the fix) drives
/// it, against Apache Kafka rather than the mock: a consumer that stops
/// polling for longer than `max.poll.interval.ms`, then polls again.
mod raw {
    use std::ffi::{CStr, CString, c_char, c_int};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use intake_kafka::rdkafka::bindings as rd;

    /// Whether the next "max poll interval exceeded" heartbeat line stalls
    /// librdkafka's main thread (see [`log`]).
    static FORCE_RACE: AtomicBool = AtomicBool::new(false);

    /// librdkafka's log callback, on the thread that logs (no log queue).
    /// On the line its main thread logs right after it sent the leave
    /// heartbeat of a member past `max.poll.interval.ms`, it sleeps 500 ms
    /// there, as librdkafka's own test does: the leave's answer is then read
    /// before the member acts on its rejoin, the race of librdkafka issue
    /// #5541.
    unsafe extern "C" fn log(
        _: *const rd::rd_kafka_t,
        _: c_int,
        _: *const c_char,
        line: *const c_char,
    ) {
        // SAFETY: librdkafka passes a NUL-terminated line it owns for the
        // call.
        let line = unsafe { CStr::from_ptr(line) }.to_string_lossy();
        if line.contains("Expediting next heartbeat")
            && line.contains("max poll interval exceeded")
            && FORCE_RACE.swap(false, Ordering::AcqRel)
        {
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// What became of the member.
    #[derive(Debug)]
    pub(super) enum Outcome {
        /// It joined again: it read every record produced after its stall
        /// and the group took its commit of them.
        JoinedAgain,
        /// librdkafka failed it for good: the fatal error's name and
        /// reason.
        Fatal(String),
        /// Neither within the patience: the records it read, and the last
        /// refusal of its commit (it reads, but not as a member).
        Stranded {
            #[allow(dead_code)]
            received: usize,
            #[allow(dead_code)]
            refusal: String,
        },
    }

    fn set(conf: *mut rd::rd_kafka_conf_t, name: &str, value: &str) {
        let (name, value) = (
            CString::new(name).expect("no NUL"),
            CString::new(value).expect("no NUL"),
        );
        let mut error = [0 as c_char; 256];
        // SAFETY: a live configuration, NUL-terminated strings and a buffer
        // of the size given.
        let result = unsafe {
            rd::rd_kafka_conf_set(
                conf,
                name.as_ptr(),
                value.as_ptr(),
                error.as_mut_ptr(),
                error.len(),
            )
        };
        assert_eq!(
            result,
            rd::rd_kafka_conf_res_t::RD_KAFKA_CONF_OK,
            "{name:?}={value:?}"
        );
    }

    /// The fatal error of `consumer`, if it has one.
    fn fatal(consumer: *mut rd::rd_kafka_t) -> Option<String> {
        let mut reason = [0 as c_char; 512];
        // SAFETY: a live consumer and a buffer of the size given.
        let code = unsafe { rd::rd_kafka_fatal_error(consumer, reason.as_mut_ptr(), reason.len()) };
        (code != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR).then(|| {
            // SAFETY: librdkafka NUL-terminates the reason and returns a
            // static name.
            let (name, reason) = unsafe {
                (
                    CStr::from_ptr(rd::rd_kafka_err2name(code)),
                    CStr::from_ptr(reason.as_ptr()),
                )
            };
            format!("{}: {}", name.to_string_lossy(), reason.to_string_lossy())
        })
    }

    /// Joins `group` (KIP-848's protocol) on `topic` (one partition), polls
    /// until assigned, stops polling for longer than `max.poll.interval.ms`
    /// (3 s), calls `produce` (20 records), and polls again until it read
    /// them and committed them, failed for good, or 20 s passed. With
    /// `force_race`, the log
    /// callback stalls librdkafka's main thread as described at [`log`].
    pub(super) fn stall_past_max_poll(
        brokers: &str,
        topic: &str,
        group: &str,
        force_race: bool,
        produce: impl FnOnce(),
    ) -> Outcome {
        // SAFETY: each handle below is used while live and destroyed once;
        // `rd_kafka_new` takes the configuration when it succeeds.
        unsafe {
            let conf = rd::rd_kafka_conf_new();
            for (name, value) in [
                ("bootstrap.servers", brokers),
                ("group.id", group),
                ("group.protocol", "consumer"),
                ("auto.offset.reset", "earliest"),
                ("enable.auto.commit", "false"),
                ("max.poll.interval.ms", "3000"),
                ("debug", "cgrp"),
            ] {
                set(conf, name, value);
            }
            rd::rd_kafka_conf_set_log_cb(conf, Some(log));
            let mut error = [0 as c_char; 512];
            let consumer = rd::rd_kafka_new(
                rd::rd_kafka_type_t::RD_KAFKA_CONSUMER,
                conf,
                error.as_mut_ptr(),
                error.len(),
            );
            assert!(!consumer.is_null(), "{:?}", CStr::from_ptr(error.as_ptr()));
            rd::rd_kafka_poll_set_consumer(consumer);
            let topics = rd::rd_kafka_topic_partition_list_new(1);
            let name = CString::new(topic).expect("no NUL");
            rd::rd_kafka_topic_partition_list_add(topics, name.as_ptr(), -1);
            let subscribed = rd::rd_kafka_subscribe(consumer, topics);
            rd::rd_kafka_topic_partition_list_destroy(topics);
            assert_eq!(
                subscribed,
                rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
            );

            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                assert!(Instant::now() < deadline, "not assigned in 20 s");
                let message = rd::rd_kafka_consumer_poll(consumer, 200);
                if !message.is_null() {
                    rd::rd_kafka_message_destroy(message);
                }
                let mut assignment = std::ptr::null_mut();
                if rd::rd_kafka_assignment(consumer, &mut assignment)
                    == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
                    && !assignment.is_null()
                {
                    let assigned = (*assignment).cnt > 0;
                    rd::rd_kafka_topic_partition_list_destroy(assignment);
                    if assigned {
                        break;
                    }
                }
            }

            FORCE_RACE.store(force_race, Ordering::Release);
            std::thread::sleep(Duration::from_secs(4));
            produce();

            let mut received = 0;
            let mut refusal = String::from("no commit tried");
            let mut committed_at = Instant::now();
            let deadline = Instant::now() + Duration::from_secs(20);
            let outcome = loop {
                if let Some(fatal) = fatal(consumer) {
                    break Outcome::Fatal(fatal);
                }
                if received == 20 && committed_at.elapsed() >= Duration::from_millis(500) {
                    // What it read, as a member's commit: refused unless it
                    // is in the group again.
                    committed_at = Instant::now();
                    let code = rd::rd_kafka_commit(consumer, std::ptr::null(), 0);
                    if code == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                        break Outcome::JoinedAgain;
                    }
                    refusal = CStr::from_ptr(rd::rd_kafka_err2name(code))
                        .to_string_lossy()
                        .into_owned();
                }
                if Instant::now() >= deadline {
                    break Outcome::Stranded { received, refusal };
                }
                let message = rd::rd_kafka_consumer_poll(consumer, 200);
                if !message.is_null() {
                    if (*message).err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                        received += 1;
                    }
                    rd::rd_kafka_message_destroy(message);
                }
            };
            FORCE_RACE.store(false, Ordering::Release);
            rd::rd_kafka_consumer_close(consumer);
            rd::rd_kafka_destroy(consumer);
            outcome
        }
    }
}

/// The defect as librdkafka's own regression test for it shows it, on
/// Apache Kafka 4.1: a KIP-848 member past `max.poll.interval.ms` whose
/// leave heartbeat is answered before it acts on its rejoin is failed for
/// good with `INVALID_REQUEST` (librdkafka issue #5541, "Fix
/// max.poll.interval.ms rejoin race", PR #5488, released in 2.15.0).
/// With the librdkafka intake builds on (2.12.1, rdkafka-sys 4.10) the
/// member must fail; with 2.15.0 or later it must join again, and this test
/// then says the docs' warning can go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn librdkafka_before_2_15_fails_a_kip_848_member_that_passed_max_poll_interval() {
    init_tracing();
    let test = "librdkafka_before_2_15_fails_a_kip_848_member_that_passed_max_poll_interval";
    let Some(kafka) = KafkaBackend::real(test) else {
        return;
    };
    let kafka = kafka.with_protocol(GroupProtocol::Consumer);
    let (version, name) = intake_kafka::rdkafka::util::get_rdkafka_version();
    // Without the race, then with it.
    for force_race in [false, true] {
        let topic = kafka.create_source(1).await.expect("topic");
        let group = kafka.new_group("g-raw-maxpoll").await;
        let brokers = kafka.brokers().to_owned();
        let runtime = tokio::runtime::Handle::current();
        let outcome = tokio::task::block_in_place(|| {
            raw::stall_past_max_poll(&brokers, &topic, &group, force_race, || {
                runtime
                    .block_on(kafka.produce(&topic, numbered(0, 20)))
                    .expect("produce");
            })
        });
        eprintln!("{test}: librdkafka {name}, race forced: {force_race}: {outcome:?}");
        match outcome {
            raw::Outcome::JoinedAgain if !force_race || version >= 0x020f_0000 => {}
            raw::Outcome::Fatal(error) if force_race && version < 0x020f_0000 => {
                assert!(error.contains("INVALID_REQUEST"), "{error}");
            }
            other => panic!("librdkafka {name}, race forced: {force_race}: {other:?}"),
        }
    }
}
