//! Support for the chaos suite (`tests/chaos.rs`): the `ledger` example as a
//! child process, the ledger file it writes, the brokers and the faults
//! injected into them, and the scenarios that combine them.

pub mod backends;
pub mod child;
pub mod effects_db;
pub mod ledger_file;
pub mod ledger_program;
#[allow(dead_code)]
#[path = "../../crates/kafka/tests/support/own_broker.rs"]
pub mod own_broker;
#[allow(dead_code)]
#[path = "../../crates/nats/tests/support/own_server.rs"]
pub mod own_nats;
pub mod scenarios;
pub mod seed;
pub mod sockets;
pub mod trickle;
