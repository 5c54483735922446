//! The billing example's service (`examples/billing/service.rs`), run as
//! it is on the memory broker and on each real broker: every payment billed
//! once and receipted in its account's order, the negative ones
//! dead-lettered, the frozen account's parked and billed once it came back.

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
