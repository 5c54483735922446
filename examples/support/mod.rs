//! What the broker examples share, so that they differ only in their broker:
//! the orders they produce, the one handler that reserves them, the layer
//! stack around it, and a shutdown on SIGTERM as well as Ctrl-C.
//!
//! Each example includes this file with `#[path = "support/mod.rs"] mod
//! support;` (an example is a single crate root; this is not an example of
//! its own).

#![allow(dead_code)] // each example uses its own subset

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::Duration;

use intake::{HandlerError, Metadata};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

/// Logs to stdout at `default` levels (`RUST_LOG` overrides them).
pub fn init_logging(default: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default.into()),
        )
        .init();
}

/// Logs to stderr at `default` levels (`RUST_LOG` overrides them), for
/// examples whose stdout is read by a program (a test, a script).
pub fn init_logging_on_stderr(default: &str) {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default.into()),
        )
        .init();
}

/// How many orders [`example_orders`] produces.
pub const ORDERS: u64 = 5;

/// An order as the examples' producers write it.
#[derive(Debug, Deserialize)]
pub struct Order {
    /// The order's number.
    pub id: u64,
    /// The customer, also the record's key: one customer's orders in order.
    pub customer: String,
    /// How many items; an order of none fails for good.
    pub quantity: u32,
}

/// The orders every example produces, as `(key, JSON payload)`: order 3
/// fails once (a timeout, retried), order 4 is malformed (dead-lettered
/// without being handled), order 5 has no items (fails for good,
/// dead-lettered).
pub fn example_orders() -> Vec<(String, String)> {
    (1..=ORDERS)
        .map(|id| {
            let customer = format!("c-{}", id % 2);
            let payload = match id {
                4 => format!(r#"{{"id":{id},"customer":"#),
                5 => format!(r#"{{"id":{id},"customer":"{customer}","quantity":0}}"#),
                _ => format!(r#"{{"id":{id},"customer":"{customer}","quantity":{id}}}"#),
            };
            (customer, payload)
        })
        .collect()
}

/// What the handler did, printed by each example when it stops.
#[derive(Debug, Default)]
pub struct Tally {
    /// Orders reserved.
    pub reserved: AtomicU64,
    /// Attempts that failed transiently and were retried.
    pub retried: AtomicU64,
}

impl Tally {
    /// A shared tally for a handler and the code that prints it.
    pub fn shared() -> Arc<Self> {
        Arc::default()
    }

    /// Prints the summary of a run.
    pub fn print(&self, example: &str, report: &intake::RunReport) {
        println!("intake {example} example");
        println!(
            "  reserved:      {}",
            self.reserved.load(AtomicOrdering::Relaxed)
        );
        println!(
            "  retried:       {}",
            self.retried.load(AtomicOrdering::Relaxed)
        );
        println!("  dead-lettered: {}", report.dead_lettered);
        println!("  unfinished:    {}", report.unfinished.len());
        for (partition, position) in &report.committed {
            println!("  {partition}: committed through {position}");
        }
        println!("  ran for {:.1?}", report.elapsed);
    }
}

/// The one handler of the broker examples: reserves an order. Order 3's
/// first attempt times out (retryable); an order without items fails for
/// good.
pub async fn reserve(meta: &Metadata, order: Order, tally: &Tally) -> Result<(), HandlerError> {
    if order.id == 3 && meta.attempt() == 1 {
        tally.retried.fetch_add(1, AtomicOrdering::Relaxed);
        return Err(HandlerError::retryable("the stock service timed out"));
    }
    if order.quantity == 0 {
        return Err(HandlerError::permanent(format!(
            "order {} has no items",
            order.id
        )));
    }
    tracing::info!(
        partition = meta.partition(),
        position = %meta.position(),
        attempt = meta.attempt(),
        order = order.id,
        customer = %order.customer,
        quantity = order.quantity,
        "order reserved"
    );
    tally.reserved.fetch_add(1, AtomicOrdering::Relaxed);
    Ok(())
}

/// The retry policy of the examples: 50 ms doubling to 2 s, three retries.
pub fn retry_policy() -> intake::Exponential {
    intake::Exponential::new(Duration::from_millis(50), Duration::from_secs(2)).max_retries(3)
}

/// A token cancelled by the first SIGTERM (a container stop, Kubernetes) or
/// Ctrl-C, which starts the graceful drain; a second signal exits at once.
pub fn shutdown_on_signals() -> CancellationToken {
    let shutdown = CancellationToken::new();
    let cancel = shutdown.clone();
    tokio::spawn(async move {
        let signal = next_signal().await;
        tracing::info!(signal, "draining; a second signal stops at once");
        cancel.cancel();
        let signal = next_signal().await;
        tracing::warn!(signal, "stopping without draining");
        std::process::exit(130);
    });
    shutdown
}

/// Waits for SIGTERM or Ctrl-C and names it.
async fn next_signal() -> &'static str {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => tokio::select! {
                _ = terminate.recv() => "SIGTERM",
                _ = tokio::signal::ctrl_c() => "Ctrl-C",
            },
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; Ctrl-C only");
                let _ = tokio::signal::ctrl_c().await;
                "Ctrl-C"
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        "Ctrl-C"
    }
}
