//! What a producer sends to the memory broker, and what it gets back.

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;

use crate::message::Headers;

/// A record to produce: payload, optional key, headers, and optionally the
/// partition and timestamp.
///
/// Without an explicit partition, a keyed record goes to the partition its
/// key hashes to (the same one Kafka's default partitioner picks) and a
/// record without a key goes to the topic's partitions in turn.
#[derive(Clone, Debug)]
pub struct Record {
    pub(crate) payload: Bytes,
    pub(crate) key: Option<Bytes>,
    pub(crate) headers: Headers,
    pub(crate) partition: Option<u32>,
    pub(crate) timestamp: Option<SystemTime>,
}

impl Record {
    /// A record with `payload`, no key, no headers.
    pub fn new(payload: impl Into<Bytes>) -> Self {
        Self {
            payload: payload.into(),
            key: None,
            headers: Headers::new(),
            partition: None,
            timestamp: None,
        }
    }

    /// Sets the key, which picks the partition unless one is given.
    pub fn with_key(mut self, key: impl Into<Bytes>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Sets the key if there is one.
    pub fn with_optional_key(mut self, key: Option<Bytes>) -> Self {
        self.key = key;
        self
    }

    /// Replaces the headers.
    pub fn with_headers(mut self, headers: Headers) -> Self {
        self.headers = headers;
        self
    }

    /// Appends one header.
    pub fn with_header(mut self, name: impl Into<Arc<str>>, value: impl Into<Bytes>) -> Self {
        self.headers.insert(name, value);
        self
    }

    /// Sends the record to `partition`, whatever its key.
    pub fn to_partition(mut self, partition: u32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// Stamps the record with `timestamp` instead of the time it is sent.
    pub fn with_timestamp(mut self, timestamp: SystemTime) -> Self {
        self.timestamp = Some(timestamp);
        self
    }
}

/// Where a produced record was stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Produced {
    /// The partition it went to.
    pub partition: u32,
    /// Its offset within that partition.
    pub offset: i64,
}
