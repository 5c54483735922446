//! Kafka: the topic, the producer and the consumer-group source.
//!
//! PARTITION is the topic partition, POSITION the offset.

use std::collections::VecDeque;
use std::time::Duration;

use intake::kafka::rdkafka::ClientConfig;
use intake::kafka::rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use intake::kafka::rdkafka::client::DefaultClientContext;
use intake::kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
use intake::kafka::rdkafka::error::{KafkaError, RDKafkaErrorCode};
use intake::kafka::rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use intake::kafka::rdkafka::{Offset, TopicPartitionList};
use intake::kafka::{
    GroupProtocol, KafkaParking, KafkaPublisher, KafkaSettings, KafkaSource, KafkaSourceBuilder,
    KafkaTransactions,
};
use intake::publish::Output;
use intake::{HandlerError, Message, RunReport, handler_fn};
use tower::ServiceBuilder;
use tower::util::BoxService;

use crate::handler::Activity;
use crate::{BoxError, Job, RelayHandler};

/// Extra librdkafka settings, `key=value` separated by commas, applied to
/// every client after the example's own (so they win).
/// `group.protocol=consumer` among them runs the groups under KIP-848.
pub const SETTINGS_ENV: &str = "LEDGER_KAFKA_SETTINGS";

/// The ledger's group session: a SIGKILLed member holds its partitions
/// this long. Under the classic protocol the member asks for it
/// (`session.timeout.ms`); under KIP-848 the broker keeps it, per group
/// (`consumer.session.timeout.ms`, set by [`group_timings`]).
const SESSION_TIMEOUT_MS: &str = "6000";
const HEARTBEAT_INTERVAL_MS: &str = "1000";

/// The source's `min_commit_interval` in milliseconds (default: the
/// source's own, 100 ms): how often offsets may be committed while a
/// backlog drains, and so how much work a crash repeats.
pub const MIN_COMMIT_ENV: &str = "LEDGER_KAFKA_MIN_COMMIT_MS";

/// The `transactional.id` of `ledger relay --exactly-once` (default
/// `ledger-relay.GROUP.TO`): one per relay running at a time, kept across
/// restarts, so a restarted relay aborts what the killed one left open.
pub const TRANSACTIONAL_ID_ENV: &str = "LEDGER_KAFKA_TRANSACTIONAL_ID";

/// `settings` with the environment's settings on top.
fn with_env(mut settings: KafkaSettings) -> Result<KafkaSettings, BoxError> {
    if let Ok(extra) = std::env::var(SETTINGS_ENV) {
        for pair in extra.split(',').filter(|pair| !pair.trim().is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("{SETTINGS_ENV}: `{pair}` is not key=value"))?;
            settings = settings.set(key.trim(), value.trim());
        }
    }
    Ok(settings)
}

/// Creates `topic` with `partitions` partitions unless it exists (with
/// whatever partition count it has), with the environment's settings.
pub async fn create_topic(bootstrap: &str, topic: &str, partitions: i32) -> Result<(), BoxError> {
    let settings = with_env(KafkaSettings::new(bootstrap))?;
    crate::kafka_topics::create_topic(&settings, topic, partitions).await
}

/// Most deliveries awaited at once: bounds memory, and stays below
/// librdkafka's local queue so that `QueueFull` is rare.
const MAX_UNCONFIRMED: usize = 100_000;

/// Sends ids `0..count` (key `id % 64`) and returns once the broker
/// acknowledged every one with `acks=all`.
pub async fn produce(bootstrap: &str, topic: &str, count: u64) -> Result<(), BoxError> {
    // Batching is what makes this fast: librdkafka gathers records for up
    // to `linger.ms` into one request per partition.
    let producer: FutureProducer = ClientConfig::clone(
        with_env(
            KafkaSettings::new(bootstrap)
                .set("acks", "all")
                .set("linger.ms", "5")
                .set("queue.buffering.max.messages", "200000")
                .set("message.timeout.ms", "60000"),
        )?
        .client_config(),
    )
    .create()?;
    let mut unconfirmed: VecDeque<(u64, DeliveryFuture)> = VecDeque::new();
    for id in 0..count {
        let payload = id.to_string();
        let key = (id % 64).to_string();
        loop {
            if unconfirmed.len() >= MAX_UNCONFIRMED {
                confirm(unconfirmed.pop_front()).await?;
            }
            let record = FutureRecord::to(topic).key(&key).payload(&payload);
            match producer.send_result(record) {
                Ok(delivery) => {
                    unconfirmed.push_back((id, delivery));
                    break;
                }
                // librdkafka's queue is full: wait for the oldest delivery,
                // which frees room, and try again.
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    if unconfirmed.is_empty() {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    } else {
                        confirm(unconfirmed.pop_front()).await?;
                    }
                }
                Err((error, _)) => return Err(format!("sending id {id}: {error}").into()),
            }
        }
    }
    while let Some(delivery) = unconfirmed.pop_front() {
        confirm(Some(delivery)).await?;
    }
    Ok(())
}

