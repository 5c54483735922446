//! A server that accepts the connection and then never answers, hangs up,
//! or answers something that is not Redis: connecting fails with a typed
//! error within a bounded time, never hangs and never panics. No Redis is
//! needed: the server is a TCP listener of the test.

use std::time::Duration;

use intake_core::backend::testkit::hostile_server::{HostileServer, Misbehaviour};
use intake_redis_streams::{Error, RedisSettings, RedisStreamsSource};

/// Far above the timeouts configured below: reaching it means a hang.
const HANG: Duration = Duration::from_secs(60);

async fn connect_to(misbehaviour: Misbehaviour) -> Error {
    let server = HostileServer::start(misbehaviour)
        .await
        .expect("a local listener");
    let connecting = RedisStreamsSource::builder(
        RedisSettings::new(format!("redis://:hunter2@{}", server.addr()))
            .connect_timeout(Duration::from_millis(300))
            .command_timeout(Duration::from_millis(300)),
    )
    .stream("orders")
    .group("billing")
    .block(Duration::from_millis(50))
    .build();
    match tokio::time::timeout(HANG, connecting).await {
        Err(_) => panic!("connecting to a {misbehaviour:?} server hangs"),
        Ok(Ok(_)) => panic!("connecting to a {misbehaviour:?} server succeeded"),
        Ok(Err(error)) => {
            assert!(!error.to_string().contains("hunter2"), "{error}");
            error
        }
    }
}

#[tokio::test]
async fn a_server_that_never_answers_is_unreachable_not_a_hang() {
    let error = connect_to(Misbehaviour::Silent).await;
    assert!(matches!(error, Error::Unreachable { .. }), "{error:?}");
}

#[tokio::test]
async fn a_server_that_hangs_up_at_once_is_unreachable() {
    let error = connect_to(Misbehaviour::CloseAtOnce).await;
    assert!(matches!(error, Error::Unreachable { .. }), "{error:?}");
}

#[tokio::test]
async fn a_server_that_is_not_redis_fails_with_a_typed_error() {
    for garbage in [
        &b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"[..],
        b"\x00\x01\x02\xff\xfe\r\n",
        b"*2\r\n$-7\r\n",
        b"$99999999999999999999\r\n",
    ] {
        let error = connect_to(Misbehaviour::Garbage(garbage)).await;
        assert!(
            matches!(
                error,
                Error::Unreachable { .. } | Error::UnexpectedReply { .. } | Error::Command { .. }
            ),
            "{}: {error:?}",
            garbage.escape_ascii()
        );
    }
}
