//! `intake dlq`: count, list, show, replay and purge the dead letters of a
//! group, through any backend's [`DeadLetterStore`].
//!
//! Each command is a function of a store and its arguments that returns
//! the text to print, so the same code runs against a broker's store and,
//! in the unit tests, against the memory broker's.

mod count;
mod letter_report;
mod list;
mod purge;
mod replay;
mod show;
mod store_failure;
mod text;

pub use self::count::count;
pub use self::list::list;
pub use self::purge::purge;
pub use self::replay::replay;
pub use self::show::show;
pub use self::store_failure::store_failure;

#[cfg(test)]
mod tests;
