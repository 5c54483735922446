//! The reference service: two routes run as one app, with shared state,
//! the usual layers, dead letters, health probes and metrics, and a
//! graceful stop on SIGTERM or Ctrl-C (a second signal stops at once).
//!
//! - `orders`: one customer's orders in order (`Key` ordering), billed into
//!   a shared ledger (`State<Arc<Ledger>>`);
//! - `payments`: decoded as JSON and audited (`State<Arc<AuditLog>>`).
//!
//! Each route's handler runs under metrics, tracing, a dead-letter
//! destination, retries with backoff, a timeout per attempt and a panic
//! guard. The service produces a steady trickle of its own orders and
//! payments, some of them poison (malformed, or refused by the handler), so
//! that retries and dead letters show in `/metrics`.
//!
//! ```text
//! cargo run --example service --features health-server   # memory broker, no setup
//! curl 127.0.0.1:9898/health/ready    # 200 once every route runs and has its partitions
//! curl 127.0.0.1:9898/health/live     # 200 while every partition makes progress
//! curl 127.0.0.1:9898/metrics         # Prometheus text
//! kill -TERM <pid>                    # drains, prints one line per route, exits 0
//!
//! cargo run --example service --features health-server,kafka -- --broker kafka://127.0.0.1:9092
//! cargo run --example service --features health-server,redis -- --broker redis://127.0.0.1:6379
//! cargo run --example service --features health-server,amqp -- --broker amqp://guest:guest@127.0.0.1:5672
//! cargo run --example service --features health-server,nats -- --broker nats://127.0.0.1:4222
//! ```
//!
//! With `--broker` it creates what it needs on the broker, named after
//! `--prefix NAME` (default `intake-service-<pid>-<time>`, new on each run):
//! Kafka topics `NAME.orders` (4 partitions) and `NAME.payments` (2), dead
//! letters in `<topic>.<group>.dlq`; Redis streams `NAME:orders` and
//! `NAME:payments` (the record key in field `key`), dead letters in
//! `<stream>:dlq`; RabbitMQ topic exchanges `NAME.orders` and
//! `NAME.payments` bound to queues of the same names with `#` (the routing
//! key is the record key), dead letters in queue `NAME.dlq` (the queues
//! expire after 10 minutes unused); JetStream streams `NAME_orders` and
//! `NAME_payments` storing `NAME.orders.>` and `NAME.payments.>` (the
//! subject, the key, is `NAME.orders.<customer>`), durable consumers
//! `NAME_billing` and `NAME_audit`, dead letters in the sink's default
//! `<stream>.<consumer>.dlq`. The groups are `NAME.billing` and
//! `NAME.audit` elsewhere. The same handlers and layers run on every broker; the
//! producer is that broker's own client.
//!
//! Environment: `INTAKE_HTTP_ADDR` (default `127.0.0.1:9898`; port 0 picks
//! one), `INTAKE_SERVICE_MESSAGES=N` stops producing after N orders (and N
//! payments), `INTAKE_SERVICE_INTERVAL_MS` (default 20) is the pause between
//! two of them, `INTAKE_SERVICE_AUDIT_MS=N` makes each audit take N ms (to
//! watch a drain, or a second signal cut it short), `RUST_LOG` (default
//! `info`; logs go to stderr).
//!
//! The first line on stdout is `health on http://ADDRESS`. At the end, one
//! line per route (`orders: succeeded N, dead-lettered N, …`), one for the
//! ledger and one for the producer. Exit codes: 0 drained, 1 failed, 2 stopped
//! at once by a second signal (or bad arguments).

#[path = "support/broker_url.rs"]
mod broker_url;
#[cfg(feature = "kafka")]
#[path = "support/kafka_topics.rs"]
mod kafka_topics;
#[path = "support/producer.rs"]
mod producer;
#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use intake::app::{App, AppError, Health, HealthListener, HealthService, HealthSettings};
use intake::backend::{Acker, DeadLetterSink, Source};
use intake::consumer::{Consumer, DeliveryOrder, SharedBudget};
use intake::memory::MemoryBroker;
use intake::metrics::prometheus::Registry;
use intake::{
    CatchPanicLayer, DeadLetterLayer, Exponential, FromRef, HandlerError, Json, Key, Message, Meta,
    Metrics, RetryLayer, State, TraceLayer,
};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceBuilder};

