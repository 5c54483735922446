//! The Redis Streams publisher against a real Redis: its bounded buffer, an
//! entry Redis refuses, and an unreachable server.

mod support;

use std::error::Error as _;
use std::time::Duration;

use intake_core::Position;
use intake_core::backend::testkit::closed_port;
use intake_core::publish::{Output, PublishError, PublishErrorKind, Publisher};
use intake_redis_streams::{RedisSettings, RedisStreamsPublisher};
use redis::AsyncCommands;

use support::{entries, field, redis_or_skip, redis_url, unique};

/// Guards against a hang; the waits under test are far shorter.
const HANG: Duration = Duration::from_secs(30);

/// The error as a reader sees it: its text, its sources' texts and `Debug`.
fn everything_shown(error: &PublishError) -> String {
    let mut shown = format!("{error} {error:?}");
    let mut source = error.source();
    while let Some(cause) = source {
        shown.push_str(&format!(" | {cause}"));
        source = cause.source();
    }
    shown
}

// current_thread: a send that finds room does not yield, so the first
// `BOUND` sends fill the buffer before the writer runs, and the bound is
// reached for sure.
#[tokio::test(flavor = "current_thread")]
async fn a_full_buffer_makes_sends_wait_and_every_output_is_still_confirmed_in_order() {
    const BOUND: usize = 8;
    const COUNT: usize = 500;
    let Some(mut admin) = redis_or_skip("publisher backpressure").await else {
        return;
    };
    let stream = unique("backpressure");
    let publisher = RedisStreamsPublisher::builder(redis_url())
        .max_pending(BOUND)
        .max_pipeline(3)
        .build()
        .await
        .expect("connect the publisher");
    let mut receipts = Vec::new();
    let mut most_pending = 0;
    for n in 0..COUNT {
        let output = Output::new(stream.as_str(), n.to_string());
        receipts.push(publisher.send(output).await.expect("send"));
        most_pending = most_pending.max(publisher.pending());
        assert!(
            publisher.pending() <= BOUND,
            "{} pending after send {n}, bound {BOUND}",
            publisher.pending()
        );
    }
    assert_eq!(
        most_pending, BOUND,
        "the buffer never filled: no backpressure"
    );
    let mut previous = None;
    for (n, receipt) in receipts.into_iter().enumerate() {
        let confirmation = tokio::time::timeout(HANG, receipt)
            .await
            .expect("confirmed in time")
            .unwrap_or_else(|error| panic!("output {n}: {error}"));
        let Some(Position::StreamId { ms, seq }) = confirmation.position else {
            panic!("output {n} confirmed without an entry id: {confirmation:?}");
        };
        assert!(previous < Some((ms, seq)), "entry ids out of send order");
        previous = Some((ms, seq));
    }
    assert_eq!(publisher.pending(), 0);
    let payloads: Vec<_> = entries(&mut admin, &stream)
        .await
        .iter()
        .map(|fields| field(fields, "payload"))
        .collect();
    let sent: Vec<_> = (0..COUNT).map(|n| Some(n.to_string())).collect();
    assert_eq!(payloads, sent, "the stream holds the outputs in send order");
    let _: Result<(), _> = admin.del(&stream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_redis_refuses_is_rejected_alone_and_a_closed_publisher_sends_nothing() {
    let Some(mut admin) = redis_or_skip("publisher rejection").await else {
        return;
    };
    let stream = unique("accepted");
    let not_a_stream = unique("string");
    let _: () = admin
        .set(&not_a_stream, "a string, not a stream")
        .await
        .expect("SET");
    let publisher = RedisStreamsPublisher::builder(redis_url())
        .build()
        .await
        .expect("connect the publisher");
    // Sent together, so the refused one shares its pipeline with the others.
    let mut receipts = Vec::new();
    for (destination, payload) in [
        (&stream, "before"),
        (&not_a_stream, "x"),
        (&stream, "after"),
    ] {
        let output = Output::new(destination.as_str(), payload);
        receipts.push(publisher.send(output).await.expect("send"));
    }
    let mut answers = Vec::new();
    for receipt in receipts {
        answers.push(tokio::time::timeout(HANG, receipt).await.expect("answered"));
    }
    let refused = match &answers[1] {
        Err(error) => error,
        Ok(confirmation) => panic!("an XADD to a string was confirmed: {confirmation:?}"),
    };
    assert_eq!(refused.kind(), PublishErrorKind::Rejected, "{refused:?}");
    assert_eq!(refused.destination(), not_a_stream);
    assert!(
        everything_shown(refused).contains("WRONGTYPE"),
        "{}",
        everything_shown(refused)
    );
    assert!(answers[0].is_ok() && answers[2].is_ok(), "{answers:?}");
    let payloads: Vec<_> = entries(&mut admin, &stream)
        .await
        .iter()
        .map(|fields| field(fields, "payload"))
        .collect();
    assert_eq!(
        payloads,
        vec![Some("before".to_owned()), Some("after".to_owned())]
    );
    let _: Result<(), _> = admin.del(&[&stream, &not_a_stream]).await;

    publisher.close().await;
    let after = publisher.send(Output::new(stream.as_str(), "late")).await;
    assert_eq!(
        after.err().map(|error| error.kind()),
        Some(PublishErrorKind::Closed)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_that_wait_past_the_queue_timeout_fail_unsent() {
    let Some(mut admin) = redis_or_skip("publisher queue timeout").await else {
        return;
    };
    let stream = unique("stalled");
    let publisher = RedisStreamsPublisher::builder(redis_url())
        .max_pipeline(1)
        .queue_timeout(Duration::from_millis(100))
        .build()
        .await
        .expect("connect the publisher");
    // Redis holds every write for half a second: the first output's XADD
    // waits in the server, the others in the queue behind it.
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(500)
        .arg("WRITE")
        .query_async(&mut admin)
        .await
        .expect("CLIENT PAUSE");
    let mut receipts = Vec::new();
    for n in 0..3 {
        let output = Output::new(stream.as_str(), n.to_string());
        receipts.push(publisher.send(output).await.expect("send"));
    }
    let mut answers = Vec::new();
    for receipt in receipts {
        answers.push(tokio::time::timeout(HANG, receipt).await.expect("answered"));
    }
    assert!(answers[0].is_ok(), "{:?}", answers[0]);
    for answer in &answers[1..] {
        let error = answer
            .as_ref()
            .expect_err("sent after waiting past the timeout");
        assert_eq!(error.kind(), PublishErrorKind::Unavailable, "{error:?}");
        assert!(error.to_string().contains("not sent"), "{error}");
    }
    let payloads: Vec<_> = entries(&mut admin, &stream)
        .await
        .iter()
        .map(|fields| field(fields, "payload"))
        .collect();
    assert_eq!(
        payloads,
        vec![Some("0".to_owned())],
        "only the first was added"
    );
    let _: Result<(), _> = admin.del(&stream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_unavailable_in_time_without_the_password_and_then_recovers() {
    let Some(mut admin) = redis_or_skip("publisher outage").await else {
        return;
    };
    // Nothing listens: the build fails, typed, without the password.
    let port = closed_port().expect("a free local port");
    let built = tokio::time::timeout(
        HANG,
        RedisStreamsPublisher::builder(
            RedisSettings::new(format!("redis://intake:s3cr3t-pw@127.0.0.1:{port}"))
                .connect_timeout(Duration::from_secs(1)),
        )
        .build(),
    )
    .await
    .expect("the build gave up in time");
    let error = built.expect_err("connected to a closed port");
    let shown = format!("{error} {error:?}");
    assert!(
        error.endpoint().is_some() && !shown.contains("s3cr3t-pw"),
        "{shown}"
    );

    // The server goes away under a connected publisher: its outputs are
    // unavailable within the reply timeout, and nothing shows the password.
    let (user, password, url) = support::temporary_user(&mut admin).await;
    let upstream = url.rsplit('@').next().unwrap_or_default().to_owned();
    let (address, forwarding) = proxy_one_connection(&upstream, "127.0.0.1:0").await;
    let publisher = RedisStreamsPublisher::builder(
        RedisSettings::new(url.replace(&upstream, &address.to_string()))
            .connect_timeout(Duration::from_secs(1))
            .command_timeout(Duration::from_secs(1)),
    )
    .queue_timeout(Duration::from_secs(3))
    .build()
    .await
    .expect("connect through the proxy");
    let stream = unique("outage");
    publisher
        .publish(Output::new(stream.as_str(), "before"))
        .await
        .expect("published before the outage");
    // Awaited: the connection is closed and the port refuses new ones.
    forwarding.abort();
    let _ = forwarding.await;
    let answer = tokio::time::timeout(
        HANG,
        publisher.publish(Output::new(stream.as_str(), "during")),
    )
    .await
    .expect("answered in time");
    let error = answer.expect_err("published with the server gone");
    assert_eq!(error.kind(), PublishErrorKind::Unavailable, "{error:?}");
    assert_eq!(error.destination(), stream);
    let shown = everything_shown(&error);
    assert!(!shown.contains(&password), "{shown}");

    // The server is back on the same address: the connection reconnects by
    // itself and publishing goes on.
    let (_, forwarding) = proxy_one_connection(&upstream, &address.to_string()).await;
    let mut attempts = 0;
    let confirmed = loop {
        attempts += 1;
        match publisher
            .publish(Output::new(stream.as_str(), "after"))
            .await
        {
            Ok(confirmation) => break confirmation,
            Err(error) if attempts < 20 => {
                assert_eq!(error.kind(), PublishErrorKind::Unavailable, "{error:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("still not published after the server came back: {error}"),
        }
    };
    assert!(confirmed.position.is_some(), "{confirmed:?}");
    forwarding.abort();
    let payloads: Vec<_> = entries(&mut admin, &stream)
        .await
        .iter()
        .map(|fields| field(fields, "payload"))
        .collect();
    assert_eq!(payloads.first(), Some(&Some("before".to_owned())));
    assert_eq!(payloads.last(), Some(&Some("after".to_owned())));
    support::drop_user(&mut admin, &user).await;
    let _: Result<(), _> = admin.del(&stream).await;
}

/// A proxy on `address` to `upstream` for one connection: the port refuses
/// any other, and aborting the task (then awaiting it) closes that one for
/// sure.
async fn proxy_one_connection(
    upstream: &str,
    address: &str,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let upstream = upstream.to_owned();
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .expect("bind the proxy");
    let address = listener.local_addr().expect("the proxy's address");
    let forwarding = tokio::spawn(async move {
        let Ok((mut client, _)) = listener.accept().await else {
            return;
        };
        drop(listener);
        if let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await {
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        }
    });
    (address, forwarding)
}
