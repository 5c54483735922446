//! [`AmqpBroker`]: a RabbitMQ connection's settings, given once, and every
//! part of a route derived from them.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::join_all;
use intake_core::backend::{Broker, RouteAddress, RouteOptions, RouteParts, Source};
use lapin::Connection;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;

use crate::connection::{DEFAULT_CONNECT_TIMEOUT, open_within};
use crate::error::{Error, Operation, classify};
use crate::parking::holding_queues;
use crate::tls::Tls;
use crate::topology::{Queue, Topology, short};
use crate::url::AmqpUrl;
use crate::{
    AmqpAcker, AmqpDeadLetterSink, AmqpDeadLetterStore, AmqpLagProbe, AmqpParking, AmqpPublisher,
    AmqpSource,
};

/// How long closing a connection used only to declare may take.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// A RabbitMQ broker: its URL, TLS settings and connection name, given
/// once, from which every part of a route is derived with the shapes of
/// [`Broker`] (the same on every intake backend).
///
/// | part | derived as |
/// |---|---|
/// | source, acker | an [`AmqpSource`] of the route's queue and its [`AmqpAcker`] |
/// | dead-letter sink | an [`AmqpDeadLetterSink`] to the queue `{queue}.dlq` through the default exchange |
/// | parking | an [`AmqpParking`] of the route's queue, with the tiers of the [`RouteOptions`] |
/// | publisher | one [`AmqpPublisher`], shared, that [routes by key](crate::AmqpPublisherBuilder::route_by_key) |
/// | dead-letter store | an [`AmqpDeadLetterStore`] of `{queue}.dlq` |
/// | lag probe | an [`AmqpLagProbe`] of the queue that also counts its parked backlog |
///
/// # Addresses: the queue is the group
///
/// A [`RouteAddress`]'s source is the queue the route consumes, which must
/// exist (declare it with [`Topology::declare`] or your broker's tools).
/// Consumers of one queue share its messages, so on RabbitMQ the queue
/// *is* the group: its dead letters, parked copies and lag belong to the
/// queue, whichever group reads it. The group names the route's
/// connections, as `rabbitmqctl list_connections client_properties` and
/// the management UI show them: `{group}`, or `{name}/{group}` with a
/// [connection name](Self::connection_name), with ` (dead letters)`,
/// ` (parking)`, ` (parking declarations)`, ` (parking relay)`,
/// ` (declarations)` and ` (lag)` appended for the parts' own connections.
///
/// # Dead letters
///
/// A route's dead letters go to the queue `{queue}.dlq`
/// ([`dead_letter_queue`](Self::dead_letter_queue)) through the default
/// exchange, each a copy with its origin and error, confirmed by the broker
/// before the original is acknowledged. [`route`](Broker::route) declares
/// that queue, durable and classic, when it does not exist (one that
/// exists is used as it is): classic, because the
/// [`AmqpDeadLetterStore`] puts back every letter it looks at, which a
/// quorum queue would count towards a delivery limit.
/// [`dead_letter_store`](Broker::dead_letter_store) reads the same queue
/// and redrives through the default exchange to the letter's origin queue.
///
/// # Parking
///
/// A route derived with [`RouteOptions::parking`] gets an [`AmqpParking`]
/// of its queue: a parked copy waits in a wait queue of its tier and comes
/// back into the route's queue through `{queue}.wait.return`, where the
/// route's source reads it; nothing else needs wiring. Without tiers in the
/// options it parks at [`AmqpParking::DEFAULT_TIERS`]. The broker keeps
/// every parking it derived, and [`shutdown`](Broker::shutdown) stops them
/// (their relays and connections; what is parked stays parked).
///
/// The [lag probe](Broker::lag_probe) counts as parked the messages
/// waiting in the wait, step and relay queues of every parking this
/// broker derived for the queue, or, when it derived none, of a parking
/// with the default tiers (see [`AmqpLagProbe::parking_tiers`] for other
/// tiers).
///
/// # Credentials
///
/// The URL's password never shows: `Debug`, errors and logs name the
/// endpoint without it (`amqp://guest@127.0.0.1:5672/%2f`).
///
/// # Clones
///
/// Clones share what the broker keeps (its parkings, its publisher), so a
/// clone's [`shutdown`](Broker::shutdown) stops the parts every clone
/// derived. A setter called on a clone changes the parts derived from it
/// afterwards, not those derived before.
///
/// ```no_run
/// use std::time::Duration;
/// use intake_amqp::AmqpBroker;
/// use intake_core::backend::{Broker, RouteAddress, RouteOptions};
///
/// # async fn run() -> Result<(), intake_amqp::Error> {
/// let broker = AmqpBroker::new("amqp://guest:guest@127.0.0.1:5672/%2f")?
///     .connection_name("billing");
/// let address = RouteAddress::new("payments", "billing");
/// let parts = broker
///     .route(&address, &RouteOptions::new().parking_tiers([Duration::from_secs(2)]))
///     .await?;
/// let _probe = broker.lag_probe(&address).await?;
/// # drop(parts);
/// broker.shutdown(Duration::from_secs(10)).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct AmqpBroker {
    /// As given, credentials included: handed to the builders, never
    /// printed.
    url: Arc<str>,
    parsed: AmqpUrl,
    tls: Tls,
    connection_name: Option<String>,
    kept: Arc<Kept>,
}

