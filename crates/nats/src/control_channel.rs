//! [`NatsControlChannel`]: one of a consumer group's control logs
//! ([`intake_core::group_control`]) as a JetStream stream.

use std::fmt::{self, Write as _};
use std::sync::Arc;
use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream::{
    self,
    consumer::DeliverPolicy,
    consumer::pull::{Ordered, OrderedConfig, OrderedErrorKind},
    context::CreateStreamErrorKind,
    stream::ConsumerErrorKind,
};
use bytes::Bytes;
use futures_util::StreamExt;
use intake_core::group_control::{ControlChannel, ControlError, ControlFeed, ControlLog};
use intake_core::publish::{Output, Publisher};
use intake_core::{BoxError, ConfigError};
use tokio::time::{Instant, MissedTickBehavior};

use crate::error::{Error, boxed};
use crate::publisher::NatsPublisher;

/// How many characters of the group a name keeps before it is cut (and
/// hashed): stream names are directory names on the server.
const MAX_GROUP_TOKEN: usize = 64;

/// How long a feed may see nothing on a connection that is up before it
/// asks the server whether the stream is still there: async-nats's ordered
/// consumer recreates a lost consumer by itself, forever, so a stream
/// deleted under it would otherwise leave the feed silent for good.
const PROBE_AFTER: Duration = Duration::from_secs(30);

/// One of a consumer group's two control logs (see
/// [`group_control`](intake_core::group_control)) as a JetStream stream,
/// from [`NatsBroker::control_channel`](crate::NatsBroker::control_channel).
///
/// | log | stream | subject | limits |
/// |---|---|---|---|
/// | [`Commands`](ControlLog::Commands) | `INTAKE_CONTROL_{group}` | `intake.control.{group}` | none: kept until deleted |
/// | [`Status`](ControlLog::Status) | `INTAKE_STATUS_{group}` | `intake.status.{group}` | `max_age` one hour |
///
/// The stream is created (file storage, one subject) when missing.
///
/// # Names
///
/// `{group}` is the group as one token that a stream name and a subject
/// can both hold: its ASCII letters, digits, `_` and `-` are kept, every
/// other character (`.`, `*`, `>`, whitespace, `/`, non-ASCII…) becomes
/// `_`, and a group longer than 64 characters is cut there. When anything
/// was replaced or cut, `_` and 8 hex digits of a hash of the whole group
/// (the low 32 bits of its FNV-1a 64) follow, so that `billing.eu` and
/// `billing/eu` do not share a log: `billing.eu` is
/// `INTAKE_CONTROL_billing_eu_<hash>`, `billing` stays `INTAKE_CONTROL_billing`.
/// The hash is fixed, so every instance and version finds the same stream.
/// An empty group is refused.
///
/// # Calls
///
/// - An append is a JetStream publish through a
///   [`NatsPublisher`] of the channel's own, done once the stream's publish
///   ack is in: the publisher's timeouts bound it (the broker's
///   [`ack_timeout`](crate::NatsBroker::ack_timeout)), and its classification
///   says whether a failure is transient.
/// - A feed is an ephemeral ordered consumer (no acks, memory storage, one
///   replica) delivering every message of the stream from its first, on
///   the same connection. async-nats recreates it from the last sequence
///   seen when it misses its heartbeats or its consumer is deleted, and
///   retries that without end, so the feed adds its own bounds: it ends
///   with [`ControlError::Unavailable`] once the connection has been down
///   for the timeout, and after 30 s without a record it
///   asks the server for the stream (within the timeout), ending with the
///   failure if that does not answer.
///
/// `Debug` and the errors show the server without credentials.
pub struct NatsControlChannel {
    publisher: NatsPublisher,
    group: Arc<str>,
    log: ControlLog,
    stream: Arc<str>,
    subject: Arc<str>,
    timeout: Duration,
}

impl fmt::Debug for NatsControlChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsControlChannel")
            .field("endpoint", &self.publisher.endpoint())
            .field("group", &self.group)
            .field("log", &self.log)
            .field("stream", &self.stream)
            .field("subject", &self.subject)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// `group` as one token of a stream name and a subject (see
/// [`NatsControlChannel`]'s names).
fn group_token(group: &str) -> String {
    let mut token = String::with_capacity(group.len().min(MAX_GROUP_TOKEN) + 9);
    let mut changed = false;
    for (at, c) in group.chars().enumerate() {
        if at == MAX_GROUP_TOKEN {
            changed = true;
            break;
        }
        if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
            token.push(c);
        } else {
            token.push('_');
            changed = true;
        }
    }
    if changed {
        // The low 32 bits of FNV-1a 64: fixed by its definition, unlike
        // std's hashers, so every instance and version agrees.
        let hash = group.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        let _ = write!(token, "_{:08x}", hash & 0xffff_ffff);
    }
    token
}

/// The stream and subject of `group`'s `log`.
fn names(group: &str, log: ControlLog) -> (String, String) {
    let token = group_token(group);
    let stream = format!("INTAKE_{}_{token}", log.as_str().to_ascii_uppercase());
    let subject = format!("intake.{}.{token}", log.as_str());
    (stream, subject)
}

