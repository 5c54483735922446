//! A ledger of deliveries, for checking a backend from the outside: what was
//! produced, what each consumer handled, and what survived crashes.
//!
//! ```text
//! cargo run --release --features full --example ledger -- \
//!     produce --broker URL --source NAME --count N [--partitions P]
//! cargo run --release --features full --example ledger -- \
//!     consume --broker URL --source NAME --group GROUP --ledger FILE \
//!     [--max-in-flight N] [--idle-exit-secs S] [--fail-every K]
//!     [--later-every K [--later-secs S]] [--effects-db POSTGRES_URL]
//!     [--ordering key|unordered]
//! cargo run --release --features full --example ledger -- \
//!     relay --broker URL --source NAME --group GROUP --to NAME2 \
//!     [--max-in-flight N] [--idle-exit-secs S] [--exactly-once [--effects-db POSTGRES_URL]]
//! ```
//!
//! `URL` is `kafka://HOST:PORT`, `redis://[USER:PASS@]HOST:PORT`,
//! `amqp://USER:PASS@HOST:PORT/VHOST` (an empty vhost is `/`) or
//! `nats://[USER:PASS@]HOST:PORT`. `NAME` is the topic, stream or queue,
//! created if missing: a Kafka topic with `P` partitions (default 4), a
//! durable quorum queue on RabbitMQ, a JetStream stream storing
//! `ledger.NAME.>` (and its durable consumer `GROUP`) on NATS.
//!
//! `produce` sends the payloads `0` … `N-1` (key `id % 64`) and exits 0 once
//! the broker confirmed every one of them (Kafka `acks=all`, Redis `XADD`
//! replies, AMQP publisher confirms, JetStream publish acks).
//!
//! `consume` appends `ID\tPARTITION\tPOSITION\n` to `FILE` for every delivery
//! it handles, before the handler reports success, so a line exists for
//! every acknowledged message even after SIGKILL. PARTITION and POSITION are
//! the message's metadata: Kafka partition and offset; Redis `0` and the
//! entry id; AMQP the channel epoch and the delivery tag; NATS `0` and the
//! stream sequence. `--fail-every K`
//! fails every K-th first attempt retryably (the retry layer tries again).
//! `--later-every K` makes every K-th first attempt (counted after
//! `--fail-every`'s) answer "retry after S seconds" (`--later-secs`,
//! default 2): the message is parked through the backend's own mechanism
//! (Kafka retry topics, RabbitMQ wait queues, a Redis due-time index, NATS
//! `nak` with a delay) and handled again once due; a parked copy's line
//! gains a fourth field, how many milliseconds after its due time it ran.
//! It stops after `S` seconds (default 5) without a handled message, or on
//! SIGTERM or Ctrl-C, commits what it finished, and prints one last line to
//! stdout: `processed=… retried=… dead_lettered=… parked=… early=…` (lines
//! written by this run; retries in process plus failures handed back to the
//! broker; permanent failures, acknowledged unprocessed: only a payload
//! that is not a decimal id; messages parked; parked copies handled before
//! their due time, which must be 0). Before an idle exit it waits (up to 60 s) while the group
//! still has unfinished messages that only arrive later: Redis entries
//! pending with a killed consumer, Kafka partitions a killed member holds
//! until its session expires.
//!
//! `relay` consumes `NAME` as `consume` does and publishes each payload
//! unchanged (same key and headers) to `NAME2` on the same broker, created
//! if missing like `NAME` (on NATS a stream `NAME2` storing
//! `ledger.NAME2.>`, published on `ledger.NAME2.relayed`), through the
//! backend's publisher and `PublishLayer`: an input is acknowledged only
//! after the broker confirmed its output, so a SIGKILL at any moment loses
//! no id (it may publish one twice). Inputs of one key are relayed in order.
//! Its last line is `relayed=… retried=… dead_lettered=…` (inputs whose
//! output was confirmed in this run; retries; payloads that are not ids).
//! `ledger consume` on `NAME2` then checks what arrived.
//!
//! `relay --exactly-once` off Kafka needs `--effects-db`: each input's
//! forward is written to a PostgreSQL outbox table (one per `NAME2`) in the
//! exactly-once transaction that marks the input processed, and a relay in
//! the same process publishes the rows, each with its row id in the header
//! `intake.outbox-id`. Each id gets one row, whatever the kills; a row may be
//! published twice (a kill between the broker's confirmation and the
//! outbox's commit), always with the same `intake.outbox-id`, for readers to
//! drop. Before it exits, the relay waits (up to 30 s) for its outbox to
//! empty.
//!
//! `--ordering key` runs each key's messages one after the other
//! (`DeliveryOrder::Key`, the key being the broker's: `id % 64` as
//! `produce` writes them) and parks a parked key's later messages behind it;
//! the ledger file then shows, per key, the order messages were handled in.
//! The default, `unordered`, runs ids in any order.
//!
//! `--effects-db` runs each message through intake-postgres's exactly-once
//! handler, which inserts `(GROUP, NAME, ID)` into `ledger_effects`: the
//! ledger file shows every delivery, the table each id once.
//!
//! Exit codes: 0 done, 1 failed (broker, database, file, or a final commit
//! that failed: finished messages the broker does not know are done), 2 bad
//! arguments.
//! Logs go to stderr (`RUST_LOG`, default `info`). Environment:
//! `LEDGER_KAFKA_SETTINGS` (`key=value,…` librdkafka settings on top of the
//! example's; with `group.protocol=consumer` the groups run under KIP-848,
//! their 6 s session set on the broker), `LEDGER_REDIS_CLAIM_MIN_IDLE_MS` (default 3000),
//! `LEDGER_PG_POOL` (connections, default 16), `LEDGER_NATS_ACK_WAIT_MS`
//! (default 5000).

