//! How the source maps JetStream onto intake: partitions from a subject
//! token, broadcast consumers, `max_ack_pending` from the budget, and the
//! settings it refuses.

mod support;

use std::time::Duration;

use intake_core::backend::testkit::TestMessage;
use intake_core::{Consumer, DeliveryOrder, HandlerError, Message};
use intake_nats::async_nats::jetstream;
use intake_nats::{Error, NatsSettings, NatsSource};
use support::{NatsBackend, Running, Seen, wait_until};

fn recording(
    seen: Seen,
) -> impl tower::Service<
    Message,
    Response = (),
    Error = HandlerError,
    Future = impl Future<Output = Result<(), HandlerError>> + Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |message: Message| {
        let seen = seen.clone();
        async move {
            seen.record(&message);
            Ok::<_, HandlerError>(())
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_partition_is_the_numbered_subject_token_and_the_key_the_subject() {
    let Some(backend) = NatsBackend::new("partition token").await else {
        return;
    };
    let stream = support::unique("parts");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    // Subjects in.<stream>.<partition>: the key of a test message is the
    // last token.
    support::produce(
        backend.client(),
        &stream,
        (0..6)
            .map(|n| TestMessage::new(format!("{}", n % 3), format!("m{n}")))
            .collect(),
    )
    .await
    .expect("produce");
    let source = backend
        .source(&stream, "g")
        .partition_token(2)
        .build()
        .await
        .expect("source");
    let acker = source.acker();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let handler = {
        let seen = seen.clone();
        tower::service_fn(move |message: Message| {
            let seen = seen.clone();
            async move {
                if let Ok(mut seen) = seen.lock() {
                    seen.push((
                        String::from_utf8_lossy(message.payload()).into_owned(),
                        message.metadata().partition(),
                        message
                            .key()
                            .map(|key| String::from_utf8_lossy(key).into_owned()),
                    ));
                }
                Ok::<_, HandlerError>(())
            }
        })
    };
    let running = Running::start(Consumer::builder(), source, acker, handler);
    wait_until("six messages", Duration::from_secs(30), || {
        seen.lock().map(|seen| seen.len()).unwrap_or(0) >= 6
    })
    .await;
    running.stop().await;
    let seen = seen.lock().expect("seen").clone();
    for (payload, partition, key) in seen {
        let n: u32 = payload[1..].parse().expect("a number");
        assert_eq!(partition, n % 3, "{payload}");
        assert_eq!(key, Some(format!("in.{stream}.{}", n % 3)), "{payload}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcast_instances_each_receive_every_new_message() {
    let Some(backend) = NatsBackend::new("broadcast").await else {
        return;
    };
    let stream = support::unique("broadcast");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    support::produce(backend.client(), &stream, support::numbered("before", 3))
        .await
        .expect("produce");
    let mut running = Vec::new();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let source = NatsSource::builder(support::nats_url())
            .stream(&stream)
            .broadcast()
            .build()
            .await
            .expect("source");
        let acker = source.acker();
        let instance = Seen::default();
        running.push(Running::start(
            Consumer::builder().ordering(DeliveryOrder::Unordered),
            source,
            acker,
            recording(instance.clone()),
        ));
        seen.push(instance);
    }
    support::produce(backend.client(), &stream, support::numbered("after", 20))
        .await
        .expect("produce");
    for instance in &seen {
        wait_until("every new message", Duration::from_secs(30), || {
            (0..20).all(|n| instance.count(format!("after{n}").as_bytes()) == 1)
        })
        .await;
        assert_eq!(
            instance.count(b"before0"),
            0,
            "only messages stored after it started"
        );
    }
    for run in running {
        run.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumers_max_ack_pending_is_raised_to_twice_the_budget_and_the_park_room() {
    let Some(backend) = NatsBackend::new("max_ack_pending").await else {
        return;
    };
    let stream = support::unique("pending");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    support::produce(backend.client(), &stream, support::numbered("m", 1))
        .await
        .expect("produce");
    let source = backend.source(&stream, "g").build().await.expect("source");
    let acker = source.acker();
    let seen = Seen::default();
    let running = Running::start(
        Consumer::builder().max_in_flight(5_000),
        source,
        acker,
        recording(seen.clone()),
    );
    wait_until("the message", Duration::from_secs(30), || seen.total() == 1).await;
    running.stop().await;
    let info = jetstream::new(backend.client().clone())
        .get_stream(&stream)
        .await
        .expect("stream")
        .consumer_info("g")
        .await
        .expect("consumer");
    // The budget, plus as many acknowledged deliveries whose acks are on
    // their way (the server counts those as pending until the ack lands),
    // plus the room for parked messages (pending until due).
    assert_eq!(
        info.config.max_ack_pending,
        10_000 + intake_nats::NatsSourceBuilder::DEFAULT_PARK_ROOM as i64
    );
}

#[tokio::test]
async fn settings_that_cannot_work_are_refused_before_connecting() {
    let cases = [
        (
            NatsSource::builder("nats://127.0.0.1:9").consumer("g"),
            "stream",
        ),
        (
            NatsSource::builder("nats://127.0.0.1:9").stream("S"),
            "consumer",
        ),
        (
            NatsSource::builder("nats://127.0.0.1:9")
                .stream("a.b")
                .consumer("g"),
            "stream",
        ),
        (
            NatsSource::builder("nats://127.0.0.1:9")
                .stream("S")
                .consumer("g")
                .broadcast(),
            "consumer",
        ),
        (
            NatsSource::builder("nats://127.0.0.1:9")
                .stream("S")
                .consumer("g")
                .max_deliveries(0),
            "max_deliveries",
        ),
    ];
    for (builder, setting) in cases {
        match builder.build().await {
            Err(Error::Config(error)) => assert_eq!(error.setting, setting),
            other => panic!("{setting}: {other:?}"),
        }
    }
    let missing = NatsSource::builder(
        NatsSettings::new("nats://127.0.0.1:9").credentials_file("/nonexistent/user.creds"),
    )
    .stream("S")
    .consumer("g")
    .build()
    .await
    .expect_err("no such file");
    assert!(matches!(missing, Error::Credentials { .. }), "{missing:?}");
    assert!(missing.to_string().contains("/nonexistent/user.creds"));
}