use crate::broker_url::Broker;
use crate::producer::Producer;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const USAGE: &str = "usage: service [--broker URL] [--prefix NAME]

URL: kafka://HOST:PORT | redis://[USER:PASS@]HOST:PORT | amqp://USER:PASS@HOST:PORT/VHOST
   | nats://[USER:PASS@]HOST:PORT (each with its feature)
Without --broker the service runs on the in-memory broker.";

// ---------------------------------------------------------------------------
// What the handlers share.

/// What the handlers share. Neither part is `Clone`: each is shared through
/// an `Arc`, never copied per message.
#[derive(Clone)]
struct Services {
    ledger: Arc<Ledger>,
    audit: Arc<AuditLog>,
}

/// What billing has done.
#[derive(Default)]
struct Ledger {
    billed_cents: AtomicU64,
    orders: AtomicU64,
}

/// What the audit has seen.
#[derive(Default)]
struct AuditLog {
    /// How long each audit takes (`INTAKE_SERVICE_AUDIT_MS`).
    pause: Option<Duration>,
    payments: AtomicU64,
}

impl FromRef<Services> for Arc<Ledger> {
    fn from_ref(services: &Services) -> Self {
        services.ledger.clone()
    }
}

impl FromRef<Services> for Arc<AuditLog> {
    fn from_ref(services: &Services) -> Self {
        services.audit.clone()
    }
}

// ---------------------------------------------------------------------------
// The handlers: plain async fns.

#[derive(Deserialize)]
struct Order {
    id: u64,
    cents: u64,
}

#[derive(Deserialize)]
struct Payment {
    id: u64,
}