/// What a broker keeps of the parts it derived, shared by its clones.
#[derive(Default)]
struct Kept {
    /// Every parking derived, for [`Broker::shutdown`].
    parkings: Mutex<Vec<AmqpParking>>,
    /// By queue: where the parkings derived for it hold their copies, for
    /// the lag probes.
    holding: Mutex<HashMap<String, BTreeSet<String>>>,
    /// The publisher, made at the first [`Broker::publisher`].
    publisher: tokio::sync::Mutex<Option<AmqpPublisher>>,
}

impl fmt::Debug for AmqpBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parkings = self
            .kept
            .parkings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        f.debug_struct("AmqpBroker")
            .field("endpoint", &self.parsed.endpoint())
            .field("tls", &self.tls)
            .field("connection_name", &self.connection_name)
            .field("parkings", &parkings)
            .finish_non_exhaustive()
    }
}

impl AmqpBroker {
    /// The broker at `url` (`amqp://user:password@host:5672/vhost`, or
    /// `amqps://` for TLS; the default vhost `/` is written `%2f`; query
    /// parameters such as `heartbeat` are passed to the broker, as by
    /// [`AmqpSource::builder`]). Nothing is sent until a part is derived.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for a URL that does not parse (shown
    /// redacted).
    pub fn new(url: impl Into<String>) -> Result<Self, Error> {
        let url: String = url.into();
        let parsed = AmqpUrl::parse(&url)?;
        Ok(Self {
            url: url.into(),
            parsed,
            tls: Tls::new(),
            connection_name: None,
            kept: Arc::default(),
        })
    }

    /// The broker at `url`; the same as [`new`](Self::new).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for a URL that does not parse (shown
    /// redacted).
    pub fn from_url(url: &str) -> Result<Self, Error> {
        Self::new(url)
    }

