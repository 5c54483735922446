//! The memory broker's behaviour, driven directly through the `Source`,
//! `Acker` and `DeadLetterSink` traits.

mod committing;
mod concurrency;
mod consuming;
mod crashes;
mod dead_letters;
mod faults;
mod inspection;
mod parking;
mod producing;
mod rebalancing;
mod support;
