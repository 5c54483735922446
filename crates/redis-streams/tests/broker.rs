//! What `RedisBroker` derives beyond the shared broker suite
//! (`tests/conformance.rs`): the lag probe's return stream and parked
//! backlog, the shutdown of the parkings it keeps, and its settings.

mod support;

use std::time::Duration;

use intake_core::backend::{Broker, RouteAddress, RouteOptions, Source};
use intake_core::lag::LagProbe;
use intake_core::parking::Parking;
use intake_core::{Message, Metadata, Position};
use intake_redis_streams::{Error, RedisBroker, RedisLagProbe, RedisParking, RedisSettings};
use support::*;

fn message_of(stream: &str, seq: u64) -> Message {
    Message::new(
        format!("m{seq}"),
        Metadata::new(stream.into(), 0, Position::StreamId { ms: 1, seq }),
    )
}

#[tokio::test]
async fn the_probe_of_a_route_counts_what_it_parked_and_reports_its_return_stream() {
    let test = "the_probe_of_a_route_counts_what_it_parked_and_reports_its_return_stream";
    let Some(_connection) = redis_or_skip(test).await else {
        return;
    };
    let stream = unique("broker");
    let group = unique("group");
    let address = RouteAddress::new(&stream, &group);
    let broker = RedisBroker::new(redis_url());

    // Before a route with parking, the return stream does not exist: the
    // probe reports the stream alone, and nothing parked.
    let mut plain = broker.route(&address, &RouteOptions::new()).await.unwrap();
    assert!(plain.parking.is_none());
    let probe = broker.lag_probe(&address).await.unwrap();
    let partitions = |lags: &[intake_core::PartitionLag]| -> Vec<String> {
        lags.iter()
            .map(|lag| lag.partition.source.to_string())
            .collect()
    };
    assert_eq!(partitions(&probe.lag().await.unwrap()), [stream.as_str()]);
    assert_eq!(probe.parked().await.unwrap(), Some(0));
    plain.source.close().await.unwrap();

    let mut parts = broker
        .route(&address, &RouteOptions::new().parking())
        .await
        .unwrap();
    let parking = parts.parking.clone().expect("asked for parking");
    let returned = RedisParking::return_stream(&stream, &group);
    assert_eq!(parking.return_stream_of(&stream), Some(returned.as_str()));
    for seq in 0..3 {
        parking
            .park(&message_of(&stream, seq), Duration::from_secs(600))
            .await
            .unwrap();
    }
    assert_eq!(probe.parked().await.unwrap(), Some(3));
    // The source created its group on the return stream it reads.
    assert_eq!(
        partitions(&probe.lag().await.unwrap()),
        [stream.clone(), returned.clone()]
    );
    // A probe from the URL alone, as `intake lag` makes it, counts them too.
    let standalone = RedisLagProbe::new(redis_url(), &group, [stream.as_str()]).unwrap();
    assert_eq!(standalone.parked().await.unwrap(), Some(3));
    // Another group parked nothing.
    let other = broker
        .lag_probe(&RouteAddress::new(&stream, "another"))
        .await
        .unwrap();
    assert_eq!(other.parked().await.unwrap(), Some(0));

    parts.source.close().await.unwrap();
    broker.shutdown(Duration::from_secs(10)).await.unwrap();
    // The mover stopped: a park is refused (the layer retries such a
    // message the ordinary way), and the three stay parked.
    let refused = parking
        .park(&message_of(&stream, 9), Duration::from_secs(1))
        .await;
    assert!(refused.is_err(), "a park after the shutdown: {refused:?}");
    assert_eq!(probe.parked().await.unwrap(), Some(3));
    // Nothing left to stop.
    broker.shutdown(Duration::from_millis(1)).await.unwrap();
}

#[tokio::test]
async fn a_parked_message_comes_back_to_the_source_of_its_route() {
    let test = "a_parked_message_comes_back_to_the_source_of_its_route";
    let Some(_connection) = redis_or_skip(test).await else {
        return;
    };
    let stream = unique("broker");
    let group = unique("group");
    let address = RouteAddress::new(&stream, &group);
    let broker = RedisBroker::new(redis_url()).consumer_name(unique("pod"));
    let mut parts = broker
        .route(&address, &RouteOptions::new().parking())
        .await
        .unwrap();
    let parking = parts.parking.take().expect("asked for parking");
    parking
        .park(&message_of(&stream, 0), Duration::from_millis(50))
        .await
        .unwrap();
    drop(parking);
    // The broker keeps the parking: its mover still moves the copy back.
    let received = receive(&mut parts.source, 1, 10, Duration::from_secs(10)).await;
    assert_eq!(payloads(&received), ["m0"]);
    let returned = RedisParking::return_stream(&stream, &group);
    assert_eq!(received[0].metadata().source().as_ref(), returned.as_str());
    assert_eq!(
        received[0].headers().get_str(intake_core::parking::ORIGIN),
        Some(stream.as_str())
    );
    parts.source.close().await.unwrap();
    broker.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test]
async fn settings_that_cannot_work_fail_the_derivation_with_a_typed_error() {
    #[cfg(feature = "tls")]
    {
        let tls = RedisBroker::new(
            RedisSettings::new("redis://127.0.0.1:6379").tls_root_certificate("pem"),
        );
        let refused = tls
            .route(&RouteAddress::new("s", "g"), &RouteOptions::new())
            .await
            .err();
        assert!(
            matches!(&refused, Some(Error::Config(error)) if error.setting == "tls_root_certificate"),
            "{refused:?}"
        );
    }
    let empty = RedisBroker::new("redis://127.0.0.1:6379").key_field("");
    let refused = empty.publisher().await.err();
    assert!(
        matches!(&refused, Some(Error::Config(error)) if error.setting == "key_field"),
        "{refused:?}"
    );
    let port = intake_core::backend::testkit::closed_port().expect("a free local port");
    let unreachable = RedisBroker::new(
        RedisSettings::new(format!("redis://:hunter2@127.0.0.1:{port}"))
            .connect_timeout(Duration::from_secs(2)),
    );
    let refused = unreachable
        .route(&RouteAddress::new("s", "g"), &RouteOptions::new())
        .await
        .err();
    let shown = refused.as_ref().map(|error| format!("{error} {error:?}"));
    assert!(
        matches!(&refused, Some(error) if error.is_transient()),
        "{shown:?}"
    );
    assert!(shown.is_some_and(|shown| !shown.contains("hunter2")));
}
