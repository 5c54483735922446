//! [`NatsDeadLetterSinkBuilder`]: the sink's subject and stream, found or
//! created when it is built, and the consumed stream's retention read.

use std::sync::Arc;
use std::time::Duration;

use async_nats::Subject;
use async_nats::jetstream;
use intake_core::dead_letter::envelope::{Broker, Carrier};

use super::retention::OriginRetention;
use super::{NatsDeadLetterSink, default_stream, default_subject};
use crate::confirm::Confirmations;
use crate::connection::Connection;
use crate::counters::NatsCounters;
use crate::deliveries::Deliveries;
use crate::error::{Error, boxed};

/// Builds a [`NatsDeadLetterSink`]; get one from
/// [`NatsSource::dead_letter_sink`](crate::NatsSource::dead_letter_sink),
/// prefilled with the source's connection, stream and consumer.
#[must_use]
pub struct NatsDeadLetterSinkBuilder {
    connection: Connection,
    source_stream: String,
    consumer: Option<String>,
    subject: Option<String>,
    stream: Option<String>,
    create_stream: bool,
    deliveries: Arc<Deliveries>,
    counters: Arc<NatsCounters>,
    confirm_timeout: Duration,
}

impl std::fmt::Debug for NatsDeadLetterSinkBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsDeadLetterSinkBuilder")
            .field("endpoint", &self.connection.endpoint)
            .field("source_stream", &self.source_stream)
            .field("consumer", &self.consumer)
            .field("subject", &self.subject)
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

impl NatsDeadLetterSinkBuilder {
    pub(crate) fn new(
        connection: Connection,
        source_stream: String,
        consumer: Option<String>,
        deliveries: Arc<Deliveries>,
        counters: Arc<NatsCounters>,
        confirm_timeout: Duration,
    ) -> Self {
        Self {
            connection,
            source_stream,
            consumer,
            subject: None,
            stream: None,
            create_stream: true,
            deliveries,
            counters,
            confirm_timeout,
        }
    }

    /// Publishes letters to `subject` (default `<stream>.<consumer>.dlq`).
    pub fn subject(mut self, subject: impl Into<String>) -> Self {
        self.subject = Some(subject.into());
        self
    }

    /// The stream to create for the subject when no stream stores it yet
    /// (default `<stream>_dlq`, storing `<stream>.*.dlq` for the default
    /// subject, the subject alone otherwise).
    pub fn stream(mut self, stream: impl Into<String>) -> Self {
        self.stream = Some(stream.into());
        self
    }

    /// Fails the build instead of creating a stream when no stream stores
    /// the subject.
    pub fn no_create(mut self) -> Self {
        self.create_stream = false;
        self
    }

    /// How long a letter's publish ack and the original's term may take
    /// (default the source's ack timeout).
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// Checks the destination (creating its stream if missing) and returns
    /// the sink.
    ///
    /// # Errors
    ///
    /// [`Error::DeadLetterLoop`] when the consumed stream itself stores the
    /// subject; [`Error::JetStream`] when the stream cannot be found or
    /// created.
    pub async fn build(self) -> Result<NatsDeadLetterSink, Error> {
        let endpoint = self.connection.endpoint.to_string();
        let default = self.subject.is_none();
        let subject = match self.subject {
            Some(subject) => subject,
            None => match &self.consumer {
                Some(consumer) => default_subject(&self.source_stream, consumer),
                None => format!("{}.dlq", self.source_stream),
            },
        };
        let context = jetstream::new(self.connection.client.clone());
        let stored_by = match context.stream_by_subject(subject.clone()).await {
            Ok(stream) => Some(stream),
            Err(error)
                if error.kind() == jetstream::context::GetStreamByNameErrorKind::NotFound =>
            {
                None
            }
            Err(error) => {
                return Err(Error::JetStream {
                    endpoint,
                    operation: format!("say which stream stores dead-letter subject `{subject}`"),
                    transient: true,
                    source: boxed(error),
                });
            }
        };
        let stream = match stored_by {
            Some(stream) if stream == self.source_stream => {
                return Err(Error::DeadLetterLoop { subject, stream });
            }
            Some(stream) => stream,
            None if !self.create_stream => {
                return Err(Error::JetStream {
                    endpoint,
                    operation: format!("find a stream storing dead-letter subject `{subject}`"),
                    transient: false,
                    source: "no stream stores the subject; create one or allow the sink to".into(),
                });
            }
            None => {
                let name = self
                    .stream
                    .clone()
                    .unwrap_or_else(|| default_stream(&self.source_stream));
                let subjects = match default {
                    true => vec![format!("{}.*.dlq", self.source_stream)],
                    false => vec![subject.clone()],
                };
                let config = jetstream::stream::Config {
                    name: name.clone(),
                    subjects,
                    storage: jetstream::stream::StorageType::File,
                    ..Default::default()
                };
                context
                    .get_or_create_stream(config)
                    .await
                    .map_err(|error| Error::JetStream {
                        endpoint: endpoint.clone(),
                        operation: format!(
                            "create dead-letter stream `{name}` for subject `{subject}`"
                        ),
                        transient: false,
                        source: boxed(error),
                    })?;
                tracing::info!(stream = %name, %subject, "created the dead-letter stream");
                name
            }
        };
        let origin_retention = match context.get_stream(&self.source_stream).await {
            Ok(mut stream) => match stream.info().await {
                Ok(info) => OriginRetention::of(info.config.retention),
                Err(error) => OriginRetention::unknown(&self.source_stream, &error),
            },
            Err(error) => OriginRetention::unknown(&self.source_stream, &error),
        };
        let mut carrier = Carrier::keyless(Broker::Nats);
        if let Some(consumer) = &self.consumer {
            carrier = carrier.with_group(consumer.as_str());
        }
        Ok(NatsDeadLetterSink {
            context,
            subject: Subject::from(subject),
            stream,
            carrier,
            source_stream: self.source_stream.as_str().into(),
            origin_retention,
            deliveries: self.deliveries,
            counters: self.counters,
            terms: tokio::sync::Mutex::new(Confirmations::new(self.connection.client.clone())),
            client: self.connection.client,
            endpoint,
            confirm_timeout: self.confirm_timeout,
        })
    }
}
