//! [`AmqpLagProbe`]: a queue's depth, and its parked backlog, from passive
//! `queue.declare`s.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use intake_core::PartitionKey;
use intake_core::lag::{DEFAULT_LAG_TIMEOUT, LagError, LagProbe, ParkedTier, PartitionLag};
use lapin::Connection;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use tokio::sync::Mutex;

use crate::connection::open_within;
use crate::error::{Error, Operation, classify};
use crate::parking::holding_queues;
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
/// ([`AmqpSource::lag_probe`](crate::AmqpSource::lag_probe)), from a
/// broker ([`AmqpBroker::lag_probe`](crate::AmqpBroker), which counts the
/// parked backlog too) or with [`AmqpLagProbe::new`].
///
/// # Parked backlog
///
/// Messages an [`AmqpParking`](crate::AmqpParking) parked wait in wait
/// queues of their own (their originals are acknowledged), where the
/// queue's depth does not show them. A probe told the parking's tiers
/// ([`parking_tiers`](Self::parking_tiers)) counts them as
/// [`parked`](LagProbe::parked): the ready messages of each tier's wait
/// queue, of the step queue and of the relay queue, one passive
/// `queue.declare` each, concurrently on channels of the probe's
/// connection. A wait queue that does not exist (not used yet, or expired
/// when idle) holds none. Without tiers, `parked` is `None`: the probe
/// does not know where the queue's parking waits.
#[derive(Clone)]
pub struct AmqpLagProbe {
    url: AmqpUrl,
    tls: Tls,
    connection_name: Option<String>,
    queue: Arc<str>,
    /// The queues holding the queue's parked copies, when known.
    parked_in: Option<Arc<[String]>>,
    connection: Arc<Mutex<Option<Connection>>>,
    timeout: Duration,
}

