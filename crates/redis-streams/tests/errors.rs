//! Bad configuration, unreachable servers, refused credentials and keys of
//! the wrong type fail with typed errors that say what to fix and never show
//! a password.

mod support;

use std::time::Duration;

use intake_core::{
    Constant,
    backend::{Source, SourceError},
};
use intake_redis_streams::{Error, RedisSettings, RedisStreamsSource};
use redis::AsyncCommands;

use support::*;

#[tokio::test]
async fn a_url_that_is_not_a_redis_url_is_refused_before_connecting() {
    let connected = RedisStreamsSource::builder("http://alice:opensesame@127.0.0.1:6379")
        .stream("s")
        .group("g")
        .build()
        .await;
    match connected {
        Err(error @ Error::InvalidUrl { .. }) => {
            let shown = format!("{error} {error:?}");
            assert!(!shown.contains("opensesame"), "{shown}");
            assert!(
                std::error::Error::source(&error).is_some(),
                "what the client objected to is the cause"
            );
        }
        other => panic!("expected InvalidUrl, got {other:?}"),
    }
}

#[tokio::test]
async fn a_missing_group_is_a_configuration_error() {
    let connected = RedisStreamsSource::builder(redis_url())
        .stream("s")
        .build()
        .await;
    match connected {
        Err(Error::Config(error)) => assert_eq!(error.setting, "group"),
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

#[tokio::test]
async fn an_unreachable_server_is_reported_with_its_endpoint_and_no_password() {
    // Nothing listens on port 1.
    let connected = RedisStreamsSource::builder(
        RedisSettings::new("redis://bob:hunter2@127.0.0.1:1/0")
            .connect_timeout(Duration::from_secs(1)),
    )
    .stream("s")
    .group("g")
    .build()
    .await;
    let error = match connected {
        Err(error @ Error::Unreachable { .. }) => error,
        other => panic!("expected Unreachable, got {other:?}"),
    };
    let text = error.to_string();
    assert!(text.contains("redis://bob@127.0.0.1:1/0"), "{text}");
    assert_eq!(error.endpoint(), Some("redis://bob@127.0.0.1:1/0"));
    assert!(!text.contains("hunter2") && !format!("{error:?}").contains("hunter2"));
    assert!(error.is_transient());
    assert!(SourceError::from(error).is_transient());
}

#[tokio::test]
async fn a_wrong_password_is_reported_as_refused_credentials() {
    let Some(mut redis) =
        redis_or_skip("a_wrong_password_is_reported_as_refused_credentials").await
    else {
        return;
    };
    let (user, password, _) = temporary_user(&mut redis).await;
    let url = redis_url().replacen("redis://", &format!("redis://{user}:not-{password}@"), 1);
    let connected = RedisStreamsSource::builder(url)
        .stream(unique("s"))
        .group("g")
        .build()
        .await;
    drop_user(&mut redis, &user).await;
    let error = match connected {
        Err(error @ Error::Unauthorized { .. }) => error,
        other => panic!("expected Unauthorized, got {other:?}"),
    };
    assert!(!error.to_string().contains(&password));
    assert!(!error.is_transient());
    assert!(matches!(
        SourceError::from(error),
        SourceError::Unauthorized { .. }
    ));
}

#[tokio::test]
async fn the_right_password_in_the_url_logs_in() {
    let Some(mut redis) = redis_or_skip("the_right_password_in_the_url_logs_in").await else {
        return;
    };
    let (user, _, url) = temporary_user(&mut redis).await;
    let stream = unique("login");
    produce(&mut redis, &stream, "m", 1).await;
    let connected = RedisStreamsSource::builder(url)
        .stream(&stream)
        .group("g")
        .block(Duration::from_millis(100))
        .build()
        .await;
    let mut source = connected.expect("connect with user and password");
    let received = receive(&mut source, 1, 10, Duration::from_secs(5)).await;
    drop_user(&mut redis, &user).await;
    assert_eq!(payloads(&received), vec!["m0"]);
}

#[tokio::test]
async fn a_key_that_is_not_a_stream_is_reported_as_wrong_type() {
    let Some(mut redis) =
        redis_or_skip("a_key_that_is_not_a_stream_is_reported_as_wrong_type").await
    else {
        return;
    };
    let key = unique("string");
    redis
        .set::<_, _, ()>(&key, "not a stream")
        .await
        .expect("SET");
    for broadcast in [false, true] {
        let config = RedisStreamsSource::builder(redis_url()).stream(&key);
        let config = if broadcast {
            config.broadcast()
        } else {
            config.group("g")
        };
        match config.build().await {
            Err(Error::WrongType { key: reported, .. }) => assert_eq!(reported, key),
            other => panic!("expected WrongType (broadcast: {broadcast}), got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_stream_replaced_by_another_type_mid_run_fails_the_source_with_wrong_type() {
    let Some(mut redis) = redis_or_skip("a_stream_replaced_by_another_type_mid_run").await else {
        return;
    };
    let stream = unique("replaced");
    let mut source = group_builder(&stream, &unique("group"), "c1")
        .build()
        .await
        .expect("connect");
    redis.del::<_, ()>(&stream).await.expect("DEL");
    redis.set::<_, _, ()>(&stream, "oops").await.expect("SET");
    let mut buffer = Vec::new();
    let failed = tokio::time::timeout(Duration::from_secs(5), source.next(&mut buffer, 10)).await;
    let Ok(Err(SourceError::Fatal(error))) = failed else {
        panic!("expected a fatal source error, got {failed:?}");
    };
    assert!(
        matches!(error.downcast_ref::<Error>(), Some(Error::WrongType { .. })),
        "{error}"
    );
}

#[tokio::test]
async fn a_deleted_stream_and_group_are_created_again() {
    let Some(mut redis) = redis_or_skip("a_deleted_stream_and_group_are_created_again").await
    else {
        return;
    };
    let stream = unique("recreated");
    let group = unique("group");
    let mut source = group_builder(&stream, &group, "c1")
        .build()
        .await
        .expect("connect");
    redis.del::<_, ()>(&stream).await.expect("DEL");
    produce(&mut redis, &stream, "m", 2).await;
    let received = receive(&mut source, 2, 10, Duration::from_secs(5)).await;
    assert_eq!(payloads(&received), vec!["m0", "m1"]);
}

#[tokio::test]
async fn a_server_that_goes_away_is_reported_unreachable_once_the_policy_gives_up() {
    if redis_or_skip("a_server_that_goes_away").await.is_none() {
        return;
    }
    let mut proxy = Proxy::start().await;
    let stream = unique("gone");
    let mut source = RedisStreamsSource::builder(
        RedisSettings::new(format!("redis://{}", proxy.address()))
            .connect_timeout(Duration::from_millis(500)),
    )
    .stream(&stream)
    .group("g")
    .block(Duration::from_millis(100))
    .reconnect_backoff(Constant::new(Duration::from_millis(10)).max_retries(2))
    .build()
    .await
    .expect("connect");
    proxy.stop();
    let mut buffer = Vec::new();
    let failed = tokio::time::timeout(Duration::from_secs(10), source.next(&mut buffer, 10)).await;
    assert!(
        matches!(failed, Ok(Err(SourceError::Unreachable { .. }))),
        "{failed:?}"
    );
}

#[tokio::test]
async fn a_server_that_comes_back_is_read_again_without_losing_entries() {
    let Some(mut redis) = redis_or_skip("a_server_that_comes_back").await else {
        return;
    };
    let mut proxy = Proxy::start().await;
    let stream = unique("outage");
    let group = unique("group");
    let mut source = RedisStreamsSource::builder(
        RedisSettings::new(format!("redis://{}", proxy.address()))
            .connect_timeout(Duration::from_millis(500)),
    )
    .stream(&stream)
    .group(&group)
    .block(Duration::from_millis(100))
    .reconnect_backoff(Constant::new(Duration::from_millis(50)).retry_forever())
    .build()
    .await
    .expect("connect");
    let mut acker = source.acker();
    produce(&mut redis, &stream, "before-", 5).await;
    let mut received = receive(&mut source, 5, 10, Duration::from_secs(5)).await;
    proxy.stop();
    produce(&mut redis, &stream, "during-", 5).await;
    let outage = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        proxy.restart().await
    });
    received.extend(receive(&mut source, 5, 10, Duration::from_secs(10)).await);
    let _proxy = outage.await.expect("proxy");
    ack(&mut acker, &received).await;
    let mut expected: Vec<String> = (0..5).map(|n| format!("before-{n}")).collect();
    expected.extend((0..5).map(|n| format!("during-{n}")));
    assert_eq!(payloads(&received), expected);
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

#[tokio::test]
async fn a_user_removed_mid_run_is_reported_as_refused_credentials() {
    let Some(mut redis) = redis_or_skip("a_user_removed_mid_run").await else {
        return;
    };
    let (user, _, url) = temporary_user(&mut redis).await;
    let mut source = RedisStreamsSource::builder(url)
        .stream(unique("gone"))
        .group("g")
        .block(Duration::from_millis(100))
        .reconnect_backoff(Constant::new(Duration::from_millis(10)).max_retries(2))
        .build()
        .await
        .expect("connect");
    // The user can no longer log in: every reconnection is refused.
    drop_user(&mut redis, &user).await;
    let mut buffer = Vec::new();
    let failed = tokio::time::timeout(Duration::from_secs(5), source.next(&mut buffer, 10)).await;
    assert!(
        matches!(failed, Ok(Err(SourceError::Unauthorized { .. }))),
        "{failed:?}"
    );
}
