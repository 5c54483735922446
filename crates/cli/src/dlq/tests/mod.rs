//! The `dlq` commands against the memory broker's store.

mod commands;
mod escaping;
mod support;
