//! The backend and publisher conformance suites, unchanged, against a real
//! Redis.

mod support;

intake_core::conformance_suite!(support::RedisBackend::new("redis conformance"));
intake_core::publisher_suite!(support::RedisBackend::new("redis publisher conformance"));