/// Bills an order. Some first attempts time out (retried); a free order is
/// refused for good (dead-lettered); a malformed one never gets here (the
/// JSON extractor refuses it, dead-lettered too).
async fn bill(
    State(ledger): State<Arc<Ledger>>,
    Meta(meta): Meta,
    Key(customer): Key,
    Json(order): Json<Order>,
) -> Result<(), HandlerError> {
    if customer.is_none() {
        return Err(HandlerError::permanent("an order without a customer"));
    }
    if order.id % 7 == 3 && meta.attempt() == 1 {
        return Err(HandlerError::retryable("the billing database timed out"));
    }
    if order.cents == 0 {
        return Err(HandlerError::permanent(format!(
            "order {} is free",
            order.id
        )));
    }
    ledger
        .billed_cents
        .fetch_add(order.cents, Ordering::Relaxed);
    ledger.orders.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Audits a payment.
async fn audit(State(audit): State<Arc<AuditLog>>, Json(payment): Json<Payment>) {
    if let Some(pause) = audit.pause {
        tokio::time::sleep(pause).await;
    }
    tracing::debug!(payment = payment.id, "audited");
    audit.payments.fetch_add(1, Ordering::Relaxed);
}

// ---------------------------------------------------------------------------
// The layers and the routes, the same on every broker.

/// `handler` under the usual layers, outermost first: metrics, a span per
/// message, the dead-letter destination for what fails for good, retries
/// with backoff for what may pass later, a timeout per attempt, and a panic
/// guard.
fn layered<H, D>(
    metrics: &Metrics,
    name: &'static str,
    dead_letters: D,
    handler: H,
) -> impl Service<Message, Response = (), Error = HandlerError, Future: Send + 'static> + Send + 'static
where
    H: Service<Message, Response = (), Error = HandlerError> + Clone + Send + 'static,
    H::Future: Send + 'static,
    D: DeadLetterSink,
{
    let measured = metrics.layer(name);
    ServiceBuilder::new()
        .layer(measured.clone())
        .layer(TraceLayer::new(name))
        .layer(DeadLetterLayer::new(dead_letters))
        .layer(
            RetryLayer::new(
                Exponential::new(Duration::from_millis(10), Duration::from_secs(1)).max_retries(3),
            )
            .observe(measured),
        )
        .timeout(Duration::from_secs(5))
        .layer(CatchPanicLayer::new())
        .service(handler)
}

/// A route's parts from its backend.
struct RouteParts<S, A, D> {
    source: S,
    acker: A,
    dead_letters: D,
}

/// Where the producer sends each route's records (see [`Producer::send`]).
struct Destinations {
    orders: String,
    payments: String,
}

/// The app with both routes, and the producer that feeds them.
struct Wired {
    app: App<Services>,
    producer: Producer,
    to: Destinations,
}

/// Adds both routes to `app`, whatever their backend.
fn wire<OS, OA, OD, PS, PA, PD>(
    app: App<Services>,
    metrics: &Metrics,
    (orders, payments): (RouteParts<OS, OA, OD>, RouteParts<PS, PA, PD>),
    producer: Producer,
    to: Destinations,
) -> Result<Wired, BoxError>
where
    OS: Source,
    OA: Acker,
    OD: DeadLetterSink,
    PS: Source,
    PA: Acker,
    PD: DeadLetterSink,
{
    let observer = Arc::new(metrics.clone());
    let billing = Consumer::builder()
        .max_in_flight(192)
        .ordering(DeliveryOrder::Key)
        .observer(observer.clone())
        .build(
            orders.source,
            orders.acker,
            layered(metrics, "billing", orders.dead_letters, app.handler(bill)),
        )?;
    let auditing = Consumer::builder()
        .max_in_flight(64)
        .ordering(DeliveryOrder::Unordered)
        .observer(observer)
        .build(
            payments.source,
            payments.acker,
            layered(metrics, "audit", payments.dead_letters, app.handler(audit)),
        )?;
    Ok(Wired {
        app: app.route("orders", billing).route("payments", auditing),
        producer,
        to,
    })
}

// ---------------------------------------------------------------------------
// Each broker: what it needs created, its sources and its producer.

/// The names of what the service creates on a real broker.
struct Names {
    prefix: String,
}

#[cfg_attr(
    not(any(feature = "kafka", feature = "redis", feature = "amqp")),
    allow(dead_code)
)]
impl Names {
    fn billing(&self) -> String {
        format!("{}.billing", self.prefix)
    }

    fn audit(&self) -> String {
        format!("{}.audit", self.prefix)
    }
}

fn on_memory(app: App<Services>, metrics: &Metrics) -> Result<Wired, BoxError> {
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 4)?;
    broker.create_topic("payments", 2)?;
    let parts = |topic: &str, group: &str| -> Result<_, BoxError> {
        let (source, acker) = broker.consumer(topic, group)?;
        let dead_letters = broker.dead_letter_sink(topic, group)?;
        Ok(RouteParts {
            source,
            acker,
            dead_letters,
        })
    };
    let routes = (parts("orders", "billing")?, parts("payments", "audit")?);
    let to = Destinations {
        orders: "orders".to_owned(),
        payments: "payments".to_owned(),
    };
    wire(app, metrics, routes, Producer::Memory(broker), to)
}

#[cfg(feature = "kafka")]
async fn on_kafka(
    app: App<Services>,
    metrics: &Metrics,
    bootstrap: &str,
    names: &Names,
) -> Result<Wired, BoxError> {
    use intake::kafka::{KafkaSettings, KafkaSource};

    let settings = KafkaSettings::new(bootstrap);
    let orders = format!("{}.orders", names.prefix);
    let payments = format!("{}.payments", names.prefix);
    kafka_topics::create_topic(&settings, &orders, 4).await?;
    kafka_topics::create_topic(&settings, &payments, 2).await?;
    let parts = async |topic: &str, group: String| -> Result<_, BoxError> {
        let source = KafkaSource::builder(settings.clone())
            .group(group)
            .topic(topic)
            .build()
            .await?;
        let acker = source.acker();
        let dead_letters = source.dead_letter_sink().build().await?;
        Ok(RouteParts {
            source,
            acker,
            dead_letters,
        })
    };
    let routes = (
        parts(&orders, names.billing()).await?,
        parts(&payments, names.audit()).await?,
    );
    let to = Destinations { orders, payments };
    wire(app, metrics, routes, Producer::kafka(bootstrap)?, to)
}

