//! [`AmqpControlChannel`]: one of a consumer group's control logs (see
//! [`intake_core::group_control`]) kept in a RabbitMQ stream queue.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use intake_core::ConfigError;
use intake_core::group_control::{ControlChannel, ControlError, ControlFeed, ControlLog};
use intake_core::publish::{Output, PublishError, PublishErrorKind, Publisher};
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, Connection, Consumer};
use tokio::sync::Mutex;

use crate::AmqpPublisher;
use crate::connection::{DEFAULT_CONNECT_TIMEOUT, open_within};
use crate::error::{Error, Operation, classify};
use crate::settings::AmqpSettings;
use crate::tls::Tls;
use crate::topology::{Queue, Topology, short};
use crate::url::AmqpUrl;

/// How many records a feed's consumer may hold unacknowledged: a stream
/// queue needs a prefetch, and each acknowledgement is a credit for the
/// next record.
const FEED_PREFETCH: u16 = 64;

/// One of a consumer group's control logs ([`ControlLog`]) on RabbitMQ: a
/// durable stream queue (`x-queue-type: stream`), which keeps its records
/// after they are read, so that every instance reads the whole log from
/// its start. From [`AmqpBroker::control_channel`](crate::AmqpBroker::control_channel).
///
/// | log | queue | retention |
/// |---|---|---|
/// | [`Commands`](ControlLog::Commands) | `{group}.intake-control` | until deleted |
/// | [`Status`](ControlLog::Status) | `{group}.intake-status` | one hour (`x-max-age`) |
///
/// - **Append**: publishes the record to the default exchange with the
///   queue as the routing key, persistent and mandatory, on a publisher of
///   its own ([`AmqpPublisher`], connection `{group} (group control)`) in
///   confirm mode; done once the broker confirmed it. It declares the queue
///   whenever it connects.
/// - **Follow**: each feed consumes the queue on a channel of its own
///   (`basic.qos` of 64, `x-stream-offset: first`, manual acknowledgements,
///   each record acknowledged as it is read), all on one connection of the
///   channel's (`{group} (group control feed)`), opened at the first
///   follow and again after it broke. A dropped feed closes its channel.
///
/// # Bounds
///
/// The timeout is the settings' [connect
/// timeout](AmqpSettings::connect_timeout) (10 s unless set): an append
/// waits at most that long for a connection and again for the confirm; a
/// follow gives up opening after it ([`ControlError::TimedOut`]). A feed
/// whose channel or connection closes ends with an error at once; one whose
/// network goes silent, once the connection's heartbeat (the URL's
/// `heartbeat`, RabbitMQ's 60 s by default) finds it dead.
///
/// Errors and `Debug` name the broker without its password. Clones share
/// the publisher and the feeds' connection.
#[derive(Clone)]
pub struct AmqpControlChannel {
    log: ControlLog,
    queue: Arc<str>,
    /// The stream queue, declared by the publisher and by every feed.
    topology: Topology,
    url: AmqpUrl,
    tls: Tls,
    feed_connection_name: Option<String>,
    timeout: Duration,
    publisher: AmqpPublisher,
    /// The connection the feeds consume on, once opened.
    feeds: Arc<Mutex<Option<Connection>>>,
}

