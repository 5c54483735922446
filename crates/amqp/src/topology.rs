//! What to declare on the broker: exchanges, queues (classic or quorum, with
//! dead-lettering and delivery limits) and bindings.
//!
//! A source declares its [`Topology`] when it connects and again after every
//! reconnect, so a queue that was deleted while the broker restarted comes
//! back. Declarations are idempotent as long as they match what exists; a
//! mismatch (`PRECONDITION_FAILED - inequivalent arg`) is an
//! [`Error::Topology`] that names the entity.

use std::time::Duration;

use intake_core::ConfigError;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Channel, ExchangeKind};

use crate::error::{Error, Operation, classify};
use crate::url::AmqpUrl;

/// The longest name AMQP allows for a queue, exchange or routing key.
pub(crate) const MAX_NAME_BYTES: usize = 255;

/// Checks that `name` fits an AMQP short string.
pub(crate) fn check_name(setting: &'static str, name: &str) -> Result<(), ConfigError> {
    if name.len() > MAX_NAME_BYTES {
        return Err(ConfigError::new(
            setting,
            format!(
                "`{}…` is {} bytes long; AMQP names are at most {MAX_NAME_BYTES} bytes",
                name.chars().take(32).collect::<String>(),
                name.len()
            ),
        ));
    }
    Ok(())
}

/// A name already checked by [`check_name`].
pub(crate) fn short(name: &str) -> ShortString {
    ShortString::try_new(name).unwrap_or_default()
}

/// How RabbitMQ stores and replicates a queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueKind {
    /// A classic queue.
    Classic,
    /// A replicated quorum queue: durable, with a delivery count
    /// (`x-delivery-count`) and an optional delivery limit.
    Quorum,
}

/// A queue to declare.
///
/// ```
/// use intake_amqp::Queue;
///
/// let orders = Queue::quorum("orders")
///     .dead_letter_exchange("orders.dlx")
///     .delivery_limit(5);
/// ```
#[derive(Clone, Debug)]
pub struct Queue {
    name: String,
    kind: QueueKind,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
    dead_letter_exchange: Option<String>,
    dead_letter_routing_key: Option<String>,
    delivery_limit: Option<u32>,
    at_least_once_dead_lettering: bool,
    message_ttl: Option<Duration>,
    arguments: Vec<(String, AMQPValue)>,
}

impl Queue {
    fn new(name: impl Into<String>, kind: QueueKind) -> Self {
        Self {
            name: name.into(),
            kind,
            durable: true,
            exclusive: false,
            auto_delete: false,
            dead_letter_exchange: None,
            dead_letter_routing_key: None,
            delivery_limit: None,
            at_least_once_dead_lettering: false,
            message_ttl: None,
            arguments: Vec::new(),
        }
    }

    /// A durable classic queue.
    pub fn classic(name: impl Into<String>) -> Self {
        Self::new(name, QueueKind::Classic)
    }

