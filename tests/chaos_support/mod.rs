//! Support for the chaos suite (`tests/chaos.rs`): the `ledger` example as a
//! child process, the ledger file it writes, the brokers and the faults
//! injected into them, and the scenarios that combine them.

pub mod backends;
pub mod child;
pub mod effects_db;
pub mod ledger_file;
pub mod ledger_program;
pub mod scenarios;
pub mod seed;
pub mod sockets;

/// Whether a missing broker (or fault tool) fails the test instead of
/// skipping it; CI sets `INTAKE_REQUIRE_BROKERS=1`.
pub fn brokers_required() -> bool {
    std::env::var("INTAKE_REQUIRE_BROKERS").is_ok_and(|value| value == "1")
}

/// Says why `test` (or a part of it) cannot run: a skip line on stdout, or a
/// failure when brokers are required.
pub fn skip(test: &str, why: &str) {
    if brokers_required() {
        panic!("{test}: required (INTAKE_REQUIRE_BROKERS=1) but {why}");
    }
    println!("skipped: {test}: {why}");
}
