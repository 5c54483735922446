//! The billing service, on whichever broker a URL names.
//!
//! ```sh
//! cargo run --example billing --features health-server                 # memory broker, demo payments
//! cargo run --example billing --features health-server,kafka -- kafka://127.0.0.1:9092
//! cargo run --example billing --features health-server,redis -- redis://127.0.0.1:6379
//! cargo run --example billing --features health-server,amqp -- amqp://guest:guest@127.0.0.1:5672
//! cargo run --example billing --features health-server,nats -- nats://127.0.0.1:4222
//! curl 127.0.0.1:9898/metrics
//! ```
//!
//! On a real broker it consumes `payments` as group `billing` (JSON
//! `{"id":1,"account":"alice","cents":250}`, keyed by account), publishes
//! a receipt per payment to `receipts`, and runs until SIGTERM or Ctrl-C.
//! The code is the same on every broker; what must exist there first is
//! the broker's own business:
//!
//! - Kafka: topics `payments` and `receipts` (or auto-creation);
//! - Redis: nothing (the route creates its stream and group);
//! - RabbitMQ: queue `payments` (the route adds `payments.dlq`), and an
//!   exchange `receipts` bound to a queue (a publisher's destination is an
//!   exchange, the output's key its routing key);
//! - NATS: a stream `payments` whose subjects do not catch the route's
//!   dead-letter subject `payments.billing.dlq` (say `in.payments.>`), and
//!   a stream capturing `receipts.>`.
//!
//! Without a URL it runs on the memory broker with a few demo payments and
//! stops once they are all billed. `service.rs` is the service itself, the
//! same on every broker.

mod service;

use std::sync::Arc;
use std::time::Duration;

use intake::AnyBroker;
use intake::backend::LagProbe;
use intake::memory::{MemoryBroker, Record};
use tokio_util::sync::CancellationToken;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let billing = service::Billing::new("receipts");
    let address = std::env::var("INTAKE_HTTP_ADDR").unwrap_or_else(|_| "127.0.0.1:9898".into());

    let report = match std::env::args().nth(1) {
        Some(url) => {
            let broker = AnyBroker::from_url(&url)?;
            service::billing(broker, Arc::clone(&billing), "payments")
                .http(address)
                .run()
                .await?
        }
        None => {
            let broker = demo_broker()?;
            let stop = CancellationToken::new();
            // Done once nothing is left to handle: neither in the topic nor
            // parked (a parked payment's original is acknowledged).
            let caught_up = {
                let (broker, stop) = (broker.clone(), stop.clone());
                async move {
                    let probe = broker.topic_lag_probe("payments", "billing");
                    loop {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        let lag = broker.lag("payments", "billing").unwrap_or(1);
                        if lag == 0 && probe.parked().await.ok().flatten() == Some(0) {
                            break;
                        }
                    }
                    stop.cancel();
                }
            };
            let service =
                service::billing(AnyBroker::from(broker), Arc::clone(&billing), "payments");
            let (report, ()) = tokio::join!(service.http(address).run_until(stop), caught_up);
            report?
        }
    };
    for route in &report.routes {
        if let Some(run) = route.report() {
            println!(
                "{}: billed {}, dead-lettered {}, in {:.1?}",
                route.name, run.succeeded, run.dead_lettered, run.elapsed
            );
        }
    }
    for account in ["alice", "bob", "frozen"] {
        println!("{account}: {} cents", billing.balance(account));
    }
    Ok(())
}

/// The memory broker with `payments` and `receipts`, and ten payments:
/// one of them negative (dead-lettered), three on the frozen account
/// (parked for 2 s, then billed).
fn demo_broker() -> Result<MemoryBroker, BoxError> {
    let broker = MemoryBroker::new();
    broker.create_topic("payments", 2)?;
    broker.create_topic("receipts", 2)?;
    for id in 0..10_i64 {
        let account = ["alice", "bob", "frozen"][(id % 3) as usize];
        let cents = if id == 7 { -5 } else { 100 * id };
        let json = format!(r#"{{"id":{id},"account":"{account}","cents":{cents}}}"#);
        broker.send("payments", Record::new(json).with_key(account))?;
    }
    Ok(broker)
}
