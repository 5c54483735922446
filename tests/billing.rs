//! The billing example's service (`examples/billing/service.rs`), run as
//! it is on the memory broker and on each real broker: every payment billed
//! once and receipted in its account's order, the negative ones
//! dead-lettered, the frozen account's parked and billed once it came back.
//!
//! On a real broker (`--features kafka`, `redis`, `amqp`, `nats`) the
//! service is made from the broker's URL ([`intake::AnyBroker::from_url`]),
//! with names of its own per run; the payments go in through the broker's
//! derived publisher, keyed by account, and the receipts are read back with
//! the broker's own client. What each broker needs first is made with its
//! own client: Kafka topics of 3 partitions; on RabbitMQ a fanout exchange
//! per queue (the publisher's destination is an exchange, its key the
//! routing key); on NATS streams on `in.{stream}.>` and `out.{stream}.>`
//! (not `{stream}.>`, which would capture the route's dead letters). A
//! broker that does not answer skips its test, saying so, unless
//! `INTAKE_REQUIRE_BROKERS=1`. Every wait is bounded; no test asserts how
//! long anything took.

#[path = "../examples/billing/service.rs"]
#[allow(dead_code)]
mod service;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use intake::backend::{Broker, DeadLetterStore, RouteAddress};
use intake::dead_letter::store::Filter;
use intake::memory::{MemoryBroker, Record};
use tokio_util::sync::CancellationToken;

const PAYMENTS: u64 = 60;
const ACCOUNTS: [&str; 4] = ["alice", "bob", "carol", "frozen"];

fn payment(id: u64) -> (String, String) {
    let account = ACCOUNTS[(id % 4) as usize].to_owned();
    let cents = if id % 25 == 11 { -100 } else { 100 + id as i64 };
    (
        account.clone(),
        format!(r#"{{"id":{id},"account":"{account}","cents":{cents}}}"#),
    )
}

fn refused(id: u64) -> bool {
    id % 25 == 11
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_billing_service_on_the_memory_broker() {
    let broker = MemoryBroker::new();
    broker.create_topic("payments", 3).unwrap();
    broker.create_topic("receipts", 3).unwrap();
    for id in 0..PAYMENTS {
        let (account, json) = payment(id);
        broker
            .send("payments", Record::new(json).with_key(account))
            .unwrap();
    }
    let billing = service::Billing::new("receipts");
    let stop = CancellationToken::new();
    let running = tokio::spawn(
        service::billing(broker.clone(), Arc::clone(&billing), "payments").run_until(stop.clone()),
    );
    let expected = (0..PAYMENTS).filter(|id| !refused(*id)).count();
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let receipts: usize = broker
                .high_watermarks("receipts")
                .unwrap()
                .iter()
                .map(|end| *end as usize)
                .sum();
            if receipts >= expected && broker.lag("payments", "billing").unwrap() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("every payment receipted within 60 s");
    stop.cancel();
    let report = running.await.unwrap().unwrap();
    let run = report.route("payments").and_then(|r| r.report()).unwrap();
    assert_eq!(run.dead_lettered, 2, "the two negative payments");

    let store = Broker::dead_letter_store(&broker, &RouteAddress::new("payments", "billing"))
        .await
        .unwrap();
    assert_eq!(store.count(&Filter::all()).await.unwrap(), 2);

    // Receipts: one per billed payment, each account's in payment order.
    let mut last: HashMap<String, u64> = HashMap::new();
    let mut receipts = 0;
    for partition in 0..3 {
        for message in broker.messages("receipts", partition, 0).unwrap() {
            let text = std::str::from_utf8(message.payload()).unwrap();
            let receipt: serde_json::Value = serde_json::from_str(text).unwrap();
            let id = receipt["payment"].as_u64().unwrap();
            let account = std::str::from_utf8(message.key().unwrap())
                .unwrap()
                .to_owned();
            if let Some(before) = last.insert(account.clone(), id) {
                assert!(before < id, "{account}: receipt {id} after {before}");
            }
            receipts += 1;
        }
    }
    assert_eq!(receipts, expected, "one receipt per billed payment");
    for account in ACCOUNTS {
        let billed: i64 = (0..PAYMENTS)
            .filter(|id| !refused(*id) && ACCOUNTS[(id % 4) as usize] == account)
            .map(|id| 100 + id as i64)
            .sum();
        assert_eq!(billing.balance(account), billed, "{account}'s balance");
    }
}

// --- each compiled backend: the same service, the broker from its URL ---

/// What the tests on the real brokers share: the run, and the receipts
/// read back with each broker's own client.
#[cfg(any(
    feature = "kafka",
    feature = "redis",
    feature = "amqp",
    feature = "nats"
))]
mod real {
    use std::time::Instant;

