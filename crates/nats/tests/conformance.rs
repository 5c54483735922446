//! intake's backend conformance suite, unchanged, on nats-server with
//! JetStream at 127.0.0.1:4222 (`.ci/services/nats.sh`). Skipped with a
//! printed reason when no server listens, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

intake_core::conformance_suite!(support::NatsBackend::new("the conformance suite on NATS"));
// The source reads the key from the subject: an output keyed `k3` to
// `in.<stream>.published` comes back keyed `in.<stream>.published.k3`, as
// the fixture's `key_read_back` tells the suite.
intake_core::publisher_suite!(support::NatsBackend::new("the publisher suite on NATS"));
