//! A group's control log on the broker `--broker` names, through the
//! backend's own channel (`control_channel` of each broker value), every
//! wait bounded by `--timeout`.

use std::time::Duration;

use futures_util::StreamExt as _;
use intake_core::group_control::{
    ControlChannel as _, ControlError, ControlFeed, ControlLog, GroupCommand,
};
use tokio::time::Instant;

use crate::broker::Broker;
use crate::failure::Failure;

/// How long the log must stay quiet after a record for its end to be
/// taken as reached: every backend hands over the records it has at once.
const QUIET: Duration = Duration::from_secs(1);

/// How long to wait for a log's first record: a feed's reader may still be
/// connecting (Kafka's assigns, then fetches) when the feed is handed over.
const FIRST_RECORD: Duration = Duration::from_secs(3);

/// One of a group's logs on one of the backends.
pub enum Channel {
    /// A topic of one partition.
    Kafka(intake_kafka::KafkaControlChannel),
    /// A stream.
    Redis(intake_redis_streams::RedisControlChannel),
    /// A stream queue.
    Amqp(intake_amqp::AmqpControlChannel),
    /// A JetStream stream.
    Nats(intake_nats::NatsControlChannel),
}

impl Channel {
    /// Group `group`'s `log` on `broker`, opened within `timeout` (Redis
    /// and Kafka connect at the first call, RabbitMQ and NATS here).
    pub async fn open(
        broker: &Broker,
        group: &str,
        log: ControlLog,
        timeout: Duration,
        what: &str,
    ) -> Result<Self, Failure> {
        let opened = async {
            match broker {
                Broker::Kafka { bootstrap, .. } => {
                    // TLS and SASL settings too, from --kafka-config.
                    let settings = broker
                        .kafka_settings()
                        .unwrap_or_else(|| intake_kafka::KafkaSettings::new(bootstrap.as_str()));
                    intake_kafka::KafkaBroker::new(settings)
                        .control_channel(group, log)
                        .await
                        .map(Channel::Kafka)
                        .map_err(|error| Failure::from_client(what, error.is_transient(), error))
                }
                Broker::Redis { url } => {
                    let settings = intake_redis_streams::RedisSettings::new(url.as_str())
                        .connect_timeout(timeout)
                        .command_timeout(timeout);
                    intake_redis_streams::RedisBroker::new(settings)
                        .control_channel(group, log)
                        .await
                        .map(Channel::Redis)
                        .map_err(|error| Failure::from_client(what, error.is_transient(), error))
                }
                Broker::Amqp { url } => {
                    let settings = intake_amqp::AmqpSettings::new(url.as_str())
                        .connection_name("intake cli (group)")
                        .connect_timeout(timeout);
                    intake_amqp::AmqpBroker::new(settings)
                        .control_channel(group, log)
                        .await
                        .map(Channel::Amqp)
                        .map_err(|error| Failure::from_client(what, error.is_transient(), error))
                }
                Broker::Nats { url } => {
                    // The URL's credentials are read by the settings.
                    let settings = intake_nats::NatsSettings::new(url.as_str())
                        .connect_timeout(timeout)
                        .connection_name("intake cli (group)");
                    intake_nats::NatsBroker::new(settings)
                        .ack_timeout(timeout)
                        .control_channel(group, log)
                        .await
                        .map(Channel::Nats)
                        .map_err(|error| Failure::from_client(what, error.is_transient(), error))
                }
            }
        };
        within(Instant::now() + timeout, timeout, what, opened).await?
    }

    /// Appends `command`; done once the broker stored it.
    pub async fn send(
        &self,
        command: &GroupCommand,
        timeout: Duration,
        what: &str,
    ) -> Result<(), Failure> {
        let record = command.encode();
        let sent = async {
            match self {
                Channel::Kafka(channel) => channel.append(record).await,
                Channel::Redis(channel) => channel.append(record).await,
                Channel::Amqp(channel) => channel.append(record).await,
                Channel::Nats(channel) => channel.append(record).await,
            }
        };
        within(Instant::now() + timeout, timeout, what, sent)
            .await?
            .map_err(|error| control_failure(what, error))
    }

    async fn follow(&self) -> Result<ControlFeed, ControlError> {
        match self {
            Channel::Kafka(channel) => channel.follow().await,
            Channel::Redis(channel) => channel.follow().await,
            Channel::Amqp(channel) => channel.follow().await,
            Channel::Nats(channel) => channel.follow().await,
        }
    }

    /// Reads the log from its start, each record to `on_record`, until no
    /// record came for [`QUIET`] (for [`FIRST_RECORD`] before the first),
    /// each window at most half of `timeout`. Fails when `deadline` passes
    /// first: a log read in part would show older pauses and statuses as
    /// the current ones.
    pub async fn read_to_end(
        &self,
        deadline: Instant,
        timeout: Duration,
        what: &str,
        mut on_record: impl FnMut(&[u8]),
    ) -> Result<u64, Failure> {
        let mut feed = within(deadline, timeout, what, self.follow())
            .await?
            .map_err(|error| control_failure(what, error))?;
        let mut read = 0_u64;
        loop {
            let window = if read == 0 { FIRST_RECORD } else { QUIET }.min(timeout / 2);
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(window.min(left), feed.next()).await {
                // Quiet for the whole window: the end.
                Err(_) if window <= left => return Ok(read),
                Err(_) => {
                    return Err(Failure::TimedOut {
                        what: format!(
                            "{what}: the log was not read to its end (a long log needs a \
                             longer --timeout)"
                        ),
                        after: timeout,
                    });
                }
                Ok(Some(Ok(record))) => {
                    read += 1;
                    on_record(&record);
                }
                Ok(Some(Err(error))) => return Err(control_failure(what, error)),
                Ok(None) => {
                    return Err(Failure::Unavailable {
                        what: what.to_owned(),
                        source: "the log's feed ended before its end was read".into(),
                    });
                }
            }
        }
    }
}

/// `work`, unless `deadline` passes first.
async fn within<T>(
    deadline: Instant,
    timeout: Duration,
    what: &str,
    work: impl Future<Output = T>,
) -> Result<T, Failure> {
    tokio::time::timeout_at(deadline, work)
        .await
        .map_err(|_| Failure::TimedOut {
            what: what.to_owned(),
            after: timeout,
        })
}

/// A channel's failed call: its own timeout as ours, the rest as the
/// channel classifies it (transient: exit 1; refused: exit 3).
fn control_failure(what: &str, error: ControlError) -> Failure {
    match error {
        ControlError::TimedOut(after) => Failure::TimedOut {
            what: what.to_owned(),
            after,
        },
        error => Failure::from_client(what, error.is_transient(), error),
    }
}