async fn confirm(delivery: Option<(u64, DeliveryFuture)>) -> Result<(), BoxError> {
    let Some((id, delivery)) = delivery else {
        return Ok(());
    };
    match delivery.await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((error, _))) => Err(format!("the broker refused id {id}: {error}").into()),
        Err(_) => Err(format!("the producer dropped id {id} unconfirmed").into()),
    }
}

/// The relay's publisher: an idempotent producer (no duplicates from the
/// client's own retries; a killed relay may still repeat an output).
pub fn publisher(bootstrap: &str) -> Result<KafkaPublisher, BoxError> {
    Ok(KafkaPublisher::builder(KafkaSettings::new(bootstrap)).build()?)
}

/// A consumer-group member of `group` on `topic` (created if missing),
/// reading with `isolation.level=read_committed`: outputs of aborted
/// transactions (a killed `relay --exactly-once`) are never consumed.
///
/// A member killed with SIGKILL never leaves the group; its partitions
/// stay with it until the broker gives up on its session. A short session
/// timeout keeps that wait (and so a restarted consumer's) to seconds.
///
/// With `parking` (`--later-every`), it also reads the group's return topic,
/// where parked copies come back once due (from its start where the group
/// has no offset there: a copy may come back before any member has one).
pub async fn source(
    bootstrap: &str,
    topic: &str,
    group: &str,
    parking: Option<&KafkaParking>,
) -> Result<KafkaSource, BoxError> {
    let mut builder = source_builder(bootstrap, topic, group).await?;
    if let Some(parking) = parking {
        builder = builder.parking(parking);
    }
    Ok(builder.build().await?)
}

/// Where `--later-every` parks: tiered retry topics of `topic`, whose
/// copies a mover returns to the group's return topic once due. Built
/// before the source: it creates the return topic the source subscribes to.
///
/// The mover's group takes the source's session timeout: the retry
/// partitions a killed mover held go to the next one within seconds, not
/// after librdkafka's default 45 s.
pub async fn parking(bootstrap: &str, topic: &str, group: &str) -> Result<KafkaParking, BoxError> {
    create_topic(bootstrap, topic, crate::args::DEFAULT_PARTITIONS).await?;
    // The mover's group is the parking's group name with `.parking`.
    let settings =
        group_timings(KafkaSettings::new(bootstrap), &format!("{group}.parking")).await?;
    Ok(KafkaParking::builder(settings, group)
        .topics([topic])
        .build()
        .await?)
}

async fn source_builder(
    bootstrap: &str,
    topic: &str,
    group: &str,
) -> Result<KafkaSourceBuilder, BoxError> {
    create_topic(bootstrap, topic, crate::args::DEFAULT_PARTITIONS).await?;
    let settings = group_timings(
        KafkaSettings::new(bootstrap)
            .set("max.poll.interval.ms", "60000")
            .set("topic.metadata.refresh.interval.ms", "5000")
            .set("isolation.level", "read_committed"),
        group,
    )
    .await?;
    let mut builder = KafkaSource::builder(settings)
        .group(group)
        .topic(topic)
        .connect_timeout(Duration::from_secs(15))
        .close_timeout(Duration::from_secs(5));
    if let Ok(millis) = std::env::var(MIN_COMMIT_ENV) {
        let millis: u64 = millis
            .parse()
            .map_err(|error| format!("{MIN_COMMIT_ENV}=`{millis}`: {error}"))?;
        builder = builder.min_commit_interval(Duration::from_millis(millis));
    }
    Ok(builder)
}

