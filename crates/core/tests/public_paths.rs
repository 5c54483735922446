//! The public API by audience: `backend` holds what a backend implements;
//! the message and dead-letter types both audiences use are the same items
//! under the root and under `backend`.

use std::any::TypeId;

fn same<A: ?Sized + 'static, B: ?Sized + 'static>() -> bool {
    TypeId::of::<A>() == TypeId::of::<B>()
}

#[test]
fn the_envelope_under_backend_is_the_dead_letter_modules() {
    assert!(same::<
        intake_core::backend::envelope::Broker,
        intake_core::dead_letter::Broker,
    >());
    assert!(same::<
        intake_core::backend::DeadLetter,
        intake_core::DeadLetter,
    >());
    assert!(same::<intake_core::backend::Message, intake_core::Message>());
}

#[test]
fn a_backend_builds_the_growing_types_through_their_constructors() {
    use intake_core::backend::{RevocationOutcome, RevokedPartition};
    use intake_core::{PartitionKey, Position};

    let partition = PartitionKey::new("orders", 3);
    let outcome = RevocationOutcome::new(vec![RevokedPartition::new(
        partition.clone(),
        Some(Position::Offset(41)),
        2,
    )]);
    let revoked = &outcome.partitions[0];
    assert_eq!(
        (&revoked.partition, revoked.committed, revoked.unfinished),
        (&partition, Some(Position::Offset(41)), 2)
    );
    let config = intake_core::ConfigError::new("max_in_flight", "is 0; use at least 1");
    assert_eq!(config.setting, "max_in_flight");
}