    /// TLS beyond the defaults for an `amqps://` URL (a private CA, a
    /// client certificate; see [`Tls`]), for every part derived from now
    /// on. Checked when a part is derived.
    #[must_use]
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = tls;
        self
    }

    /// Names the connections of every part derived from now on (see the
    /// [type docs](Self) for the names each part's connection gets).
    #[must_use]
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = Some(name.into());
        self
    }

    /// The broker, without the password: `amqp://user@host:port/vhost`.
    pub fn endpoint(&self) -> &str {
        self.parsed.endpoint()
    }

    /// The queue a route on `queue` dead-letters into: `{queue}.dlq`.
    pub fn dead_letter_queue(queue: &str) -> String {
        format!("{queue}.dlq")
    }

    /// The name of the connections of a route read as `group`.
    fn route_connection(&self, group: &str) -> String {
        match &self.connection_name {
            Some(name) => format!("{name}/{group}"),
            None => group.to_owned(),
        }
    }

    /// The name of a connection the broker's own part `part` opens.
    fn part_connection(&self, part: &str) -> String {
        match &self.connection_name {
            Some(name) => format!("{name} ({part})"),
            None => format!("intake {part}"),
        }
    }

    /// Declares `dead_letters` as a durable classic queue unless it exists
    /// (then it is used as it is, whatever its settings), on a connection
    /// of its own named `{connection} (declarations)`. Bounded by the
    /// connect timeout for the connection and again for the declarations.
    async fn ensure_dead_letter_queue(
        &self,
        dead_letters: &str,
        connection: &str,
    ) -> Result<(), Error> {
        let name = format!("{connection} (declarations)");
        let url = &self.parsed;
        let open = open_within(url, Some(&name), &self.tls, DEFAULT_CONNECT_TIMEOUT).await?;
        let declared = tokio::time::timeout(
            DEFAULT_CONNECT_TIMEOUT,
            self.declare_if_missing(&open, dead_letters),
        )
        .await
        .unwrap_or_else(|_| {
            Err(Error::Unreachable {
                endpoint: url.endpoint().to_owned(),
                source: format!(
                    "the declaration of queue `{dead_letters}` got no answer within \
                     {DEFAULT_CONNECT_TIMEOUT:?}"
                )
                .into(),
            })
        });
        // Best effort: the broker reclaims the connection when it goes.
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, open.close(200, short("declared"))).await;
        declared
    }

    async fn declare_if_missing(&self, connection: &Connection, queue: &str) -> Result<(), Error> {
        let url = &self.parsed;
        let fail = |operation| move |error| classify(error, url.endpoint(), url.vhost(), operation);
        let channel = connection
            .create_channel()
            .await
            .map_err(fail(Operation::Other))?;
        let exists = channel
            .queue_declare(
                short(queue),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(fail(Operation::UseQueue(queue)));
        match exists {
            Ok(_) => return Ok(()),
            // The missing queue closed the channel.
            Err(Error::QueueNotFound { .. }) => {}
            Err(error) => return Err(error),
        }
        let channel = connection
            .create_channel()
            .await
            .map_err(fail(Operation::Other))?;
        Topology::new()
            .queue(Queue::classic(queue))
            .declare_on(&channel, url)
            .await
    }

    /// Keeps `parking` for the shutdown, and where it holds its copies for
    /// the lag probes of `queue`.
    fn keep(&self, queue: &str, parking: &AmqpParking) {
        self.kept
            .holding
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(queue.to_owned())
            .or_default()
            .extend(parking.holding_queues());
        self.kept
            .parkings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(parking.clone());
    }

    /// Where the parked copies of `queue` wait: what the parkings this
    /// broker derived for it use, or a parking with the default tiers.
    fn holding(&self, queue: &str) -> Vec<String> {
        let holding = self
            .kept
            .holding
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(queue)
            .map(|queues| queues.iter().cloned().collect());
        holding.unwrap_or_else(|| holding_queues(queue, &AmqpParking::DEFAULT_TIERS))
    }
}

/// Closes a source whose route could not be derived whole (bounded by the
/// source's close timeout).
async fn discard(mut source: AmqpSource) {
    if let Err(error) = source.close().await {
        tracing::debug!(%error, "closing the source of a route that was not derived");
    }
}

/// The parts of a route on a RabbitMQ queue (see the [type docs](AmqpBroker)).
impl Broker for AmqpBroker {
    type Source = AmqpSource;
    type Acker = AmqpAcker;
    type DeadLetterSink = AmqpDeadLetterSink;
    type Parking = AmqpParking;
    type Publisher = AmqpPublisher;
    type DeadLetterStore = AmqpDeadLetterStore;
    type LagProbe = AmqpLagProbe;
    type Error = Error;

