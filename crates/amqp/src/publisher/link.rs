//! The publisher at work: where an output goes, whether it fits, and the
//! connection and channel it goes out on (reopened after a loss, under the
//! reconnect backoff).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use intake_core::BackoffPolicy;
use intake_core::publish::{Output, PublishError, PublishErrorKind};
use lapin::options::{ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Connection, ExchangeKind};
use tokio::time::Instant;

use crate::connection::open_within;
use crate::error::{Error, Operation, classify};
use crate::topology::MAX_NAME_BYTES;

use super::properties::{content_header_len, properties};
use super::{FRAME_OVERHEAD, Link, LinkState, Routing, Shared};

impl Shared {
    pub(super) fn error(
        &self,
        kind: PublishErrorKind,
        destination: &str,
        what: String,
    ) -> PublishError {
        PublishError::new(kind, destination, what)
    }

    /// Where `output` goes: exchange and routing key.
    pub(super) fn route(
        &self,
        output: &Output,
    ) -> Result<(ShortString, ShortString), PublishError> {
        let destination = output.destination();
        let (exchange, routing_key) = match &self.routing {
            Routing::Exchange(exchange) => (exchange.as_str(), destination.as_bytes()),
            Routing::ByKey => (destination, output.key().map_or(&[][..], Bytes::as_ref)),
        };
        let short = |what: &str, name: &[u8]| {
            std::str::from_utf8(name)
                .ok()
                .and_then(|name| ShortString::try_new(name).ok())
                .ok_or_else(|| {
                    self.error(
                        PublishErrorKind::Rejected,
                        destination,
                        format!(
                            "its {what} is not UTF-8 text of at most {MAX_NAME_BYTES} bytes, which \
                             AMQP (and lapin) require"
                        ),
                    )
                })
        };
        Ok((
            short("exchange", exchange.as_bytes())?,
            short("routing key", routing_key)?,
        ))
    }

    /// The output's properties (see [`properties`]).
    pub(super) fn properties(&self, output: &Output) -> Result<BasicProperties, PublishError> {
        properties(output, &self.routing, self.persistent)
    }

    /// Rejects what the broker would refuse by closing the channel (or the
    /// connection), which would fail every other output in flight.
    pub(super) fn check_size(
        &self,
        output: &Output,
        properties: &BasicProperties,
        frame_max: u32,
    ) -> Result<(), PublishError> {
        let payload = output.payload().len();
        if payload > self.max_payload_bytes {
            return Err(self.error(
                PublishErrorKind::Rejected,
                output.destination(),
                format!(
                    "its payload of {payload} bytes is larger than max_payload_bytes ({}); the \
                     broker refuses messages above its max_message_size",
                    self.max_payload_bytes
                ),
            ));
        }
        let room = usize::try_from(frame_max)
            .unwrap_or(usize::MAX)
            .saturating_sub(FRAME_OVERHEAD);
        let header = content_header_len(properties);
        if frame_max != 0 && header > room {
            return Err(self.error(
                PublishErrorKind::Rejected,
                output.destination(),
                format!(
                    "its headers take {header} bytes, more than one frame of {frame_max} bytes \
                     holds (the broker would close the connection)"
                ),
            ));
        }
        Ok(())
    }

    /// Opens a connection (or, on `reuse`'s live connection, a channel) in
    /// confirm mode and declares the topology.
    pub(super) async fn connect(&self, reuse: Option<Connection>) -> Result<Link, Error> {
        let url = &self.url;
        let fail = |error| classify(error, url.endpoint(), url.vhost(), Operation::Other);
        let connection = match reuse.filter(|connection| connection.status().connected()) {
            Some(connection) => connection,
            None => {
                open_within(
                    url,
                    self.connection_name.as_deref(),
                    &self.tls,
                    self.connect_timeout,
                )
                .await?
            }
        };
        let channel = connection.create_channel().await.map_err(fail)?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(fail)?;
        self.topology.declare_on(&channel, url).await?;
        let frame_max = connection.configuration().frame_max();
        tracing::debug!(
            endpoint = url.endpoint(),
            channel = channel.id(),
            "AMQP publisher connected"
        );
        Ok(Link {
            connection,
            channel,
            frame_max,
            exchanges: HashSet::new(),
        })
    }

