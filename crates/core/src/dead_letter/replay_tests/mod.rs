//! Replay as a consumer: dead letters consumed from their destination by the
//! runtime and handed to the handler as the messages that failed.

mod dry_run;
mod loop_guard;
mod replayed;
mod support;
mod unreadable;
