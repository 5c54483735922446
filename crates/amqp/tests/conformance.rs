//! The backend conformance suite, unchanged, against RabbitMQ.

mod support;

async fn backend() -> Option<support::AmqpBackend> {
    support::AmqpBackend::connect_or_skip("amqp conformance").await
}

intake_core::conformance_suite!(backend());
intake_core::publisher_suite!(backend());