#[cfg(feature = "redis")]
async fn on_redis(
    app: App<Services>,
    metrics: &Metrics,
    url: &str,
    names: &Names,
) -> Result<Wired, BoxError> {
    use intake::redis_streams::RedisStreamsSource;

    let orders = format!("{}:orders", names.prefix);
    let payments = format!("{}:payments", names.prefix);
    let parts = async |stream: &str, group: String| -> Result<_, BoxError> {
        let source = RedisStreamsSource::builder(url)
            .stream(stream)
            .consumer(format!("{group}-{}", std::process::id()))
            .group(group)
            .key_field("key")
            .build()
            .await?;
        let acker = source.acker();
        let dead_letters = source.dead_letter_sink().build().await?;
        Ok(RouteParts {
            source,
            acker,
            dead_letters,
        })
    };
    let routes = (
        parts(&orders, names.billing()).await?,
        parts(&payments, names.audit()).await?,
    );
    let to = Destinations { orders, payments };
    wire(app, metrics, routes, Producer::redis(url).await?, to)
}

#[cfg(feature = "amqp")]
async fn on_amqp(
    app: App<Services>,
    metrics: &Metrics,
    url: &str,
    names: &Names,
) -> Result<Wired, BoxError> {
    use intake::amqp::lapin::types::AMQPValue;
    use intake::amqp::{AmqpSettings, AmqpSource, Exchange, Queue, Topology};

    // Unused queues go away by themselves: each run has names of its own.
    let expiring =
        |name: &str| Queue::classic(name).argument("x-expires", AMQPValue::LongUInt(600_000));
    let dead_letter_queue = format!("{}.dlq", names.prefix);
    let orders = format!("{}.orders", names.prefix);
    let payments = format!("{}.payments", names.prefix);
    let parts = async |name: &str, group: String| -> Result<_, BoxError> {
        // A topic exchange in front of the queue: the routing key, which
        // the source gives as the message key, is the record's key.
        let topology = Topology::new()
            .exchange(Exchange::topic(name).auto_delete())
            .queue(expiring(name))
            .bind(name, name, "#")
            .queue(expiring(&dead_letter_queue));
        let source = AmqpSource::builder(AmqpSettings::new(url).connection_name(group))
            .queue(name)
            .declare(topology)
            .build()
            .await?;
        let acker = source.acker();
        let dead_letters = source
            .dead_letter_sink()
            .exchange("")
            .routing_key(dead_letter_queue.as_str())
            .build()
            .await?;
        Ok(RouteParts {
            source,
            acker,
            dead_letters,
        })
    };
    let routes = (
        parts(&orders, names.billing()).await?,
        parts(&payments, names.audit()).await?,
    );
    let to = Destinations { orders, payments };
    wire(app, metrics, routes, Producer::amqp(url).await?, to)
}

#[cfg(feature = "nats")]
async fn on_nats(
    app: App<Services>,
    metrics: &Metrics,
    url: &str,
    names: &Names,
) -> Result<Wired, BoxError> {
    use intake::nats::NatsSource;

    // Stream and durable consumer names take no dots; subjects do.
    let prefix = names.prefix.replace('.', "_");
    let parts = async |route: &str, group: &str| -> Result<_, BoxError> {
        let source = NatsSource::builder(url)
            .stream(format!("{prefix}_{route}"))
            .consumer(format!("{prefix}_{group}"))
            .create_stream([format!("{prefix}.{route}.>")])
            .build()
            .await?;
        let acker = source.acker();
        let dead_letters = source.dead_letter_sink().build().await?;
        Ok(RouteParts {
            source,
            acker,
            dead_letters,
        })
    };
    let routes = (
        parts("orders", "billing").await?,
        parts("payments", "audit").await?,
    );
    let to = Destinations {
        orders: format!("{prefix}.orders"),
        payments: format!("{prefix}.payments"),
    };
    wire(app, metrics, routes, Producer::nats(url).await?, to)
}