    /// A quorum queue (always durable).
    pub fn quorum(name: impl Into<String>) -> Self {
        Self::new(name, QueueKind::Quorum)
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The queue's kind.
    pub fn kind(&self) -> QueueKind {
        self.kind
    }

    /// Not durable: gone when the broker restarts (classic queues only).
    pub fn transient(mut self) -> Self {
        self.durable = false;
        self
    }

    /// Used by one connection only and deleted when it closes (classic
    /// queues only).
    pub fn exclusive(mut self) -> Self {
        self.exclusive = true;
        self
    }

    /// Deleted when its last consumer goes (classic queues only).
    pub fn auto_delete(mut self) -> Self {
        self.auto_delete = true;
        self
    }

    /// Messages rejected without requeue, expired, or past the delivery
    /// limit go to `exchange` (`x-dead-letter-exchange`).
    pub fn dead_letter_exchange(mut self, exchange: impl Into<String>) -> Self {
        self.dead_letter_exchange = Some(exchange.into());
        self
    }

    /// The routing key dead letters are published with
    /// (`x-dead-letter-routing-key`); by default their original one.
    pub fn dead_letter_routing_key(mut self, routing_key: impl Into<String>) -> Self {
        self.dead_letter_routing_key = Some(routing_key.into());
        self
    }

    /// After `limit` failed deliveries a message is dead-lettered (or
    /// dropped without a dead-letter exchange) (`x-delivery-limit`, quorum
    /// queues only).
    ///
    /// Which returns count as failed depends on the RabbitMQ version: up to
    /// 4.2 every return (reject, nack, a closed channel), from 4.3 only
    /// `basic.reject`. intake retries with `basic.reject`, so retries count
    /// on every version.
    pub fn delivery_limit(mut self, limit: u32) -> Self {
        self.delivery_limit = Some(limit);
        self
    }

    /// Dead-letters at least once (`x-dead-letter-strategy: at-least-once`
    /// with `x-overflow: reject-publish`): the queue keeps a message until
    /// the dead-letter queue confirmed it. Quorum queues with a dead-letter
    /// exchange only; the default is at most once.
    pub fn at_least_once_dead_lettering(mut self) -> Self {
        self.at_least_once_dead_lettering = true;
        self
    }

    /// Messages older than `ttl` expire (and are dead-lettered if the queue
    /// has a dead-letter exchange) (`x-message-ttl`).
    pub fn message_ttl(mut self, ttl: Duration) -> Self {
        self.message_ttl = Some(ttl);
        self
    }

    /// Any other `x-` argument, as RabbitMQ documents it.
    pub fn argument(mut self, name: impl Into<String>, value: AMQPValue) -> Self {
        self.arguments.push((name.into(), value));
        self
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.name.is_empty() {
            return Err(ConfigError::new(
                "queue.name",
                "is empty; name the queue (server-named queues are for broadcast sources)",
            ));
        }
        check_name("queue.name", &self.name)?;
        for name in self
            .dead_letter_exchange
            .iter()
            .chain(&self.dead_letter_routing_key)
        {
            check_name("queue.dead_letter", name)?;
        }
        for (name, _) in &self.arguments {
            check_name("queue.argument", name)?;
        }
        if self.kind == QueueKind::Quorum {
            let classic_only = [
                (!self.durable, "transient"),
                (self.exclusive, "exclusive"),
                (self.auto_delete, "auto_delete"),
            ];
            if let Some((_, setting)) = classic_only.iter().find(|(set, _)| *set) {
                return Err(ConfigError::new(
                    "queue",
                    format!(
                        "quorum queue `{}` cannot be {setting}; use Queue::classic for that",
                        self.name
                    ),
                ));
            }
        } else {
            if self.delivery_limit.is_some() {
                return Err(ConfigError::new(
                    "queue.delivery_limit",
                    format!(
                        "is a quorum-queue setting; declare `{}` with Queue::quorum",
                        self.name
                    ),
                ));
            }
            if self.at_least_once_dead_lettering {
                return Err(ConfigError::new(
                    "queue.at_least_once_dead_lettering",
                    format!(
                        "is a quorum-queue setting; declare `{}` with Queue::quorum",
                        self.name
                    ),
                ));
            }
        }
        if self.at_least_once_dead_lettering && self.dead_letter_exchange.is_none() {
            return Err(ConfigError::new(
                "queue.at_least_once_dead_lettering",
                format!(
                    "needs a dead-letter exchange; add .dead_letter_exchange(..) to `{}`",
                    self.name
                ),
            ));
        }
        Ok(())
    }

    pub(crate) fn arguments(&self) -> FieldTable {
        let mut table = FieldTable::default();
        if self.kind == QueueKind::Quorum {
            table.insert(
                short("x-queue-type"),
                AMQPValue::LongString("quorum".into()),
            );
        }
        if let Some(exchange) = &self.dead_letter_exchange {
            table.insert(
                short("x-dead-letter-exchange"),
                AMQPValue::LongString(exchange.as_str().into()),
            );
        }
        if let Some(routing_key) = &self.dead_letter_routing_key {
            table.insert(
                short("x-dead-letter-routing-key"),
                AMQPValue::LongString(routing_key.as_str().into()),
            );
        }
        if let Some(limit) = self.delivery_limit {
            table.insert(
                short("x-delivery-limit"),
                AMQPValue::LongLongInt(i64::from(limit)),
            );
        }
        if self.at_least_once_dead_lettering {
            table.insert(
                short("x-dead-letter-strategy"),
                AMQPValue::LongString("at-least-once".into()),
            );
            table.insert(
                short("x-overflow"),
                AMQPValue::LongString("reject-publish".into()),
            );
        }
        if let Some(ttl) = self.message_ttl {
            let millis = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
            table.insert(short("x-message-ttl"), AMQPValue::LongLongInt(millis));
        }
        for (name, value) in &self.arguments {
            table.insert(short(name), value.clone());
        }
        table
    }
}

/// An exchange to declare.
#[derive(Clone, Debug)]
pub struct Exchange {
    name: String,
    kind: ExchangeKind,
    durable: bool,
    auto_delete: bool,
}

impl Exchange {
    fn new(name: impl Into<String>, kind: ExchangeKind) -> Self {
        Self {
            name: name.into(),
            kind,
            durable: true,
            auto_delete: false,
        }
    }

