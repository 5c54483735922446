//! [`RedisStreamsSource`]: entries of one or more streams, read as a member
//! of a consumer group or, in broadcast mode, by every instance.
//!
//! # Cancel safety
//!
//! The runtime may drop a pending [`Source::next`]. Nothing is lost when it
//! does:
//!
//! - Entries are read only inside `next`, at most as many as the runtime
//!   asked for, so reading stops by itself while the in-flight budget is
//!   full.
//! - A group entry read with `>` enters this consumer's pending entries list
//!   (PEL) on the server before the reply is even sent. Decoded entries wait
//!   in the source until a call hands them out, and the source remembers the
//!   newest id it has decoded per stream. If a call is dropped midway (or
//!   the connection is lost), the next call reopens the reading connection,
//!   has the server close the old one (so that a read still blocked there
//!   cannot take an entry later), and first re-reads this consumer's
//!   pending entries *after* that id:
//!   exactly those that reached the PEL but not the source. Entries at or
//!   before it were decoded and are either waiting in the source, with the
//!   runtime, or (if the source itself is dropped) pending in Redis, where a
//!   restart or a claim finds them. Such a re-read fetches the entries by id
//!   (`XRANGE`) rather than with `XREADGROUP`, which would count one more
//!   delivery each time: calls dropped in a row must not push an entry that
//!   no handler saw past `max_deliveries`.
//! - An entry bound for the dead-letter stream stays in the source until its
//!   write finished; a dropped call leaves it to the next one. The write is
//!   idempotent (it does nothing once the original is acknowledged), so a
//!   write whose reply was lost is not repeated as a second letter.
//! - A broadcast read changes nothing on the server; the next read starts
//!   after the last entry decoded.

mod blocking_connection;
mod broadcast;
pub(crate) mod builder;
pub(crate) mod convert;
mod group;
mod key_order;
mod read_size;
pub(crate) mod settings;
mod staging;

use std::sync::Arc;

use intake_core::{
    DeliveryOrder, Message,
    backend::{Limits, Source, SourceError, SourceEvent},
};
use redis::aio::MultiplexedConnection;

use crate::acker::RedisStreamsAcker;
use crate::connection::{Connector, SharedConnection};
use crate::counters::RedisCounters;
use crate::dead_letter::{RedisDeadLetterSink, RedisDeadLetterSinkBuilder};
use crate::error::Error;
use crate::held::{self, HeldEntries};
use crate::source::settings::Settings;

use self::blocking_connection::BlockingConnection;
use self::broadcast::BroadcastReader;
use self::group::GroupReader;
use self::read_size::ReadSize;

/// Reads entries of Redis streams and hands them to the runtime as
/// messages. Built by [`RedisStreamsSource::builder`]; its acker is
/// [`acker`](Self::acker).
///
/// Each message's partition is its stream (partition 0), its position the
/// entry id, its timestamp the id's milliseconds, and its attempt the
/// delivery count Redis keeps for the entry.
pub struct RedisStreamsSource {
    reader: Reader,
    /// What [`dead_letter_sink`](Self::dead_letter_sink) hands out.
    dead_letters: RedisDeadLetterSinkBuilder,
    settings: Arc<Settings>,
    /// The connection of acknowledgements (and of the dead-letter sink).
    shared: SharedConnection,
    /// The entries handed out and not yet acknowledged, which the acker
    /// releases.
    held: Arc<HeldEntries>,
    /// How many entries one read may bring, from the consumer's byte
    /// budget.
    read_size: ReadSize,
    /// Resets the idle time of the entries this consumer holds; ends with
    /// the source.
    keep_alive: Option<tokio::task::AbortHandle>,
    /// Whether the reading connection reaches the server (it reconnects on
    /// its own, so the runtime sees no error during an outage).
    reachability: intake_core::backend::Reachability,
}