// A crate root in examples/ looks for its modules next to itself, where the
// other examples live; these are the ledger's own.
#[path = "ledger/amqp.rs"]
mod amqp;
#[path = "ledger/args.rs"]
mod args;
#[path = "support/broker_url.rs"]
mod broker_url;
#[path = "ledger/effects.rs"]
mod effects;
#[path = "ledger/handler.rs"]
mod handler;
#[path = "ledger/journal.rs"]
mod journal;
#[path = "ledger/kafka.rs"]
mod kafka;
#[path = "support/kafka_topics.rs"]
mod kafka_topics;
#[path = "ledger/nats.rs"]
mod nats;
#[path = "ledger/outbox.rs"]
mod outbox;
#[path = "ledger/redis.rs"]
mod redis;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use intake::backend::{Acker, Source};
use intake::parking::{Parking, ParkingLayer};
use intake::postgres::MessageId;
use intake::publish::{Output, PublishLayer, Publisher};
use intake::retry::RetryLayer;
use intake::{
    Consumer, ConsumerBuilder, DeliveryOrder, Exponential, HandlerError, Message, RunReport,
    handler_fn,
};
use tokio_util::sync::CancellationToken;
use tower::util::BoxService;
use tower::{Layer, ServiceBuilder};

use crate::args::{Broker, Command, Consume, Produce, Relay};
use crate::handler::{Activity, CountRetries};
use crate::journal::Journal;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> ExitCode {
    let command = match args::parse(std::env::args().skip(1)) {
        Ok(command) => command,
        Err(error) => {
            if error.to_string().is_empty() {
                println!("{}", args::USAGE);
                return ExitCode::SUCCESS;
            }
            eprintln!("ledger: {error}\n\n{}", args::USAGE);
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,lapin=warn,sqlx=warn".into()),
        )
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("ledger: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        match command {
            Command::Produce(produce_args) => produce(produce_args).await,
            Command::Consume(consume_args) => consume(consume_args).await,
            Command::Relay(relay_args) => relay(relay_args).await,
        }
    });
    // Clients that linger in the background (a Kafka client closing) must
    // not hold the exit.
    runtime.shutdown_timeout(Duration::from_secs(2));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("ledger: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn produce(args: Produce) -> Result<(), BoxError> {
    let started = Instant::now();
    match &args.broker {
        Broker::Kafka { bootstrap } => {
            kafka::create_topic(bootstrap, &args.source, args.partitions).await?;
            kafka::produce(bootstrap, &args.source, args.count).await?;
        }
        Broker::Redis { url } => redis::produce(url, &args.source, args.count).await?,
        Broker::Amqp { url } => amqp::produce(url, &args.source, args.count).await?,
        Broker::Nats { url } => nats::produce(url, &args.source, args.count).await?,
    }
    let elapsed = started.elapsed();
    tracing::info!(
        broker = %args.broker.endpoint(),
        source = %args.source,
        count = args.count,
        ?elapsed,
        per_second = (args.count as f64 / elapsed.as_secs_f64()) as u64,
        "produced and confirmed"
    );
    Ok(())
}

