//! Reading without a consumer group (`XREAD`): every instance sees every
//! entry, nothing is acknowledged, and a restart starts over at the
//! configured start.

use std::sync::Arc;

use intake_core::{DeadLetter, Message, SourceName};
use redis::Value;
use redis::aio::MultiplexedConnection;

use super::blocking_connection::BlockingConnection;
use super::convert::{Decoded, EntryDecoder, RawEntry, parse_entries, split_read_reply};
use super::staging::{OnFailure, Poison, Staging};
use crate::connection::Connector;
use crate::dead_letter::RedisDeadLetterSink;
use crate::error::Error;
use crate::source::settings::{Settings, StartFrom};
use crate::stream_id::StreamId;

/// Where each stream's reading starts. "New entries" is resolved to the
/// stream's last id now, not left as `$`: `$` means "newer than the last
/// entry when this command runs", so entries added between two reads would
/// be skipped.
pub(super) async fn start_positions(
    connection: &mut MultiplexedConnection,
    connector: &Connector,
    settings: &Settings,
) -> Result<Vec<StreamId>, Error> {
    let mut positions = Vec::with_capacity(settings.streams.len());
    for stream in &settings.streams {
        let last: Value = redis::cmd("XREVRANGE")
            .arg(&**stream)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(connection)
            .await
            .map_err(|error| connector.key_error(error, "XREVRANGE", stream))?;
        let position = match settings.start {
            StartFrom::Beginning => StreamId::ZERO,
            StartFrom::NewEntries => {
                let mut entries = Vec::new();
                parse_entries(last, "XREVRANGE", &mut entries)?;
                entries.first().map_or(StreamId::ZERO, |entry| entry.id)
            }
        };
        positions.push(position);
    }
    Ok(positions)
}

pub(super) struct BroadcastReader {
    settings: Arc<Settings>,
    connection: BlockingConnection,
    streams: Vec<(SourceName, StreamId)>,
    decoder: EntryDecoder,
    sink: RedisDeadLetterSink,
    staging: Staging,
    raw: Vec<RawEntry>,
    replies: Vec<(usize, Value)>,
}

impl BroadcastReader {
    pub(super) fn new(
        settings: Arc<Settings>,
        connection: BlockingConnection,
        sink: RedisDeadLetterSink,
        positions: Vec<StreamId>,
    ) -> Self {
        Self {
            streams: settings.streams.iter().cloned().zip(positions).collect(),
            decoder: EntryDecoder::new(settings.payload_field.clone(), settings.key_field.clone()),
            connection,
            sink,
            staging: Staging::default(),
            raw: Vec::new(),
            replies: Vec::new(),
            settings,
        }
    }

    pub(super) async fn next(
        &mut self,
        deliveries: &mut Vec<Message>,
        max: usize,
    ) -> Result<(), Error> {
        self.connection.begin_call();
        let result = self.fill(deliveries, max).await;
        self.connection.end_call();
        result
    }

    async fn fill(&mut self, deliveries: &mut Vec<Message>, max: usize) -> Result<(), Error> {
        loop {
            self.staging
                .dead_letter(&self.sink, OnFailure::Stop)
                .await?;
            if self.staging.hand_out(deliveries, max) {
                return Ok(());
            }
            match self.read(max).await {
                Ok(()) => self.connection.succeeded(),
                Err(error) if error.is_transient() => {
                    self.connection.drop_connection();
                    self.connection.back_off(error).await?;
                }
                Err(error) => return Err(error),
            }
        }
    }

    async fn read(&mut self, max: usize) -> Result<(), Error> {
        let count = (max / self.streams.len()).max(1);
        let mut command = redis::cmd("XREAD");
        command
            .arg("COUNT")
            .arg(count)
            .arg("BLOCK")
            .arg(u64::try_from(self.settings.block.as_millis()).unwrap_or(u64::MAX))
            .arg("STREAMS");
        for (stream, _) in &self.streams {
            command.arg(&**stream);
        }
        for (_, position) in &self.streams {
            command.arg(*position);
        }
        let connector = self.connection.connector().clone();
        let (connection, _) = self.connection.get().await?;
        let reply: Value = command
            .query_async(connection)
            .await
            .map_err(|error| connector.key_error(error, "XREAD", &self.settings.stream_list()))?;
        self.replies.clear();
        let streams = &self.streams;
        split_read_reply(
            reply,
            "XREAD",
            |key| {
                streams
                    .iter()
                    .position(|(stream, _)| stream.as_bytes() == key)
            },
            &mut self.replies,
        )?;
        let mut replies = std::mem::take(&mut self.replies);
        for (index, entries) in replies.drain(..) {
            self.raw.clear();
            let skipped = parse_entries(entries, "XREAD", &mut self.raw)?;
            self.settings.counters.add_malformed(skipped.malformed);
            let (stream, position) = &mut self.streams[index];
            for entry in self.raw.drain(..) {
                *position = (*position).max(entry.id);
                let Some(fields) = entry.fields else {
                    continue;
                };
                match self.decoder.decode(stream, entry.id, fields, 1) {
                    Decoded::Message(message) => self.staging.ready.push_back(message),
                    Decoded::MissingPayload(message) => self.staging.poison.push_back(Poison {
                        letter: DeadLetter::new(
                            message,
                            format!(
                                "the entry has no `{}` field; set `payload_field` to the field \
                                 that holds the payload",
                                self.settings.payload_field
                            ),
                            0,
                        ),
                        with_payload: false,
                    }),
                }
            }
        }
        self.replies = replies;
        Ok(())
    }
}