impl Drop for RedisStreamsSource {
    fn drop(&mut self) {
        if let Some(keep_alive) = self.keep_alive.take() {
            keep_alive.abort();
        }
    }
}

enum Reader {
    Group(Box<GroupReader>),
    Broadcast(Box<BroadcastReader>),
}

impl std::fmt::Debug for RedisStreamsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStreamsSource")
            .field("streams", &self.settings.streams)
            .field("group", &self.settings.group)
            .field("consumer", &self.settings.consumer)
            .finish_non_exhaustive()
    }
}

impl RedisStreamsSource {
    pub(crate) async fn start(
        connector: Connector,
        mut connection: MultiplexedConnection,
        settings: Arc<Settings>,
        dead_letters: RedisDeadLetterSinkBuilder,
        shared: SharedConnection,
        held: Arc<HeldEntries>,
    ) -> Result<Self, Error> {
        // Groups are created and broadcast start positions resolved before
        // the connection is handed over, so that errors (a key of the wrong
        // type) surface from `build`.
        let positions = match &settings.group {
            Some(_) => {
                group::create_groups(&mut connection, &connector, &settings).await?;
                if settings.delete_acked {
                    group::refuse_shared_streams(&mut connection, &connector, &settings).await?;
                }
                None
            }
            None => Some(broadcast::start_positions(&mut connection, &connector, &settings).await?),
        };
        let connection = BlockingConnection::new(
            connector,
            settings.block,
            settings.reconnect.clone(),
            connection,
            settings.counters.clone(),
        )
        .await;
        let reachability = connection.reachability().clone();
        // The source's own dead letters (past `max_deliveries`, no payload
        // field).
        let sink = RedisDeadLetterSink::new(shared.clone(), &settings);
        let keep_alive = settings.group.is_some().then(|| {
            tokio::spawn(held::keep_alive(
                held.clone(),
                shared.clone(),
                settings.clone(),
            ))
            .abort_handle()
        });
        let reader = match positions {
            None => Reader::Group(Box::new(GroupReader::new(
                settings.clone(),
                connection,
                sink,
                held.clone(),
            ))),
            Some(positions) => Reader::Broadcast(Box::new(BroadcastReader::new(
                settings.clone(),
                connection,
                sink,
                positions,
            ))),
        };
        tracing::info!(
            streams = ?settings.streams,
            group = settings.group.as_deref().unwrap_or("(broadcast)"),
            consumer = %settings.consumer,
            "Redis Streams source started"
        );
        Ok(Self {
            reader,
            dead_letters,
            settings,
            shared,
            held,
            read_size: ReadSize::default(),
            keep_alive,
            reachability,
        })
    }

    /// The acker of this source's entries: `XACK` (with `XDEL` under
    /// [`delete_acked`](builder::RedisStreamsSourceBuilder::delete_acked))
    /// on the source's shared connection, or nothing at all for a
    /// broadcast reader. Hand it to the consumer with the source.
    pub fn acker(&self) -> RedisStreamsAcker {
        RedisStreamsAcker::new(
            self.shared.clone(),
            self.settings.clone(),
            self.held.clone(),
        )
    }

    /// A builder of the dead-letter sink of this consumer, for the
    /// dead-letter layer: prefilled from the source (group, consumer name,
    /// payload field, dead-letter stream, the streams it reads), on the
    /// source's connection. Its
    /// [`build`](RedisDeadLetterSinkBuilder::build) refuses a dead-letter
    /// stream the source reads.
    pub fn dead_letter_sink(&self) -> RedisDeadLetterSinkBuilder {
        self.dead_letters.clone()
    }

