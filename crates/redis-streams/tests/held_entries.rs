//! Entries a live consumer holds (queued in the runtime or running) are
//! nobody's claim candidates: not its own (a copy of an entry it already
//! holds, and after `max_deliveries` copies a spurious dead letter), and not
//! another consumer's (the consumer keeps their idle time short while it
//! holds them). Once the consumer is gone, they are claimed as before.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use intake_core::{Consumer, DeliveryOrder, HandlerError, Message};
use tokio_util::sync::CancellationToken;

use support::*;

/// Far above every wait of these tests: reaching it means a hang.
const HANG: Duration = Duration::from_secs(60);

#[tokio::test]
async fn entries_queued_behind_a_slow_handler_are_not_claimed_by_their_own_consumer() {
    let Some(mut redis) = redis_or_skip("entries_queued_behind_a_slow_handler").await else {
        return;
    };
    let stream = unique("queued");
    let group = unique("group");
    let total = 12;
    produce(&mut redis, &stream, "m", total).await;
    // Partition ordering runs one handler at a time, so the last entries of
    // a full budget wait in the queue far longer than claim_min_idle.
    let source = group_builder(&stream, &group, "slow")
        .claim_min_idle(Duration::from_millis(300))
        .claim_interval(Duration::from_millis(50))
        .max_deliveries(2)
        .build()
        .await
        .expect("connect");
    let acker = source.acker();
    let counters = source.counters();
    let handled: Arc<Mutex<BTreeMap<String, Vec<u32>>>> = Arc::default();
    let shutdown = CancellationToken::new();
    let handler = {
        let handled = handled.clone();
        let shutdown = shutdown.clone();
        tower::service_fn(move |message: Message| {
            let handled = handled.clone();
            let shutdown = shutdown.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let mut handled = handled.lock().expect("not poisoned");
                handled
                    .entry(String::from_utf8_lossy(message.payload()).into_owned())
                    .or_default()
                    .push(message.metadata().attempt());
                if handled.len() == total {
                    shutdown.cancel();
                }
                Ok::<_, HandlerError>(())
            }
        })
    };
    let report = tokio::time::timeout(
        HANG,
        Consumer::builder()
            .max_in_flight(total)
            .ordering(DeliveryOrder::Partition)
            .build(source, acker, handler)
            .expect("consumer")
            .run(shutdown),
    )
    .await
    .expect("every entry was handled")
    .expect("run");
    let handled = handled.lock().expect("not poisoned").clone();
    let copies: BTreeMap<_, _> = handled
        .iter()
        .filter(|(_, attempts)| attempts != &&vec![1])
        .collect();
    assert!(
        copies.is_empty(),
        "entries handled twice or late: {copies:?}"
    );
    assert_eq!(report.succeeded, total as u64);
    assert_eq!(counters.dead_lettered(), 0, "no spurious dead letter");
    assert!(
        entries(&mut redis, &format!("{stream}:dlq"))
            .await
            .is_empty()
    );
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

#[tokio::test]
async fn entries_held_by_a_live_consumer_are_not_claimed_by_another_until_it_is_gone() {
    let Some(mut redis) = redis_or_skip("entries_held_by_a_live_consumer").await else {
        return;
    };
    let stream = unique("held");
    let group = unique("group");
    produce(&mut redis, &stream, "m", 5).await;
    let config = |name: &str| {
        group_builder(&stream, &group, name)
            .claim_min_idle(Duration::from_millis(300))
            .claim_interval(Duration::from_millis(50))
    };
    let mut holder = config("holder").build().await.expect("connect");
    let held = receive(&mut holder, 5, 10, Duration::from_secs(5)).await;
    assert_eq!(held.len(), 5);

    // The holder's handlers take long: its entries stay unacknowledged for
    // several claim_min_idle, while another consumer of the group looks for
    // entries to claim.
    let mut other = config("other").build().await.expect("connect");
    let claimed = receive(&mut other, 1, 10, Duration::from_millis(1500)).await;
    assert!(
        claimed.is_empty(),
        "a live consumer's entries were claimed: {:?}",
        payloads(&claimed)
    );
    assert!(holder.counters().refreshed() > 0);

    // The holder dies: its entries are claimed once idle long enough.
    drop(holder);
    let claimed = receive(&mut other, 5, 10, Duration::from_secs(10)).await;
    assert_eq!(payloads(&claimed), payloads(&held));
    assert!(
        claimed
            .iter()
            .all(|message| message.metadata().attempt() == 2)
    );
}