    /// A durable direct exchange: routes by exact routing key.
    pub fn direct(name: impl Into<String>) -> Self {
        Self::new(name, ExchangeKind::Direct)
    }

    /// A durable fanout exchange: every bound queue gets every message.
    pub fn fanout(name: impl Into<String>) -> Self {
        Self::new(name, ExchangeKind::Fanout)
    }

    /// A durable topic exchange: routes by routing-key pattern.
    pub fn topic(name: impl Into<String>) -> Self {
        Self::new(name, ExchangeKind::Topic)
    }

    /// A durable headers exchange: routes by header values.
    pub fn headers(name: impl Into<String>) -> Self {
        Self::new(name, ExchangeKind::Headers)
    }

    /// The exchange's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Not durable: gone when the broker restarts.
    pub fn transient(mut self) -> Self {
        self.durable = false;
        self
    }

    /// Deleted when its last binding goes.
    pub fn auto_delete(mut self) -> Self {
        self.auto_delete = true;
        self
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.name.is_empty() {
            return Err(ConfigError::new(
                "exchange.name",
                "is empty; the default exchange exists already and cannot be declared",
            ));
        }
        check_name("exchange.name", &self.name)
    }

    pub(crate) async fn declare_on(&self, channel: &Channel, url: &AmqpUrl) -> Result<(), Error> {
        channel
            .exchange_declare(
                short(&self.name),
                self.kind.clone(),
                ExchangeDeclareOptions {
                    durable: self.durable,
                    auto_delete: self.auto_delete,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|error| {
                classify(
                    error,
                    url.endpoint(),
                    url.vhost(),
                    Operation::Declare(&format!("exchange `{}`", self.name)),
                )
            })
    }
}

/// A binding of a queue to an exchange.
#[derive(Clone, Debug)]
pub struct Binding {
    queue: String,
    exchange: String,
    routing_key: String,
}

/// Exchanges, queues and bindings to declare, in that order.
///
/// ```
/// use intake_amqp::{Exchange, Queue, Topology};
///
/// let topology = Topology::new()
///     .exchange(Exchange::direct("orders.dlx"))
///     .queue(Queue::classic("orders.dlq"))
///     .bind("orders.dlq", "orders.dlx", "orders")
///     .queue(Queue::quorum("orders").dead_letter_exchange("orders.dlx").delivery_limit(5));
/// assert!(topology.validate().is_ok());
/// ```
#[derive(Clone, Debug, Default)]
pub struct Topology {
    exchanges: Vec<Exchange>,
    queues: Vec<Queue>,
    bindings: Vec<Binding>,
}

impl Topology {
    /// Nothing to declare yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares `exchange`.
    pub fn exchange(mut self, exchange: Exchange) -> Self {
        self.exchanges.push(exchange);
        self
    }

    /// Declares `queue`.
    pub fn queue(mut self, queue: Queue) -> Self {
        self.queues.push(queue);
        self
    }