    use intake::AnyBroker;
    use intake::backend::testkit::harness::unique_group;
    use intake::backend::testkit::skip_or_fail;
    use intake::publish::{Output, Publisher};

    use super::*;

    /// The bound of every wait on a broker.
    pub const PATIENCE: Duration = Duration::from_secs(60);

    /// Whether something listens on 127.0.0.1:`port`; if not, skips `test`
    /// (or fails it under `INTAKE_REQUIRE_BROKERS=1`).
    pub fn listening(test: &str, port: u16) -> bool {
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        match std::net::TcpStream::connect_timeout(&address, Duration::from_secs(2)) {
            Ok(_) => true,
            Err(error) => {
                skip_or_fail(test, &format!("no broker on {address}: {error}"));
                false
            }
        }
    }

    /// A name of this run's own, the prefix of every name it uses (so that
    /// what the route derives from them, `{name}.billing.dlq` and the like,
    /// shares it too).
    pub fn run_name() -> String {
        unique_group("billing")
    }

    /// Where the run's payments and receipts go on one broker.
    pub struct Names {
        /// The route's source: a topic, stream or queue.
        pub payments: String,
        /// Where the payments are published (the source itself, or what
        /// routes to it: a RabbitMQ exchange, a NATS subject prefix).
        pub publish_payments_to: String,
        /// Where the service publishes its receipts (`Billing::new`).
        pub receipts: String,
    }

    /// One stored receipt: the account it is keyed by, and the payment it
    /// bills.
    pub fn receipt(account: &str, payload: &[u8]) -> (String, u64) {
        let text = std::str::from_utf8(payload).expect("a receipt is UTF-8");
        let receipt: serde_json::Value = serde_json::from_str(text).expect("a receipt is JSON");
        let payment = receipt["payment"].as_u64().expect("the receipt's payment");
        (account.to_owned(), payment)
    }

