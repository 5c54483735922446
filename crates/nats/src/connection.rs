//! Connecting with [`NatsSettings`](crate::NatsSettings) (credentials,
//! TLS, the reconnect backoff), and what the client's events tell the
//! source (a new connection, a backoff that gave up).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::{ConnectErrorKind, ConnectOptions, Event};
use intake_core::BackoffPolicy;

use crate::error::{Error, boxed};
use crate::settings::{Credentials, Tls};
use crate::url::{ServerUrls, UrlCredentials};

/// What a connection's events tell its users.
#[derive(Debug, Default)]
pub(crate) struct ConnectionEvents {
    /// Counts reconnections (the first connection is 0): a pull request
    /// made on an earlier connection may be gone.
    reconnected: AtomicU64,
    /// The connection was lost and not yet made anew.
    lost: AtomicBool,
    /// Wakes whoever waits on the old connection.
    notify: tokio::sync::Notify,
    /// Reconnect attempts since the last connection.
    attempts: AtomicUsize,
    /// The reconnect backoff gave up.
    gave_up: AtomicBool,
    /// Unreachable from a lost connection until the client connects again,
    /// for readiness (the client reconnects on its own).
    pub(crate) reachability: intake_core::backend::Reachability,
}

impl ConnectionEvents {
    /// The number of reconnections so far.
    pub(crate) fn epoch(&self) -> u64 {
        self.reconnected.load(Ordering::Acquire)
    }

    /// Resolves at the next reconnection, or once the backoff gave up.
    pub(crate) fn reconnection(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// `Some(attempts)` once the reconnect backoff gave up.
    pub(crate) fn gave_up(&self) -> Option<usize> {
        self.gave_up
            .load(Ordering::Acquire)
            .then(|| self.attempts.load(Ordering::Acquire))
    }
}

/// A connected client and what the source needs to know about it.
#[derive(Clone, Debug)]
pub(crate) struct Connection {
    pub(crate) client: async_nats::Client,
    pub(crate) endpoint: Arc<str>,
    pub(crate) events: Arc<ConnectionEvents>,
}

/// What [`connect`] needs: [`NatsSettings`](crate::NatsSettings) resolved
/// for one part.
#[derive(Clone)]
pub(crate) struct ConnectSettings {
    pub(crate) urls: ServerUrls,
    pub(crate) credentials: Option<Credentials>,
    pub(crate) tls: Option<Tls>,
    pub(crate) reconnect_backoff: Arc<dyn BackoffPolicy>,
    pub(crate) connect_timeout: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) name: Option<String>,
}

impl std::fmt::Debug for ConnectSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectSettings")
            .field("endpoint", &self.urls.endpoint)
            .field("credentials", &self.credentials)
            .field("tls", &self.tls)
            .field("connect_timeout", &self.connect_timeout)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// How often the client still tries to reconnect once the policy gave up:
/// async-nats has no way to stop reconnecting from the callback, so the
/// source ends the run with [`Error::GaveUp`] instead, and the client stops
/// when the source and acker holding it are dropped.
const GIVE_UP_DELAY: Duration = Duration::from_secs(1);

