//! The dead-letter store of each broker, for `intake dlq`.
//!
//! A broker whose backend has no `DeadLetterStore` yet is answered with
//! [`Failure::Unsupported`] (exit code 4), never with an empty store: "0
//! dead letters" from a store that cannot look would be a lie a script
//! acts on.

use std::time::Duration;

use intake_core::dead_letter::store::DeadLetterStore;
use intake_redis_streams::{RedisDeadLetters, RedisStreamsPublisher};

use crate::broker::Broker;
use crate::failure::Failure;

/// The store of the dead letters of `source` on `broker`, in
/// `dead_letters` or else where the backend's sink writes them by default;
/// every broker call bounded by `timeout`.
pub async fn open(
    broker: &Broker,
    source: &str,
    dead_letters: Option<&str>,
    timeout: Duration,
    command: &str,
) -> Result<Box<dyn DeadLetterStore>, Failure> {
    let what = format!("{command}: connecting to {}", broker.endpoint());
    match broker {
        Broker::Redis { url } => {
            let log = RedisDeadLetters::builder(url.as_str())
                .connect_timeout(timeout)
                .command_timeout(timeout);
            let log = match dead_letters {
                Some(stream) => log.stream(stream),
                None => log.dead_letters_of(source),
            };
            let log = log
                .build()
                .await
                .map_err(|error| redis_failure(&what, error))?;
            // The publisher's defaults are the source's (fields `payload`
            // and `key`), so a replayed message reads back as it was.
            let publisher = RedisStreamsPublisher::builder(url.as_str())
                .connect_timeout(timeout)
                .command_timeout(timeout)
                .build()
                .await
                .map_err(|error| redis_failure(&what, error))?;
            Ok(Box::new(log.store(publisher)))
        }
        Broker::Kafka { .. } | Broker::Amqp { .. } | Broker::Nats { .. } => {
            Err(Failure::Unsupported {
                command: command.to_owned(),
                broker: broker.kind(),
            })
        }
    }
}

fn redis_failure(what: &str, error: intake_redis_streams::Error) -> Failure {
    if error.is_transient() {
        Failure::Unavailable {
            what: what.to_owned(),
            source: Box::new(error),
        }
    } else {
        Failure::Refused {
            what: what.to_owned(),
            source: Box::new(error),
        }
    }
}
