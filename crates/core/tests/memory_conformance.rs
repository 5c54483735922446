//! The backend conformance suite on the in-memory broker.
//!
//! Runs with the `testkit` feature: `cargo test -p intake-core --features testkit`.
#![cfg(feature = "testkit")]

use intake_core::backend::testkit::memory_backend::MemoryBackend;

async fn backend() -> Option<MemoryBackend> {
    Some(MemoryBackend::new())
}

intake_core::conformance_suite!(backend());
intake_core::publisher_suite!(backend());
intake_core::dead_letter_store_suite!(backend());
intake_core::broker_suite!(backend());
intake_core::control_suite!(backend());