async fn consume(args: Consume) -> Result<(), BoxError> {
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));

    let (journal, journal_thread) =
        Journal::open(&args.ledger).map_err(|error| format!("opening {}: {error}", args.ledger))?;
    let activity =
        Arc::new(Activity::new(args.fail_every).later_every(args.later_every, args.later));
    let message_id = message_id(&args.broker);
    let effects = match &args.effects_db {
        Some(url) => Some(
            effects::connect(
                url,
                &args.group,
                &args.source,
                message_id,
                args.max_in_flight,
            )
            .await?,
        ),
        None => None,
    };
    let handler = ServiceBuilder::new()
        .layer(retries(&activity))
        .service(handler::service(journal, activity.clone(), effects));
    let consumer = Consumer::builder()
        .max_in_flight(args.max_in_flight)
        // Ids have no order to keep unless asked; commits stay ordered
        // regardless.
        .ordering(match args.key_order {
            true => DeliveryOrder::Key,
            false => DeliveryOrder::Unordered,
        })
        .shutdown_deadline(Duration::from_secs(10));

    let job = Job {
        activity: &activity,
        labels: Labels::of_consume(&args),
        shutdown: &shutdown,
        consumer,
        parks: args.later_every.is_some(),
        key_order: args.key_order,
    };
    let ran = connect_and_run(&args.broker, &args.source, &args.group, job, handler).await;
    // The handler, and with it the last Journal, is gone: the writer thread
    // finishes its last batch and stops.
    journal_thread.join();
    let report = ran?;
    println!(
        "processed={} retried={} dead_lettered={} parked={} early={}",
        activity.processed(),
        activity.retried() + report.requeued + report.redispatched,
        report.discarded,
        report.parked,
        activity.early(),
    );
    settled(&report)
}

/// `Ok` unless the run's final commit left finished messages uncommitted:
/// then an error, so the exit status does not claim a run the broker will
/// deliver again in part (the issue saw a relay print success, exit 0, with
/// nothing committed). Messages left unfinished by a stop (a retry waiting
/// in backoff) are the graceful stop's ordinary business (CONTRACT §4):
/// logged, delivered again, no error.
fn settled(report: &RunReport) -> Result<(), BoxError> {
    if report.not_committed.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the final commit failed for {} partitions: their finished messages are delivered again",
        report.not_committed.len()
    )
    .into())
}

/// `handler`, parking through `parking` (given with `--later-every`) what
/// asks for later, keeping a parked key's later messages behind it when
/// the consumer keeps the order per key.
fn parked<H, P>(
    handler: H,
    parking: Option<P>,
    key_order: bool,
    key_of: Option<KeyOf>,
) -> ConsumeHandler
where
    H: tower::Service<Message, Response = (), Error = HandlerError> + Send + 'static,
    H::Future: Send + 'static,
    P: Parking,
{
    match parking {
        Some(parking) => {
            let mut layer = ParkingLayer::new(parking).keep_key_order(key_order);
            if let Some(key_of) = key_of {
                layer = layer.key_with(key_of);
            }
            BoxService::new(layer.layer(handler))
        }
        None => BoxService::new(handler),
    }
}

/// Where a message's key is, when it is not the broker's key.
type KeyOf = for<'a> fn(&'a Message) -> Option<&'a [u8]>;

/// A handler of any stack, so that one `run` takes them all.
type ConsumeHandler = BoxService<Message, (), HandlerError>;