    /// The live link, reconnecting (with the backoff between attempts)
    /// until `deadline`.
    pub(super) async fn live<'a>(
        &self,
        state: &'a mut LinkState,
        deadline: Instant,
        destination: &str,
    ) -> Result<&'a mut Link, PublishError> {
        loop {
            let reuse = match state.live.take() {
                Some(link) if link.channel.status().connected() => {
                    return Ok(state.live.insert(link));
                }
                Some(link) => {
                    tracing::warn!(
                        endpoint = self.url.endpoint(),
                        channel = link.channel.id(),
                        "AMQP publisher's channel is gone; its unconfirmed outputs fail as \
                         unavailable; reopening"
                    );
                    Some(link.connection)
                }
                None => None,
            };
            if let Some(at) = state.retry_at {
                if at > deadline {
                    let error = self.error(
                        PublishErrorKind::Unavailable,
                        destination,
                        format!(
                            "no connection to the broker at {} within the send timeout ({:?}); \
                             publish again",
                            self.url.endpoint(),
                            self.send_timeout
                        ),
                    );
                    return Err(match &state.last_error {
                        Some(cause) => error.with_source(Arc::clone(cause)),
                        None => error,
                    });
                }
                tokio::time::sleep_until(at).await;
            }
            let attempt = tokio::time::timeout_at(deadline, self.connect(reuse)).await;
            match attempt {
                Ok(Ok(link)) => {
                    if state.failures > 0 {
                        tracing::info!(
                            endpoint = self.url.endpoint(),
                            failures = state.failures,
                            "AMQP publisher reconnected"
                        );
                    }
                    state.failures = 0;
                    state.retry_at = None;
                    state.last_error = None;
                    return Ok(state.live.insert(link));
                }
                Ok(Err(error)) => {
                    state.failures = state.failures.saturating_add(1);
                    tracing::warn!(
                        endpoint = self.url.endpoint(),
                        failures = state.failures,
                        %error,
                        "AMQP publisher cannot connect"
                    );
                    let error = Arc::new(error);
                    state.last_error = Some(Arc::clone(&error));
                    let Some(delay) = self.reconnect.delay(state.failures) else {
                        self.closed.store(true, Ordering::Release);
                        return Err(self
                            .error(
                                PublishErrorKind::Closed,
                                destination,
                                format!(
                                    "the reconnect backoff gave up after {} failed attempts; \
                                     make a new publisher",
                                    state.failures
                                ),
                            )
                            .with_source(error));
                    };
                    state.retry_at = Some(Instant::now() + delay);
                }
                Err(_elapsed) => {
                    return Err(self.error(
                        PublishErrorKind::Unavailable,
                        destination,
                        format!(
                            "no connection to the broker at {} within the send timeout ({:?}); \
                             publish again",
                            self.url.endpoint(),
                            self.send_timeout
                        ),
                    ));
                }
            }
        }
    }

    /// Checks once per connection that `exchange` exists, on a channel of
    /// its own: publishing to a missing exchange closes the channel, and
    /// every output in flight on it would fail along.
    pub(super) async fn check_exchange(
        &self,
        link: &mut Link,
        exchange: &ShortString,
        destination: &str,
    ) -> Result<(), PublishError> {
        let name = exchange.as_str();
        if name.is_empty() || name.starts_with("amq.") || link.exchanges.contains(name) {
            return Ok(());
        }
        let url = &self.url;
        let unavailable = |error: lapin::Error| {
            self.error(
                PublishErrorKind::Unavailable,
                destination,
                format!("could not check that exchange `{name}` exists; publish again"),
            )
            .with_source(classify(
                error,
                url.endpoint(),
                url.vhost(),
                Operation::Other,
            ))
        };
        let probe = link
            .connection
            .create_channel()
            .await
            .map_err(unavailable)?;
        let declared = probe
            .exchange_declare(
                exchange.clone(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    passive: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await;
        match declared {
            Ok(()) => {
                let _ = probe.close(200, "checked".into()).await;
                link.exchanges.insert(name.to_owned());
                Ok(())
            }
            Err(error) if is_not_found(&error) => Err(self
                .error(
                    PublishErrorKind::Rejected,
                    destination,
                    format!("exchange `{name}` does not exist; declare it before publishing to it"),
                )
                .with_source(classify(
                    error,
                    url.endpoint(),
                    url.vhost(),
                    Operation::Other,
                ))),
            Err(error) => Err(unavailable(error)),
        }
    }
}

fn is_not_found(error: &lapin::Error) -> bool {
    use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
    matches!(
        error.kind(),
        lapin::ErrorKind::ProtocolError(amqp)
            if matches!(amqp.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
    )
}
