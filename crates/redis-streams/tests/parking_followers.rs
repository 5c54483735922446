//! Review R9 on Redis: two members of one group park. A key's head is
//! parked by one member, and its copy comes back through the group's
//! return stream to whichever member reads first; the key's later messages
//! (its followers), parked behind the head by the member that parked it,
//! come back to either member too. A follower back at the member that
//! parked it while the head is not back there is parked again (1 ms,
//! doubling per follower turned away, since core's change): this counts how
//! often each is parked, and checks that nothing is lost or run twice.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use intake_core::parking::{ParkError, Parked, Parking, ParkingLayer, parks_header};
use intake_core::{Consumer, DeliveryOrder, HandlerError, Message};
use intake_redis_streams::{RedisParking, RedisStreamsSource};
use redis::AsyncCommands;
use tokio_util::sync::CancellationToken;

use support::*;

/// A parking that counts its parks per payload.
#[derive(Clone)]
struct Counting {
    inner: RedisParking,
    parks: Arc<Mutex<BTreeMap<String, u32>>>,
}

#[async_trait::async_trait]
impl Parking for Counting {
    async fn park(&self, message: &Message, delay: Duration) -> Result<Parked, ParkError> {
        let parked = self.inner.park(message, delay).await;
        if parked.is_ok() {
            let name = String::from_utf8_lossy(message.payload()).into_owned();
            *self
                .parks
                .lock()
                .expect("not poisoned")
                .entry(name)
                .or_default() += 1;
        }
        parked
    }

    fn is_returned_copy(&self, message: &Message) -> bool {
        self.inner.is_returned_copy(message)
    }
}

type Runs = Arc<Mutex<Vec<(String, &'static str, bool)>>>;

/// A member `name` of `group` with its own parking; the key `k`'s head
/// `k-0` asks for later on its first run.
async fn member(
    stream: &str,
    group: &str,
    name: &'static str,
    parks: &Arc<Mutex<BTreeMap<String, u32>>>,
    runs: &Runs,
    stop: &CancellationToken,
) -> (
    tokio::task::JoinHandle<intake_core::RunReport>,
    RedisParking,
) {
    let source: RedisStreamsSource = group_builder(stream, group, name)
        .stream(RedisParking::return_stream(stream, group))
        .key_field("key")
        .build()
        .await
        .expect("connect");
    let acker = source.acker();
    let parking = source
        .parking()
        .poll_interval(Duration::from_millis(50))
        .build()
        .await
        .expect("parking");
    let counting = Counting {
        inner: parking.clone(),
        parks: Arc::clone(parks),
    };
    let handler = tower::ServiceBuilder::new()
        .layer(ParkingLayer::new(counting))
        .service(tower::service_fn({
            let runs = Arc::clone(runs);
            move |message: Message| {
                let payload = String::from_utf8_lossy(message.payload()).into_owned();
                let later = payload == "k-0" && parks_header(&message) == 0;
                runs.lock()
                    .expect("not poisoned")
                    .push((payload, name, !later));
                std::future::ready(if later {
                    Err(HandlerError::retry_later(
                        "not yet",
                        Duration::from_millis(300),
                    ))
                } else {
                    Ok(())
                })
            }
        }));
    let consumer = Consumer::builder()
        .max_in_flight(32)
        .ordering(DeliveryOrder::Key)
        .build(source, acker, handler)
        .expect("consumer");
    let stop = stop.clone();
    (
        tokio::spawn(async move { consumer.run(stop).await.expect("run") }),
        parking,
    )
}

#[tokio::test]
async fn followers_of_a_head_that_comes_back_to_another_member_are_parked_a_bounded_number_of_times()
 {
    let Some(mut redis) = redis_or_skip("followers_of_a_head_that_comes_back").await else {
        return;
    };
    let mut totals = Vec::new();
    for round in 0..3 {
        let stream = unique("r9");
        let group = unique("group");
        for n in 0..6 {
            for key in ["k", "o"] {
                let _: String = redis
                    .xadd(
                        &stream,
                        "*",
                        &[("payload", format!("{key}-{n}")), ("key", key.to_owned())],
                    )
                    .await
                    .expect("XADD");
            }
        }
        let parks: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
        let runs: Runs = Arc::default();
        let stop = CancellationToken::new();
        // The first member reads every entry, and parks k-0 and its
        // followers; the second joins once it has.
        let (first, first_parking) = member(&stream, &group, "first", &parks, &runs, &stop).await;
        let started = tokio::time::Instant::now();
        while !runs
            .lock()
            .expect("not poisoned")
            .iter()
            .any(|run| run.0 == "k-0")
            && started.elapsed() < Duration::from_secs(10)
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (second, second_parking) =
            member(&stream, &group, "second", &parks, &runs, &stop).await;
        let started = tokio::time::Instant::now();
        loop {
            let succeeded = runs
                .lock()
                .expect("not poisoned")
                .iter()
                .filter(|run| run.2)
                .count();
            if succeeded >= 12 || started.elapsed() > Duration::from_secs(30) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.cancel();
        let (first, second) = (first.await.expect("joined"), second.await.expect("joined"));
        first_parking.shutdown().await;
        second_parking.shutdown().await;
        let runs = runs.lock().expect("not poisoned").clone();
        let parks = parks.lock().expect("not poisoned").clone();
        let succeeded: Vec<&(String, &str, bool)> = runs.iter().filter(|run| run.2).collect();
        let mut names: Vec<&str> = succeeded.iter().map(|run| run.0.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 12, "every message succeeded: {runs:?}");
        assert_eq!(succeeded.len(), 12, "and once: {runs:?}");
        let followers: Vec<u32> = (1..6)
            .map(|n| parks.get(&format!("k-{n}")).copied().unwrap_or(0))
            .collect();
        let k_order: Vec<(&str, &str)> = succeeded
            .iter()
            .filter(|run| run.0.starts_with("k-"))
            .map(|run| (run.0.as_str(), run.1))
            .collect();
        eprintln!(
            "round {round}: parks of k-0 {:?}, of its followers k-1..k-5 {followers:?} \
             (first parked {}, second {}); k succeeded in order {k_order:?}",
            parks.get("k-0"),
            first.parked,
            second.parked,
        );
        totals.extend(followers.iter().copied());
        for (n, count) in followers.iter().enumerate() {
            assert!(
                (1..=25).contains(count),
                "k-{} parked {count} times: {runs:?}",
                n + 1
            );
        }
    }
    eprintln!(
        "parks per follower over the rounds: {totals:?}, at most {:?}",
        totals.iter().max()
    );
}
