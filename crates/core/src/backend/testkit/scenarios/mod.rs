//! The scenarios every backend passes unchanged. Each is named after the
//! behaviour it proves and fails with a message saying what went wrong.
//!
//! One file per theme; every scenario is re-exported here, where the suite
//! macros call it (`$crate::backend::testkit::scenarios::NAME`).

mod app;
mod crashes_and_rebalances;
mod dead_letters;
mod delivery;
mod handlers;
mod limits;
mod shutdown;
mod unreachable;

pub use self::app::{a_failed_startup_consumes_nothing, an_app_runs_two_routes_under_one_budget};
pub use self::crashes_and_rebalances::{
    a_full_budget_still_sees_assignment_changes, rebalances_between_two_consumers,
    redelivers_after_a_crash,
};
pub use self::dead_letters::{
    malformed_payloads_do_not_stop_the_consumer, poison_messages_reach_the_dead_letter_destination,
};
pub use self::delivery::{
    broadcast_delivers_to_every_instance, commit_never_passes_an_unfinished_message,
    delivers_every_message, retries_then_succeeds,
};
pub use self::limits::in_flight_stays_within_its_bound;
pub use self::shutdown::graceful_shutdown_commits_finished_work;
pub use self::unreachable::an_unreachable_broker_is_an_error_without_its_password;
