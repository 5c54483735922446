//! The billing service: the handler and its wiring, the same on every
//! broker (the example's `main.rs` picks the broker from a URL; the tests
//! run this module on the memory broker and on each real one).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use intake::backend::Broker;
use intake::publish::Output;
use intake::service::{Route, Service};
use intake::{DeliveryOrder, HandlerError, Json, Meta, State};
use serde::Deserialize;

/// A payment event, as JSON.
#[derive(Deserialize)]
pub struct Payment {
    pub id: u64,
    pub account: String,
    pub cents: i64,
}

/// What every message shares: each account's balance, and where receipts
/// go.
pub struct Billing {
    balances: Mutex<HashMap<String, i64>>,
    receipts: String,
}

impl Billing {
    pub fn new(receipts: impl Into<String>) -> Arc<Self> {
        let balances = Mutex::default();
        Arc::new(Self {
            balances,
            receipts: receipts.into(),
        })
    }

    pub fn balance(&self, account: &str) -> i64 {
        let balances = self.balances.lock().unwrap_or_else(PoisonError::into_inner);
        balances.get(account).copied().unwrap_or(0)
    }
}

/// Bills a payment and answers with its receipt, which the service
/// publishes and the broker confirms before the payment is acknowledged.
///
/// - a negative amount is refused for good: dead-lettered;
/// - the `frozen` account answers "retry later in 2 s" on a first delivery:
///   parked, handled when it comes back;
/// - every tenth payment meets a flaky downstream on its first attempt:
///   retried in process.
pub async fn bill(
    State(billing): State<Arc<Billing>>,
    Meta(meta): Meta,
    Json(payment): Json<Payment>,
) -> Result<Output, HandlerError> {
    if payment.cents < 0 {
        return Err(HandlerError::permanent(format!(
            "payment {} is negative",
            payment.id
        )));
    }
    if payment.account == "frozen" && meta.parked_from().is_none() {
        return Err(HandlerError::retry_later(
            "the account is frozen",
            Duration::from_secs(2),
        ));
    }
    if payment.id % 10 == 3 && meta.attempt() == 1 {
        return Err(HandlerError::retryable("the ledger timed out"));
    }
    let balance = {
        let mut balances = billing
            .balances
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let balance = balances.entry(payment.account.clone()).or_default();
        *balance += payment.cents;
        *balance
    };
    let receipt = format!(r#"{{"payment":{},"balance":{balance}}}"#, payment.id);
    Ok(Output::new(billing.receipts.as_str(), receipt).with_key(payment.account))
}

/// The service on `broker`: `payments` in per-account order, under the
/// safe stack (dead letters, parking, retries, panic guard, metrics,
/// tracing), with every receipt confirmed before its payment is
/// acknowledged.
pub fn billing<B: Broker>(
    broker: B,
    state: Arc<Billing>,
    payments: &str,
) -> Service<B, Arc<Billing>> {
    let per_account = Route::new().ordering(DeliveryOrder::Key);
    Service::with_state("billing", broker, state).route_with(payments, per_account, bill)
}
