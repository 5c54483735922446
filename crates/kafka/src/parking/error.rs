//! [`ParkingError`]: why a message could not be parked in a retry topic,
//! or the mover did not stop in time.

use std::time::Duration;

use rdkafka::error::KafkaError;

/// A park that failed, the cause of the
/// [`ParkError`](intake_core::parking::ParkError) the parking layer sees
/// (it then retries the message the ordinary way), or a mover that did not
/// stop within its timeout. The brokers a variant names are
/// `bootstrap.servers` with any credentials hidden.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ParkingError {
    /// The message came from a topic the parking was not built for: its
    /// mover would not bring it back after a restart.
    #[error(
        "messages of topic `{topic}` cannot be parked: the parking was built for {configured:?}; add the topic (`KafkaParkingBuilder::topics`)"
    )]
    UnknownTopic {
        /// The message's topic.
        topic: String,
        /// The topics the parking serves.
        configured: Vec<String>,
    },
    /// No source of the parking's group reads the return topic the
    /// message's copy would come back to: parked, it would never be handled
    /// again (its original is acknowledged). A source reads it once built
    /// with [`KafkaSourceBuilder::parking`](crate::KafkaSourceBuilder::parking).
    #[error(
        "messages of `{topic}` are not parked: no source of group `{group}` was built to read their return topic `{return_topic}`, so a parked copy would never be handled again; build the source with `.parking(&parking)` so the return topic is read"
    )]
    ReturnTopicUnread {
        /// The message's origin topic.
        topic: String,
        /// The parking's consumer group.
        group: String,
        /// Where its copies come back to.
        return_topic: String,
    },
    /// The message's partition is no Kafka partition number.
    #[error("partition {partition} of `{topic}` is no Kafka partition")]
    BadPartition {
        /// The message's topic.
        topic: String,
        /// The partition it names.
        partition: u32,
    },
    /// The brokers did not say whether a topic exists, or how many
    /// partitions it has.
    #[error("cannot look up topic `{topic}` on {brokers}")]
    Lookup {
        /// The topic.
        topic: String,
        /// The configured brokers.
        brokers: String,
        /// The client's error.
        source: Box<KafkaError>,
    },
    /// The origin topic does not exist, so its retry topic cannot be sized.
    #[error("topic `{topic}` does not exist on {brokers}")]
    OriginMissing {
        /// The origin topic.
        topic: String,
        /// The configured brokers.
        brokers: String,
    },
    /// The retry topic does not exist and creating it failed.
    #[error(
        "retry topic `{topic}` does not exist on {brokers} and creating it failed; create it by hand (as many partitions as its origin) or allow this client to create topics"
    )]
    TopicNotCreated {
        /// The retry topic.
        topic: String,
        /// The configured brokers.
        brokers: String,
        /// The broker's or client's answer.
        source: Box<KafkaError>,
    },
    /// The broker did not confirm the parked copy within the delivery
    /// timeout, or refused it.
    #[error("producing the parked message to `{topic}` on {brokers} failed")]
    Write {
        /// The retry topic.
        topic: String,
        /// The configured brokers.
        brokers: String,
        /// The producer's error.
        source: Box<KafkaError>,
    },
    /// A metadata lookup or topic creation took longer than the delivery
    /// timeout.
    #[error("`{topic}` on {brokers} was not looked up or created within {waited:?}")]
    TimedOut {
        /// The topic.
        topic: String,
        /// The configured brokers.
        brokers: String,
        /// How long the parking waited.
        waited: Duration,
    },
    /// The brokers did not say how much is parked
    /// ([`KafkaParking::backlog`](super::KafkaParking::backlog)): unknown,
    /// which is not "nothing parked".
    #[error("cannot count what group `{group}` has parked on {brokers}")]
    Backlog {
        /// The consumer group whose messages are parked.
        group: String,
        /// The configured brokers.
        brokers: String,
        /// The client's error.
        source: Box<KafkaError>,
    },
    /// The count of what is parked took longer than its timeout.
    #[error("what group `{group}` has parked on {brokers} was not counted within {waited:?}")]
    BacklogTimedOut {
        /// The consumer group whose messages are parked.
        group: String,
        /// The configured brokers.
        brokers: String,
        /// How long the count waited.
        waited: Duration,
    },
    /// The mover did not stop within the shutdown timeout; it stops on its
    /// own once its current batch is confirmed or given up.
    #[error("the parking mover did not stop within {waited:?}")]
    ShutdownTimedOut {
        /// How long the shutdown waited.
        waited: Duration,
    },
}