async fn relay(args: Relay) -> Result<(), BoxError> {
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    let activity = Arc::new(Activity::new(None));
    // Kafka's exactly-once relay: its source commits in these transactions.
    let mut transactions = None;
    let (handler, outbox) = match &args.broker {
        Broker::Kafka { bootstrap } if args.exactly_once => {
            kafka::create_topic(bootstrap, &args.to, args::DEFAULT_PARTITIONS).await?;
            let kept = kafka::transactions(bootstrap, &args.group, &args.to)?;
            let handler = kafka::exactly_once_handler(&kept, &args.to, &activity);
            transactions = Some((bootstrap, kept));
            (handler, None)
        }
        Broker::Kafka { bootstrap } => {
            kafka::create_topic(bootstrap, &args.to, args::DEFAULT_PARTITIONS).await?;
            let handler = relay_handler(kafka::publisher(bootstrap)?, args.to.clone(), &activity);
            (handler, None)
        }
        Broker::Redis { url } => {
            let publisher = redis::publisher(url).await?;
            forwarding(publisher, args.to.clone(), &args, &activity).await?
        }
        Broker::Amqp { url } => {
            amqp::declare(url, &args.to).await?;
            let publisher = amqp::publisher(url).await?;
            forwarding(publisher, args.to.clone(), &args, &activity).await?
        }
        Broker::Nats { url } => {
            nats::create_stream(url, &args.to).await?;
            let subject = nats::relay_subject(&args.to);
            forwarding(nats::publisher(url).await?, subject, &args, &activity).await?
        }
    };
    let consumer = Consumer::builder()
        .max_in_flight(args.max_in_flight)
        // Each key's outputs in its inputs' order.
        .ordering(DeliveryOrder::Key)
        .shutdown_deadline(Duration::from_secs(10));
    let job = Job {
        activity: &activity,
        labels: Labels {
            broker: &args.broker,
            source: &args.source,
            group: &args.group,
            writes_to: &args.to,
            idle_exit: args.idle_exit,
        },
        shutdown: &shutdown,
        consumer,
        parks: false,
        key_order: true,
    };
    let report = match &transactions {
        Some((bootstrap, kept)) => {
            kafka::run_exactly_once(bootstrap, &args.source, &args.group, kept, job, handler)
                .await?
        }
        None => connect_and_run(&args.broker, &args.source, &args.group, job, handler).await?,
    };
    if let Some(outbox) = outbox {
        let published = outbox.drain().await?;
        tracing::info!(published, "the outbox relay published its rows");
    }
    println!(
        "relayed={} retried={} dead_lettered={}",
        report.succeeded,
        activity.retried() + report.requeued + report.redispatched,
        report.discarded,
    );
    settled(&report)
}

/// What a relay runs each input through.
type RelayHandler = BoxService<Message, (), HandlerError>;

/// The relay's handler off Kafka: publishing directly, or with
/// `--exactly-once` through the outbox in `--effects-db` (and the outbox's
/// relay, which the caller drains before it exits).
async fn forwarding<P: Publisher + Sync>(
    publisher: P,
    destination: String,
    args: &Relay,
    activity: &Arc<Activity>,
) -> Result<(RelayHandler, Option<outbox::Outbox>), BoxError> {
    let Some(url) = args.effects_db.as_deref().filter(|_| args.exactly_once) else {
        return Ok((relay_handler(publisher, destination, activity), None));
    };
    let (write_outbox, outbox) = outbox::connect(
        url,
        &args.group,
        destination,
        message_id(&args.broker),
        args.max_in_flight,
        publisher,
    )
    .await?;
    let touched = Arc::clone(activity);
    let handler = ServiceBuilder::new()
        .layer(retries(activity))
        .map_request(move |message: Message| {
            touched.touch();
            message
        })
        .service(write_outbox);
    Ok((BoxService::new(handler), Some(outbox)))
}

/// What identifies a message across redeliveries, for the processed-markers.
fn message_id(broker: &Broker) -> MessageId {
    match broker {
        // AMQP delivery tags change on redelivery; the producer's
        // message-id property does not.
        Broker::Amqp { .. } => MessageId::header(intake::amqp::headers::MESSAGE_ID),
        Broker::Kafka { .. } | Broker::Redis { .. } | Broker::Nats { .. } => MessageId::Position,
    }
}

/// Forwards each input to `destination` unchanged (payload, key, headers)
/// and completes it once the broker confirmed the output: a payload that is
/// not an id is a permanent failure, a failed publish a retryable one.
/// Boxed, because each backend's publisher makes a handler of its own type
/// and one `run` takes them all.
fn relay_handler<P: Publisher>(
    publisher: P,
    destination: String,
    activity: &Arc<Activity>,
) -> RelayHandler {
    let destination: Arc<str> = destination.into();
    let touched = Arc::clone(activity);
    let forward = handler_fn(move |message: Message| {
        touched.touch();
        let destination = Arc::clone(&destination);
        async move {
            handler::parse_id(message.payload())?;
            Ok::<_, HandlerError>(Output::forward(&message, destination))
        }
    });
    BoxService::new(
        ServiceBuilder::new()
            .layer(retries(activity))
            .layer(PublishLayer::new(publisher))
            .service(forward),
    )
}

