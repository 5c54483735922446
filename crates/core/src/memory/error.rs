//! What the memory broker refuses, and why.

/// A request the memory broker cannot carry out.
///
/// Every variant names the topic or group at fault and says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryError {
    /// The topic was never created.
    #[error("topic `{topic}` does not exist: create it first with `MemoryBroker::create_topic`")]
    UnknownTopic {
        /// The topic asked for.
        topic: String,
    },
    /// A topic of that name already exists.
    #[error("topic `{topic}` already exists (with {partitions} partition(s)); pick another name")]
    TopicExists {
        /// The topic.
        topic: String,
        /// Its partition count.
        partitions: u32,
    },
    /// A topic was asked for with a partition count the broker cannot hold.
    #[error(
        "topic `{topic}` cannot have {partitions} partitions: use between 1 and {max}",
        max = super::topic::MAX_PARTITIONS
    )]
    InvalidPartitionCount {
        /// The topic.
        topic: String,
        /// The count asked for.
        partitions: u32,
    },
    /// A record named a partition the topic does not have.
    #[error("topic `{topic}` has no partition {partition}: its partitions are 0..{partitions}")]
    UnknownPartition {
        /// The topic.
        topic: String,
        /// The partition asked for.
        partition: u32,
        /// The topic's partition count.
        partitions: u32,
    },
    /// An empty topic or group name.
    #[error("the {what} name is empty: give every topic and group a name")]
    EmptyName {
        /// "topic" or "group".
        what: &'static str,
    },
    /// A record of a dead-letter topic is not a dead letter intake can read
    /// (something else wrote it there).
    #[error("record {offset} of dead-letter topic `{topic}` is not a dead letter")]
    MalformedDeadLetter {
        /// The dead-letter topic.
        topic: String,
        /// The record's offset.
        offset: i64,
        /// What is wrong with it.
        #[source]
        source: crate::dead_letter::EnvelopeError,
    },
}
