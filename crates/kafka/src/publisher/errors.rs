//! What a librdkafka error means for one output: its kind, and the
//! publish errors the publisher returns.

use super::*;

/// What a librdkafka error code means for one output.
pub(super) fn kind_of(code: RDKafkaErrorCode) -> PublishErrorKind {
    use RDKafkaErrorCode as Code;
    match code {
        // This output, as it is, is refused every time.
        Code::MessageSizeTooLarge
        | Code::InvalidMessageSize
        | Code::MessageBatchTooLarge
        | Code::InvalidMessage
        | Code::InvalidRecord
        | Code::InvalidTopic
        | Code::InvalidArgument
        | Code::InvalidTimestamp
        | Code::PolicyViolation
        | Code::UnsupportedForMessageFormat => PublishErrorKind::Rejected,
        // Purged by close or drop, or a producer librdkafka gave up on.
        Code::PurgeQueue | Code::PurgeInflight | Code::Fatal => PublishErrorKind::Closed,
        // Anything else, a destination missing or not allowed among them
        // (`destination_missing`): that says nothing about the output (a
        // topic deleted and created again, a migration, an ACL not granted
        // yet), and every output to it fails the same way until it is
        // back, so failing each input for good would dead-letter them all.
        // They are retried, after the consumer's backoff.
        _ => PublishErrorKind::Unavailable,
    }
}

/// Whether `code` says the destination topic is missing, or this client
/// may not write to it (rather than anything about the output itself).
/// An unknown partition is one of a topic deleted under an output the
/// partitioner had placed (outputs name no partition of their own).
pub(super) fn destination_missing(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as Code;
    matches!(
        code,
        Code::UnknownTopic
            | Code::UnknownTopicOrPartition
            | Code::UnknownPartition
            | Code::TopicAuthorizationFailed
            | Code::ClusterAuthorizationFailed
    )
}

/// An output librdkafka refused when it was handed over.
pub(super) fn refused(error: KafkaError, destination: &str, brokers: &str) -> PublishError {
    let kind = match &error {
        KafkaError::MessageProduction(code) => kind_of(*code),
        // A topic name with a NUL byte, which no broker takes.
        KafkaError::Nul(_) => PublishErrorKind::Rejected,
        _ => PublishErrorKind::Unavailable,
    };
    let what = match kind {
        PublishErrorKind::Rejected => format!(
            "the Kafka client refused the output for {brokers} (too large for `message.max.bytes`, or an invalid topic name); sending it again fails the same way"
        ),
        PublishErrorKind::Closed => return closed(destination, Some(error)),
        _ if error.rdkafka_error_code().is_some_and(destination_missing) => missing(brokers),
        _ => format!("the Kafka client for {brokers} could not take the output; publish again"),
    };
    PublishError::new(kind, destination, what).with_source(error)
}

/// An output whose delivery report is a failure.
pub(super) fn delivery_failed(
    error: KafkaError,
    destination: &str,
    shared: &Shared,
) -> PublishError {
    let kind = match &error {
        KafkaError::MessageProduction(code) => kind_of(*code),
        _ => PublishErrorKind::Unavailable,
    };
    let brokers = &shared.brokers;
    let what = match kind {
        PublishErrorKind::Rejected => format!(
            "the Kafka broker at {brokers} refused the output itself (too large for the topic, or an invalid record); sending it again fails the same way"
        ),
        PublishErrorKind::Closed => return closed(destination, Some(error)),
        _ if error.rdkafka_error_code().is_some_and(destination_missing) => missing(brokers),
        _ => format!(
            "not confirmed by the Kafka broker at {brokers} within {:?} (message.timeout.ms); it may or may not be stored; publish again",
            shared.delivery_timeout
        ),
    };
    PublishError::new(kind, destination, what).with_source(error)
}

/// What an output to a missing (or forbidden) destination is told.
pub(super) fn missing(brokers: &str) -> String {
    format!(
        "the topic does not exist at {brokers} (or this client may not write to it): the output is not stored; publish again once the topic is back"
    )
}

pub(super) fn closed(destination: &str, source: Option<KafkaError>) -> PublishError {
    let error = PublishError::new(
        PublishErrorKind::Closed,
        destination,
        "the Kafka publisher was closed (or its producer failed for good) before the output was confirmed; make a new publisher",
    );
    match source {
        Some(source) => error.with_source(source),
        None => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_of_the_output_itself_are_rejected_and_the_rest_retryable() {
        use RDKafkaErrorCode as Code;
        for code in [
            Code::MessageSizeTooLarge,
            Code::InvalidTopic,
            Code::InvalidRecord,
        ] {
            assert_eq!(kind_of(code), PublishErrorKind::Rejected, "{code:?}");
        }
        // A missing or forbidden destination is no property of the output.
        for code in [
            Code::MessageTimedOut,
            Code::AllBrokersDown,
            Code::RequestTimedOut,
            Code::UnknownTopic,
            Code::UnknownTopicOrPartition,
            Code::UnknownPartition,
            Code::TopicAuthorizationFailed,
            Code::ClusterAuthorizationFailed,
        ] {
            assert_eq!(kind_of(code), PublishErrorKind::Unavailable, "{code:?}");
        }
        for code in [Code::PurgeQueue, Code::PurgeInflight, Code::Fatal] {
            assert_eq!(kind_of(code), PublishErrorKind::Closed, "{code:?}");
        }
    }
}
