//! NATS JetStream: the stream (created if missing, storing
//! `ledger.<stream>.>`), the confirmed publisher and the source (a durable
//! pull consumer, created if missing).
//!
//! PARTITION is always 0 (a stream is one partition), POSITION the stream
//! sequence, which a redelivery keeps: the exactly-once markers use it.

use std::collections::VecDeque;
use std::time::Duration;

use intake::nats::async_nats::jetstream::{self, context::PublishAckFuture};
use intake::nats::{NatsPublisher, NatsSettings, NatsSource, async_nats};

use crate::BoxError;

/// Overrides the consumer's `ack_wait` (ms), after which the server
/// delivers again what a killed consumer held. Default [`DEFAULT_ACK_WAIT`].
pub const ACK_WAIT_ENV: &str = "LEDGER_NATS_ACK_WAIT_MS";

/// Short, so that what a SIGKILLed consumer held comes back within
/// seconds; the source reports slower work in progress, so nothing running
/// is delivered twice.
const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(5);

/// Publishes awaited at once; the rest wait for acks to free room.
const MAX_UNCONFIRMED: usize = 5_000;

fn subjects(stream: &str) -> String {
    format!("ledger.{stream}.>")
}

/// Publishes ids `0..count` on `ledger.<stream>.<id % 64>` and returns once
/// JetStream acknowledged every one.
pub async fn produce(url: &str, stream: &str, count: u64) -> Result<(), BoxError> {
    let client = async_nats::connect(url).await?;
    let context = jetstream::new(client.clone());
    get_or_create_stream(&context, stream).await?;
    let mut unconfirmed: VecDeque<(u64, PublishAckFuture)> = VecDeque::new();
    for id in 0..count {
        if unconfirmed.len() >= MAX_UNCONFIRMED {
            confirm(unconfirmed.pop_front()).await?;
        }
        let ack = context
            .publish(
                format!("ledger.{stream}.{}", id % 64),
                id.to_string().into(),
            )
            .await?;
        unconfirmed.push_back((id, ack));
    }
    while let Some(pending) = unconfirmed.pop_front() {
        confirm(Some(pending)).await?;
    }
    client.flush().await?;
    Ok(())
}

/// The stream `stream`, storing `ledger.<stream>.>`, created if missing.
async fn get_or_create_stream(context: &jetstream::Context, stream: &str) -> Result<(), BoxError> {
    context
        .get_or_create_stream(jetstream::stream::Config {
            name: stream.to_owned(),
            subjects: vec![subjects(stream)],
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await?;
    Ok(())
}

/// Creates the stream a relay publishes into, if missing.
pub async fn create_stream(url: &str, stream: &str) -> Result<(), BoxError> {
    let client = async_nats::connect(url).await?;
    get_or_create_stream(&jetstream::new(client), stream).await
}

/// The relay's publisher: JetStream publishes pipelined on a connection of
/// its own, each confirmed by the stream's ack.
pub async fn publisher(url: &str) -> Result<NatsPublisher, BoxError> {
    Ok(NatsPublisher::builder(url).build().await?)
}

/// The subject a relay publishes on: one the stream `stream` stores.
pub fn relay_subject(stream: &str) -> String {
    format!("ledger.{stream}.relayed")
}

async fn confirm(pending: Option<(u64, PublishAckFuture)>) -> Result<(), BoxError> {
    let Some((id, ack)) = pending else {
        return Ok(());
    };
    ack.await
        .map_err(|error| format!("JetStream did not acknowledge id {id}: {error}"))?;
    Ok(())
}

/// A member of consumer group `group` (a durable pull consumer of the
/// stream, created if missing, with the stream).
pub async fn source(url: &str, stream: &str, group: &str) -> Result<NatsSource, BoxError> {
    let ack_wait = match std::env::var(ACK_WAIT_ENV) {
        Ok(ms) => Duration::from_millis(
            ms.parse()
                .map_err(|_| format!("{ACK_WAIT_ENV}: `{ms}` is not milliseconds"))?,
        ),
        Err(_) => DEFAULT_ACK_WAIT,
    };
    let settings = NatsSettings::new(url)
        .connection_name(format!("ledger {group} pid {}", std::process::id()));
    let source = NatsSource::builder(settings)
        .stream(stream)
        .consumer(group)
        .create_stream([subjects(stream)])
        .ack_wait(ack_wait)
        // Every id must reach the ledger: a message that happened to be in
        // flight at several kills is delivered again, never given up.
        .unlimited_deliveries()
        // Retries handed back come again soon (the retry layer's own
        // backoff already ran).
        .redelivery_backoff(intake::Constant::new(Duration::from_millis(100)).retry_forever())
        .fetch_wait(Duration::from_secs(1))
        .build()
        .await?;
    tracing::info!(consumer = %source.consumer_name(), ?ack_wait, "consuming the durable consumer");
    Ok(source)
}

/// Asks the server how many messages the group has not acknowledged,
/// delivered or not: what a killed consumer held comes back only after
/// `ack_wait`, which may be later than a restarted consumer's idle deadline.
pub struct PendingProbe {
    client: async_nats::Client,
    stream: String,
    group: String,
}

impl PendingProbe {
    pub async fn connect(url: &str, stream: &str, group: &str) -> Result<Self, BoxError> {
        Ok(Self {
            client: async_nats::connect(url).await?,
            stream: stream.to_owned(),
            group: group.to_owned(),
        })
    }

    /// Unacknowledged messages, or `None` when the server could not say.
    pub async fn pending(&mut self) -> Option<u64> {
        let asked = async {
            let stream = jetstream::new(self.client.clone())
                .get_stream(&self.stream)
                .await?;
            let info = stream.consumer_info(&self.group).await?;
            Ok::<u64, BoxError>(info.num_ack_pending as u64 + info.num_pending)
        }
        .await;
        match asked {
            Ok(pending) => Some(pending),
            Err(error) => {
                tracing::warn!(%error, "consumer info failed; the backlog is unknown");
                None
            }
        }
    }
}