impl fmt::Debug for AmqpControlChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpControlChannel")
            .field("endpoint", &self.url.endpoint())
            .field("queue", &self.queue)
            .field("log", &self.log)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl AmqpControlChannel {
    /// The queue that keeps `group`'s `log`: `{group}.intake-control` or
    /// `{group}.intake-status`.
    pub fn queue_name(group: &str, log: ControlLog) -> String {
        format!("{group}.intake-{}", log.as_str())
    }

    /// The queue this channel appends to and follows.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The stream queue of `log` named `queue`, as every channel of it
    /// declares it (the broker refuses a declaration that differs).
    fn stream_queue(queue: &str, log: ControlLog) -> Queue {
        let mut declared = Queue::classic(queue).argument(
            "x-queue-type",
            AMQPValue::LongString(LongString::from("stream")),
        );
        if let Some(age) = log.retention() {
            declared = declared.argument(
                "x-max-age",
                AMQPValue::LongString(LongString::from(format!("{}s", age.as_secs()))),
            );
        }
        declared
    }

    /// `group`'s `log` on the broker `settings` describe, whose connection
    /// name (if any) the channel's connections are named after. Connects
    /// its publisher once, declaring the queue, so that a wrong password or
    /// a declaration the broker refuses shows here; a broker that cannot be
    /// reached now is not an error (the first append tries again).
    pub(crate) async fn open(
        settings: AmqpSettings,
        group: &str,
        log: ControlLog,
    ) -> Result<Self, Error> {
        if group.is_empty() {
            return Err(ConfigError::new(
                "group",
                "is empty; name the consumer group whose control log this is",
            )
            .into());
        }
        let queue = Self::queue_name(group, log);
        let topology = Topology::new().queue(Self::stream_queue(&queue, log));
        topology.validate()?;
        let part = format!("group {}", log.as_str());
        let checked = settings.check()?;
        let timeout = checked.connect_timeout_or(DEFAULT_CONNECT_TIMEOUT);
        let feed_connection_name = checked
            .connection_name
            .as_ref()
            .map(|name| format!("{name} ({part} feed)"));
        let publisher = AmqpPublisher::builder(settings.for_part(&part))
            .declare(topology.clone())
            .send_timeout(timeout)
            .confirm_timeout(timeout)
            .build()
            .await?;
        Ok(Self {
            log,
            queue: queue.into(),
            topology,
            url: checked.url,
            tls: checked.tls,
            feed_connection_name,
            timeout,
            publisher,
            feeds: Arc::default(),
        })
    }

    /// A channel for a new feed, on the feeds' connection (opened when
    /// there is none or it broke). One caller at a time, so that two
    /// follows do not open two connections.
    async fn feed_channel(&self) -> Result<Channel, Error> {
        let mut kept = self.feeds.lock().await;
        let connection = match kept.take() {
            Some(connection) if connection.status().connected() => connection,
            _ => {
                open_within(
                    &self.url,
                    self.feed_connection_name.as_deref(),
                    &self.tls,
                    self.timeout,
                )
                .await?
            }
        };
        let channel = connection
            .create_channel()
            .await
            .map_err(|error| self.fail(error, Operation::Other))?;
        // Kept only once it proved usable: a connection that cannot open a
        // channel may still look connected.
        *kept = Some(connection);
        Ok(channel)
    }

    fn fail(&self, error: lapin::Error, operation: Operation<'_>) -> Error {
        classify(error, self.url.endpoint(), self.url.vhost(), operation)
    }

    /// Declares the queue and consumes it from its first record.
    async fn open_feed(&self) -> Result<ControlFeed, Error> {
        let channel = self.feed_channel().await?;
        self.topology.declare_on(&channel, &self.url).await?;
        let consuming = Operation::UseQueue(&self.queue);
        channel
            .basic_qos(FEED_PREFETCH, BasicQosOptions { global: false })
            .await
            .map_err(|error| self.fail(error, consuming))?;
        let mut arguments = FieldTable::default();
        arguments.insert(
            short("x-stream-offset"),
            AMQPValue::LongString(LongString::from("first")),
        );
        let consumer = channel
            .basic_consume(
                short(&self.queue),
                short(""),
                BasicConsumeOptions::default(),
                arguments,
            )
            .await
            .map_err(|error| self.fail(error, consuming))?;
        let feed = Feed {
            consumer,
            _channel: channel,
            url: self.url.clone(),
            queue: Arc::clone(&self.queue),
            timeout: self.timeout,
            failure: None,
            ended: false,
        };
        Ok(futures_util::stream::unfold(feed, Feed::next).boxed())
    }
}

/// A publish that failed, as the control channel's error: one the broker
/// did not take for now may succeed later; a refused or closed one will
/// not.
fn publish_failed(error: PublishError) -> ControlError {
    let transient = error.kind() == PublishErrorKind::Unavailable;
    ControlError::from_backend(error, transient)
}

/// One of the backend's errors, classified.
fn backend_failed(error: Error) -> ControlError {
    let transient = error.is_transient();
    ControlError::from_backend(error, transient)
}

