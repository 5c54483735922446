//! The console's Group section in a real browser on Apache Kafka
//! (127.0.0.1:9092; `INTAKE_REQUIRE_BROKERS=1` makes its absence fail):
//! the steps of `tests/console_browser_group.rs`
//! (`tests/console_browser_support/group.rs`) with three instances, each
//! with its own `KafkaBroker`, of a group of the run's own on a fresh topic
//! of three partitions. The group rebalances for seconds as instances join
//! and leave: every step waits for the page with a deadline. While the
//! paused partition holds, its owner's page shows its broker lag.
//! Screenshots `group-kafka-*.png`.

mod console_browser_support;
#[path = "console_browser_support/group.rs"]
mod group;
#[path = "../examples/support/kafka_topics.rs"]
mod kafka_topics;

use std::future::Future;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use console_browser_support::browser;
use group::{Cluster, PARTITIONS, run};
use intake::kafka::rdkafka::admin::{AdminClient, AdminOptions};
use intake::kafka::rdkafka::client::DefaultClientContext;
use intake::kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use intake::kafka::{KafkaBroker, KafkaSettings};
use intake_core::backend::RouteAddress;
use intake_core::backend::testkit::harness::unique_group;
use intake_core::backend::testkit::skip_or_fail;

/// A topic of three partitions and a group, both of this run's own.
struct Kafka {
    settings: KafkaSettings,
    address: RouteAddress,
    producer: FutureProducer,
}

impl Kafka {
    async fn start() -> Self {
        // The group reads what was sent before it joined.
        let settings = KafkaSettings::new("127.0.0.1:9092").set("auto.offset.reset", "earliest");
        let run = unique_group("console-group");
        let partitions = i32::try_from(PARTITIONS).expect("a partition count");
        kafka_topics::create_topic(&settings, &run, partitions)
            .await
            .expect("create the topic");
        let producer = settings.client_config().create().expect("a producer");
        let address = RouteAddress::new(run.clone(), format!("{run}-billing"));
        Self {
            settings,
            address,
            producer,
        }
    }
}

impl Cluster for Kafka {
    type Broker = KafkaBroker;
    const NAME: &'static str = "group-kafka";
    fn broker(&self) -> KafkaBroker {
        KafkaBroker::new(self.settings.clone())
    }
    fn address(&self) -> &RouteAddress {
        &self.address
    }
    async fn send(&self, partition: u32, payload: String) {
        let partition = i32::try_from(partition).expect("a partition");
        let record = FutureRecord::<(), _>::to(self.address.source())
            .partition(partition)
            .payload(&payload);
        self.producer
            .send(record, Duration::from_secs(10))
            .await
            .expect("Kafka has the message");
    }
    /// The topic and the group's control and status topics.
    fn clean_up(&self) -> impl Future<Output = ()> + Send {
        let group = self.address.group();
        let topics = [
            self.address.source().to_owned(),
            format!("{group}.intake-control"),
            format!("{group}.intake-status"),
        ];
        let admin: Option<AdminClient<DefaultClientContext>> =
            self.settings.client_config().create().ok();
        async move {
            let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
            if let Some(admin) = admin {
                let _ = admin.delete_topics(&topics, &AdminOptions::new()).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_kafka_the_group_section_shows_every_instance_and_a_pause_holds_on_the_owner() {
    let test = "on_kafka_the_group_section_shows_every_instance_and_a_pause_holds_on_the_owner";
    let kafka = SocketAddr::from(([127, 0, 0, 1], 9092));
    if let Err(error) = TcpStream::connect_timeout(&kafka, Duration::from_secs(2)) {
        skip_or_fail(test, &format!("no Kafka on {kafka}: {error}"));
        return;
    }
    let Some(client) = browser(test).await else {
        return;
    };
    run(client, Kafka::start().await).await;
}
