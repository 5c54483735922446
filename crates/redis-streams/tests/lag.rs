//! Broker-side lag from `XINFO GROUPS`: what the probe reports equals what
//! the server holds for the group.

mod support;

use std::time::Duration;

use intake_core::backend::Source;
use intake_core::backend::testkit::assert_unreachable_lag_probe;
use intake_core::lag::{LagError, LagProbe};
use intake_redis_streams::RedisLagProbe;
use support::*;

#[tokio::test]
async fn the_lag_is_what_the_group_has_not_acknowledged() {
    let Some(mut connection) =
        redis_or_skip("the_lag_is_what_the_group_has_not_acknowledged").await
    else {
        return;
    };
    let stream = unique("lag");
    let group = unique("group");
    let mut source = group_builder(&stream, &group, "c1").build().await.unwrap();
    let mut acker = source.acker();
    produce(&mut connection, &stream, "m", 10).await;
    let probe = source.lag_probe().expect("a group source has a probe");

    let before = probe.lag().await.unwrap();
    assert_eq!(before.len(), 1);
    assert_eq!(before[0].partition.source.as_ref(), stream);
    assert_eq!(before[0].messages, Some(10));
    assert!(before[0].oldest_age.is_some());

    // Read four (one stays pending) and acknowledge three.
    let received = receive(&mut source, 4, 4, Duration::from_secs(5)).await;
    assert_eq!(received.len(), 4);
    ack(&mut acker, &received[..3]).await;

    let after = probe.lag().await.unwrap();
    assert_eq!(after[0].messages, Some(7));
    let server = unacknowledged(&mut connection, &stream, &group)
        .await
        .unwrap();
    assert_eq!(after[0].messages, Some(server));

    // A probe made from the URL alone agrees.
    let standalone = RedisLagProbe::new(redis_url(), &group, [stream.as_str()]).unwrap();
    let standalone = standalone.lag().await.unwrap();
    assert_eq!(standalone[0].partition, after[0].partition);
    assert_eq!(standalone[0].messages, after[0].messages);

    ack(&mut acker, &received[3..]).await;
    let rest = receive(&mut source, 6, 6, Duration::from_secs(5)).await;
    ack(&mut acker, &rest).await;
    let drained = probe.lag().await.unwrap();
    assert_eq!(drained[0].messages, Some(0));
    assert_eq!(drained[0].oldest_age, Some(Duration::ZERO));
    source.close().await.unwrap();
}

#[tokio::test]
async fn an_unknown_group_is_refused() {
    let Some(mut connection) = redis_or_skip("an_unknown_group_is_refused").await else {
        return;
    };
    let stream = unique("lag");
    produce(&mut connection, &stream, "m", 1).await;
    let probe = RedisLagProbe::new(redis_url(), "nobody", [stream.as_str()]).unwrap();
    let error = probe.lag().await.unwrap_err();
    assert!(matches!(error, LagError::Refused(_)), "{error:?}");
    assert!(!error.is_transient());
}

#[tokio::test]
async fn an_unreachable_server_is_a_transient_error_within_the_timeout() {
    let port = intake_core::backend::testkit::closed_port().expect("a free local port");
    let url = format!("redis://:secret@127.0.0.1:{port}");
    let probe = RedisLagProbe::new(&url, "group", ["stream"])
        .unwrap()
        .timeout(Duration::from_secs(2));
    assert_unreachable_lag_probe(&probe, Some("secret")).await;
}