    /// Binds `queue` to `exchange` with `routing_key`.
    pub fn bind(
        mut self,
        queue: impl Into<String>,
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
    ) -> Self {
        self.bindings.push(Binding {
            queue: queue.into(),
            exchange: exchange.into(),
            routing_key: routing_key.into(),
        });
        self
    }

    /// The queues declared.
    pub fn queues(&self) -> &[Queue] {
        &self.queues
    }

    /// Whether there is nothing to declare.
    pub fn is_empty(&self) -> bool {
        self.exchanges.is_empty() && self.queues.is_empty() && self.bindings.is_empty()
    }

    /// Checks every declaration without a broker; builders call it, so a
    /// declaration RabbitMQ would refuse fails when the source is built, and
    /// so does a queue whose dead letters this topology routes back into it
    /// (they would be consumed again, fail again, forever).
    pub fn validate(&self) -> Result<(), ConfigError> {
        for exchange in &self.exchanges {
            exchange.validate()?;
        }
        for queue in &self.queues {
            queue.validate()?;
            if let Some(exchange) = &queue.dead_letter_exchange
                && self.routes_into(
                    exchange,
                    queue.dead_letter_routing_key.as_deref(),
                    &queue.name,
                )
            {
                return Err(ConfigError::new(
                    "queue.dead_letter_exchange",
                    format!(
                        "routes the dead letters of queue `{}` back into it (through exchange `{exchange}`), \
                         where they would be consumed again; route them to another queue",
                        queue.name
                    ),
                ));
            }
        }
        for binding in &self.bindings {
            check_name("binding.queue", &binding.queue)?;
            check_name("binding.exchange", &binding.exchange)?;
            check_name("binding.routing_key", &binding.routing_key)?;
        }
        Ok(())
    }

    /// This topology and `other`'s declarations together.
    pub(crate) fn joined(&self, other: &Topology) -> Topology {
        let mut joined = self.clone();
        joined.exchanges.extend(other.exchanges.iter().cloned());
        joined.queues.extend(other.queues.iter().cloned());
        joined.bindings.extend(other.bindings.iter().cloned());
        joined
    }

    /// Whether a message published to `exchange` with `routing_key` reaches
    /// `queue`, as far as this topology shows: the default exchange routes
    /// by queue name; a fanout declared here reaches every queue bound to it,
    /// a direct or topic exchange declared here the queues bound with exactly
    /// that key. An exchange declared elsewhere is not judged.
    pub(crate) fn routes_into(
        &self,
        exchange: &str,
        routing_key: Option<&str>,
        queue: &str,
    ) -> bool {
        if exchange.is_empty() {
            return routing_key == Some(queue);
        }
        let Some(declared) = self
            .exchanges
            .iter()
            .find(|declared| declared.name == exchange)
        else {
            return false;
        };
        self.bindings
            .iter()
            .filter(|binding| binding.exchange == exchange && binding.queue == queue)
            .any(|binding| match &declared.kind {
                ExchangeKind::Fanout => true,
                ExchangeKind::Direct | ExchangeKind::Topic => {
                    routing_key == Some(binding.routing_key.as_str())
                }
                _ => false,
            })
    }

    /// Opens a connection to `url`, declares everything and closes it: for
    /// setting a broker up (a producer, a test, a deploy step).
    pub async fn declare(&self, url: &str) -> Result<(), Error> {
        self.validate()?;
        let url = AmqpUrl::parse(url)?;
        let connection = crate::connection::open(&url, None, &crate::Tls::new()).await?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|error| classify(error, url.endpoint(), url.vhost(), Operation::Other))?;
        let declared = self.declare_on(&channel, &url).await;
        let _ = connection.close(200, short("topology declared")).await;
        declared
    }

