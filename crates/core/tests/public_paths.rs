//! The public API by audience: `backend` holds what a backend implements,
//! and the root paths the backend crates import today still name the same
//! items (hidden from the root's documentation) until they switch over.

use std::any::TypeId;

fn same<A: ?Sized + 'static, B: ?Sized + 'static>() -> bool {
    TypeId::of::<A>() == TypeId::of::<B>()
}

#[test]
fn the_backend_module_and_the_hidden_root_paths_name_the_same_items() {
    use intake_core::backend;

    assert!(same::<backend::SourceEvent, intake_core::SourceEvent>());
    assert!(same::<backend::SourceError, intake_core::source::SourceError>());
    assert!(same::<backend::Limits, intake_core::Limits>());
    assert!(same::<backend::Revocation, intake_core::Revocation>());
    assert!(same::<
        backend::RevocationHandle,
        intake_core::RevocationHandle,
    >());
    assert!(same::<
        backend::RevocationOutcome,
        intake_core::source::RevocationOutcome,
    >());
    assert!(same::<
        backend::RevocationError,
        intake_core::source::RevocationError,
    >());
    assert!(same::<backend::AckBatch, intake_core::AckBatch>());
    assert!(same::<backend::AckError, intake_core::acker::AckError>());
    assert!(same::<backend::AckMode, intake_core::AckMode>());
    assert!(same::<backend::PartitionAck, intake_core::PartitionAck>());
    assert!(same::<backend::DeadLetterError, intake_core::DeadLetterError>());
    assert!(same::<
        dyn backend::DeadLetterSink,
        dyn intake_core::DeadLetterSink,
    >());
    assert!(same::<
        backend::envelope::Broker,
        intake_core::dead_letter::Broker,
    >());
}

#[cfg(feature = "testkit")]
#[test]
fn the_testkit_is_under_backend_and_at_its_old_path() {
    assert!(same::<
        intake_core::backend::testkit::TestMessage,
        intake_core::testkit::TestMessage,
    >());
}

#[test]
#[allow(deprecated)]
fn the_former_ordering_name_is_delivery_order() {
    assert!(same::<intake_core::Ordering, intake_core::DeliveryOrder>());
    assert_eq!(intake_core::Ordering::Key, intake_core::DeliveryOrder::Key);
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
