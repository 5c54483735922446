//! One record at a time to any backend, with its raw client, each confirmed
//! by the broker before the next: the upstream that the `service` example
//! simulates for its own routes. (Bulk producers that keep thousands of
//! records unconfirmed, for load, are the ledger's.)
//!
//! Included with `#[path = "support/producer.rs"] mod producer;`.

use intake::memory::{MemoryBroker, Record};

/// What may go wrong while producing.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A producer for one broker. `send(destination, key, payload)` means on
/// each: a memory topic and the record key; a Kafka topic and the record
/// key; a Redis stream and the entry's `key` field (the payload in
/// `payload`); an AMQP exchange and the routing key; on NATS JetStream the
/// subject `<destination>.<key>` (the source's key is the subject).
pub enum Producer {
    /// The in-memory broker.
    Memory(MemoryBroker),
    /// A Kafka producer (`acks=all`).
    #[cfg(feature = "kafka")]
    Kafka(intake::kafka::rdkafka::producer::FutureProducer),
    /// A Redis connection.
    #[cfg(feature = "redis")]
    Redis(intake::redis_streams::redis::aio::MultiplexedConnection),
    /// An AMQP channel in confirm mode, and its connection.
    #[cfg(feature = "amqp")]
    Amqp {
        /// Kept open while the channel is used (boxed: it is large).
        connection: Box<intake::amqp::lapin::Connection>,
        /// The channel publishes go to.
        channel: intake::amqp::lapin::Channel,
    },
    /// A JetStream context (boxed: it is large).
    #[cfg(feature = "nats")]
    Nats(Box<intake::nats::async_nats::jetstream::Context>),
}

impl Producer {
    /// A Kafka producer for `bootstrap` that waits for every replica.
    #[cfg(feature = "kafka")]
    pub fn kafka(bootstrap: &str) -> Result<Self, BoxError> {
        let settings = intake::kafka::KafkaSettings::new(bootstrap)
            .set("acks", "all")
            .set("linger.ms", "1");
        let config = intake::kafka::rdkafka::ClientConfig::clone(settings.client_config());
        Ok(Producer::Kafka(config.create()?))
    }

    /// A Redis producer on one multiplexed connection.
    #[cfg(feature = "redis")]
    pub async fn redis(url: &str) -> Result<Self, BoxError> {
        let client = intake::redis_streams::redis::Client::open(url)?;
        Ok(Producer::Redis(
            client.get_multiplexed_async_connection().await?,
        ))
    }

    /// An AMQP producer with publisher confirms.
    #[cfg(feature = "amqp")]
    pub async fn amqp(url: &str) -> Result<Self, BoxError> {
        use intake::amqp::lapin::options::ConfirmSelectOptions;
        use intake::amqp::lapin::{Connection, ConnectionProperties};

        let connection = Connection::connect(url, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Producer::Amqp {
            connection: Box::new(connection),
            channel,
        })
    }

    /// A JetStream producer (each publish acknowledged by the stream).
    #[cfg(feature = "nats")]
    pub async fn nats(url: &str) -> Result<Self, BoxError> {
        use intake::nats::async_nats;

        let client = async_nats::connect(url).await?;
        Ok(Producer::Nats(Box::new(async_nats::jetstream::new(client))))
    }

    /// Sends one record and waits until the broker confirmed it.
    pub async fn send(
        &mut self,
        destination: &str,
        key: &str,
        payload: &str,
    ) -> Result<(), BoxError> {
        match self {
            Producer::Memory(broker) => {
                broker.send(
                    destination,
                    Record::new(payload.to_owned()).with_key(key.to_owned()),
                )?;
            }
            #[cfg(feature = "kafka")]
            Producer::Kafka(producer) => {
                use intake::kafka::rdkafka::producer::FutureRecord;
                producer
                    .send(
                        FutureRecord::to(destination).key(key).payload(payload),
                        std::time::Duration::from_secs(10),
                    )
                    .await
                    .map_err(|(error, _)| error)?;
            }
            #[cfg(feature = "redis")]
            Producer::Redis(connection) => {
                let _id: String = intake::redis_streams::redis::cmd("XADD")
                    .arg(destination)
                    .arg("*")
                    .arg("payload")
                    .arg(payload)
                    .arg("key")
                    .arg(key)
                    .query_async(connection)
                    .await?;
            }
            #[cfg(feature = "amqp")]
            Producer::Amqp { channel, .. } => {
                use intake::amqp::lapin::BasicProperties;
                use intake::amqp::lapin::options::BasicPublishOptions;

                let confirmation = channel
                    .basic_publish(
                        destination.into(),
                        key.into(),
                        BasicPublishOptions {
                            mandatory: true,
                            ..BasicPublishOptions::default()
                        },
                        payload.as_bytes(),
                        BasicProperties::default()
                            .with_content_type("application/json".into())
                            .with_delivery_mode(2),
                    )
                    .await?
                    .await?;
                if !confirmation.is_ack() {
                    return Err(format!("{destination} refused a record (nack)").into());
                }
                if confirmation.take_message().is_some() {
                    return Err(format!("{destination} routed a record to no queue").into());
                }
            }
            #[cfg(feature = "nats")]
            Producer::Nats(context) => {
                context
                    .publish(format!("{destination}.{key}"), payload.to_owned().into())
                    .await?
                    .await?;
            }
        }
        Ok(())
    }

    /// Closes what needs closing (an AMQP connection).
    pub async fn close(self) {
        #[cfg(feature = "amqp")]
        if let Producer::Amqp { connection, .. } = self {
            let _ = connection.close(200, "produced".into()).await;
        }
        #[cfg(not(feature = "amqp"))]
        drop(self);
    }
}
