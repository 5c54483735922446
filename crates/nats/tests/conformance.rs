//! intake's backend conformance suite, unchanged, on nats-server with
//! JetStream at 127.0.0.1:4222 (`.ci/services/nats.sh`). Skipped with a
//! printed reason when no server listens, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

intake_core::conformance_suite!(support::NatsBackend::new("the conformance suite on NATS"));
// Not `published_outputs_are_confirmed_and_delivered`: it expects the key
// sent to come back as `Message::key()`, and this crate's source reads the
// key from the subject, so an output keyed `k3` to `in.<stream>.published`
// comes back keyed `in.<stream>.published.k3` (its headers intact;
// `tests/publishing.rs` checks both).
intake_core::publisher_suite!(@scenarios support::NatsBackend::new("the publisher suite on NATS");
    outputs_keep_their_order_per_key,
    a_relay_acknowledges_inputs_after_their_outputs,
);
