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
use intake_core::group_control::ControlLog;
use lapin::Connection;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;

use crate::connection::{DEFAULT_CONNECT_TIMEOUT, open_within};
use crate::error::{Error, Operation, classify};
use crate::parking::holding_queues;
use crate::settings::AmqpSettings;
use crate::topology::{Queue, Topology, short};
use crate::url::AmqpUrl;
use crate::{
    AmqpAcker, AmqpControlChannel, AmqpDeadLetterSink, AmqpDeadLetterStore, AmqpLagProbe,
    AmqpParking, AmqpPublisher, AmqpSource,
};

/// How long closing a connection used only to declare may take.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// A RabbitMQ broker: its [`AmqpSettings`] (URL, TLS, connection name,
/// connect timeout), given once, from which every part of a route is derived with the shapes of
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
/// | group control log | an [`AmqpControlChannel`] on the stream queue `{group}.intake-control` or `{group}.intake-status` ([`control_channel`](Self::control_channel)) |
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
/// [connection name](AmqpSettings::connection_name), with ` (dead letters)`,
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
/// and replays through the default exchange to the letter's origin queue.
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
/// use intake_amqp::{AmqpBroker, AmqpSettings};
/// use intake_core::backend::{Broker, RouteAddress, RouteOptions};
///
/// # async fn run() -> Result<(), intake_amqp::Error> {
/// let broker = AmqpBroker::new(
///     AmqpSettings::new("amqp://guest:guest@127.0.0.1:5672/%2f").connection_name("billing"),
/// );
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
    settings: AmqpSettings,
    /// The settings' endpoint, without the password.
    endpoint: Arc<str>,
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
            .field("settings", &self.settings)
            .field("parkings", &parkings)
            .finish_non_exhaustive()
    }
}

impl AmqpBroker {
    /// The broker `settings` describe (a URL alone converts into
    /// [`AmqpSettings`]). Nothing is sent, and nothing checked, until a
    /// part is derived: a URL that does not parse is an
    /// [`Error::InvalidUrl`] (shown redacted) from each part then.
    pub fn new(settings: impl Into<AmqpSettings>) -> Self {
        let settings = settings.into();
        Self {
            endpoint: settings.endpoint().into(),
            settings,
            kept: Arc::default(),
        }
    }

    /// The broker at `url` (`amqp://user:password@host:5672/vhost`, or
    /// `amqps://` for TLS; see [`AmqpSettings`]), checked at once.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for a URL that does not parse (shown
    /// redacted).
    pub fn from_url(url: &str) -> Result<Self, Error> {
        AmqpUrl::parse(url)?;
        Ok(Self::new(url))
    }

    /// The broker, without the password: `amqp://user@host:port/vhost`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The queue a route on `queue` dead-letters into: `{queue}.dlq`.
    pub fn dead_letter_queue(queue: &str) -> String {
        format!("{queue}.dlq")
    }

    /// Group `group`'s control log `log` (see
    /// [`intake_core::group_control`]): the stream queue
    /// `{group}.intake-control` (commands, kept until deleted) or
    /// `{group}.intake-status` (status, kept an hour), declared when the
    /// channel connects. Its connections are named after the group, as a
    /// route's are: `{group} (group control)` for appends and
    /// `{group} (group control feed)` for the feeds (`status` for the
    /// status log). Hand a commands channel to
    /// [`GroupControl::new`](intake_core::group_control::GroupControl::new).
    ///
    /// ```no_run
    /// use intake_amqp::AmqpBroker;
    /// use intake_core::group_control::{ControlLog, GroupControl};
    ///
    /// # async fn run() -> Result<(), intake_amqp::Error> {
    /// let broker = AmqpBroker::new("amqp://guest:guest@127.0.0.1:5672/%2f");
    /// let commands = broker.control_channel("billing", ControlLog::Commands).await?;
    /// let group = GroupControl::new(commands, "instance-a");
    /// # drop(group);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] (shown redacted) or [`Error::Config`] for a
    /// bad URL or an empty group, and a connection or declaration the
    /// broker refuses for a reason retrying does not fix (a wrong password,
    /// a queue of that name that is not such a stream). A broker that
    /// cannot be reached now is not an error: the first append or follow
    /// tries again.
    pub async fn control_channel(
        &self,
        group: &str,
        log: ControlLog,
    ) -> Result<AmqpControlChannel, Error> {
        let settings = self
            .settings
            .clone()
            .named(Some(self.route_connection(group)));
        AmqpControlChannel::open(settings, group, log).await
    }

    /// The name of the connections of a route read as `group`.
    fn route_connection(&self, group: &str) -> String {
        match self.settings.name() {
            Some(name) => format!("{name}/{group}"),
            None => group.to_owned(),
        }
    }

    /// The settings of a part of the broker's own (not a route's), its
    /// connection named by [`part_connection`](Self::part_connection).
    fn part_settings(&self, part: &str) -> AmqpSettings {
        self.settings
            .clone()
            .named(Some(self.part_connection(part)))
    }