    /// Runs the billing service on the broker of `url` over the 60 payments,
    /// and checks what the memory test checks: the two negative payments
    /// dead-lettered (in the run's report and in the derived dead-letter
    /// store), one receipt per billed payment, each account's receipts in
    /// payment order, the balances.
    ///
    /// `count` tells how many receipts are stored, `read` reads them all
    /// (each account's in the order stored), with the broker's own client.
    pub async fn bills_every_payment_on<C, R>(
        url: &str,
        kind: &str,
        names: &Names,
        count: impl Fn() -> C,
        read: impl FnOnce() -> R,
    ) where
        C: Future<Output = u64>,
        R: Future<Output = Vec<(String, u64)>>,
    {
        let began = Instant::now();
        let broker = AnyBroker::from_url(url).expect("a broker of the URL");
        assert_eq!(broker.kind(), kind);

        // The payments, keyed by account, through the broker's derived
        // publisher: all sent, then every confirmation awaited.
        let publisher = tokio::time::timeout(PATIENCE, Broker::publisher(&broker))
            .await
            .expect("the publisher within the patience")
            .expect("derive the publisher");
        let mut confirmations = Vec::new();
        for id in 0..PAYMENTS {
            let (account, json) = payment(id);
            let output = Output::new(names.publish_payments_to.as_str(), json).with_key(account);
            confirmations.push(publisher.send(output).await.expect("send a payment"));
        }
        for confirmation in confirmations {
            tokio::time::timeout(PATIENCE, confirmation)
                .await
                .expect("a payment confirmed within the patience")
                .expect("a payment confirmed");
        }
        let published = began.elapsed();

        let billing = service::Billing::new(names.receipts.as_str());
        let stop = CancellationToken::new();
        let running = tokio::spawn(
            service::billing(broker.clone(), Arc::clone(&billing), &names.payments)
                .shutdown_timeout(Duration::from_secs(20))
                .run_until(stop.clone()),
        );
        let expected = (0..PAYMENTS).filter(|id| !refused(*id)).count() as u64;
        let receipted = tokio::time::timeout(PATIENCE, async {
            loop {
                let stored = count().await;
                if stored >= expected || running.is_finished() {
                    return stored;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        let billed = began.elapsed();
        let dead_letters = match receipted {
            Ok(stored) if stored >= expected => {
                // Both negative payments were settled before a later
                // payment of their account could be receipted; the
                // store's count is read until it shows them (bounded).
                let address = RouteAddress::new(names.payments.as_str(), "billing");
                let store = tokio::time::timeout(PATIENCE, broker.dead_letter_store(&address))
                    .await
                    .expect("the dead-letter store within the patience")
                    .expect("derive the dead-letter store");
                let mut counted = 0;
                let deadline = Instant::now() + Duration::from_secs(20);
                while Instant::now() < deadline {
                    counted = tokio::time::timeout(PATIENCE, store.count(&Filter::all()))
                        .await
                        .expect("the dead-letter count within the patience")
                        .expect("count the dead letters");
                    if counted >= 2 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Some(counted)
            }
            _ => None,
        };
        stop.cancel();
        let report = tokio::time::timeout(PATIENCE, running)
            .await
            .expect("the service stops within the patience")
            .expect("the service's task")
            .expect("the service ends well");
        let stopped = began.elapsed();
        let run = report
            .route(&names.payments)
            .and_then(|route| route.report())
            .expect("the route's report");
        let stored = receipted.unwrap_or_else(|_| {
            panic!("{expected} receipts within {PATIENCE:?}; the run: {run:?}")
        });
        assert!(
            stored >= expected,
            "the service stopped early with {stored} receipts: {report:?}"
        );
        assert_eq!(run.dead_lettered, 2, "the two negative payments: {run:?}");
        assert_eq!(dead_letters, Some(2), "in the derived dead-letter store");

        // Receipts: one per billed payment, each account's in payment order.
        let receipts = read().await;
        let mut last: HashMap<&str, u64> = HashMap::new();
        for (account, id) in &receipts {
            if let Some(before) = last.insert(account, *id) {
                assert!(before < *id, "{account}: receipt {id} after {before}");
            }
        }
        assert_eq!(
            receipts.len() as u64,
            expected,
            "one receipt per billed payment"
        );
        for account in ACCOUNTS {
            let billed: i64 = (0..PAYMENTS)
                .filter(|id| !refused(*id) && ACCOUNTS[(id % 4) as usize] == account)
                .map(|id| 100 + id as i64)
                .sum();
            assert_eq!(billing.balance(account), billed, "{account}'s balance");
        }
        println!(
            "{kind}: payments published in {published:.1?}, receipted by {billed:.1?}, \
             service stopped by {stopped:.1?}; {run:?}"
        );
    }
}

#[cfg(feature = "kafka")]
#[path = "../examples/support/kafka_topics.rs"]
mod kafka_topics;

#[cfg(feature = "kafka")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_billing_service_on_kafka() {
    use intake::kafka::KafkaSettings;
    use intake::kafka::rdkafka::admin::{AdminClient, AdminOptions};
    use intake::kafka::rdkafka::client::DefaultClientContext;
    use intake::kafka::rdkafka::consumer::{BaseConsumer, Consumer};
    use intake::kafka::rdkafka::{Message as _, Offset, TopicPartitionList};

    const PARTITIONS: i32 = 3;

    if !real::listening("the_billing_service_on_kafka", 9092) {
        return;
    }
    let settings = KafkaSettings::new("127.0.0.1:9092");
    let run = real::run_name();
    let names = real::Names {
        payments: format!("{run}-payments"),
        publish_payments_to: format!("{run}-payments"),
        receipts: format!("{run}-receipts"),
    };
    for topic in [&names.payments, &names.receipts] {
        kafka_topics::create_topic(&settings, topic, PARTITIONS)
            .await
            .expect("create the topic");
    }
    let reader = format!("{run}-reader");
    let consumer = move |settings: &KafkaSettings| -> BaseConsumer {
        let mut config = settings.client_config().clone();
        config
            .set("group.id", reader.as_str())
            .set("enable.auto.commit", "false");
        config.create().expect("a Kafka consumer")
    };
    // Where each partition of the receipts topic ends.
    let ends = {
        let (settings, topic) = (settings.clone(), names.receipts.clone());
        let consumer = consumer.clone();
        move || {
            let consumer = consumer(&settings);
            (0..PARTITIONS)
                .map(|partition| {
                    consumer
                        .fetch_watermarks(&topic, partition, Duration::from_secs(10))
                        .expect("the receipts' watermarks")
                        .1
                })
                .collect::<Vec<i64>>()
        }
    };
    let count = {
        let ends = ends.clone();
        move || {
            let ends = ends.clone();
            async move {
                let ends = tokio::task::spawn_blocking(ends).await.expect("watermarks");
                ends.iter().sum::<i64>() as u64
            }
        }
    };
    // Every receipt up to the ends, partition by partition in offset order
    // (an account's receipts share a partition).
    let read = {
        let (settings, topic) = (settings.clone(), names.receipts.clone());
        move || async move {
            tokio::task::spawn_blocking(move || {
                let ends = ends();
                let consumer = consumer(&settings);
                let mut assignment = TopicPartitionList::new();
                for partition in 0..PARTITIONS {
                    assignment
                        .add_partition_offset(&topic, partition, Offset::Beginning)
                        .expect("assign a partition");
                }
                consumer.assign(&assignment).expect("assign the receipts");
                let mut read: Vec<Vec<(String, u64)>> = vec![Vec::new(); PARTITIONS as usize];
                let deadline = std::time::Instant::now() + real::PATIENCE;
                while (0..PARTITIONS as usize).any(|p| (read[p].len() as i64) < ends[p]) {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "every receipt read within {:?}",
                        real::PATIENCE
                    );
                    let Some(message) = consumer.poll(Duration::from_millis(200)) else {
                        continue;
                    };
                    let message = message.expect("a receipt");
                    let account =
                        std::str::from_utf8(message.key().expect("a receipt has its key"))
                            .expect("a UTF-8 key");
                    let receipt = real::receipt(account, message.payload().unwrap_or_default());
                    read[message.partition() as usize].push(receipt);
                }
                read.concat()
            })
            .await
            .expect("read the receipts")
        }
    };
    real::bills_every_payment_on("kafka://127.0.0.1:9092", "kafka", &names, count, read).await;

    // Every topic of the run: the two above, and what the route derived
    // from the payments topic (dead letters, retry and return topics).
    let admin: AdminClient<DefaultClientContext> = settings
        .client_config()
        .create()
        .expect("a Kafka admin client");
    let topics: Vec<String> = admin
        .inner()
        .fetch_metadata(None, Duration::from_secs(10))
        .map(|metadata| {
            metadata
                .topics()
                .iter()
                .map(|topic| topic.name().to_owned())
                .filter(|name| name.starts_with(&run))
                .collect()
        })
        .unwrap_or_default();
    let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
    let _ = admin.delete_topics(&topics, &AdminOptions::new()).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_billing_service_on_redis_streams() {
    use intake::redis_streams::redis::{self, AsyncCommands, streams::StreamRangeReply};

    if !real::listening("the_billing_service_on_redis_streams", 6379) {
        return;
    }
    let url = "redis://127.0.0.1:6379";
    let run = real::run_name();
    // The route creates the stream and its group (from the first entry).
    let names = real::Names {
        payments: format!("{run}-payments"),
        publish_payments_to: format!("{run}-payments"),
        receipts: format!("{run}-receipts"),
    };
    let redis = redis::Client::open(url)
        .expect("a Redis client")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to Redis");
    let count = || {
        let (mut redis, stream) = (redis.clone(), names.receipts.clone());
        async move {
            let length: u64 = redis.xlen(&stream).await.expect("XLEN the receipts");
            length
        }
    };
    let read = || {
        let (mut redis, stream) = (redis.clone(), names.receipts.clone());
        async move {
            let entries: StreamRangeReply = redis
                .xrange_all(&stream)
                .await
                .expect("XRANGE the receipts");
            entries
                .ids
                .iter()
                .map(|entry| {
                    let account: String = entry.get("key").expect("a receipt has its key");
                    let payload: Vec<u8> = entry.get("payload").expect("a receipt's payload");
                    real::receipt(&account, &payload)
                })
                .collect()
        }
    };
    real::bills_every_payment_on(url, "redis", &names, count, read).await;

    // Every key of the run: the two streams and what the route derived
    // from the payments stream (dead letters, return stream, due index).
    let mut redis = redis;
    let keys: Vec<String> = redis.keys(format!("{run}*")).await.unwrap_or_default();
    if !keys.is_empty() {
        let _: Result<u64, _> = redis.del(&keys).await;
    }
}

#[cfg(feature = "amqp")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_billing_service_on_rabbitmq() {
    use intake::amqp::lapin::options::{
        BasicGetOptions, ExchangeDeleteOptions, QueueDeclareOptions, QueueDeleteOptions,
    };
    use intake::amqp::lapin::types::{AMQPValue, FieldTable};
    use intake::amqp::lapin::{Connection, ConnectionProperties};
    use intake::amqp::{Exchange, Queue, Topology};

    if !real::listening("the_billing_service_on_rabbitmq", 5672) {
        return;
    }
    let url = "amqp://guest:guest@127.0.0.1:5672/%2f";
    let run = real::run_name();
    // The broker's publisher routes by key: an output's destination is an
    // exchange and its key the routing key, which the source reads back as
    // the message's key. So payments and receipts each go to a fanout
    // exchange bound to a queue of the same name, keyed by account.
    let names = real::Names {
        payments: format!("{run}-payments"),
        publish_payments_to: format!("{run}-payments"),
        receipts: format!("{run}-receipts"),
    };
    // Unused, the queues go away by themselves.
    let expires = || AMQPValue::LongUInt(600_000);
    Topology::new()
        .exchange(Exchange::fanout(names.payments.as_str()))
        .exchange(Exchange::fanout(names.receipts.as_str()))
        .queue(Queue::classic(names.payments.as_str()).argument("x-expires", expires()))
        .queue(Queue::classic(names.receipts.as_str()).argument("x-expires", expires()))
        .bind(names.payments.as_str(), names.payments.as_str(), "")
        .bind(names.receipts.as_str(), names.receipts.as_str(), "")
        .declare(url)
        .await
        .expect("declare the exchanges and queues");
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("connect to RabbitMQ");
    let channel = connection
        .create_channel()
        .await
        .expect("a RabbitMQ channel");
    let count = || {
        let (channel, queue) = (channel.clone(), names.receipts.clone());
        async move {
            let declared = channel
                .queue_declare(
                    queue.as_str().into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .expect("the receipts queue");
            u64::from(declared.message_count())
        }
    };
    let read = || {
        let (channel, queue) = (channel.clone(), names.receipts.clone());
        async move {
            let mut read = Vec::new();
            while let Some(message) = channel
                .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
                .await
                .expect("get a receipt")
            {
                let delivery = message.delivery;
                read.push(real::receipt(delivery.routing_key.as_str(), &delivery.data));
            }
            read
        }
    };
    real::bills_every_payment_on(url, "amqp", &names, count, read).await;

    // What the run declared, and what the route did that does not expire
    // (the dead-letter queue, the parking's relay queue and exchanges).
    let payments = names.payments.as_str();
    for queue in [
        payments.to_owned(),
        names.receipts.clone(),
        format!("{payments}.dlq"),
        format!("{payments}.wait.relay"),
    ] {
        let _ = channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    for exchange in [
        payments.to_owned(),
        names.receipts.clone(),
        format!("{payments}.wait.return"),
        format!("{payments}.wait.relay"),
    ] {
        let _ = channel
            .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
            .await;
    }
    let _ = connection.close(200, "done".into()).await;
}

#[cfg(feature = "nats")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_billing_service_on_nats_jetstream() {
    use intake::nats::async_nats::{self, jetstream};

    if !real::listening("the_billing_service_on_nats_jetstream", 4222) {
        return;
    }
    let url = "nats://127.0.0.1:4222";
    let run = real::run_name();
    // The publisher sends to `{destination}.{key}`, and the source reads a
    // message's subject as its key. The streams' subjects are not
    // `{stream}.>`: the route's dead letters go to `{stream}.billing.dlq`,
    // which the payments stream must not capture.
    let names = real::Names {
        payments: format!("{run}-payments"),
        publish_payments_to: format!("in.{run}-payments"),
        receipts: format!("out.{run}-receipts"),
    };
    let receipts_stream = format!("{run}-receipts");
    let client = async_nats::connect(url).await.expect("connect to NATS");
    let context = jetstream::new(client);
    for (stream, subjects) in [
        (&names.payments, &names.publish_payments_to),
        (&receipts_stream, &names.receipts),
    ] {
        context
            .create_stream(jetstream::stream::Config {
                name: stream.clone(),
                subjects: vec![format!("{subjects}.>")],
                ..Default::default()
            })
            .await
            .expect("create the stream");
    }
    let count = || {
        let (context, stream) = (context.clone(), receipts_stream.clone());
        async move {
            let stream = context
                .get_stream(&stream)
                .await
                .expect("the receipts stream");
            stream.cached_info().state.messages
        }
    };
    let read = || {
        let (context, stream) = (context.clone(), receipts_stream.clone());
        let prefix = format!("{}.", names.receipts);
        async move {
            let stream = context
                .get_stream(&stream)
                .await
                .expect("the receipts stream");
            let state = stream.cached_info().state.clone();
            let mut read = Vec::new();
            for sequence in state.first_sequence..=state.last_sequence {
                let message = stream
                    .get_raw_message(sequence)
                    .await
                    .expect("read a receipt");
                let account = message
                    .subject
                    .strip_prefix(prefix.as_str())
                    .expect("a receipt's subject ends with its key");
                read.push(real::receipt(account, &message.payload));
            }
            read
        }
    };
    real::bills_every_payment_on(url, "nats", &names, count, read).await;

    for stream in [
        names.payments.clone(),
        receipts_stream,
        format!("{}_dlq", names.payments),
    ] {
        let _ = context.delete_stream(&stream).await;
    }
}