/// The retry layer of both commands: ten tries within a few seconds, each
/// counted.
fn retries(activity: &Arc<Activity>) -> RetryLayer<Exponential, CountRetries> {
    RetryLayer::new(
        Exponential::new(Duration::from_millis(10), Duration::from_millis(500)).max_retries(10),
    )
    .observe(CountRetries(Arc::clone(activity)))
}

/// A consumer to run on whichever backend the broker URL names: what
/// [`connect_and_run`] needs besides the source and the handler.
struct Job<'a> {
    activity: &'a Arc<Activity>,
    labels: Labels<'a>,
    shutdown: &'a CancellationToken,
    consumer: ConsumerBuilder,
    /// `--later-every`: park what asks for later through the backend.
    parks: bool,
    /// `--ordering key`: a parked key's later messages wait behind it.
    key_order: bool,
}

/// What the run's log lines name, and when it exits.
struct Labels<'a> {
    broker: &'a Broker,
    source: &'a str,
    group: &'a str,
    /// The ledger file (`consume`) or the destination (`relay`).
    writes_to: &'a str,
    idle_exit: Duration,
}

impl<'a> Labels<'a> {
    fn of_consume(args: &'a Consume) -> Self {
        Self {
            broker: &args.broker,
            source: &args.source,
            group: &args.group,
            writes_to: &args.ledger,
            idle_exit: args.idle_exit,
        }
    }
}

/// Connects a member of `group` to `source` on `broker`, and runs it with
/// `handler` until it is idle or signalled.
async fn connect_and_run<H>(
    broker: &Broker,
    source: &str,
    group: &str,
    job: Job<'_>,
    handler: H,
) -> Result<RunReport, BoxError>
where
    H: tower::Service<intake::Message, Response = (), Error = intake::HandlerError>
        + Send
        + 'static,
    H::Future: Send + 'static,
{
    match broker {
        Broker::Kafka { bootstrap } => {
            let source_name = source;
            let parking = match job.parks {
                true => Some(kafka::parking(bootstrap, source_name, group).await?),
                false => None,
            };
            let source = kafka::source(bootstrap, source_name, group, parking.as_ref()).await?;
            let acker = source.acker();
            let backlog = Backlog::Kafka(
                kafka::LagProbe::new(bootstrap, source_name, group)?.with_parking(parking.clone()),
            );
            let handler = parked(handler, parking, job.key_order, None);
            run(source, acker, handler, job, Some(backlog)).await
        }
        Broker::Redis { url } => {
            let pending = redis::PendingProbe::connect(url, source, group).await?;
            let source = redis::source(url, source, group, job.parks).await?;
            let acker = source.acker();
            let parking = match job.parks {
                true => Some(source.parking().build().await?),
                false => None,
            };
            let handler = parked(handler, parking, job.key_order, None);
            run(source, acker, handler, job, Some(Backlog::Redis(pending))).await
        }
        Broker::Amqp { url } => {
            let parking = match job.parks {
                true => Some(amqp::parking(url, source).await?),
                false => None,
            };
            let source = amqp::source(url, source, group).await?;
            let acker = source.acker();
            // An AMQP message's broker key is its routing key, the queue's
            // name for every id: the ledger's key travels in a header.
            let handler = parked(handler, parking, job.key_order, Some(amqp::key_of));
            let job = Job {
                consumer: job.consumer.key_with(amqp::key_of),
                ..job
            };
            run(source, acker, handler, job, None).await
        }
        Broker::Nats { url } => {
            let pending = nats::PendingProbe::connect(url, source, group).await?;
            let source = nats::source(url, source, group).await?;
            let acker = source.acker();
            let handler = parked(
                handler,
                job.parks.then(|| source.parking()),
                job.key_order,
                None,
            );
            run(source, acker, handler, job, Some(Backlog::Nats(pending))).await
        }
    }
}