    fn kind(&self) -> &'static str {
        "amqp"
    }

    /// Declares `{queue}.dlq` if it is missing, then builds the source of
    /// the queue (which must exist), its acker, its dead-letter sink, and
    /// with [`RouteOptions::parking`] its parking, each connected once so
    /// that a wrong password or a missing queue shows here. What was built
    /// before a part that fails is closed again.
    async fn route(
        &self,
        address: &RouteAddress,
        options: &RouteOptions,
    ) -> Result<RouteParts<Self>, Error> {
        let queue = address.source();
        let connection = self.route_connection(address.group());
        let dead_letters = Self::dead_letter_queue(queue);
        Topology::new()
            .queue(Queue::classic(dead_letters.as_str()))
            .validate()?;
        let source = AmqpSource::builder(&*self.url)
            .queue(queue)
            .connection_name(connection.as_str())
            .tls(self.tls.clone())
            .build()
            .await?;
        let acker = source.acker();
        if let Err(error) = self
            .ensure_dead_letter_queue(&dead_letters, &connection)
            .await
        {
            discard(source).await;
            return Err(error);
        }
        let dead_letter_sink = match source
            .dead_letter_sink()
            .exchange("")
            .routing_key(dead_letters.as_str())
            .build()
            .await
        {
            Ok(sink) => sink,
            Err(error) => {
                discard(source).await;
                return Err(error);
            }
        };
        let Some(parking) = &options.parking else {
            return Ok(RouteParts::new(source, acker, dead_letter_sink, None));
        };
        let tiers = parking
            .tiers
            .clone()
            .unwrap_or_else(|| AmqpParking::DEFAULT_TIERS.to_vec());
        let parking = AmqpParking::builder(&*self.url)
            .queue(queue)
            .tiers(tiers)
            .connection_name(connection.as_str())
            .tls(self.tls.clone())
            .build()
            .await;
        match parking {
            Ok(parking) => {
                self.keep(queue, &parking);
                Ok(RouteParts::new(
                    source,
                    acker,
                    dead_letter_sink,
                    Some(parking),
                ))
            }
            Err(error) => {
                discard(source).await;
                Err(error)
            }
        }
    }

    /// The broker's publisher, made at the first call (connection
    /// `{name} (publisher)`, or `intake publisher`) and shared by every
    /// later one. It [routes by key](crate::AmqpPublisherBuilder::route_by_key):
    /// an output's destination names the exchange and its key is the
    /// routing key, which a source reads back as the message's key (the
    /// destination `""`, the default exchange, with the queue as the key
    /// publishes straight into a queue).
    async fn publisher(&self) -> Result<AmqpPublisher, Error> {
        let mut kept = self.kept.publisher.lock().await;
        if let Some(publisher) = kept.as_ref() {
            return Ok(publisher.clone());
        }
        let publisher = AmqpPublisher::builder(&*self.url)
            .route_by_key()
            .connection_name(self.part_connection("publisher"))
            .tls(self.tls.clone())
            .build()
            .await?;
        *kept = Some(publisher.clone());
        Ok(publisher)
    }

    /// The dead letters of the route's queue, in `{queue}.dlq`, redriven
    /// through a publisher of their own on the default exchange (to the
    /// origin queue). The dead-letter queue must exist: deriving the route
    /// declares it.
    async fn dead_letter_store(
        &self,
        address: &RouteAddress,
    ) -> Result<AmqpDeadLetterStore, Error> {
        let publisher = AmqpPublisher::builder(&*self.url)
            .connection_name(self.part_connection("dead-letter store"))
            .tls(self.tls.clone())
            .build()
            .await?;
        AmqpDeadLetterStore::builder(&*self.url)
            .queue(Self::dead_letter_queue(address.source()))
            .tls(self.tls.clone())
            .build(publisher)
            .await
    }

    /// A probe of the route's queue (connection `{group} (lag)`, opened at
    /// the first query) that counts its parked backlog too (see the
    /// [type docs](AmqpBroker)).
    async fn lag_probe(&self, address: &RouteAddress) -> Result<AmqpLagProbe, Error> {
        let queue = address.source();
        Ok(AmqpLagProbe::with_settings(
            self.parsed.clone(),
            self.tls.clone(),
            Some(self.route_connection(address.group())),
            queue,
        )
        .parked_in(self.holding(queue)))
    }

    /// Closes every parking this broker (or a clone) derived (their relays
    /// stop after the copy they move, parks in flight are awaited) and the
    /// shared publisher (outputs in flight are awaited), concurrently, all
    /// within `timeout`. A later [`publisher`](Broker::publisher) call
    /// makes a new publisher.
    ///
    /// # Errors
    ///
    /// [`Error::ShutdownTimedOut`] when some did not finish in time; they
    /// end after their current step.
    async fn shutdown(&self, timeout: Duration) -> Result<(), Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        let parkings = std::mem::take(
            &mut *self
                .kept
                .parkings
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        let publisher = match tokio::time::timeout_at(deadline, self.kept.publisher.lock()).await {
            Ok(mut kept) => kept.take(),
            Err(_) => None,
        };
        let mut closing: Vec<Pin<Box<dyn Future<Output = ()> + Send + '_>>> = parkings
            .iter()
            .map(|parking| Box::pin(parking.close()) as Pin<Box<dyn Future<Output = ()> + Send>>)
            .collect();
        if let Some(publisher) = &publisher {
            closing.push(Box::pin(publisher.close()));
        }
        let unfinished = join_all(
            closing
                .into_iter()
                .map(|close| tokio::time::timeout_at(deadline, close)),
        )
        .await
        .into_iter()
        .filter(Result::is_err)
        .count();
        if unfinished == 0 {
            Ok(())
        } else {
            Err(Error::ShutdownTimedOut {
                endpoint: self.parsed.endpoint().to_owned(),
                parts: unfinished,
                within: timeout,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_shows_in_no_printed_form() {
        let broker = AmqpBroker::new("amqp://app:hunter2@broker:5672/%2f")
            .expect("a valid URL")
            .connection_name("billing");
        let shown = format!("{broker:?} {}", broker.endpoint());
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("amqp://app@broker:5672/%2f"), "{shown}");
        let error = AmqpBroker::from_url("amqp://app:12/hunter2@broker").unwrap_err();
        assert!(!format!("{error} {error:?}").contains("hunter2"));
    }

    #[test]
    fn the_group_names_the_route_connections() {
        let broker = AmqpBroker::new("amqp://guest:guest@127.0.0.1:5672/%2f").unwrap();
        assert_eq!(broker.route_connection("billing"), "billing");
        assert_eq!(broker.part_connection("publisher"), "intake publisher");
        let broker = broker.connection_name("payments-service");
        assert_eq!(
            broker.route_connection("billing"),
            "payments-service/billing"
        );
        assert_eq!(
            broker.part_connection("publisher"),
            "payments-service (publisher)"
        );
        assert_eq!(AmqpBroker::dead_letter_queue("orders"), "orders.dlq");
    }

    #[test]
    fn a_probe_counts_the_default_tiers_until_a_parking_is_derived() {
        let broker = AmqpBroker::new("amqp://guest:guest@127.0.0.1:5672/%2f").unwrap();
        let holding = broker.holding("orders");
        assert_eq!(holding.len(), AmqpParking::DEFAULT_TIERS.len() + 2);
        assert!(holding.contains(&"orders.wait.1000ms".to_owned()));
        assert!(holding.contains(&"orders.wait.hop.86400000ms".to_owned()));
        assert!(holding.contains(&"orders.wait.relay".to_owned()));
    }
}