    /// A builder of the parking of this consumer, for the parking layer:
    /// prefilled from the source (its [`RedisSettings`](crate::RedisSettings):
    /// server, TLS, timeouts, the command timeout bounding each park and
    /// mover round; its group, payload field, and as consumed streams the
    /// streams it reads but their return streams), on a connection of its
    /// own. Parked messages
    /// come back to a return stream only this group reads, so the source
    /// must read it too, with one more line on its builder:
    /// `.stream(RedisParking::return_stream("orders", "billing"))`. The
    /// builder's [`build`](crate::RedisParkingBuilder::build) refuses a
    /// return stream the source does not read, and a broadcast reader
    /// (no group to return to).
    pub fn parking(&self) -> crate::RedisParkingBuilder {
        crate::RedisParkingBuilder::from_source(self.shared.connector().clone(), &self.settings)
    }

    /// This consumer's name within its group.
    pub fn consumer(&self) -> &str {
        &self.settings.consumer
    }

    /// The counters of this consumer (shared with its acker and dead-letter
    /// sink): entries acknowledged because they vanished, malformed replies,
    /// dead letters, retries after transient failures.
    pub fn counters(&self) -> Arc<RedisCounters> {
        self.settings.counters.clone()
    }

    /// A probe of the group's broker-side lag on the source's streams,
    /// sharing the source's connection; `None` for a broadcast reader,
    /// which has no group on the server.
    pub fn lag_probe(&self) -> Option<crate::RedisLagProbe> {
        let group = self.settings.group.clone()?;
        Some(crate::RedisLagProbe::of_source(
            &self.shared,
            group,
            &self.settings.streams,
        ))
    }

    /// The consumer group, or `None` for a broadcast reader.
    pub fn group(&self) -> Option<&str> {
        self.settings.group.as_deref()
    }
}

impl Source for RedisStreamsSource {
    async fn next(
        &mut self,
        deliveries: &mut Vec<Message>,
        max: usize,
    ) -> Result<SourceEvent, SourceError> {
        if max == 0 {
            // The budget is full: read nothing (`COUNT 0` would even mean
            // "no limit" to Redis). A Redis source has no assignment changes
            // to report, so it waits until the runtime asks again; nothing
            // is under way, so dropping this wait costs nothing.
            return std::future::pending().await;
        }
        let max = self.read_size.limit(max);
        let before = deliveries.len();
        let delivered = match &mut self.reader {
            Reader::Group(reader) => reader.next(deliveries, max).await,
            Reader::Broadcast(reader) => reader.next(deliveries, max).await,
        };
        if self.read_size.is_bounded() {
            let read = &deliveries[before..];
            let bytes = read.iter().map(Message::byte_size).sum();
            self.read_size.observe(bytes, read.len());
        }
        delivered.map(|()| SourceEvent::Delivered).map_err(|error| {
            tracing::error!(%error, "the Redis Streams source failed");
            SourceError::from(error)
        })
    }

    /// Sizes each read (`COUNT`) so that it brings at most an eighth of
    /// `max_in_flight_bytes` at the average size of the entries before
    /// (see `source/read_size.rs`); `max_in_flight` already bounds every read
    /// through `next`'s `max`, and a stream has no revocation to time.
    fn set_limits(&mut self, limits: Limits) {
        self.read_size.set_budget(limits.max_in_flight_bytes);
        if let Reader::Group(reader) = &mut self.reader {
            reader.set_limits(
                limits.max_in_flight,
                limits.ordering != DeliveryOrder::Unordered,
            );
        }
    }

    /// Unreachable from the first failed attempt to reach the server until
    /// a command works again: the source reconnects with its own policy
    /// (`reconnect`), and `next` waits meanwhile.
    fn reachability(&self) -> Option<intake_core::backend::Reachability> {
        Some(self.reachability.clone())
    }

    async fn close(&mut self) -> Result<(), SourceError> {
        // Entries still held now were not finished: once their idle time
        // passes claim_min_idle, other consumers may take them over.
        if let Some(keep_alive) = self.keep_alive.take() {
            keep_alive.abort();
        }
        match &mut self.reader {
            Reader::Group(reader) => reader.close().await.map_err(SourceError::from),
            Reader::Broadcast(_) => Ok(()),
        }
    }
}
