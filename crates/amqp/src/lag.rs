//! [`AmqpLagProbe`]: a queue's depth, from a passive `queue.declare`.

use std::sync::Arc;
use std::time::Duration;

use intake_core::PartitionKey;
use intake_core::lag::{DEFAULT_LAG_TIMEOUT, LagError, LagProbe, PartitionLag};
use lapin::Connection;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use tokio::sync::Mutex;

use crate::connection::open_within;
use crate::error::{Error, Operation, classify};
use crate::tls::Tls;
use crate::topology::short;
use crate::url::AmqpUrl;

/// Reports a queue's depth as its broker-side lag (partition 0 of the
/// queue): the `message_count` of a passive `queue.declare`, which is
/// RabbitMQ's `messages_ready`, the messages no consumer holds.
///
/// AMQP 0-9-1 has no command that tells a queue's *unacknowledged*
/// deliveries (RabbitMQ's `messages_unacknowledged` is in the management
/// API only), so messages delivered to a consumer and not yet acknowledged
/// are not counted: they come back into the count when their channel
/// closes. The count is what the queue would still hand out, a lower bound
/// of what the consumers have not finished. The broker tells no ages.
///
/// The probe opens a connection of its own (named `<name> (lag)` when the
/// source has a name), at its first query and again after a failure, and a
/// channel per query; every query, connecting included, is bounded by
/// [`timeout`](Self::timeout) (5 s by default). Get one from a source
/// ([`AmqpSource::lag_probe`](crate::AmqpSource::lag_probe)) or with
/// [`AmqpLagProbe::new`].
#[derive(Clone)]
pub struct AmqpLagProbe {
    url: AmqpUrl,
    tls: Tls,
    connection_name: Option<String>,
    queue: Arc<str>,
    connection: Arc<Mutex<Option<Connection>>>,
    timeout: Duration,
}

impl std::fmt::Debug for AmqpLagProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpLagProbe")
            .field("url", &self.url)
            .field("queue", &self.queue)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl AmqpLagProbe {
    /// A probe of `queue` at `url`, without TLS client settings (an
    /// `amqps://` URL uses the system's roots). It connects at its first
    /// query.
    ///
    /// # Errors
    ///
    /// A URL that does not parse ([`Error::InvalidUrl`], password
    /// redacted).
    pub fn new(url: &str, queue: &str) -> Result<Self, Error> {
        Ok(Self::with_settings(
            AmqpUrl::parse(url)?,
            Tls::default(),
            None,
            queue,
        ))
    }

    pub(crate) fn with_settings(
        url: AmqpUrl,
        tls: Tls,
        connection_name: Option<String>,
        queue: &str,
    ) -> Self {
        Self {
            url,
            tls,
            connection_name,
            queue: queue.into(),
            connection: Arc::new(Mutex::new(None)),
            timeout: DEFAULT_LAG_TIMEOUT,
        }
    }

    /// The longest a query may take, connecting included.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    async fn query(&self) -> Result<u64, Error> {
        let fail = |error| {
            classify(
                error,
                self.url.endpoint(),
                self.url.vhost(),
                Operation::UseQueue(&self.queue),
            )
        };
        // One query at a time: the lock keeps a second caller from opening
        // a second connection while the first connects.
        let mut kept = self.connection.lock().await;
        let open = match kept.take() {
            Some(open) if open.status().connected() => open,
            _ => {
                let name = self
                    .connection_name
                    .as_ref()
                    .map(|name| format!("{name} (lag)"));
                open_within(&self.url, name.as_deref(), &self.tls, self.timeout).await?
            }
        };
        // A connection that cannot open a channel is not put back: the next
        // query connects anew.
        let channel = open.create_channel().await.map_err(fail)?;
        *kept = Some(open);
        drop(kept);
        // A missing queue closes the channel (404), not the connection.
        let declared = channel
            .queue_declare(
                short(&self.queue),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(fail)?;
        if channel.status().connected() {
            // Best effort: the broker reclaims the channel with the
            // connection anyway.
            let _ = channel.close(200, "lag probed".into()).await;
        }
        Ok(u64::from(declared.message_count()))
    }
}

impl LagProbe for AmqpLagProbe {
    fn group(&self) -> &str {
        &self.queue
    }

    async fn lag(&self) -> Result<Vec<PartitionLag>, LagError> {
        match tokio::time::timeout(self.timeout, self.query()).await {
            Err(_) => Err(LagError::TimedOut(self.timeout)),
            Ok(Ok(ready)) => Ok(vec![PartitionLag::new(
                PartitionKey::new(&*self.queue, 0),
                Some(ready),
            )]),
            Ok(Err(error)) => {
                let transient = error.is_transient();
                Err(LagError::from_backend(error, transient))
            }
        }
    }
}
