//! The conformance fixture for the in-memory broker.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{Backend, Capabilities, ConnectSettings, TestMessage};
use crate::dead_letter::{Broker, DeadLetter};
use crate::error::BoxError;
use crate::memory::{MemoryAcker, MemoryBroker, MemoryDeadLetterSink, MemorySource, Record};

/// Runs the conformance suite on a [`MemoryBroker`].
///
/// ```
/// use intake_core::backend::testkit::Backend;
/// use intake_core::backend::testkit::memory_backend::MemoryBackend;
///
/// let backend = MemoryBackend::new();
/// assert_eq!(backend.name(), "memory");
/// ```
#[derive(Debug, Default)]
pub struct MemoryBackend {
    broker: MemoryBroker,
    next_topic: AtomicU64,
}

impl MemoryBackend {
    /// A fixture over a fresh broker with default settings.
    pub fn new() -> Self {
        Self::with_broker(MemoryBroker::new())
    }

    /// A fixture over `broker` (for a shorter rebalance timeout, say).
    pub fn with_broker(broker: MemoryBroker) -> Self {
        Self {
            broker,
            next_topic: AtomicU64::new(0),
        }
    }

    /// The broker under test, for inspection and fault injection.
    pub fn broker(&self) -> &MemoryBroker {
        &self.broker
    }
}

#[async_trait::async_trait]
impl Backend for MemoryBackend {
    type Source = MemorySource;
    type Acker = MemoryAcker;
    type Sink = MemoryDeadLetterSink;

    fn name(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            broker: Broker::Memory,
            partitions: true,
            shared_groups: true,
            crash_redelivery_after: Duration::ZERO,
            key_order_through_crashes: true,
        }
    }

    async fn create_source(&self, partitions: u32) -> Result<String, BoxError> {
        let topic = format!(
            "conformance-{}",
            self.next_topic.fetch_add(1, Ordering::Relaxed)
        );
        self.broker.create_topic(&topic, partitions)?;
        Ok(topic)
    }

    async fn produce(&self, source: &str, messages: Vec<TestMessage>) -> Result<(), BoxError> {
        let records = messages.into_iter().map(|message| {
            Record::new(message.payload)
                .with_optional_key(message.key)
                .with_headers(message.headers)
        });
        self.broker.send_batch(source, records)?;
        Ok(())
    }

    async fn connect(
        &self,
        source: &str,
        group: &str,
        _settings: ConnectSettings,
    ) -> Result<(Self::Source, Self::Acker), BoxError> {
        // The memory broker has no prefetch to size: a fetch takes what the
        // runtime asks for.
        Ok(self.broker.consumer(source, group)?)
    }

    /// A group of the instance's own, as Kafka's broadcast mode does: the
    /// memory broker delivers every message to every group.
    async fn connect_broadcast(
        &self,
        source: &str,
        _settings: ConnectSettings,
    ) -> Option<Result<(Self::Source, Self::Acker), BoxError>> {
        let group = super::harness::unique_group("broadcast");
        Some(self.broker.consumer(source, &group).map_err(Into::into))
    }

    async fn dead_letter_sink(&self, source: &str, group: &str) -> Result<Self::Sink, BoxError> {
        Ok(self.broker.dead_letter_sink(source, group)?)
    }

    async fn dead_letters(&self, source: &str, group: &str) -> Result<Vec<DeadLetter>, BoxError> {
        Ok(self.broker.dead_letters(source, group)?)
    }

    async fn unacknowledged(&self, source: &str, group: &str) -> Result<u64, BoxError> {
        Ok(self.broker.lag(source, group)?)
    }
}

#[async_trait::async_trait]
impl super::PublishingBackend for MemoryBackend {
    type Publisher = crate::memory::MemoryPublisher;

    async fn publisher(&self) -> Result<Self::Publisher, BoxError> {
        Ok(self.broker.memory_publisher())
    }

    fn destination(&self, source: &str) -> String {
        source.to_owned()
    }
}

impl super::broker::BrokerBackend for MemoryBackend {
    type Broker = MemoryBroker;

    fn broker(&self) -> MemoryBroker {
        self.broker.clone()
    }
}

#[async_trait::async_trait]
impl super::control_channel::ControlBackend for MemoryBackend {
    type Channel = crate::memory::MemoryControlChannel;

    async fn control_channel(
        &self,
        group: &str,
        log: crate::group_control::ControlLog,
    ) -> Result<Self::Channel, BoxError> {
        Ok(self.broker().group_control_channel(group, log))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acker::{AckBatch, Acker, PartitionAck};
    use crate::dead_letter::DeadLetterSink;
    use crate::source::{Source, SourceEvent};

    #[tokio::test]
    async fn the_fixture_round_trips_produce_consume_commit_and_dead_letters() {
        let backend = MemoryBackend::new();
        let topic = backend.create_source(2).await.expect("topic");
        assert_ne!(
            backend.create_source(2).await.expect("topic"),
            topic,
            "names are unique"
        );
        backend
            .produce(
                &topic,
                vec![
                    TestMessage::new("k", "hello"),
                    TestMessage::new("k", "again"),
                ],
            )
            .await
            .expect("produce");
        assert_eq!(backend.unacknowledged(&topic, "g").await.expect("lag"), 2);

        let settings = ConnectSettings { max_in_flight: 8 };
        let (mut source, mut acker) = backend
            .connect(&topic, "g", settings)
            .await
            .expect("connect");
        let mut buf = Vec::new();
        assert!(matches!(
            source.next(&mut buf, 8).await,
            Ok(SourceEvent::Assigned(_))
        ));
        assert!(matches!(
            source.next(&mut buf, 8).await,
            Ok(SourceEvent::Delivered)
        ));
        assert_eq!(buf.len(), 2);

        let sink = backend.dead_letter_sink(&topic, "g").await.expect("sink");
        sink.write(&DeadLetter::new(buf[0].clone(), "boom", 2))
            .await
            .expect("write");
        let last = &buf[1];
        let mut done = PartitionAck::new(last.metadata().partition_key());
        done.watermark = Some(last.metadata().position());
        acker
            .ack(&AckBatch {
                partitions: vec![done],
                sync: true,
            })
            .await
            .expect("commit");
        assert_eq!(backend.unacknowledged(&topic, "g").await.expect("lag"), 0);

        let letters = backend
            .dead_letters(&topic, "g")
            .await
            .expect("dead letters");
        assert_eq!(letters.len(), 1);
        let letter = &letters[0];
        assert_eq!(letter.message.payload(), "hello");
        assert_eq!(
            (
                &**letter.message.metadata().source(),
                letter.message.metadata().partition(),
                letter.message.metadata().position()
            ),
            (
                topic.as_str(),
                buf[0].metadata().partition(),
                crate::message::Position::Offset(0)
            )
        );
        assert_eq!((letter.error.as_str(), letter.attempts), ("boom", 2));
    }
}
