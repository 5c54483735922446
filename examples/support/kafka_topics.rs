//! Kafka topics that the examples create before they produce or consume.
//!
//! Included with `#[path = "support/kafka_topics.rs"] mod kafka_topics;`.

use std::time::Duration;

use intake::kafka::KafkaSettings;
use intake::kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use intake::kafka::rdkafka::client::DefaultClientContext;
use intake::kafka::rdkafka::error::RDKafkaErrorCode;

/// Creates `topic` with `partitions` partitions unless it exists (with
/// whatever partition count it has).
pub async fn create_topic(
    settings: &KafkaSettings,
    topic: &str,
    partitions: i32,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let admin: AdminClient<DefaultClientContext> = settings.client_config().create()?;
    let results = admin
        .create_topics(
            &[NewTopic::new(
                topic,
                partitions,
                TopicReplication::Fixed(-1),
            )],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(format!("creating topic {topic}: {code}").into()),
        }
    }
    Ok(())
}
