//! [`Settings`]: what a source, its acker, its dead-letter sink and its
//! parking share, as the builder checked it, and the setting types they are
//! made of. The connection is [`RedisSettings`](crate::RedisSettings).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use intake_core::{BackoffPolicy, ConfigError, SourceName};

use crate::counters::RedisCounters;

/// The entry field that holds the payload unless set otherwise.
pub(crate) const DEFAULT_PAYLOAD_FIELD: &str = "payload";

/// Where a new consumer group starts reading a stream (or where a broadcast
/// reader starts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StartFrom {
    /// The oldest entry still in the stream (`0`). The default for consumer
    /// groups: entries written before the group existed are processed too.
    #[default]
    Beginning,
    /// Only entries added after the group was created or the broadcast
    /// reader connected (`$`). The default for broadcast readers.
    NewEntries,
}

/// The stream that receives dead letters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeadLetterStream {
    /// The source stream's name followed by this suffix: `orders` with
    /// `":dlq"` (the default) writes to `orders:dlq`.
    Suffix(String),
    /// One stream for the dead letters of every source stream.
    Fixed(String),
}

impl Default for DeadLetterStream {
    fn default() -> Self {
        DeadLetterStream::Suffix(":dlq".to_owned())
    }
}

impl DeadLetterStream {
    /// The dead-letter stream of source stream `stream`.
    pub fn name_for(&self, stream: &str) -> String {
        match self {
            DeadLetterStream::Suffix(suffix) => format!("{stream}{suffix}"),
            DeadLetterStream::Fixed(name) => name.clone(),
        }
    }

    /// Refuses a destination that is empty or, for one of the `consumed`
    /// streams, is itself consumed: its dead letters would be read again.
    pub(crate) fn check(&self, consumed: &[impl AsRef<str>]) -> Result<(), ConfigError> {
        let (DeadLetterStream::Suffix(name) | DeadLetterStream::Fixed(name)) = self;
        if name.is_empty() {
            return Err(ConfigError::new(
                "dead_letter_stream",
                "is empty: dead letters would go back to the source stream",
            ));
        }
        for stream in consumed {
            let dead_letters = self.name_for(stream.as_ref());
            if consumed.iter().any(|other| other.as_ref() == dead_letters) {
                return Err(ConfigError::new(
                    "dead_letter_stream",
                    format!(
                        "`{dead_letters}` is also a stream this consumer reads; dead letters \
                         would be consumed again"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Settings shared by a source, its acker and its dead-letter sink.
pub(crate) struct Settings {
    pub(crate) streams: Vec<SourceName>,
    /// `None` in broadcast mode.
    pub(crate) group: Option<Arc<str>>,
    pub(crate) consumer: Arc<str>,
    pub(crate) payload_field: Arc<str>,
    pub(crate) key_field: Option<Arc<str>>,
    /// Whether an entry with a key waits for older entries of its key in
    /// other hands (`source/key_order.rs`).
    pub(crate) key_order: bool,
    pub(crate) start: StartFrom,
    pub(crate) block: Duration,
    pub(crate) claim_min_idle: Duration,
    pub(crate) claim_interval: Duration,
    pub(crate) max_deliveries: Option<u32>,
    pub(crate) dead_letter_stream: DeadLetterStream,
    pub(crate) delete_acked: bool,
    pub(crate) reconnect: Arc<dyn BackoffPolicy>,
    /// Counters shared by the source, the acker and the dead-letter sink.
    pub(crate) counters: Arc<RedisCounters>,
}

impl Settings {
    /// The streams as one text, for errors of commands that span them all.
    pub(crate) fn stream_list(&self) -> String {
        self.streams
            .iter()
            .map(|stream| &**stream)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// `<hostname>-<pid>-<n>`: a consumer name no other live process uses.
pub(crate) fn default_consumer_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|host| !host.is_empty())
        .unwrap_or_else(|| "intake".to_owned());
    format!(
        "{host}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
