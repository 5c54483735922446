//! Records a producer can store that a consumer must survive: an empty
//! payload, headers of megabytes, header bytes that are not UTF-8.

mod support;

use std::io::{Read, Write};
use std::time::Duration;

use intake_core::backend::testkit::TestMessage;
use intake_core::{Consumer, DeadLetterLayer, DeliveryOrder, HandlerError, Headers, Message};
use support::{NatsBackend, Running, Seen, wait_until};

/// Handles every message; a payload that is not `ok…` fails permanently.
fn picky(
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
            match message.payload().starts_with(b"ok") {
                true => Ok(()),
                false => Err(HandlerError::permanent("not an ok payload")),
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_payload_is_delivered_empty_and_dead_lettered_not_dropped() {
    let Some(backend) = NatsBackend::new("empty payload").await else {
        return;
    };
    let stream = support::unique("empty");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    support::produce(
        backend.client(),
        &stream,
        vec![TestMessage::new("k", ""), TestMessage::new("k", "ok1")],
    )
    .await
    .expect("produce");
    let source = backend.source(&stream, "g").build().await.expect("source");
    let sink = source.dead_letter_sink().build().await.expect("sink");
    let acker = source.acker();
    let seen = Seen::default();
    let running = Running::start(
        Consumer::builder().ordering(DeliveryOrder::Unordered),
        source,
        acker,
        tower::ServiceBuilder::new()
            .layer(DeadLetterLayer::new(sink))
            .service(picky(seen.clone())),
    );
    wait_until("both settled", Duration::from_secs(30), || {
        seen.total() >= 2 && support::block_on_unacknowledged(backend.client(), &stream, "g") == 0
    })
    .await;
    running.stop().await;
    assert_eq!(seen.count(b""), 1, "the empty payload reached the handler");
    let letters = intake_core::backend::testkit::Backend::dead_letters(&backend, &stream, "g")
        .await
        .expect("read back");
    assert_eq!(letters.len(), 1);
    assert!(letters[0].message.payload().is_empty());
    assert!(
        letters[0].reference.is_none(),
        "the letter itself, not a reference"
    );
}

/// Consumes `messages` under a dead-letter layer whose handler fails
/// every payload that is not `ok…`; returns what the handler saw (the
/// value sizes of header `X-Huge`) and the letters read back.
async fn dead_letter_all_but_ok(
    backend: &NatsBackend,
    messages: Vec<TestMessage>,
) -> (Vec<usize>, Vec<intake_core::DeadLetter>) {
    let stream = support::unique("big");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    let count = messages.len();
    support::produce(backend.client(), &stream, messages)
        .await
        .expect("produce");
    let source = backend.source(&stream, "g").build().await.expect("source");
    let sink = source.dead_letter_sink().build().await.expect("sink");
    let acker = source.acker();
    let seen = Seen::default();
    let sizes = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let handler = {
        let sizes = sizes.clone();
        tower::ServiceBuilder::new()
            .layer(DeadLetterLayer::new(sink))
            .map_request(move |message: Message| {
                if let Ok(mut sizes) = sizes.lock() {
                    sizes.push(
                        message
                            .headers()
                            .get("X-Huge")
                            .map_or(0, |value| value.len()),
                    );
                }
                message
            })
            .service(picky(seen.clone()))
    };
    let running = Running::start(
        Consumer::builder().ordering(DeliveryOrder::Unordered),
        source,
        acker,
        handler,
    );
    wait_until("every message settled", Duration::from_secs(30), || {
        seen.total() >= count
            && support::block_on_unacknowledged(backend.client(), &stream, "g") == 0
    })
    .await;
    running.stop().await;
    let letters = intake_core::backend::testkit::Backend::dead_letters(backend, &stream, "g")
        .await
        .expect("read back");
    let sizes = sizes.lock().expect("sizes").clone();
    (sizes, letters)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_at_jetstreams_limit_are_delivered_whole_and_their_letter_is_written_reduced() {
    let Some(backend) = NatsBackend::new("huge headers").await else {
        return;
    };
    // JetStream stores at most 64 KiB of headers with a message; this one
    // fits, its letter (the same headers and the envelope) would not.
    let huge = "h".repeat(intake_nats::MAX_DEAD_LETTER_HEADER_BYTES - 200);
    let mut poison = TestMessage::new("k", "poison");
    poison.headers = [("X-Huge", huge.clone())].into_iter().collect::<Headers>();
    let (sizes, letters) =
        dead_letter_all_but_ok(&backend, vec![poison, TestMessage::new("k", "ok1")]).await;
    assert!(
        sizes.contains(&huge.len()),
        "the header reached the handler whole"
    );
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!(&letter.message.payload()[..], b"poison");
    assert_eq!(
        letter.headers_omitted, 1,
        "written without the original header"
    );
    assert!(letter.message.headers().get("X-Huge").is_none());
    assert!(letter.reference.is_none());
    assert!(
        letter
            .error
            .contains("they stay with the original in stream"),
        "the letter says where the headers it leaves out are: {}",
        letter.error
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_letter_over_the_servers_max_payload_becomes_a_reference() {
    let Some(backend) = NatsBackend::new("max payload").await else {
        return;
    };
    let max_payload = backend.client().server_info().max_payload;
    // The original fits by a few hundred bytes; its letter, which adds the
    // envelope, does not.
    let payload = "p".repeat(max_payload - 300);
    let (_, letters) = dead_letter_all_but_ok(
        &backend,
        vec![
            TestMessage::new("k", payload.clone()),
            TestMessage::new("k", "ok1"),
        ],
    )
    .await;
    assert_eq!(letters.len(), 1);
    let reference = letters[0].reference.expect("a reference letter");
    assert_eq!(reference.payload_bytes, payload.len());
    assert!(letters[0].message.payload().is_empty());
}

/// Publishes `payload` to `subject` with a header block whose value is not
/// UTF-8, over a raw connection (async-nats cannot write such a header).
fn publish_raw_non_utf8_header(url: &str, subject: &str, payload: &[u8]) {
    let address = url.trim_start_matches("nats://");
    let mut socket = std::net::TcpStream::connect(address).expect("connect");
    socket
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut info = [0u8; 4096];
    let _ = socket.read(&mut info).expect("INFO");
    let header = b"NATS/1.0\r\nX-Bin: \xff\xfe\r\n\r\n";
    let mut frame = format!(
        "CONNECT {{\"verbose\":false,\"headers\":true}}\r\nHPUB {subject} {} {}\r\n",
        header.len(),
        header.len() + payload.len()
    )
    .into_bytes();
    frame.extend_from_slice(header);
    frame.extend_from_slice(payload);
    frame.extend_from_slice(b"\r\nPING\r\n");
    socket.write_all(&frame).expect("publish");
    let mut pong = [0u8; 64];
    let read = socket.read(&mut pong).expect("PONG");
    assert!(
        pong[..read].windows(4).any(|window| window == b"PONG"),
        "{:?}",
        &pong[..read]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_that_is_not_utf8_costs_its_delivery_a_reconnect_and_the_rest_flows() {
    let Some(backend) = NatsBackend::new("non-UTF-8 header").await else {
        return;
    };
    let stream = support::unique("nonutf8");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    support::produce(
        backend.client(),
        &stream,
        vec![TestMessage::new("k", "ok0")],
    )
    .await
    .expect("produce");
    publish_raw_non_utf8_header(
        &support::nats_url(),
        &support::subject_of(&stream, Some(b"k")),
        b"bad",
    );
    support::produce(
        backend.client(),
        &stream,
        (1..20)
            .map(|n| TestMessage::new("k", format!("ok{n}")))
            .collect(),
    )
    .await
    .expect("produce");
    let source = backend
        .source(&stream, "g")
        .ack_wait(Duration::from_secs(1))
        .build()
        .await
        .expect("source");
    let acker = source.acker();
    let seen = Seen::default();
    let running = Running::start(
        Consumer::builder().ordering(DeliveryOrder::Unordered),
        source,
        acker,
        picky(seen.clone()),
    );
    wait_until("the 20 valid messages", Duration::from_secs(60), || {
        (0..20).all(|n| seen.count(format!("ok{n}").as_bytes()) >= 1)
    })
    .await;
    running.stop().await;
    assert_eq!(
        seen.count(b"bad"),
        0,
        "async-nats never hands the message on"
    );
    assert!(
        support::block_on_unacknowledged(backend.client(), &stream, "g") >= 1,
        "and it stays unacknowledged: nothing is dropped silently"
    );
}