impl ControlChannel for AmqpControlChannel {
    fn log(&self) -> ControlLog {
        self.log
    }

    async fn append(&self, record: Bytes) -> Result<(), ControlError> {
        let receipt = self
            .publisher
            .send(Output::new(Arc::clone(&self.queue), record))
            .await
            .map_err(publish_failed)?;
        receipt.await.map_err(publish_failed)?;
        Ok(())
    }

    async fn follow(&self) -> Result<ControlFeed, ControlError> {
        match tokio::time::timeout(self.timeout, self.open_feed()).await {
            Ok(opened) => opened.map_err(backend_failed),
            Err(_elapsed) => Err(ControlError::TimedOut(self.timeout)),
        }
    }
}

/// A feed's consumer, read one record at a time.
struct Feed {
    consumer: Consumer,
    /// Held for the feed's life: a consumer alone does not keep its
    /// connection open, and dropping the last handle closes the channel.
    _channel: Channel,
    url: AmqpUrl,
    queue: Arc<str>,
    timeout: Duration,
    /// Why the feed ends, told after the record read before it.
    failure: Option<ControlError>,
    ended: bool,
}

impl Feed {
    /// The next record (acknowledged), or the error that ends the feed.
    async fn next(mut self) -> Option<(Result<Bytes, ControlError>, Self)> {
        if self.ended {
            return None;
        }
        if let Some(failure) = self.failure.take() {
            self.ended = true;
            return Some((Err(failure), self));
        }
        let item = match self.consumer.next().await {
            Some(Ok(delivery)) => {
                // The acknowledgement is the stream's credit for the next
                // record; a channel that cannot take it ends the feed,
                // after this record.
                let acked = tokio::time::timeout(
                    self.timeout,
                    delivery.acker.ack(BasicAckOptions::default()),
                )
                .await;
                self.failure = match acked {
                    Ok(Ok(_)) => None,
                    Ok(Err(error)) => Some(self.failed(error)),
                    Err(_elapsed) => Some(ControlError::TimedOut(self.timeout)),
                };
                Ok(Bytes::from(delivery.data))
            }
            Some(Err(error)) => {
                self.ended = true;
                Err(self.failed(error))
            }
            None => {
                self.ended = true;
                Err(backend_failed(Error::Broker {
                    endpoint: self.url.endpoint().to_owned(),
                    source: format!(
                        "the broker cancelled the consumer of queue `{}`, or its channel closed",
                        self.queue
                    )
                    .into(),
                }))
            }
        };
        Some((item, self))
    }

    fn failed(&self, error: lapin::Error) -> ControlError {
        backend_failed(classify(
            error,
            self.url.endpoint(),
            self.url.vhost(),
            Operation::UseQueue(&self.queue),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_logs_are_stream_queues_named_after_the_group() {
        assert_eq!(
            AmqpControlChannel::queue_name("billing", ControlLog::Commands),
            "billing.intake-control"
        );
        assert_eq!(
            AmqpControlChannel::queue_name("billing", ControlLog::Status),
            "billing.intake-status"
        );
        let commands = AmqpControlChannel::stream_queue("c", ControlLog::Commands).arguments();
        let status = AmqpControlChannel::stream_queue("s", ControlLog::Status).arguments();
        for table in [&commands, &status] {
            assert_eq!(
                table.inner().get("x-queue-type"),
                Some(&AMQPValue::LongString("stream".into()))
            );
        }
        assert_eq!(commands.inner().get("x-max-age"), None);
        assert_eq!(
            status.inner().get("x-max-age"),
            Some(&AMQPValue::LongString("3600s".into()))
        );
    }

    #[tokio::test]
    async fn an_empty_group_is_refused_without_its_password() {
        let settings = AmqpSettings::new("amqp://app:hunter2@127.0.0.1:1/%2f");
        let error = AmqpControlChannel::open(settings, "", ControlLog::Commands)
            .await
            .expect_err("refused");
        assert!(matches!(error, Error::Config(_)), "{error:?}");
        assert!(!format!("{error} {error:?}").contains("hunter2"));
    }
}
