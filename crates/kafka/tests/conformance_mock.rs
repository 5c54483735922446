//! intake's backend conformance suite, unchanged, on rdkafka's in-process
//! mock cluster (the fast tier: no broker to install).

mod support;

async fn backend() -> Option<support::KafkaBackend> {
    support::init_tracing();
    Some(support::KafkaBackend::mock())
}

intake_core::conformance_suite!(backend());