// ---------------------------------------------------------------------------
// The upstream this service simulates.

/// How much the producer sends, and how fast.
#[derive(Clone, Copy)]
struct Trickle {
    /// Stop after this many orders (and as many payments); `None`: never.
    limit: Option<u64>,
    /// The pause between two orders.
    interval: Duration,
}

/// What the producer sent.
#[derive(Default)]
struct Sent {
    orders: AtomicU64,
    payments: AtomicU64,
}

/// Sends an order and a payment every `trickle.interval` until `stop` or
/// the limit. One order in 50 is malformed and one in 37 is free, one
/// payment in 40 has a text id: all of them are dead-lettered.
async fn produce(
    mut producer: Producer,
    to: Destinations,
    trickle: Trickle,
    sent: Arc<Sent>,
    stop: CancellationToken,
) {
    let mut ticks = tokio::time::interval(trickle.interval);
    let mut id = 0_u64;
    while trickle.limit.is_none_or(|limit| id < limit) {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = ticks.tick() => {}
        }
        let order = match id {
            id if id % 50 == 9 => format!(r#"{{"id":{id},"cents":"#),
            id if id % 37 == 6 => format!(r#"{{"id":{id},"cents":0}}"#),
            id => format!(r#"{{"id":{id},"cents":{}}}"#, 100 + id % 900),
        };
        let payment = match id {
            id if id % 40 == 5 => r#"{"id":"five"}"#.to_owned(),
            id => format!(r#"{{"id":{id}}}"#),
        };
        let customer = format!("customer-{}", id % 7);
        let account = format!("account-{}", id % 5);
        if let Err(error) = producer.send(&to.orders, &customer, &order).await {
            tracing::warn!(%error, "the producer stopped");
            break;
        }
        sent.orders.fetch_add(1, Ordering::Relaxed);
        if let Err(error) = producer.send(&to.payments, &account, &payment).await {
            tracing::warn!(%error, "the producer stopped");
            break;
        }
        sent.payments.fetch_add(1, Ordering::Relaxed);
        id += 1;
    }
    producer.close().await;
}

// ---------------------------------------------------------------------------

/// The command line and the environment.
struct Options {
    broker: Option<Broker>,
    prefix: String,
    trickle: Trickle,
    audit_pause: Option<Duration>,
}

fn options() -> Result<Options, String> {
    let mut broker = None;
    let mut prefix = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--broker" => {
                let url = args.next().ok_or("--broker needs a URL")?;
                broker = Some(Broker::parse(&url)?);
            }
            "--prefix" => prefix = Some(args.next().ok_or("--prefix needs a name")?),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    let prefix = prefix.unwrap_or_else(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        format!("intake-service-{}-{}", std::process::id(), now.as_millis())
    });
    let millis = |name: &str| -> Result<Option<u64>, String> {
        std::env::var(name)
            .ok()
            .map(|value| {
                value
                    .parse()
                    .map_err(|_| format!("{name}: `{value}` is not a number"))
            })
            .transpose()
    };
    let interval = Duration::from_millis(millis("INTAKE_SERVICE_INTERVAL_MS")?.unwrap_or(20));
    if interval.is_zero() {
        return Err("INTAKE_SERVICE_INTERVAL_MS must be at least 1".to_owned());
    }
    Ok(Options {
        broker,
        prefix,
        trickle: Trickle {
            limit: millis("INTAKE_SERVICE_MESSAGES")?,
            interval,
        },
        audit_pause: millis("INTAKE_SERVICE_AUDIT_MS")?.map(Duration::from_millis),
    })
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let options = match options() {
        Ok(options) => options,
        Err(problem) if problem.is_empty() => {
            println!("{USAGE}");
            return Ok(());
        }
        Err(problem) => {
            eprintln!("service: {problem}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    support::init_logging_on_stderr("info,lapin=warn");

    let services = Services {
        ledger: Arc::default(),
        audit: Arc::new(AuditLog {
            pause: options.audit_pause,
            payments: AtomicU64::new(0),
        }),
    };
    let registry = Registry::new();
    let metrics = Metrics::register(&registry)?;
    let health = Health::new(HealthSettings {
        stall_window: Duration::from_secs(60),
        ..HealthSettings::default()
    });
    let app = App::with_state(services.clone())
        .shared_budget(SharedBudget::new(256, 32 << 20)?)
        .drain_deadline(Duration::from_secs(10))
        .health(health.clone());

    let names = Names {
        prefix: options.prefix.clone(),
    };
    let Wired { app, producer, to } = match &options.broker {
        None => on_memory(app, &metrics)?,
        Some(broker) => {
            tracing::info!(broker = %broker.endpoint(), prefix = %names.prefix, "connecting");
            match broker {
                #[cfg(feature = "kafka")]
                Broker::Kafka { bootstrap } => on_kafka(app, &metrics, bootstrap, &names).await?,
                #[cfg(feature = "redis")]
                Broker::Redis { url } => on_redis(app, &metrics, url, &names).await?,
                #[cfg(feature = "amqp")]
                Broker::Amqp { url } => on_amqp(app, &metrics, url, &names).await?,
                #[cfg(feature = "nats")]
                Broker::Nats { url } => on_nats(app, &metrics, url, &names).await?,
                #[allow(unreachable_patterns)] // with every backend feature on
                other => {
                    eprintln!(
                        "service: {} is not built in (build with --features kafka, redis, amqp or nats)",
                        other.endpoint()
                    );
                    std::process::exit(2);
                }
            }
        }
    };

    let address = std::env::var("INTAKE_HTTP_ADDR").unwrap_or_else(|_| "127.0.0.1:9898".into());
    let listener = HealthListener::bind(&address).await?;
    // The test that runs this example reads the address from this line.
    println!("health on http://{}", listener.local_addr()?);
    let serving = CancellationToken::new();
    let server = tokio::spawn(listener.serve(
        HealthService::new(health).with_metrics(registry),
        serving.clone(),
    ));

    let sent = Arc::new(Sent::default());
    let trickle = options.trickle;
    let app = app.background("producer", {
        let sent = sent.clone();
        move |stop| produce(producer, to, trickle, sent, stop)
    });

    let result = app.run().await;
    serving.cancel();
    let _ = server.await;

    let report = match &result {
        Ok(report) => report,
        Err(error) => match error.report() {
            Some(report) => report,
            None => return Err(result.err().map_or_else(|| "no report".into(), Into::into)),
        },
    };
    for route in &report.routes {
        match route.report() {
            Some(run) => println!(
                "{}: succeeded {}, dead-lettered {}, requeued {}, redispatched {}, unfinished {}, committed on {} partition(s), in {:.1?}",
                route.name,
                run.succeeded,
                run.dead_lettered,
                run.requeued,
                run.redispatched,
                run.unfinished.len(),
                run.committed.len(),
                run.elapsed,
            ),
            None => println!("{}: {:?}", route.name, route.outcome),
        }
    }
    println!(
        "ledger: {} orders billed, {} cents; {} payments audited",
        services.ledger.orders.load(Ordering::Relaxed),
        services.ledger.billed_cents.load(Ordering::Relaxed),
        services.audit.payments.load(Ordering::Relaxed)
    );
    println!(
        "producer: {} orders, {} payments sent",
        sent.orders.load(Ordering::Relaxed),
        sent.payments.load(Ordering::Relaxed)
    );
    match result {
        Ok(_) => Ok(()),
        Err(AppError::StoppedAtOnce { .. }) => {
            println!("stopped at once");
            std::process::exit(2)
        }
        Err(error) => Err(error.into()),
    }
}
