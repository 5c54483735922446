//! A "broker" that accepts the connection and then never answers, hangs up,
//! or answers something that is not Kafka: the source fails to build with a
//! typed error within its connect timeout, and a dead-letter write fails
//! within its delivery timeout, leaving the original unacknowledged. Never a
//! hang, never a panic. No Kafka is needed: the server is a TCP listener of
//! the test.

use std::time::Duration;

use intake_core::backend::testkit::hostile_server::{HostileServer, Misbehaviour};
use intake_core::{
    DeadLetter, Message, Metadata, Position,
    backend::{DeadLetterSink, SourceError},
};
use intake_kafka::{Error, KafkaDeadLetterSink, KafkaSettings, KafkaSource};

/// Far above the timeouts configured below: reaching it means a hang.
const HANG: Duration = Duration::from_secs(60);

const MISBEHAVIOURS: [Misbehaviour; 4] = [
    Misbehaviour::Silent,
    Misbehaviour::CloseAtOnce,
    Misbehaviour::Garbage(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"),
    // A response header announcing a 2 GiB frame, then nothing.
    Misbehaviour::Garbage(b"\x7f\xff\xff\xff\x00\x00\x00\x01"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_never_answers_properly_is_unreachable_within_the_connect_timeout() {
    for misbehaviour in MISBEHAVIOURS {
        let server = HostileServer::start(misbehaviour)
            .await
            .expect("a local listener");
        let building = KafkaSource::builder(
            KafkaSettings::new(server.addr().to_string()).set("sasl.password", "hunter2"),
        )
        .group("billing")
        .topic("orders")
        .connect_timeout(Duration::from_secs(2))
        .build();
        let error = match tokio::time::timeout(HANG, building).await {
            Err(_) => panic!("building against a {misbehaviour:?} broker hangs"),
            Ok(Ok(_)) => panic!("building against a {misbehaviour:?} broker succeeded"),
            Ok(Err(error)) => error,
        };
        assert!(
            matches!(error, Error::Unreachable { .. } | Error::Config { .. }),
            "{misbehaviour:?}: {error:?}"
        );
        let shown = format!("{} {error:?}", intake_core::error::ErrorChain::new(&error));
        assert!(!shown.contains("hunter2"), "{shown}");
        if matches!(error, Error::Unreachable { .. }) {
            assert!(SourceError::from(error).is_transient());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_write_to_a_silent_broker_fails_within_its_delivery_timeout() {
    let server = HostileServer::start(Misbehaviour::Silent)
        .await
        .expect("a local listener");
    let sink =
        KafkaDeadLetterSink::builder(KafkaSettings::new(server.addr().to_string()), "billing")
            .delivery_timeout(Duration::from_secs(2))
            .build()
            .await
            .expect("a producer needs no broker to be built");
    let letter = DeadLetter::new(
        Message::new(
            "poison",
            Metadata::new("orders".into(), 0, Position::Offset(7)),
        ),
        "permanent error: bad payload",
        3,
    );
    let written = tokio::time::timeout(HANG, sink.write(&letter))
        .await
        .expect("the write ends within its delivery timeout");
    let error = written.expect_err("nothing confirmed the write");
    let chain = intake_core::error::ErrorChain::new(&error).to_string();
    assert!(chain.contains("orders.billing.dlq"), "{chain}");
}