/// Whether the status code of a JetStream API error says the server cannot
/// do it now (5xx) rather than refuses it (4xx).
fn server_busy(error: &jetstream::Error) -> bool {
    error.code() >= 500
}

impl NatsControlChannel {
    /// `group`'s `log` through `publisher`'s connection, its stream created
    /// when missing, each request bounded by `timeout`.
    pub(crate) async fn open(
        publisher: NatsPublisher,
        group: &str,
        log: ControlLog,
        timeout: Duration,
    ) -> Result<Self, Error> {
        if group.is_empty() {
            return Err(ConfigError::new("group", "is empty; name the consumer group").into());
        }
        let (stream, subject) = names(group, log);
        let config = jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![subject.clone()],
            max_age: log.retention().unwrap_or_default(),
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        };
        let endpoint = publisher.endpoint().to_owned();
        let operation = || {
            format!(
                "create stream `{stream}` for the group's {} log",
                log.as_str()
            )
        };
        match tokio::time::timeout(timeout, publisher.context().get_or_create_stream(config)).await
        {
            Err(_) => {
                return Err(Error::Unconfirmed {
                    endpoint,
                    what: format!("the creation of stream `{stream}`"),
                    waited: timeout,
                });
            }
            Ok(Err(error)) => {
                let transient = match error.kind() {
                    CreateStreamErrorKind::TimedOut
                    | CreateStreamErrorKind::JetStreamUnavailable
                    | CreateStreamErrorKind::Response => true,
                    CreateStreamErrorKind::JetStream(ref error) => server_busy(error),
                    _ => false,
                };
                return Err(Error::JetStream {
                    endpoint,
                    operation: operation(),
                    transient,
                    source: boxed(error),
                });
            }
            Ok(Ok(_)) => {}
        }
        Ok(Self {
            publisher,
            group: group.into(),
            log,
            stream: stream.into(),
            subject: subject.into(),
            timeout,
        })
    }

    /// The group whose log this is.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The JetStream stream holding the log (see the names above).
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The one subject of the stream, which appends publish to.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// The server, as errors and logs show it (no credentials).
    pub fn endpoint(&self) -> &str {
        self.publisher.endpoint()
    }

    fn failed(&self, operation: String, transient: bool, source: BoxError) -> Error {
        Error::JetStream {
            endpoint: self.endpoint().to_owned(),
            operation,
            transient,
            source,
        }
    }

    /// The ordered consumer's messages from the stream's first.
    async fn messages(&self) -> Result<Ordered, Error> {
        let operation = || format!("follow stream `{}`", self.stream);
        let stream = self
            .publisher
            .context()
            .get_stream_no_info(&*self.stream)
            .await
            .map_err(|error| self.failed(operation(), true, boxed(error)))?;
        let consumer = stream
            .create_consumer(OrderedConfig {
                deliver_policy: DeliverPolicy::All,
                description: Some(format!(
                    "intake: a follower of the {} log",
                    self.log.as_str()
                )),
                ..Default::default()
            })
            .await
            .map_err(|error| {
                let transient = match error.kind() {
                    ConsumerErrorKind::TimedOut | ConsumerErrorKind::Request => true,
                    ConsumerErrorKind::JetStream(ref error) => server_busy(error),
                    _ => false,
                };
                self.failed(operation(), transient, boxed(error))
            })?;
        // Subscribing fails only on a client that is closed.
        consumer
            .messages()
            .await
            .map_err(|error| self.failed(operation(), true, boxed(error)))
    }
}

impl ControlChannel for NatsControlChannel {
    fn log(&self) -> ControlLog {
        self.log
    }

    async fn append(&self, record: Bytes) -> Result<(), ControlError> {
        // The publisher bounds the wait for room and the ack; this bounds
        // the two together once more, whatever the client does.
        let bound = self.timeout.saturating_mul(2);
        let published = tokio::time::timeout(
            bound,
            self.publisher.publish(Output::new(&*self.subject, record)),
        )
        .await;
        match published {
            Err(_) => Err(ControlError::TimedOut(bound)),
            Ok(Ok(_confirmation)) => Ok(()),
            Ok(Err(error)) => {
                let transient = error.is_transient();
                Err(ControlError::from_backend(error, transient))
            }
        }
    }

