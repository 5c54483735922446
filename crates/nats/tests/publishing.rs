//! `NatsPublisher` on nats-server: what an output becomes on the wire, the
//! bound on unconfirmed outputs, outputs the server refuses, and a server
//! that is gone. The publisher conformance scenarios run in
//! `tests/conformance.rs`.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use intake_core::publish::{Output, PublishError, PublishErrorKind, Publisher};
use intake_core::{Consumer, HandlerError, Message, Position};
use intake_nats::{Error, NatsPublisher, NatsSettings};
use support::{Running, create_stream, nats_or_skip, nats_url, unique, wait_until};

/// Long enough for anything on the local server.
const PATIENCE: Duration = Duration::from_secs(30);

fn chain(error: &dyn std::error::Error) -> String {
    let mut text = format!("{error} / {error:?}");
    let mut cause = error.source();
    while let Some(error) = cause {
        text.push_str(&format!(" / {error} / {error:?}"));
        cause = error.source();
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_come_back_keyed_by_their_subject_with_their_headers() {
    let Some(client) = nats_or_skip("outputs_come_back_keyed_by_their_subject").await else {
        return;
    };
    let stream = unique("published");
    create_stream(&client, &stream)
        .await
        .expect("create the stream");
    let destination = format!("in.{stream}.out");
    let publisher = NatsPublisher::builder(nats_url())
        .build()
        .await
        .expect("connect");
    let outputs = [
        Output::new(destination.as_str(), "keyed")
            .with_key("customer 7.eu*>")
            .with_header("scenario", "one")
            .with_header("scenario", "two"),
        Output::new(destination.as_str(), "keyless").with_header("Nats-Msg-Id", "keyless-1"),
    ];
    for output in outputs {
        let confirmation = publisher.publish(output).await.expect("confirmed");
        assert!(matches!(confirmation.position, Some(Position::Offset(_))));
        assert_eq!(confirmation.partition, None);
    }

    let seen = Arc::new(Mutex::new(Vec::<Message>::new()));
    let handler = {
        let seen = Arc::clone(&seen);
        tower::service_fn(move |message: Message| {
            let seen = Arc::clone(&seen);
            async move {
                if let Ok(mut seen) = seen.lock() {
                    seen.push(message);
                }
                Ok::<(), HandlerError>(())
            }
        })
    };
    let backend = support::NatsBackend::new("outputs_come_back_keyed")
        .await
        .expect("the shared server");
    let source = backend
        .source(&stream, "reader")
        .build()
        .await
        .expect("source");
    let acker = source.acker();
    let running = Running::start(Consumer::builder(), source, acker, handler);
    wait_until("both outputs consumed", PATIENCE, || {
        seen.lock().map(|seen| seen.len() >= 2).unwrap_or(false)
    })
    .await;
    running.stop().await;
    let seen = seen.lock().map(|seen| seen.clone()).unwrap_or_default();
    let keyed = &seen[0];
    assert_eq!(keyed.payload().as_ref(), b"keyed");
    assert_eq!(
        keyed.key().map(|key| key.as_ref()),
        Some(format!("{destination}.customer_7_eu__").as_bytes()),
        "the key is the subject's last token, its `.`, `*`, `>` and spaces replaced"
    );
    let values: Vec<&[u8]> = keyed
        .headers()
        .iter()
        .filter(|header| &*header.name == "scenario")
        .map(|header| header.value.as_ref())
        .collect();
    assert_eq!(values, [b"one".as_slice(), b"two".as_slice()]);
    let keyless = &seen[1];
    assert_eq!(
        keyless.key().map(|key| key.as_ref()),
        Some(destination.as_bytes()),
        "no key: the destination itself"
    );
    assert_eq!(keyless.headers().get_str("Nats-Msg-Id"), Some("keyless-1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_bound_still_confirms_every_output_in_order() {
    const BOUND: usize = 4;
    const COUNT: usize = 200;
    let Some(client) = nats_or_skip("a_tiny_bound_still_confirms_every_output").await else {
        return;
    };
    let stream = unique("bounded");
    create_stream(&client, &stream)
        .await
        .expect("create the stream");
    let destination: Arc<str> = format!("in.{stream}.out").into();
    let publisher = NatsPublisher::builder(nats_url())
        .max_unconfirmed(BOUND)
        .build()
        .await
        .expect("connect");
    // Every receipt held, none polled before the last send: the places are
    // freed by the acks themselves, as a handler returning more outputs
    // than the bound needs.
    let mut receipts = Vec::with_capacity(COUNT);
    let mut most = 0;
    for n in 0..COUNT {
        let output = Output::new(Arc::clone(&destination), n.to_string()).with_key("one-key");
        receipts.push(
            publisher
                .send(output)
                .await
                .expect("room within the send timeout"),
        );
        let unconfirmed = publisher.unconfirmed();
        assert!(
            unconfirmed <= BOUND,
            "{unconfirmed} unconfirmed after send {n}, over the bound of {BOUND}"
        );
        most = most.max(unconfirmed);
    }
    assert!(
        most >= 1,
        "a sent output counts as unconfirmed until its ack"
    );
    let mut positions = Vec::with_capacity(COUNT);
    for receipt in receipts {
        let confirmation = tokio::time::timeout(PATIENCE, receipt)
            .await
            .expect("confirmed in time")
            .expect("confirmed");
        match confirmation.position {
            Some(Position::Offset(offset)) => positions.push(offset),
            other => panic!("a confirmation without a stream sequence: {other:?}"),
        }
    }
    let contiguous: Vec<i64> = (positions[0]..positions[0] + COUNT as i64).collect();
    assert_eq!(positions, contiguous, "stored in the order sent, none lost");
    assert_eq!(publisher.unconfirmed(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_the_server_refuses_are_rejected() {
    let Some(client) = nats_or_skip("outputs_the_server_refuses_are_rejected").await else {
        return;
    };
    let publisher = NatsPublisher::builder(nats_url())
        .build()
        .await
        .expect("connect");

    // No stream stores the subject: JetStream has no responder for it.
    let nowhere = unique("nowhere");
    let receipt = publisher
        .send(Output::new(nowhere.as_str(), "lost"))
        .await
        .expect("sent");
    let error = tokio::time::timeout(PATIENCE, receipt)
        .await
        .expect("answered in time")
        .expect_err("no stream stores it");
    assert_eq!(error.kind(), PublishErrorKind::Rejected, "{error}");
    assert_eq!(error.destination(), nowhere);
    assert!(
        std::error::Error::source(&error).is_some(),
        "the client's error is the source"
    );

    // Over the server's max_payload.
    let stream = unique("refusing");
    create_stream(&client, &stream)
        .await
        .expect("create the stream");
    let max_payload = client.server_info().max_payload;
    let too_large = vec![b'x'; max_payload + 1];
    let error = publisher
        .send(Output::new(format!("in.{stream}.out"), too_large))
        .await
        .expect_err("over max_payload");
    assert_eq!(error.kind(), PublishErrorKind::Rejected, "{error}");

    // A header value no NATS header can carry (and the source could not
    // read back).
    let error = publisher
        .send(Output::new(format!("in.{stream}.out"), "x").with_header("bad", vec![0xff, 0xfe]))
        .await
        .expect_err("a header value that is not UTF-8");
    assert_eq!(error.kind(), PublishErrorKind::Rejected, "{error}");
    assert!(error.to_string().contains("\"bad\""), "{error}");
    assert_eq!(publisher.unconfirmed(), 0, "refused outputs hold no place");

    publisher.close().await;
    let error = publisher
        .send(Output::new(format!("in.{stream}.out"), "late"))
        .await
        .expect_err("closed");
    assert_eq!(error.kind(), PublishErrorKind::Closed, "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_fails_the_build_transiently_without_the_password() {
    support::init_tracing();
    let port = intake_core::backend::testkit::closed_port().expect("a free port");
    let built = tokio::time::timeout(
        PATIENCE,
        NatsPublisher::builder(
            NatsSettings::new(format!("nats://app:s3cret-pw@127.0.0.1:{port}"))
                .connect_timeout(Duration::from_secs(2)),
        )
        .build(),
    )
    .await
    .expect("the build ends within its connect timeout");
    let error = built.expect_err("nothing listens");
    assert!(matches!(error, Error::Unreachable { .. }), "{error:?}");
    assert!(error.is_transient());
    let text = chain(&error);
    assert!(!text.contains("s3cret-pw"), "{text}");
}

/// A TCP relay to the shared server that the test can take away: its
/// listener closed (the port refuses connections from then on) and every
/// relayed connection cut, as a server that went away.
struct Relay {
    port: u16,
    tasks: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Relay {
    async fn start() -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let tasks = Arc::new(Mutex::new(Vec::new()));
        let accepting = {
            let tasks = Arc::clone(&tasks);
            tokio::spawn(async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    let relayed = tokio::spawn(async move {
                        if let Ok(mut outbound) =
                            tokio::net::TcpStream::connect("127.0.0.1:4222").await
                        {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                    if let Ok(mut tasks) = tasks.lock() {
                        tasks.push(relayed.abort_handle());
                    }
                }
            })
        };
        if let Ok(mut held) = tasks.lock() {
            held.push(accepting.abort_handle());
        }
        Ok(Self { port, tasks })
    }

    fn cut(&self) {
        if let Ok(tasks) = self.tasks.lock() {
            tasks.iter().for_each(tokio::task::AbortHandle::abort);
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
    }
}

fn assert_unavailable_without(error: &PublishError, secret: &str) {
    assert_eq!(error.kind(), PublishErrorKind::Unavailable, "{error}");
    let text = chain(error);
    assert!(!text.contains(secret), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_server_makes_outputs_unavailable_within_the_bounded_waits() {
    const SECRET: &str = "s3cret-pw";
    let Some(client) = nats_or_skip("a_lost_server_makes_outputs_unavailable").await else {
        return;
    };
    if support::nats_url() != "nats://127.0.0.1:4222" {
        return; // the relay leads to the default server only
    }
    let stream = unique("lost");
    create_stream(&client, &stream)
        .await
        .expect("create the stream");
    let destination = format!("in.{stream}.out");
    let relay = Relay::start().await.expect("a relay port");
    // The shared server has no authorization and ignores the credentials;
    // they are here to show they appear nowhere.
    let settings = NatsSettings::new(format!("nats://app:{SECRET}@127.0.0.1:{}", relay.port))
        .connect_timeout(Duration::from_secs(1));
    let publisher = NatsPublisher::builder(settings)
        .max_unconfirmed(1)
        .send_timeout(Duration::from_millis(500))
        .ack_timeout(Duration::from_secs(1))
        .build()
        .await
        .expect("connect through the relay");
    publisher
        .publish(Output::new(destination.as_str(), "before"))
        .await
        .expect("confirmed while the server is there");

    relay.cut();
    let receipt = tokio::time::timeout(
        PATIENCE,
        publisher.send(Output::new(destination.as_str(), "during")),
    )
    .await
    .expect("the send does not hang")
    .expect("handed to the client");
    // The one place is taken until the first ack times out: no room.
    let no_room = tokio::time::timeout(
        PATIENCE,
        publisher.send(Output::new(destination.as_str(), "no room")),
    )
    .await
    .expect("the send waits at most its timeout")
    .expect_err("no room while the first is unconfirmed");
    assert_unavailable_without(&no_room, SECRET);
    let unconfirmed = tokio::time::timeout(PATIENCE, receipt)
        .await
        .expect("the receipt waits at most the ack timeout")
        .expect_err("no ack from a server that is gone");
    assert_unavailable_without(&unconfirmed, SECRET);
    let shown = format!("{publisher:?}");
    assert!(!shown.contains(SECRET), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_published_again_with_its_id_is_stored_once() {
    let Some(client) = nats_or_skip("an_output_published_again_with_its_id").await else {
        return;
    };
    let stream = unique("deduplicated");
    create_stream(&client, &stream)
        .await
        .expect("create the stream");
    let publisher = NatsPublisher::builder(nats_url())
        .message_id_header("order-id")
        .build()
        .await
        .expect("connect");
    let output = Output::new(format!("in.{stream}.out"), "paid").with_header("order-id", "o-17");
    let first = publisher.publish(output.clone()).await.expect("confirmed");
    let again = publisher.publish(output).await.expect("confirmed again");
    assert_eq!(again.position, first.position, "the stream kept the first");
    let other = Output::new(format!("in.{stream}.out"), "paid").with_header("order-id", "o-18");
    let second = publisher.publish(other).await.expect("confirmed");
    assert_ne!(
        second.position, first.position,
        "another id is another output"
    );
    let mut handle = intake_nats::async_nats::jetstream::new(client)
        .get_stream(&stream)
        .await
        .expect("the stream");
    let stored = handle.info().await.expect("stream info").state.messages;
    assert_eq!(stored, 2);
}
