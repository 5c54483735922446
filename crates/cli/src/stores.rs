//! The dead-letter store of each broker, for `intake dlq`.
//!
//! A broker whose backend has no `DeadLetterStore` yet is answered with
//! [`Failure::Unsupported`] (exit code 4), never with an empty store: "0
//! dead letters" from a store that cannot look would be a lie a script
//! acts on.

use std::time::Duration;

use intake_core::dead_letter::store::DeadLetterStore;

use crate::broker::Broker;
use crate::failure::Failure;

/// The store of the dead letters of `group` consuming `source` on
/// `broker`, each of its waits bounded by `timeout`.
pub async fn open(
    broker: &Broker,
    source: &str,
    group: &str,
    timeout: Duration,
    command: &str,
) -> Result<Box<dyn DeadLetterStore>, Failure> {
    // No backend crate has a store yet (the memory broker's lives in the
    // process that owns it): every scheme answers "not supported yet".
    let _ = (source, group, timeout);
    Err(Failure::Unsupported {
        command: command.to_owned(),
        broker: broker.kind(),
    })
}
