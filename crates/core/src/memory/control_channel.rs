//! [`MemoryControlChannel`]: a group's control logs, kept in the memory
//! broker.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use tokio::sync::Notify;

use super::MemoryBroker;
use crate::group_control::{ControlChannel, ControlError, ControlFeed, ControlLog};

/// How many records a status log keeps (the oldest go first); a commands
/// log keeps every record.
const STATUS_RECORDS: usize = 10_000;

/// One log: its records and a wake-up for its feeds.
#[derive(Default)]
pub(super) struct LogState {
    records: Mutex<Records>,
    grew: Notify,
}

#[derive(Default)]
struct Records {
    /// How many records were dropped from the front (status logs only).
    dropped: usize,
    kept: VecDeque<Bytes>,
}

impl LogState {
    fn lock(&self) -> std::sync::MutexGuard<'_, Records> {
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One of a group's control logs on a [`MemoryBroker`] (see
/// [`group_control`](crate::group_control)); from
/// [`MemoryBroker::group_control_channel`]. Clones share the log.
#[derive(Clone)]
pub struct MemoryControlChannel {
    group: String,
    log: ControlLog,
    state: Arc<LogState>,
}

impl fmt::Debug for MemoryControlChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryControlChannel")
            .field("group", &self.group)
            .field("log", &self.log)
            .finish_non_exhaustive()
    }
}

impl MemoryBroker {
    /// Group `group`'s `log`, created on first use.
    pub fn group_control_channel(&self, group: &str, log: ControlLog) -> MemoryControlChannel {
        MemoryControlChannel {
            group: group.to_owned(),
            log,
            state: self.control_log(group, log),
        }
    }
}

impl ControlChannel for MemoryControlChannel {
    fn log(&self) -> ControlLog {
        self.log
    }

    async fn append(&self, record: Bytes) -> Result<(), ControlError> {
        {
            let mut records = self.state.lock();
            records.kept.push_back(record);
            if self.log == ControlLog::Status && records.kept.len() > STATUS_RECORDS {
                records.kept.pop_front();
                records.dropped += 1;
            }
        }
        self.state.grew.notify_waiters();
        Ok(())
    }

    async fn follow(&self) -> Result<ControlFeed, ControlError> {
        let state = self.state.clone();
        let feed = futures_util::stream::unfold((state, 0_usize), |(state, next)| async move {
            loop {
                // Registered before the look, so an append between the
                // look and the wait still wakes it.
                let watched = Arc::clone(&state);
                let grew = watched.grew.notified();
                let found = {
                    let records = state.lock();
                    let at = next.max(records.dropped);
                    records
                        .kept
                        .get(at - records.dropped)
                        .map(|record| (record.clone(), at + 1))
                };
                if let Some((record, next)) = found {
                    return Some((Ok(record), (state, next)));
                }
                grew.await;
            }
        });
        Ok(Box::pin(feed))
    }
}
