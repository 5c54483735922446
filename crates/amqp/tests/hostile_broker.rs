//! A "broker" that accepts the connection and then never answers, hangs up,
//! or answers something that is not AMQP: connecting fails with a typed
//! error within the connect timeout, never hangs and never panics, and the
//! error never shows the password. No RabbitMQ is needed: the server is a
//! TCP listener of the test.

use std::time::Duration;

use intake_amqp::{AmqpDeadLetterSink, AmqpSource, Error};
use intake_core::backend::testkit::hostile_server::{HostileServer, Misbehaviour};

/// Far above the timeouts in play: reaching it means a hang.
const HANG: Duration = Duration::from_secs(60);

const MISBEHAVIOURS: [Misbehaviour; 4] = [
    Misbehaviour::Silent,
    Misbehaviour::CloseAtOnce,
    Misbehaviour::Garbage(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"),
    // A method frame announcing a 2 GiB payload, then nothing.
    Misbehaviour::Garbage(b"\x01\x00\x00\x7f\xff\xff\xff\x00\x0a"),
];

#[tokio::test]
async fn a_broker_that_never_answers_properly_fails_the_connect_with_a_typed_error() {
    for misbehaviour in MISBEHAVIOURS {
        let server = HostileServer::start(misbehaviour)
            .await
            .expect("a local listener");
        let connecting = AmqpSource::builder(
            intake_amqp::AmqpSettings::new(format!("amqp://app:hunter2@{}/%2f", server.addr()))
                .connect_timeout(Duration::from_millis(500)),
        )
        .queue("orders")
        .build();
        let error = match tokio::time::timeout(HANG, connecting).await {
            Err(_) => panic!("connecting to a {misbehaviour:?} broker hangs"),
            Ok(Ok(_)) => panic!("connecting to a {misbehaviour:?} broker succeeded"),
            Ok(Err(error)) => error,
        };
        assert!(
            matches!(error, Error::Unreachable { .. } | Error::Broker { .. }),
            "{misbehaviour:?}: {error:?}"
        );
        assert!(!error.to_string().contains("hunter2"), "{error}");
        assert!(!format!("{error:?}").contains("hunter2"), "{error:?}");
    }
}

#[tokio::test]
async fn a_dead_letter_sink_facing_a_silent_broker_fails_within_the_connect_timeout() {
    let server = HostileServer::start(Misbehaviour::Silent)
        .await
        .expect("a local listener");
    let connecting =
        AmqpDeadLetterSink::builder(format!("amqp://app:hunter2@{}/%2f", server.addr()))
            .exchange("orders.dlx")
            .build();
    let error = tokio::time::timeout(HANG, connecting)
        .await
        .expect("the connect ends within its timeout")
        .expect_err("nothing answered");
    assert!(matches!(error, Error::Unreachable { .. }), "{error:?}");
    assert!(!error.to_string().contains("hunter2"), "{error}");
}