    async fn follow(&self) -> Result<ControlFeed, ControlError> {
        let messages = match tokio::time::timeout(self.timeout, self.messages()).await {
            Err(_) => return Err(ControlError::TimedOut(self.timeout)),
            Ok(Err(error)) => {
                let transient = error.is_transient();
                return Err(ControlError::from_backend(error, transient));
            }
            Ok(Ok(messages)) => messages,
        };
        let check_every =
            (self.timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let mut checks = tokio::time::interval(check_every);
        checks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let feed = Feed {
            messages,
            client: self.publisher.client().clone(),
            context: self.publisher.context().clone(),
            endpoint: self.endpoint().into(),
            stream: self.stream.clone(),
            timeout: self.timeout,
            checks,
            lost_since: None,
            quiet_since: Instant::now(),
        };
        let records = futures_util::stream::unfold(Some(feed), |feed| async move {
            let mut feed = feed?;
            match feed.next().await {
                Ok(record) => Some((Ok(record), Some(feed))),
                // The feed ends with its error: the follower opens a new one.
                Err(error) => Some((Err(error), None)),
            }
        });
        Ok(Box::pin(records))
    }
}

/// A feed's state: the ordered consumer and what bounds it.
struct Feed {
    messages: Ordered,
    client: async_nats::Client,
    context: jetstream::Context,
    endpoint: Arc<str>,
    stream: Arc<str>,
    timeout: Duration,
    checks: tokio::time::Interval,
    /// Since when the connection is down, while it is.
    lost_since: Option<Instant>,
    /// Since the last record or the last probe of the stream.
    quiet_since: Instant,
}

impl Feed {
    /// The next record's payload, or the error that ends the feed.
    async fn next(&mut self) -> Result<Bytes, ControlError> {
        loop {
            tokio::select! {
                message = self.messages.next() => {
                    return match message {
                        Some(Ok(message)) => {
                            self.quiet_since = Instant::now();
                            Ok(message.message.payload)
                        }
                        Some(Err(error)) => {
                            let transient = !matches!(
                                error.kind(),
                                OrderedErrorKind::PushBasedConsumer | OrderedErrorKind::Other
                            );
                            Err(self.failed(transient, boxed(error)))
                        }
                        None => Err(self.failed(
                            true,
                            "the client ended the ordered consumer's messages".into(),
                        )),
                    };
                }
                _ = self.checks.tick() => self.check().await?,
            }
        }
    }

    fn failed(&self, transient: bool, source: BoxError) -> ControlError {
        let error = Error::JetStream {
            endpoint: self.endpoint.to_string(),
            operation: format!("follow stream `{}`", self.stream),
            transient,
            source,
        };
        ControlError::from_backend(error, transient)
    }

    /// Ends the feed when the connection has been down for the timeout, or
    /// when a quiet feed's stream does not answer.
    async fn check(&mut self) -> Result<(), ControlError> {
        let now = Instant::now();
        if self.client.connection_state() != State::Connected {
            let since = *self.lost_since.get_or_insert(now);
            if now.duration_since(since) >= self.timeout {
                tracing::warn!(
                    endpoint = %self.endpoint,
                    stream = %self.stream,
                    "the connection to NATS has been down for the timeout: ending the control log's feed"
                );
                return Err(ControlError::Unavailable(Box::new(Error::Disconnected {
                    endpoint: self.endpoint.to_string(),
                    source: format!("not connected for {:?}", self.timeout).into(),
                })));
            }
            return Ok(());
        }
        self.lost_since = None;
        if now.duration_since(self.quiet_since) < PROBE_AFTER {
            return Ok(());
        }
        self.quiet_since = now;
        match tokio::time::timeout(self.timeout, self.context.get_stream(&*self.stream)).await {
            Err(_) => Err(ControlError::TimedOut(self.timeout)),
            Ok(Err(error)) => {
                // A stream that is gone or refused stays so; the rest
                // (timeouts, no responders) may pass.
                let transient = !matches!(
                    error.kind(),
                    jetstream::context::GetStreamErrorKind::JetStream(ref js) if !server_busy(js)
                );
                Err(self.failed(transient, boxed(error)))
            }
            Ok(Ok(_)) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_group_is_kept_as_it_is() {
        assert_eq!(
            names("billing-eu_2", ControlLog::Commands),
            (
                "INTAKE_CONTROL_billing-eu_2".to_owned(),
                "intake.control.billing-eu_2".to_owned()
            )
        );
        assert_eq!(
            names("billing", ControlLog::Status),
            (
                "INTAKE_STATUS_billing".to_owned(),
                "intake.status.billing".to_owned()
            )
        );
    }

    #[test]
    fn a_group_with_other_characters_is_replaced_and_hashed() {
        for group in ["a.b", "a*b", "a>b", "a b", "a/b", "a\\b", "a\tb", "aéb"] {
            let token = group_token(group);
            assert!(token.starts_with("a_b_"), "{group}: {token}");
            assert_eq!(token.len(), "a_b_".len() + 8, "{group}: {token}");
            assert!(
                token
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'),
                "{group}: {token}"
            );
        }
        assert_ne!(group_token("a.b"), group_token("a/b"));
        assert_ne!(group_token("a.b"), group_token("a_b"));
        // Fixed by its definition: the same in every process and version.
        assert_eq!(group_token("a.b"), group_token("a.b"));
        assert_eq!(group_token("orders.eu"), "orders_eu_4c0cfca4");
    }

    #[test]
    fn a_long_group_is_cut_and_hashed() {
        let long = "g".repeat(200);
        let token = group_token(&long);
        assert_eq!(token.len(), MAX_GROUP_TOKEN + 9);
        assert_ne!(token, group_token(&"g".repeat(201)));
        assert_eq!(group_token(&"g".repeat(64)), "g".repeat(64));
    }
}