/// Connects once (bounded by the connect timeout); afterwards the client
/// reconnects by itself on the backoff's schedule.
pub(crate) async fn connect(settings: &ConnectSettings) -> Result<Connection, Error> {
    let endpoint: Arc<str> = settings.urls.endpoint.as_str().into();
    let events = Arc::new(ConnectionEvents::default());
    let mut options = ConnectOptions::new()
        .connection_timeout(settings.connect_timeout)
        .request_timeout(Some(settings.request_timeout))
        // Reconnects are bounded by the backoff (see the callback below),
        // never by a count of async-nats's own.
        .max_reconnects(None)
        .ignore_discovered_servers();
    if let Some(name) = &settings.name {
        options = options.name(name);
    }
    match &settings.urls.credentials {
        Some(UrlCredentials::Token(token)) => options = options.token(token.clone()),
        Some(UrlCredentials::UserPassword(user, password)) => {
            options = options.user_and_password(user.clone(), password.clone());
        }
        None => {}
    }
    match &settings.credentials {
        Some(Credentials::Token(token)) => options = options.token(token.clone()),
        Some(Credentials::UserPassword(user, password)) => {
            options = options.user_and_password(user.clone(), password.clone());
        }
        Some(Credentials::Nkey(seed)) => options = options.nkey(seed.clone()),
        Some(Credentials::File(path)) => {
            options = options
                .credentials_file(path)
                .await
                .map_err(|error| Error::Credentials {
                    what: format!("file {}", path.display()),
                    source: boxed(error),
                })?;
        }
        None => {}
    }
    if let Some(tls) = &settings.tls {
        options = tls.apply(options);
    } else if settings.urls.tls {
        options = options.require_tls(true);
    }
    let backoff = settings.reconnect_backoff.clone();
    let delay_events = events.clone();
    let first_attempt = AtomicBool::new(true);
    options = options.reconnect_delay_callback(move |attempts| {
        // async-nats calls this before the first connection's attempt as
        // well, with 1, as before a reconnect's first: that one is no retry
        // and goes at once (waiting the policy's first delay there made
        // every build 100 ms slower by default).
        if first_attempt.swap(false, Ordering::AcqRel) {
            return Duration::ZERO;
        }
        // async-nats counts from 1 and calls this before each reconnect;
        // the policy's first retry is 1 as well.
        delay_events.attempts.store(attempts, Ordering::Release);
        let retry = u32::try_from(attempts).unwrap_or(u32::MAX);
        match backoff.delay(retry) {
            Some(delay) => delay,
            None => {
                delay_events.gave_up.store(true, Ordering::Release);
                // Wakes a source waiting for the connection to come back.
                delay_events.notify.notify_waiters();
                GIVE_UP_DELAY
            }
        }
    });
    let event_endpoint = endpoint.clone();
    let callback_events = events.clone();
    options = options.event_callback(move |event| {
        let events = callback_events.clone();
        let endpoint = event_endpoint.clone();
        async move {
            match event {
                Event::Connected => {
                    events.attempts.store(0, Ordering::Release);
                    events.reachability.reachable();
                    if events.lost.swap(false, Ordering::AcqRel) {
                        events.reconnected.fetch_add(1, Ordering::AcqRel);
                        events.notify.notify_waiters();
                        tracing::info!(%endpoint, "reconnected to NATS");
                    }
                }
                Event::Disconnected => {
                    events.lost.store(true, Ordering::Release);
                    events.reachability.unreachable();
                    tracing::warn!(%endpoint, "lost the connection to NATS; reconnecting with backoff");
                }
                Event::SlowConsumer(sid) => {
                    tracing::warn!(%endpoint, sid, "the client dropped messages of a slow subscription");
                }
                other => tracing::info!(%endpoint, event = %other, "NATS client event"),
            }
        }
    });
    let addresses: Vec<async_nats::ServerAddr> = settings
        .urls
        .addresses
        .iter()
        .map(|address| address.parse())
        .collect::<Result<_, _>>()
        .map_err(|error: std::io::Error| Error::InvalidUrl {
            url: endpoint.to_string(),
            reason: format!("the client cannot use the address ({error})"),
        })?;
    let client = options
        .connect(addresses)
        .await
        .map_err(|error| connect_error(&endpoint, error))?;
    Ok(Connection {
        client,
        endpoint,
        events,
    })
}

/// Whether a certificate was refused somewhere in `error`'s causes:
/// async-nats reports a handshake that failed on a certificate as an I/O
/// error, which would pass for an outage.
fn refused_certificate(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if error.downcast_ref::<async_nats::rustls::Error>().is_some() {
            return true;
        }
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && io
                .get_ref()
                .is_some_and(|inner| inner.downcast_ref::<async_nats::rustls::Error>().is_some())
        {
            return true;
        }
        cause = error.source();
    }
    false
}

fn connect_error(endpoint: &str, error: async_nats::ConnectError) -> Error {
    let endpoint = endpoint.to_owned();
    if refused_certificate(&error) {
        return Error::Tls {
            endpoint,
            source: boxed(error),
        };
    }
    match error.kind() {
        ConnectErrorKind::AuthorizationViolation => Error::Unauthorized {
            endpoint,
            source: boxed(error),
        },
        ConnectErrorKind::Authentication => Error::Credentials {
            what: "given (the nkey seed or creds file cannot sign the server's nonce)".to_owned(),
            source: boxed(error),
        },
        ConnectErrorKind::Tls => Error::Tls {
            endpoint,
            source: boxed(error),
        },
        ConnectErrorKind::ServerParse => Error::InvalidUrl {
            url: endpoint,
            reason: "the client cannot parse the server address".to_owned(),
        },
        ConnectErrorKind::Dns
        | ConnectErrorKind::TimedOut
        | ConnectErrorKind::Io
        | ConnectErrorKind::MaxReconnects => Error::Unreachable {
            endpoint,
            source: boxed(error),
        },
    }
}

#[cfg(test)]
mod tests {
    use intake_core::Constant;

    use super::*;

    /// async-nats asks the reconnect delay callback before the first
    /// connection's attempt too: with the policy's first delay there, every
    /// source and publisher waited it out (100 ms by default) before it
    /// connected at all.
    #[tokio::test]
    async fn the_first_connection_does_not_wait_out_the_reconnect_backoff() {
        let url =
            std::env::var("INTAKE_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
        let settings = ConnectSettings {
            urls: ServerUrls::parse(&url).expect("the test's URL"),
            credentials: None,
            tls: None,
            reconnect_backoff: Arc::new(Constant::new(Duration::from_secs(10))),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            name: None,
        };
        let started = tokio::time::Instant::now();
        if let Err(error) = connect(&settings).await {
            intake_core::backend::testkit::skip_or_fail(
                "first connection without backoff",
                &format!("no NATS server at {url} ({error})"),
            );
            return;
        }
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(5),
            "connected after {took:?}: the first attempt waited for the reconnect backoff"
        );
    }
}
