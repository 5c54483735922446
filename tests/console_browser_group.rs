//! The console's Group section in a real browser (headless chromium through
//! chromedriver, as `tests/console_browser.rs`): three instances of one
//! consumer group on the memory broker. Instance 0's page lists every
//! instance with its partitions; a partition paused with its switch there
//! shows paused under its owner (whichever instance that is), holds its
//! messages while the others flow, and hands them over once resumed; a
//! stopped instance shows stale. The steps are
//! `tests/console_browser_support/group.rs`'s, shared with
//! `tests/console_browser_kafka.rs`; screenshots `group-*.png`.

mod console_browser_support;
#[path = "console_browser_support/group.rs"]
mod group;

use console_browser_support::browser;
use group::{Cluster, PARTITIONS, run};
use intake::memory::{MemoryBroker, Record};
use intake_core::backend::RouteAddress;

/// The memory broker: the topic `orders` read as `billing`.
struct Memory(MemoryBroker, RouteAddress);

impl Cluster for Memory {
    type Broker = MemoryBroker;
    const NAME: &'static str = "group";
    fn broker(&self) -> MemoryBroker {
        self.0.clone()
    }
    fn address(&self) -> &RouteAddress {
        &self.1
    }
    async fn send(&self, partition: u32, payload: String) {
        let record = Record::new(payload).to_partition(partition);
        self.0.send("orders", record).expect("send");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_group_section_shows_every_instance_and_a_pause_holds_on_the_owner() {
    let test = "the_group_section_shows_every_instance_and_a_pause_holds_on_the_owner";
    let Some(client) = browser(test).await else {
        return;
    };
    let broker = MemoryBroker::new();
    broker.create_topic("orders", PARTITIONS).expect("topic");
    run(
        client,
        Memory(broker, RouteAddress::new("orders", "billing")),
    )
    .await;
}
