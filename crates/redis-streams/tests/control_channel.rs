//! The group control channel's Redis specifics: where its logs are kept and
//! how (the status log trimmed, the commands log not), entries it did not
//! write skipped, a lost connection ending a feed in time, and a server
//! that is not there failing an append as transient without showing the
//! password.

mod support;

use std::error::Error as _;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt as _;
use intake_core::group_control::{ControlChannel, ControlError, ControlFeed, ControlLog};
use intake_redis_streams::{RedisBroker, RedisControlChannel, RedisSettings};
use redis::AsyncCommands as _;

/// The next item of `feed` within 10 s.
async fn next(feed: &mut ControlFeed) -> Option<Result<Bytes, ControlError>> {
    tokio::time::timeout(Duration::from_secs(10), feed.next())
        .await
        .expect("the feed answers within 10 s")
}

/// `error`, its `Debug` and every cause, as one text.
fn everything_shown(error: &ControlError) -> String {
    let mut shown = format!("{error} {error:?}");
    let mut cause = error.source();
    while let Some(inner) = cause {
        shown.push_str(&format!(" {inner}"));
        cause = inner.source();
    }
    shown
}

#[tokio::test]
async fn each_log_is_a_stream_of_the_group_and_only_the_status_log_is_trimmed() {
    let Some(mut admin) = support::redis_or_skip("control logs' streams").await else {
        return;
    };
    let group = support::unique("control-trim");
    let broker = RedisBroker::new(support::redis_url());
    for (log, suffix) in [
        (ControlLog::Commands, "intake-control"),
        (ControlLog::Status, "intake-status"),
    ] {
        let channel = broker.control_channel(&group, log).await.expect("open");
        let key = format!("{group}:{suffix}");
        assert_eq!(channel.stream(), key);
        assert_eq!(RedisControlChannel::stream_of(&group, log), key);
        // 10,300 appends, 100 at a time on the shared connection.
        for chunk in 0..103 {
            let appends = (0..100).map(|n| channel.append(Bytes::from(format!("{chunk}-{n}"))));
            for appended in futures_util::future::join_all(appends).await {
                appended.expect("append");
            }
        }
        let length: u64 = admin.xlen(&key).await.expect("XLEN");
        match log {
            ControlLog::Commands => assert_eq!(length, 10_300, "{key}"),
            // `~` trims whole nodes of the stream only: about 10,000.
            ControlLog::Status => {
                assert!((10_000..10_300).contains(&length), "{key}: {length}")
            }
        }
        let _: () = admin.del(&key).await.expect("DEL");
    }
}

#[tokio::test]
async fn an_entry_without_a_record_field_is_skipped() {
    let Some(mut admin) = support::redis_or_skip("control log's strange entries").await else {
        return;
    };
    let group = support::unique("control-strange");
    let channel = RedisBroker::new(support::redis_url())
        .control_channel(&group, ControlLog::Commands)
        .await
        .expect("open");
    channel.append(Bytes::from("first")).await.expect("append");
    let _: String = admin
        .xadd(channel.stream(), "*", &[("payload", "not a record")])
        .await
        .expect("XADD");
    channel.append(Bytes::from("second")).await.expect("append");
    let mut feed = channel.follow().await.expect("follow");
    assert_eq!(
        next(&mut feed).await.map(|r| r.ok()),
        Some(Some(Bytes::from("first")))
    );
    assert_eq!(
        next(&mut feed).await.map(|r| r.ok()),
        Some(Some(Bytes::from("second")))
    );
    let _: () = admin.del(channel.stream()).await.expect("DEL");
}

#[tokio::test]
async fn a_feed_whose_connection_is_lost_ends_with_a_transient_error_in_time() {
    let Some(_) = support::redis_or_skip("control feed's lost connection").await else {
        return;
    };
    let mut proxy = support::Proxy::start().await;
    let settings = RedisSettings::new(format!("redis://{}", proxy.address()))
        .connect_timeout(Duration::from_millis(500))
        .command_timeout(Duration::from_millis(500));
    let channel = RedisBroker::new(settings)
        .control_channel(&support::unique("control-lost"), ControlLog::Commands)
        .await
        .expect("open");
    channel.append(Bytes::from("before")).await.expect("append");
    let mut feed = channel.follow().await.expect("follow");
    assert_eq!(
        next(&mut feed).await.map(|r| r.ok()),
        Some(Some(Bytes::from("before")))
    );

    // The feed is now blocked in a read; the connection goes away.
    proxy.stop();
    let started = Instant::now();
    match next(&mut feed).await {
        Some(Err(error)) => assert!(error.is_transient(), "{error:?}"),
        other => panic!("expected the feed's error, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(
        next(&mut feed).await.is_none(),
        "the feed ends after its error"
    );
}

/// A channel whose server is not there: its append fails as transient
/// within the timeouts (connect plus command, with slack for a busy
/// machine), and neither the error nor the channel's `Debug` shows the
/// URL's password. A feed cannot be opened either.
#[tokio::test]
async fn a_control_channel_without_its_server_fails_an_append_as_transient_in_time() {
    let port = intake_core::backend::testkit::closed_port().expect("a free port");
    let settings = RedisSettings::new(format!("redis://app:s3cr3t-pw@127.0.0.1:{port}/0"))
        .connect_timeout(Duration::from_millis(500))
        .command_timeout(Duration::from_millis(500));
    let channel = RedisBroker::new(settings)
        .control_channel("control-closed-port", ControlLog::Commands)
        .await
        .expect("the URL is valid; nothing is connected yet");
    assert!(!format!("{channel:?}").contains("s3cr3t-pw"), "{channel:?}");

    let started = Instant::now();
    let appended = channel.append(Bytes::from_static(b"a command")).await;
    let took = started.elapsed();
    let error = appended.expect_err("nothing listens on the port");
    assert!(error.is_transient(), "{error:?}");
    assert!(took < Duration::from_secs(3), "the append took {took:?}");
    let shown = everything_shown(&error);
    assert!(!shown.contains("s3cr3t-pw"), "{shown}");

    let started = Instant::now();
    let error = channel
        .follow()
        .await
        .err()
        .expect("nothing listens on the port");
    let took = started.elapsed();
    assert!(error.is_transient(), "{error:?}");
    assert!(
        took < Duration::from_secs(3),
        "opening the feed took {took:?}"
    );
    let shown = everything_shown(&error);
    assert!(!shown.contains("s3cr3t-pw"), "{shown}");
}