    pub(crate) async fn declare_on(&self, channel: &Channel, url: &AmqpUrl) -> Result<(), Error> {
        for exchange in &self.exchanges {
            exchange.declare_on(channel, url).await?;
        }
        for queue in &self.queues {
            channel
                .queue_declare(
                    short(&queue.name),
                    QueueDeclareOptions {
                        durable: queue.durable,
                        exclusive: queue.exclusive,
                        auto_delete: queue.auto_delete,
                        ..QueueDeclareOptions::default()
                    },
                    queue.arguments(),
                )
                .await
                .map_err(|error| {
                    classify(
                        error,
                        url.endpoint(),
                        url.vhost(),
                        Operation::Declare(&format!("queue `{}`", queue.name)),
                    )
                })?;
        }
        for binding in &self.bindings {
            channel
                .queue_bind(
                    short(&binding.queue),
                    short(&binding.exchange),
                    short(&binding.routing_key),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|error| {
                    classify(
                        error,
                        url.endpoint(),
                        url.vhost(),
                        Operation::Declare(&format!(
                            "binding of queue `{}` to exchange `{}`",
                            binding.queue, binding.exchange
                        )),
                    )
                })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_limit_on_a_classic_queue_fails_validation() {
        let topology = Topology::new().queue(Queue::classic("orders").delivery_limit(3));
        let error = topology.validate().unwrap_err();
        assert_eq!(error.setting, "queue.delivery_limit");
        assert!(error.problem.contains("Queue::quorum"));
    }

    #[test]
    fn a_quorum_queue_cannot_be_exclusive() {
        let error = Queue::quorum("orders").exclusive().validate().unwrap_err();
        assert!(error.problem.contains("exclusive"));
    }

    #[test]
    fn at_least_once_dead_lettering_needs_a_dead_letter_exchange() {
        let error = Queue::quorum("orders")
            .at_least_once_dead_lettering()
            .validate()
            .unwrap_err();
        assert!(error.problem.contains("dead_letter_exchange"));
    }

    #[test]
    fn an_overlong_name_is_a_config_error_not_a_panic() {
        let name = "q".repeat(300);
        let error = Topology::new()
            .queue(Queue::classic(name))
            .validate()
            .unwrap_err();
        assert!(error.problem.contains("300 bytes"));
    }

    #[test]
    fn a_queue_that_dead_letters_into_itself_is_refused() {
        let through_default = Topology::new().queue(
            Queue::quorum("orders")
                .dead_letter_exchange("")
                .dead_letter_routing_key("orders"),
        );
        let error = through_default.validate().unwrap_err();
        assert_eq!(error.setting, "queue.dead_letter_exchange");
        assert!(error.problem.contains("`orders`"), "{}", error.problem);

        let through_fanout = Topology::new()
            .exchange(Exchange::fanout("orders.dlx"))
            .queue(Queue::quorum("orders").dead_letter_exchange("orders.dlx"))
            .bind("orders", "orders.dlx", "");
        assert!(through_fanout.validate().is_err());

        let through_direct = Topology::new()
            .exchange(Exchange::direct("dlx"))
            .queue(
                Queue::quorum("orders")
                    .dead_letter_exchange("dlx")
                    .dead_letter_routing_key("dead"),
            )
            .bind("orders", "dlx", "dead");
        assert!(through_direct.validate().is_err());

        let elsewhere = Topology::new()
            .exchange(Exchange::direct("dlx"))
            .queue(Queue::classic("orders.dlq"))
            .bind("orders.dlq", "dlx", "orders")
            .queue(Queue::quorum("orders").dead_letter_exchange("dlx"));
        assert!(elsewhere.validate().is_ok());
    }

    #[test]
    fn quorum_arguments_carry_type_limit_and_dead_letter_exchange() {
        let table = Queue::quorum("orders")
            .dead_letter_exchange("dlx")
            .delivery_limit(4)
            .arguments();
        let inner = table.inner();
        assert_eq!(
            inner.get("x-queue-type"),
            Some(&AMQPValue::LongString("quorum".into()))
        );
        assert_eq!(
            inner.get("x-delivery-limit"),
            Some(&AMQPValue::LongLongInt(4))
        );
        assert_eq!(
            inner.get("x-dead-letter-exchange"),
            Some(&AMQPValue::LongString("dlx".into()))
        );
    }
}
