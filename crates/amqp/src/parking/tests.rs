use super::tier::{is_tier_name, tier_ttls};
use super::*;
use crate::topology::{MAX_NAME_BYTES, QueueKind};

#[test]
fn default_tiers_are_sorted_and_each_at_most_five_thirds_of_the_one_before() {
    let tiers = AmqpParking::DEFAULT_TIERS;
    assert_eq!(tier_ttls(tiers.to_vec()).ok(), Some(tiers.to_vec()));
    for pair in tiers.windows(2) {
        let ratio = pair[1].as_secs_f64() / pair[0].as_secs_f64();
        assert!(ratio <= 5.0 / 3.0 + 1e-9, "{:?} -> {:?}", pair[0], pair[1]);
    }
}

#[test]
fn tiers_are_whole_milliseconds_rounded_up_sorted_once_each() {
    let ttls = tier_ttls(vec![
        Duration::from_secs(5),
        Duration::from_micros(1_500),
        Duration::from_millis(2),
        Duration::from_secs(5),
    ]);
    assert_eq!(
        ttls.ok(),
        Some(vec![Duration::from_millis(2), Duration::from_secs(5)])
    );
    for refused in [vec![], vec![Duration::ZERO], vec![MAX_TIER * 2]] {
        assert!(tier_ttls(refused).is_err());
    }
}

#[test]
fn a_wait_queue_outlives_every_message_published_before_its_lease_is_renewed() {
    // A message published just before the renewal waits its TTL; the
    // queue lives its TTL plus the margin from the last declaration.
    assert!(RENEW_AFTER * 4 < EXPIRY_MARGIN);
    let tier = Tier::new("orders", Duration::from_secs(30), QueueKind::Quorum);
    let tier = tier.expect("a valid tier");
    assert_eq!(tier.wait, "orders.wait.30000ms");
    let queue = &tier.topology.queues()[0];
    assert_eq!(queue.name(), "orders.wait.30000ms");
    assert_eq!(queue.kind(), QueueKind::Quorum);
    let declared = format!("{queue:?}");
    assert!(
        declared.contains(r#"("x-expires", LongLongInt(1830000))"#),
        "{declared}"
    );
}

#[test]
fn only_a_tiers_wait_queue_names_a_tier() {
    for tier in ["1000ms", "1ms", "86400000ms"] {
        assert!(is_tier_name(tier), "{tier}");
    }
    for other in [
        "ms",
        "hop.1000ms",
        "relay",
        "1000",
        "10s",
        "1000ms.x",
        "-1ms",
    ] {
        assert!(!is_tier_name(other), "{other}");
    }
    let hop = Tier::hop("orders", Duration::from_secs(60), QueueKind::Quorum);
    let hop = hop.expect("a valid step queue");
    assert_eq!(hop.wait, "orders.wait.hop.60000ms");
    let declared = format!("{:?}", hop.topology.queues());
    assert!(declared.contains("orders.wait.relay"), "{declared}");
}

#[test]
fn the_holding_queues_are_the_tiers_wait_queues_the_longest_step_and_the_relay() {
    let tiers = [
        Duration::from_secs(60),
        Duration::from_micros(1_500),
        Duration::ZERO,
        MAX_TIER * 2,
        Duration::from_secs(60),
    ];
    assert_eq!(
        holding_queues("orders", &tiers),
        [
            "orders.wait.2ms",
            "orders.wait.60000ms",
            "orders.wait.hop.60000ms",
            "orders.wait.relay",
        ]
    );
    assert_eq!(holding_queues("orders", &[]), ["orders.wait.relay"]);
    let tier = Tier::new("orders", Duration::from_secs(60), QueueKind::Quorum);
    let hop = Tier::hop("orders", Duration::from_secs(60), QueueKind::Quorum);
    assert_eq!(tier.expect("a valid tier").wait, "orders.wait.60000ms");
    assert_eq!(hop.expect("a valid step").wait, "orders.wait.hop.60000ms");
}

#[test]
fn a_queue_name_too_long_for_its_wait_queues_is_refused() {
    let queue = "q".repeat(MAX_NAME_BYTES - 5);
    assert!(Tier::new(&queue, Duration::from_secs(1), QueueKind::Quorum).is_err());
}