/// What a consumer that is idle asks before it exits: whether its group
/// still has unfinished messages that it may yet receive. After a SIGKILL
/// they come back only later: Redis entries once they are idle longer than
/// the claim delay, Kafka partitions once the broker expires the dead
/// member's session, NATS messages after the consumer's `ack_wait`.
/// (RabbitMQ requeues a dead consumer's messages at once.)
enum Backlog {
    /// Entries delivered and not acknowledged, with any consumer.
    Redis(redis::PendingProbe),
    /// Messages past the group's committed offsets, and those its parking
    /// holds (parked, or back and not committed).
    Kafka(kafka::LagProbe),
    /// Messages the durable consumer has not had acknowledged.
    Nats(nats::PendingProbe),
}

impl Backlog {
    /// Unfinished messages, or `None` when the broker could not say.
    async fn size(&mut self) -> Option<u64> {
        match self {
            Backlog::Redis(probe) => probe.pending().await,
            Backlog::Kafka(probe) => probe.lag().await,
            Backlog::Nats(probe) => probe.pending().await,
        }
    }
}

/// Runs the consumer until it has been idle for `--idle-exit-secs` or a
/// signal arrives, and reports what it did.
async fn run<S, A, H>(
    source: S,
    acker: A,
    handler: H,
    Job {
        activity,
        labels,
        shutdown,
        consumer,
        parks: _,
        key_order: _,
    }: Job<'_>,
    backlog: Option<Backlog>,
) -> Result<RunReport, BoxError>
where
    S: Source,
    A: Acker,
    H: tower::Service<intake::Message, Response = (), Error = intake::HandlerError>
        + Send
        + 'static,
    H::Future: Send + 'static,
{
    let consumer = consumer.build(source, acker, handler)?;
    tracing::info!(
        broker = %labels.broker.endpoint(),
        source = %labels.source,
        group = %labels.group,
        to = %labels.writes_to,
        "consuming"
    );
    // Connecting is not idleness: the clock starts now.
    activity.touch();
    let idle_watch = tokio::spawn(exit_when_idle(
        activity.clone(),
        labels.idle_exit,
        backlog,
        shutdown.clone(),
    ));
    let ran = consumer.run(shutdown.clone()).await;
    idle_watch.abort();
    let report = ran?;
    tracing::info!(
        succeeded = report.succeeded,
        requeued = report.requeued,
        redispatched = report.redispatched,
        discarded = report.discarded,
        interrupted = report.interrupted,
        unfinished = report.unfinished.len(),
        elapsed = ?report.elapsed,
        "stopped"
    );
    Ok(report)
}

/// Longest the idle exit waits for the group's backlog: far beyond the
/// claim delay and the session timeout, yet finite, so that a message
/// nobody can finish (or another group member that holds on to its
/// partitions) does not keep the consumer forever.
const BACKLOG_PATIENCE: Duration = Duration::from_secs(60);

async fn exit_when_idle(
    activity: Arc<Activity>,
    idle_exit: Duration,
    mut backlog: Option<Backlog>,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut backlog_since: Option<Instant> = None;
    loop {
        tick.tick().await;
        if activity.idle_for() < idle_exit {
            backlog_since = None;
            continue;
        }
        if let Some(backlog) = &mut backlog {
            // Unknown counts as unfinished: the patience bounds the wait.
            let unfinished = backlog.size().await;
            let first_look = backlog_since.is_none();
            let waited = backlog_since.get_or_insert_with(Instant::now).elapsed();
            if unfinished != Some(0) && waited < BACKLOG_PATIENCE {
                if first_look {
                    tracing::info!(
                        ?unfinished,
                        "idle, but the group has unfinished messages: waiting for them"
                    );
                }
                // Asking costs the broker a little: not every tick.
                tokio::time::sleep(Duration::from_millis(400)).await;
                continue;
            }
            if unfinished != Some(0) {
                tracing::warn!(
                    ?unfinished,
                    "the group still has unfinished messages; exiting anyway"
                );
            }
        }
        tracing::info!(?idle_exit, "idle: shutting down");
        shutdown.cancel();
        return;
    }
}

/// SIGTERM or Ctrl-C starts a graceful shutdown; a second one is left to the
/// default (the process is already stopping).
async fn cancel_on_signal(shutdown: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = terminate.recv() => tracing::info!("SIGTERM: shutting down"),
                    _ = tokio::signal::ctrl_c() => tracing::info!("Ctrl-C: shutting down"),
                }
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; Ctrl-C only");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    shutdown.cancel();
}