    /// The name of a connection the broker's own part `part` opens.
    fn part_connection(&self, part: &str) -> String {
        match self.settings.name() {
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
        let checked = self.settings.check()?;
        let url = &checked.url;
        let timeout = checked.connect_timeout_or(DEFAULT_CONNECT_TIMEOUT);
        let open = open_within(url, Some(&name), &checked.tls, timeout).await?;
        let declared =
            tokio::time::timeout(timeout, Self::declare_if_missing(url, &open, dead_letters))
                .await
                .unwrap_or_else(|_| {
                    Err(Error::Unreachable {
                        endpoint: url.endpoint().to_owned(),
                        source: format!(
                            "the declaration of queue `{dead_letters}` got no answer within \
                     {timeout:?}"
                        )
                        .into(),
                    })
                });
        // Best effort: the broker reclaims the connection when it goes.
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, open.close(200, short("declared"))).await;
        declared
    }

    async fn declare_if_missing(
        url: &AmqpUrl,
        connection: &Connection,
        queue: &str,
    ) -> Result<(), Error> {
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
    type ControlChannel = AmqpControlChannel;
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
        let settings = self.settings.clone().named(Some(connection.clone()));
        let source = AmqpSource::builder(&settings).queue(queue).build().await?;
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
        let parking = AmqpParking::builder(settings)
            .queue(queue)
            .tiers(tiers)
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
        let settings = self.part_settings("publisher");
        let publisher = AmqpPublisher::builder(settings)
            .route_by_key()
            .build()
            .await?;
        *kept = Some(publisher.clone());
        Ok(publisher)
    }

    /// The dead letters of the route's queue, in `{queue}.dlq`, replayed
    /// through a publisher of their own on the default exchange (to the
    /// origin queue). The dead-letter queue must exist: deriving the route
    /// declares it.
    async fn dead_letter_store(
        &self,
        address: &RouteAddress,
    ) -> Result<AmqpDeadLetterStore, Error> {
        let settings = self.part_settings("dead-letter store");
        let publisher = AmqpPublisher::builder(&settings).build().await?;
        AmqpDeadLetterStore::builder(settings)
            .queue(Self::dead_letter_queue(address.source()))
            .build(publisher)
            .await
    }

    /// A probe of the route's queue (connection `{group} (lag)`, opened at
    /// the first query) that counts its parked backlog too (see the
    /// [type docs](AmqpBroker)).
    async fn lag_probe(&self, address: &RouteAddress) -> Result<AmqpLagProbe, Error> {
        let queue = address.source();
        let checked = self.settings.check()?;
        Ok(AmqpLagProbe::with_settings(
            checked.url,
            checked.tls,
            Some(self.route_connection(address.group())),
            queue,
        )
        .parked_in(self.holding(queue)))
    }

    async fn control_channel(
        &self,
        group: &str,
        log: ControlLog,
    ) -> Result<AmqpControlChannel, Error> {
        AmqpBroker::control_channel(self, group, log).await
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
                endpoint: self.endpoint().to_owned(),
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
        let broker = AmqpBroker::new(
            AmqpSettings::new("amqp://app:hunter2@broker:5672/%2f").connection_name("billing"),
        );
        let shown = format!("{broker:?} {}", broker.endpoint());
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("amqp://app@broker:5672/%2f"), "{shown}");
        let error = AmqpBroker::from_url("amqp://app:12/hunter2@broker").unwrap_err();
        assert!(!format!("{error} {error:?}").contains("hunter2"));
    }

    #[tokio::test]
    async fn a_bad_url_is_refused_when_a_part_is_derived_without_its_password() {
        let broker = AmqpBroker::new("amqp://app:12/hunter2@broker");
        assert!(!format!("{broker:?} {}", broker.endpoint()).contains("hunter2"));
        let address = RouteAddress::new("orders", "billing");
        let errors = [
            broker.route(&address, &RouteOptions::new()).await.err(),
            broker.publisher().await.err(),
            broker.dead_letter_store(&address).await.err(),
            broker.lag_probe(&address).await.err(),
        ];
        for error in errors {
            let error = error.expect("refused");
            assert!(matches!(error, Error::InvalidUrl { .. }), "{error:?}");
            assert!(!format!("{error} {error:?}").contains("hunter2"));
        }
    }

    #[test]
    fn the_group_names_the_route_connections() {
        let url = "amqp://guest:guest@127.0.0.1:5672/%2f";
        let broker = AmqpBroker::new(url);
        assert_eq!(broker.route_connection("billing"), "billing");
        assert_eq!(broker.part_connection("publisher"), "intake publisher");
        let broker = AmqpBroker::new(AmqpSettings::new(url).connection_name("payments-service"));
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
        let broker = AmqpBroker::new("amqp://guest:guest@127.0.0.1:5672/%2f");
        let holding = broker.holding("orders");
        assert_eq!(holding.len(), AmqpParking::DEFAULT_TIERS.len() + 2);
        assert!(holding.contains(&"orders.wait.1000ms".to_owned()));
        assert!(holding.contains(&"orders.wait.hop.86400000ms".to_owned()));
        assert!(holding.contains(&"orders.wait.relay".to_owned()));
    }
}