impl std::fmt::Debug for AmqpLagProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpLagProbe")
            .field("url", &self.url)
            .field("queue", &self.queue)
            .field("parked_in", &self.parked_in)
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
            parked_in: None,
            connection: Arc::new(Mutex::new(None)),
            timeout: DEFAULT_LAG_TIMEOUT,
        }
    }

    /// The longest a query may take, connecting included.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Counts as [parked](LagProbe::parked) the messages waiting for the
    /// queue's [`AmqpParking`](crate::AmqpParking) with these `tiers`
    /// ([`AmqpParking::DEFAULT_TIERS`](crate::AmqpParking::DEFAULT_TIERS)
    /// for a parking built with the default ones): in each tier's wait
    /// queue, the step queue of the longest tier and the relay queue (see
    /// the [type docs](Self)). Tiers no parking can have (zero, beyond 30
    /// days) are left out.
    pub fn parking_tiers(mut self, tiers: impl IntoIterator<Item = Duration>) -> Self {
        let tiers: Vec<Duration> = tiers.into_iter().collect();
        self.parked_in = Some(holding_queues(&self.queue, &tiers).into());
        self
    }

    /// Counts as parked the messages of these `queues` (a broker's union of
    /// the parkings it derived for the queue).
    pub(crate) fn parked_in(mut self, queues: Vec<String>) -> Self {
        self.parked_in = Some(queues.into());
        self
    }

    /// The ready messages of the probed queue.
    async fn query(&self) -> Result<u64, Error> {
        let mut kept = self.connected().await?;
        let ready = match kept.as_ref() {
            Some(connection) => self.ready(connection, &self.queue, false).await,
            None => Err(self.gone()),
        };
        if let Err(error) = &ready
            && !matches!(error, Error::QueueNotFound { .. })
        {
            // Reconnect at the next query: a connection that cannot open a
            // channel may look connected and still be of no use. A missing
            // queue closes only its channel.
            *kept = None;
        }
        Ok(ready?.unwrap_or(0))
    }

    /// The probe's connection, opened if need be. One caller at a time: the
    /// lock keeps a second caller from opening a second connection while
    /// the first connects.
    async fn connected(&self) -> Result<tokio::sync::MutexGuard<'_, Option<Connection>>, Error> {
        let mut kept = self.connection.lock().await;
        if !kept.as_ref().is_some_and(|open| open.status().connected()) {
            *kept = None;
            let name = self
                .connection_name
                .as_ref()
                .map(|name| format!("{name} (lag)"));
            let open = open_within(&self.url, name.as_deref(), &self.tls, self.timeout).await?;
            *kept = Some(open);
        }
        Ok(kept)
    }

    fn gone(&self) -> Error {
        Error::Broker {
            endpoint: self.url.endpoint().to_owned(),
            source: "the lag probe's connection is gone".into(),
        }
    }

    /// The ready messages of `queue`, from a passive declare on a channel
    /// of its own. A queue that does not exist is `None` where
    /// `missing_is_none`, else [`Error::QueueNotFound`].
    async fn ready(
        &self,
        connection: &Connection,
        queue: &str,
        missing_is_none: bool,
    ) -> Result<Option<u64>, Error> {
        let fail = |error| {
            classify(
                error,
                self.url.endpoint(),
                self.url.vhost(),
                Operation::UseQueue(queue),
            )
        };
        let channel = connection.create_channel().await.map_err(fail)?;
        // A missing queue closes the channel (404), not the connection.
        let declared = channel
            .queue_declare(
                short(queue),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(fail);
        let declared = match declared {
            Ok(declared) => declared,
            Err(Error::QueueNotFound { .. }) if missing_is_none => return Ok(None),
            Err(error) => return Err(error),
        };
        if channel.status().connected() {
            // Best effort: the broker reclaims the channel with the
            // connection anyway.
            let _ = channel.close(200, "lag probed".into()).await;
        }
        Ok(Some(u64::from(declared.message_count())))
    }

    /// The ready messages of every queue in `queues`, concurrently; a
    /// missing one holds none.
    /// The messages in each of `queues`, in their order.
    async fn count_parked(&self, queues: &[String]) -> Result<Vec<u64>, Error> {
        let mut kept = self.connected().await?;
        let Some(connection) = kept.as_ref() else {
            return Err(self.gone());
        };
        let counts = join_all(
            queues
                .iter()
                .map(|queue| self.ready(connection, queue, true)),
        )
        .await;
        let mut parked = Vec::with_capacity(counts.len());
        for count in counts {
            match count {
                Ok(count) => parked.push(count.unwrap_or(0)),
                Err(error) => {
                    *kept = None;
                    return Err(error);
                }
            }
        }
        Ok(parked)
    }

    /// Each holding queue's name and count, within the timeout; `None`
    /// when the probe does not know the parking's queues.
    async fn parked_per_queue(&self) -> Result<Option<Vec<(&str, u64)>>, LagError> {
        let Some(queues) = &self.parked_in else {
            return Ok(None);
        };
        match tokio::time::timeout(self.timeout, self.count_parked(queues)).await {
            Err(_) => Err(LagError::TimedOut(self.timeout)),
            Ok(Ok(counts)) => Ok(Some(
                queues.iter().map(String::as_str).zip(counts).collect(),
            )),
            Ok(Err(error)) => {
                let transient = error.is_transient();
                Err(LagError::from_backend(error, transient))
            }
        }
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

    /// The messages waiting in the parking's wait, step and relay queues,
    /// when the probe knows its tiers ([`parking_tiers`](Self::parking_tiers),
    /// or derived from an [`AmqpBroker`](crate::AmqpBroker)); else `None`.
    async fn parked(&self) -> Result<Option<u64>, LagError> {
        Ok(self.parked_tiers().await?.as_deref().map(ParkedTier::total))
    }

    /// The same per holding queue, named by what follows `{queue}.wait.`
    /// (`1000ms`, `hop.500ms`); a message's due time is its per-queue TTL's
    /// business in RabbitMQ, not readable without taking the message.
    async fn parked_tiers(&self) -> Result<Option<Vec<ParkedTier>>, LagError> {
        let prefix = format!("{}.wait.", self.queue);
        Ok(self.parked_per_queue().await?.map(|queues| {
            queues
                .into_iter()
                .map(|(name, messages)| {
                    ParkedTier::new(name.strip_prefix(&prefix).unwrap_or(name), messages)
                })
                .collect()
        }))
    }
}
