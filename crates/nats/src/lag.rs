//! [`NatsLagProbe`]: a JetStream consumer's lag, from its consumer info.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::context::ConsumerInfoErrorKind;
use intake_core::PartitionKey;
use intake_core::lag::{DEFAULT_LAG_TIMEOUT, LagError, LagProbe, PartitionLag};

use crate::error::{Error, boxed};

/// Reports a JetStream consumer's lag on its stream (partition 0 of the
/// stream), from `CONSUMER.INFO`: `num_pending` (messages of the consumer's
/// subjects not yet delivered) plus `num_ack_pending` (delivered and not
/// acknowledged). The server tells no ages.
///
/// Parked messages are in that count and have none of their own:
/// [`parked`](LagProbe::parked) is `None` (why is on its implementation).
///
/// Get one from a source ([`NatsSource::lag_probe`](crate::NatsSource::lag_probe),
/// on the source's client), from a [`NatsBroker`](crate::NatsBroker)
/// ([`Broker::lag_probe`](intake_core::backend::Broker::lag_probe)), or
/// with [`NatsLagProbe::new`] on a client of your own. Every query is bounded by [`timeout`](Self::timeout) (5 s by
/// default).
#[derive(Clone)]
pub struct NatsLagProbe {
    client: async_nats::Client,
    endpoint: Arc<str>,
    stream: Arc<str>,
    consumer: Arc<str>,
    timeout: Duration,
}

impl std::fmt::Debug for NatsLagProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsLagProbe")
            .field("endpoint", &self.endpoint)
            .field("stream", &self.stream)
            .field("consumer", &self.consumer)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl NatsLagProbe {
    /// A probe of durable `consumer` on `stream`, through `client`.
    /// `endpoint` names the server in errors: give it without credentials.
    pub fn new(client: async_nats::Client, endpoint: &str, stream: &str, consumer: &str) -> Self {
        Self {
            client,
            endpoint: endpoint.into(),
            stream: stream.into(),
            consumer: consumer.into(),
            timeout: DEFAULT_LAG_TIMEOUT,
        }
    }

    pub(crate) fn of_source(
        client: async_nats::Client,
        endpoint: Arc<str>,
        stream: &str,
        consumer: &str,
    ) -> Self {
        Self {
            client,
            endpoint,
            stream: stream.into(),
            consumer: consumer.into(),
            timeout: DEFAULT_LAG_TIMEOUT,
        }
    }

    /// The longest a query may take.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    async fn query(&self) -> Result<u64, Error> {
        let operation = || format!("consumer info of `{}` on `{}`", self.consumer, self.stream);
        let context = async_nats::jetstream::new(self.client.clone());
        let stream = context
            .get_stream_no_info(&*self.stream)
            .await
            .map_err(|error| Error::JetStream {
                endpoint: self.endpoint.to_string(),
                operation: operation(),
                transient: false,
                source: boxed(error),
            })?;
        let info = stream
            .consumer_info(&*self.consumer)
            .await
            .map_err(|error| {
                let transient = matches!(
                    error.kind(),
                    ConsumerInfoErrorKind::Offline
                        | ConsumerInfoErrorKind::Request
                        | ConsumerInfoErrorKind::TimedOut
                        | ConsumerInfoErrorKind::NoResponders
                );
                Error::JetStream {
                    endpoint: self.endpoint.to_string(),
                    operation: operation(),
                    transient,
                    source: boxed(error),
                }
            })?;
        Ok(info.num_pending.saturating_add(info.num_ack_pending as u64))
    }
}

impl LagProbe for NatsLagProbe {
    fn group(&self) -> &str {
        &self.consumer
    }

    async fn lag(&self) -> Result<Vec<PartitionLag>, LagError> {
        match tokio::time::timeout(self.timeout, self.query()).await {
            Err(_) => Err(LagError::TimedOut(self.timeout)),
            Ok(Ok(messages)) => Ok(vec![PartitionLag::new(
                PartitionKey::new(&*self.stream, 0),
                Some(messages),
            )]),
            Ok(Err(error)) => {
                let transient = error.is_transient();
                Err(LagError::from_backend(error, transient))
            }
        }
    }

    /// `None`: on NATS a parked message is no backlog beside the
    /// consumer's, and nothing can tell it apart there. A park
    /// ([`NatsParking`](crate::NatsParking)) waits in the process that
    /// made it, still delivered and unacknowledged; one past the room goes
    /// back to the server with a delayed `-NAK`, unacknowledged until due
    /// too. Either way the consumer's `num_ack_pending` holds it, so
    /// [`lag`](LagProbe::lag) counts it already, beside the messages being
    /// handled. The parks of one process are known to its source
    /// ([`NatsSource::parked_waiting`](crate::NatsSource::parked_waiting)),
    /// but counting them here would count them twice and miss every other
    /// instance's (a probe in another process, `intake lag`, sees none).
    async fn parked(&self) -> Result<Option<u64>, LagError> {
        Ok(None)
    }
}
