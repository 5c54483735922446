//! The backend conformance suite, unchanged, against a real Redis.

mod support;

intake_core::conformance_suite!(support::RedisBackend::new("redis conformance"));
