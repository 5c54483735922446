//! Two routes run as one service on the in-memory broker: orders (one
//! customer's orders in order) billed into a shared ledger, and payments
//! (JSON) audited, under one shared in-flight budget, with health probes
//! and a graceful stop on SIGTERM or Ctrl-C (a second signal stops at once).
//!
//! ```text
//! cargo run --example app --features health-server
//! curl 127.0.0.1:9898/health/ready     # INTAKE_HTTP_ADDR overrides the address
//! kill -TERM <pid>                     # drains, prints a line per route, exits 0
//! ```
//!
//! `INTAKE_APP_ORDERS=N` stops producing after N orders (and payments);
//! `INTAKE_APP_AUDIT_MS=N` makes each audit take N ms (to watch a drain, or
//! a second signal cut it short).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use intake::app::{App, AppError, Health, HealthListener, HealthService, HealthSettings};
use intake::consumer::{Consumer, DeliveryOrder, SharedBudget};
use intake::memory::{MemoryBroker, Record};
use intake::{FromRef, HandlerError, Json, Key, State};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

/// What the handlers share. The ledger is not `Clone`: it is shared
/// through an `Arc`, never copied per message.
#[derive(Clone)]
struct Services {
    ledger: Arc<Ledger>,
}

#[derive(Default)]
struct Ledger {
    billed_cents: AtomicU64,
    orders: AtomicU64,
    payments: AtomicU64,
}

impl FromRef<Services> for Arc<Ledger> {
    fn from_ref(services: &Services) -> Self {
        services.ledger.clone()
    }
}

#[derive(Deserialize)]
struct Order {
    cents: u64,
}

#[derive(Deserialize)]
struct Payment {
    id: u64,
}

async fn bill(
    State(ledger): State<Arc<Ledger>>,
    Key(customer): Key,
    Json(order): Json<Order>,
) -> Result<(), HandlerError> {
    if customer.is_none() {
        return Err(HandlerError::permanent("an order without a customer"));
    }
    ledger
        .billed_cents
        .fetch_add(order.cents, Ordering::Relaxed);
    ledger.orders.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

async fn audit(State(ledger): State<Arc<Ledger>>, Json(payment): Json<Payment>) {
    if let Some(pause) = std::env::var("INTAKE_APP_AUDIT_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
    {
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    tracing::debug!(payment = payment.id, "audited");
    ledger.payments.fetch_add(1, Ordering::Relaxed);
}

/// Produces a steady trickle of orders and payments, as the service's
/// upstream would.
fn produce(broker: MemoryBroker, limit: Option<u64>, stop: CancellationToken) {
    tokio::spawn(async move {
        let mut id = 0u64;
        while limit.is_none_or(|limit| id < limit) && !stop.is_cancelled() {
            let order = Record::new(format!(r#"{{"cents":{}}}"#, 100 + id % 900))
                .with_key(format!("customer-{}", id % 7));
            let payment = Record::new(format!(r#"{{"id":{id}}}"#));
            if broker.send("orders", order).is_err() || broker.send("payments", payment).is_err() {
                return;
            }
            id += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();

    let broker = MemoryBroker::new();
    broker.create_topic("orders", 4)?;
    broker.create_topic("payments", 2)?;
    let limit = std::env::var("INTAKE_APP_ORDERS")
        .ok()
        .and_then(|value| value.parse().ok());

    let services = Services {
        ledger: Arc::default(),
    };
    let health = Health::new(HealthSettings {
        stall_window: Duration::from_secs(60),
        ..HealthSettings::default()
    });
    let app = App::with_state(services.clone())
        .shared_budget(SharedBudget::new(256, 32 << 20)?)
        .drain_deadline(Duration::from_secs(10))
        .health(health.clone());

    let (orders, orders_acker) = broker.consumer("orders", "billing")?;
    let (payments, payments_acker) = broker.consumer("payments", "audit")?;
    let orders_route = Consumer::builder()
        .max_in_flight(192)
        .ordering(DeliveryOrder::Key)
        .build(orders, orders_acker, app.handler(bill))?;
    let payments_route = Consumer::builder()
        .max_in_flight(64)
        .ordering(DeliveryOrder::Unordered)
        .build(payments, payments_acker, app.handler(audit))?;

    let address = std::env::var("INTAKE_HTTP_ADDR").unwrap_or_else(|_| "127.0.0.1:9898".into());
    let listener = HealthListener::bind(&address).await?;
    // The test that runs this example reads the address from this line.
    println!("health on http://{}", listener.local_addr()?);
    let serving = CancellationToken::new();
    let server = tokio::spawn(listener.serve(HealthService::new(health), serving.clone()));

    let producing = CancellationToken::new();
    let app = app
        .on_startup("producer", {
            let (broker, producing) = (broker.clone(), producing.clone());
            async move || {
                produce(broker, limit, producing);
                Ok::<_, std::convert::Infallible>(())
            }
        })
        .on_shutdown("producer", {
            let producing = producing.clone();
            async move || {
                producing.cancel();
                Ok::<_, std::convert::Infallible>(())
            }
        })
        .route("orders", orders_route)
        .route("payments", payments_route);

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
                "{}: succeeded {}, unfinished {}, committed {:?}",
                route.name,
                run.succeeded,
                run.unfinished.len(),
                run.committed
            ),
            None => println!("{}: {:?}", route.name, route.outcome),
        }
    }
    let ledger = &services.ledger;
    println!(
        "ledger: {} orders, {} cents, {} payments",
        ledger.orders.load(Ordering::Relaxed),
        ledger.billed_cents.load(Ordering::Relaxed),
        ledger.payments.load(Ordering::Relaxed)
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