/// `settings` with the environment's on top, and the ledger's group
/// session and heartbeat for `group` under the protocol they choose:
/// member settings under the classic protocol (unless the environment sets
/// them), the group's broker-side config under KIP-848, which refuses them
/// as member settings and would otherwise hold a killed member's
/// partitions for the broker's default 45 s.
async fn group_timings(settings: KafkaSettings, group: &str) -> Result<KafkaSettings, BoxError> {
    let settings = with_env(settings)?;
    if settings.chosen_group_protocol()? == GroupProtocol::Consumer {
        set_group_config(&settings, group).await?;
        return Ok(settings);
    }
    let chosen = |key: &str| settings.client_config().get(key).is_some();
    let (session, heartbeat) = (
        chosen("session.timeout.ms"),
        chosen("heartbeat.interval.ms"),
    );
    let mut settings = settings;
    if !session {
        settings = settings.set("session.timeout.ms", SESSION_TIMEOUT_MS);
    }
    if !heartbeat {
        settings = settings.set("heartbeat.interval.ms", HEARTBEAT_INTERVAL_MS);
    }
    Ok(settings)
}

/// Sets the ledger's session and heartbeat as `group`'s config on the
/// broker (KIP-848, Kafka 4.0+), and waits (up to 10 s) until the broker
/// applies it: a member that joins before would keep the defaults until
/// its next heartbeat.
async fn set_group_config(settings: &KafkaSettings, group: &str) -> Result<(), BoxError> {
    let admin: AdminClient<DefaultClientContext> = settings.client_config().create()?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let timings = AlterConfig::new(ResourceSpecifier::Group(group))
        .set("consumer.session.timeout.ms", SESSION_TIMEOUT_MS)
        .set("consumer.heartbeat.interval.ms", HEARTBEAT_INTERVAL_MS);
    for result in admin.alter_configs(&[timings], &options).await? {
        result.map_err(|(_, code)| format!("setting group {group}'s session: {code}"))?;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        // rdkafka cannot read an entry whose source is the group's own
        // config (RD_KAFKA_CONFIG_SOURCE_GROUP_CONFIG): once the broker
        // applied it, the describe fails naming that source.
        let applied = match admin
            .describe_configs(&[ResourceSpecifier::Group(group)], &options)
            .await
        {
            Err(error) => error.to_string().contains("GROUP_CONFIG"),
            Ok(found) => found.into_iter().flatten().any(|config| {
                config.entries.iter().any(|entry| {
                    entry.name == "consumer.session.timeout.ms"
                        && entry.value.as_deref() == Some(SESSION_TIMEOUT_MS)
                })
            }),
        };
        if applied {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(format!("group {group}'s session config not applied within 10 s").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The transactions of `ledger relay --exactly-once` from `group` to `to`.
/// A short transaction timeout: a relay killed and not restarted holds
/// back `read_committed` readers of `to` for that long at most.
pub fn transactions(bootstrap: &str, group: &str, to: &str) -> Result<KafkaTransactions, BoxError> {
    let id = std::env::var(TRANSACTIONAL_ID_ENV)
        .unwrap_or_else(|_| format!("ledger-relay.{group}.{to}"));
    Ok(
        KafkaTransactions::new(with_env(KafkaSettings::new(bootstrap))?, id)
            .transaction_timeout(Duration::from_secs(10))
            .operation_timeout(Duration::from_secs(15)),
    )
}

/// The handler of `ledger relay --exactly-once`: each input's payload,
/// key and headers forwarded to `to`, kept for the transaction that
/// commits the input (retried as the publishing relay's are).
pub fn exactly_once_handler(
    transactions: &KafkaTransactions,
    to: &str,
    activity: &std::sync::Arc<Activity>,
) -> RelayHandler {
    let destination: std::sync::Arc<str> = to.into();
    let touched = std::sync::Arc::clone(activity);
    let forward = handler_fn(move |message: Message| {
        touched.touch();
        let destination = std::sync::Arc::clone(&destination);
        async move {
            crate::handler::parse_id(message.payload())?;
            Ok::<_, HandlerError>(Output::forward(&message, destination))
        }
    });
    BoxService::new(
        ServiceBuilder::new()
            .layer(crate::retries(activity))
            .layer(transactions.layer())
            .service(forward),
    )
}

/// Runs `ledger relay --exactly-once`: the source reads `topic` in `group`
/// and commits its offsets in `transactions` with the outputs `handler`
/// kept.
pub async fn run_exactly_once(
    bootstrap: &str,
    topic: &str,
    group: &str,
    transactions: &KafkaTransactions,
    job: Job<'_>,
    handler: RelayHandler,
) -> Result<RunReport, BoxError> {
    let source = source_builder(bootstrap, topic, group)
        .await?
        .exactly_once(transactions)
        .build()
        .await?;
    let acker = source.acker();
    let backlog = crate::Backlog::Kafka(LagProbe::new(bootstrap, topic, group)?);
    crate::run(source, acker, handler, job, Some(backlog)).await
}

/// Measures the group's lag: messages past its committed offsets, over
/// every partition of the topic, and with `--later-every` what its parking
/// holds (parked in the retry topics, or back in the return topic and not
/// committed): a parked message is out of the topic's lag for as long as it
/// waits. The idle exit waits while there is lag: a restarted consumer gets
/// no partitions until the broker gives up on the killed member's session,
/// which may be later than its idle deadline, and parked messages come back
/// only once due.
///
/// A plain client with the group's id that never subscribes, so it reads
/// the group's offsets without joining it.
pub struct LagProbe {
    client: std::sync::Arc<BaseConsumer>,
    topic: String,
    parking: Option<KafkaParking>,
}

impl LagProbe {
    pub fn new(bootstrap: &str, topic: &str, group: &str) -> Result<Self, BoxError> {
        let client: BaseConsumer = with_env(KafkaSettings::new(bootstrap))?
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .client_config()
            .create()?;
        Ok(Self {
            client: std::sync::Arc::new(client),
            topic: topic.to_owned(),
            parking: None,
        })
    }

    /// Counts what `parking` holds too (`--later-every`).
    pub fn with_parking(mut self, parking: Option<KafkaParking>) -> Self {
        self.parking = parking;
        self
    }

    /// The group's lag, or `None` when the broker could not say (a group
    /// that is rebalancing, a broker restarting): unknown is not "none".
    pub async fn lag(&self) -> Option<u64> {
        let (client, topic) = (self.client.clone(), self.topic.clone());
        // librdkafka's calls block: keep them off the runtime's workers.
        let lag = tokio::task::spawn_blocking(move || group_lag(&client, &topic)).await;
        let parked = match &self.parking {
            None => 0,
            Some(parking) => match parking.backlog().await {
                Ok(backlog) => backlog.total(),
                Err(error) => {
                    tracing::warn!(error = %intake::ErrorChain::new(&error), "counting the parked messages failed; the backlog is unknown");
                    return None;
                }
            },
        };
        match lag {
            Ok(Ok(lag)) => Some(lag.saturating_add(parked)),
            Ok(Err(error)) => {
                tracing::warn!(%error, "reading the group's lag failed; the backlog is unknown");
                None
            }
            Err(error) => {
                tracing::warn!(%error, "the lag probe panicked; the backlog is unknown");
                None
            }
        }
    }
}

fn group_lag(client: &BaseConsumer, topic: &str) -> Result<u64, KafkaError> {
    const TIMEOUT: Duration = Duration::from_secs(5);
    let metadata = client.fetch_metadata(Some(topic), TIMEOUT)?;
    let mut partitions = TopicPartitionList::new();
    for topic_metadata in metadata.topics() {
        for partition in topic_metadata.partitions() {
            partitions.add_partition(topic, partition.id());
        }
    }
    let committed = client.committed_offsets(partitions, TIMEOUT)?;
    let mut lag = 0;
    for element in committed.elements() {
        let (low, high) = client.fetch_watermarks(topic, element.partition(), TIMEOUT)?;
        let from = match element.offset() {
            Offset::Offset(offset) => offset,
            // Nothing committed: the group starts at the beginning.
            _ => low,
        };
        lag += u64::try_from(high - from).unwrap_or(0);
    }
    Ok(lag)
}
