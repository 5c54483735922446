//! Health (and metrics) over HTTP: a tower service that mounts in axum, and
//! a small listener for services without a web stack.
//!
//! `GET /health/live` and `GET /health/ready` answer `200 OK` or `503
//! Service Unavailable`, with one line per route saying what is wrong;
//! `GET /metrics` (with the `metrics` feature and a registry) answers the
//! prometheus text format. With the `console` feature and
//! [`HealthService::with_console`], paths under `/console/api/v1/` answer
//! the operator console's JSON (`docs/CONSOLE.md`). Anything else is `404`.
//!
//! ```
//! use intake_core::app::{Health, HealthService};
//!
//! let health = Health::default();
//! let service = HealthService::new(health.clone());
//! // In axum: `Router::new().route_service("/health/{*probe}", service)`,
//! // or `.fallback_service(service)`.
//! # drop(service);
//! ```

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::task::{Context, Poll};

use http::{Method, Request, Response, StatusCode, header};

use super::health::{Health, HealthReport};

/// Answers the health probes (and `/metrics`) from a [`Health`].
///
///
/// `GET /health/live` and `GET /health/ready` answer `200 OK` or `503
/// Service Unavailable`, with one line per route saying what is wrong;
/// `GET /metrics` (with the `metrics` feature and a registry) answers the
/// prometheus text format. Anything else is `404`.
///
/// ```
/// use intake_core::app::{Health, HealthService};
///
/// let health = Health::default();
/// let service = HealthService::new(health.clone());
/// // In axum: `Router::new().route_service("/health/{*probe}", service)`,
/// // or `.fallback_service(service)`.
/// # drop(service);
/// ```
#[derive(Clone, Debug)]
pub struct HealthService {
    health: Health,
    #[cfg(feature = "metrics")]
    registry: Option<prometheus::Registry>,
    #[cfg(feature = "console")]
    console: Option<super::Console>,
}

impl HealthService {
    /// Answers from `health`.
    pub fn new(health: Health) -> Self {
        Self {
            health,
            #[cfg(feature = "metrics")]
            registry: None,
            #[cfg(feature = "console")]
            console: None,
        }
    }

    /// Also answers the console's API under `/console/api/v1/` (feature
    /// `console`; see `docs/CONSOLE.md`).
    #[cfg(feature = "console")]
    pub fn with_console(mut self, console: super::Console) -> Self {
        self.console = Some(console);
        self
    }

    /// The answer to `request`: [`respond`](Self::respond) to its method
    /// and path, or the console's answer for a path under `/console/`
    /// (which reads the query and, for a mutating route, the headers).
    pub fn respond_to<B>(&self, request: &Request<B>) -> Response<String> {
        #[cfg(feature = "console")]
        if let Some(console) = &self.console
            && (request.uri().path().starts_with("/console/") || request.uri().path() == "/console")
        {
            return console.respond(request);
        }
        self.respond(request.method(), request.uri().path())
    }

    /// The answer to `request` with its body read (the listener reads at
    /// most 64 KiB, within its header read timeout), from the peer at `peer` if known: what
    /// [`respond_to`](Self::respond_to) answers, and the console's
    /// dead-letter routes, which read a store and take a JSON body.
    pub async fn respond_with_body(
        &self,
        request: Request<bytes::Bytes>,
        peer: Option<std::net::SocketAddr>,
    ) -> Response<String> {
        #[cfg(feature = "console")]
        if let Some(console) = &self.console
            && request.uri().path().starts_with("/console/")
        {
            return console.respond_with_body(&request, peer).await;
        }
        let _ = peer;
        self.respond_to(&request)
    }

    /// Also answers `GET /metrics` with what `registry` holds (the one the
    /// [`Metrics`](crate::Metrics) collector registers in).
    #[cfg(feature = "metrics")]
    pub fn with_metrics(mut self, registry: prometheus::Registry) -> Self {
        self.registry = Some(registry);
        self
    }

    /// The answer to a request for `path`.
    pub fn respond(&self, method: &Method, path: &str) -> Response<String> {
        if method != Method::GET && method != Method::HEAD {
            return text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n".to_owned());
        }
        match path {
            "/health/live" => probe(self.health.liveness()),
            "/health/ready" => probe(self.health.readiness()),
            #[cfg(feature = "metrics")]
            "/metrics" if self.registry.is_some() => self.metrics(),
            _ => text(StatusCode::NOT_FOUND, "not found\n".to_owned()),
        }
    }

    #[cfg(feature = "metrics")]
    fn metrics(&self) -> Response<String> {
        use prometheus::Encoder;

        let Some(registry) = &self.registry else {
            return text(StatusCode::NOT_FOUND, "not found\n".to_owned());
        };
        let encoder = prometheus::TextEncoder::new();
        let mut body = Vec::new();
        if let Err(error) = encoder.encode(&registry.gather(), &mut body) {
            tracing::warn!(%error, "encoding the metrics failed");
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "encoding the metrics failed\n".to_owned(),
            );
        }
        let mut response = Response::new(String::from_utf8_lossy(&body).into_owned());
        if let Ok(value) = header::HeaderValue::from_str(encoder.format_type()) {
            response.headers_mut().insert(header::CONTENT_TYPE, value);
        }
        response
    }
}

fn probe(report: HealthReport) -> Response<String> {
    let status = if report.is_healthy() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    text(status, report.to_string())
}

fn text(status: StatusCode, body: String) -> Response<String> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

impl<B> tower::Service<Request<B>> for HealthService {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        ready(Ok(self.respond_to(&request)))
    }
}

/// A small HTTP/1 listener serving a [`HealthService`], for services
/// without a web stack (feature `health-server`).
///
/// Probes need a bind that the cluster reaches (not only loopback), so the
/// listener expects clients it does not trust, and no client can hold it
/// open:
///
/// - At most [`max_connections`](Self::max_connections) connections at once
///   (default 64). A connection accepted beyond it closes the oldest one
///   first, so a flood of idle connections cannot keep a probe out, and the
///   listener holds a bounded number of file descriptors whatever arrives
///   (broker clients need theirs to reconnect).
/// - A request's head must arrive within
///   [`header_read_timeout`](Self::header_read_timeout) of the connection
///   (default 5 s): a client that sends nothing, or a byte at a time, is cut
///   off.
/// - One request per connection (no keep-alive: a probe or a scrape every
///   few seconds gains nothing from it), and the whole exchange, reading the
///   request and writing the answer to a client that may not read it, ends
///   within [`request_timeout`](Self::request_timeout) (default 10 s).
/// - A request's body (the console's POSTs) is at most 64 KiB (`413 Payload
///   Too Large` beyond, unread) and must arrive within the header read
///   timeout too (`408 Request Timeout`).
#[cfg(feature = "health-server")]
#[derive(Debug)]
pub struct HealthListener {
    listener: tokio::net::TcpListener,
    max_connections: usize,
    header_read_timeout: std::time::Duration,
    request_timeout: std::time::Duration,
}

/// The most bytes of a request body the [`HealthListener`] reads: a
/// longer one is answered `413 Payload Too Large` unread.
#[cfg(feature = "health-server")]
const MAX_BODY: usize = 64 * 1024;

/// The default of [`HealthListener::max_connections`].
#[cfg(feature = "health-server")]
const MAX_CONNECTIONS: usize = 64;

/// The default of [`HealthListener::header_read_timeout`].
#[cfg(feature = "health-server")]
const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The default of [`HealthListener::request_timeout`].
#[cfg(feature = "health-server")]
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

#[cfg(feature = "health-server")]
impl HealthListener {
    /// Binds `address` (such as `127.0.0.1:9898`; port 0 picks a free one),
    /// with the default limits (see the [type docs](Self)).
    pub async fn bind(address: impl tokio::net::ToSocketAddrs) -> std::io::Result<Self> {
        Ok(Self {
            listener: tokio::net::TcpListener::bind(address).await?,
            max_connections: MAX_CONNECTIONS,
            header_read_timeout: HEADER_READ_TIMEOUT,
            request_timeout: REQUEST_TIMEOUT,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }

    /// How many connections it holds at once (default 64; at least 1): one
    /// accepted beyond it closes the oldest.
    pub fn max_connections(mut self, max: usize) -> Self {
        self.max_connections = max.max(1);
        self
    }

    /// How long a connection may take to send a request's head (default
    /// 5 s; at least 1 ms).
    pub fn header_read_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.header_read_timeout = timeout.max(std::time::Duration::from_millis(1));
        self
    }

    /// How long a connection may last, from its accept to its answer
    /// written (default 10 s; at least 1 ms).
    pub fn request_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.request_timeout = timeout.max(std::time::Duration::from_millis(1));
        self
    }

    /// Serves `service` until `shutdown` fires: one task per connection
    /// (probes, not messages), each within the limits (see the [type
    /// docs](Self)).
    pub async fn serve(
        self,
        service: HealthService,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        use hyper_util::rt::{TokioIo, TokioTimer};

        let mut connections = tokio::task::JoinSet::new();
        // The connections' tasks, oldest first, to close the oldest when a
        // new one would go over the cap.
        let mut open: std::collections::VecDeque<tokio::task::AbortHandle> =
            std::collections::VecDeque::with_capacity(self.max_connections);
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_read_timeout)
            .keep_alive(false);
        loop {
            let accepted = tokio::select! {
                () = shutdown.cancelled() => break,
                accepted = self.listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok((stream, peer)) => (stream, peer),
                Err(error) => {
                    // A full file table, say: the next accept may work.
                    tracing::warn!(%error, "accepting a health connection failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            // Reap finished connections so neither list grows.
            while connections.try_join_next().is_some() {}
            open.retain(|task| !task.is_finished());
            while open.len() >= self.max_connections {
                let Some(oldest) = open.pop_front() else {
                    break;
                };
                tracing::debug!(
                    max_connections = self.max_connections,
                    "too many health connections: closing the oldest"
                );
                oldest.abort();
            }
            let service = service.clone();
            let shutdown = shutdown.clone();
            let body_timeout = self.header_read_timeout;
            let connection = builder.serve_connection(
                TokioIo::new(stream),
                hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let service = service.clone();
                    async move {
                        let response = match read_body(request, body_timeout).await {
                            Ok(request) => service.respond_with_body(request, Some(peer)).await,
                            Err(status) => text(status, format!("{status}\n")),
                        };
                        Ok::<_, Infallible>(response)
                    }
                }),
            );
            let request_timeout = self.request_timeout;
            open.push_back(connections.spawn(async move {
                tokio::select! {
                    result = tokio::time::timeout(request_timeout, connection) => match result {
                        Ok(Ok(())) => {}
                        Ok(Err(error)) => {
                            tracing::debug!(%error, "a health connection ended with an error");
                        }
                        Err(_) => {
                            tracing::debug!(timeout = ?request_timeout, "a health connection outlived the request timeout: closed");
                        }
                    },
                    () = shutdown.cancelled() => {}
                }
            }));
        }
        connections.shutdown().await;
    }
}

/// `request` with its body read: at most [`MAX_BODY`] bytes (`413`
/// beyond, said by `Content-Length` or found while reading), within
/// `timeout` (`408`).
#[cfg(feature = "health-server")]
async fn read_body(
    request: Request<hyper::body::Incoming>,
    timeout: std::time::Duration,
) -> Result<Request<bytes::Bytes>, StatusCode> {
    use hyper::body::Body as _;

    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|length| length.to_str().ok())
        .and_then(|length| length.parse::<u64>().ok());
    if declared.is_some_and(|length| length > MAX_BODY as u64) {
        return Err(StatusCode::PAYLOAD_TOO_LARGE);
    }
    let (parts, mut body) = request.into_parts();
    let reading = async {
        let mut read = Vec::new();
        while let Some(frame) =
            std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await
        {
            let frame = frame.map_err(|_| StatusCode::BAD_REQUEST)?;
            if let Ok(data) = frame.into_data() {
                if read.len() + data.len() > MAX_BODY {
                    return Err(StatusCode::PAYLOAD_TOO_LARGE);
                }
                read.extend_from_slice(&data);
            }
        }
        Ok(bytes::Bytes::from(read))
    };
    let body = tokio::time::timeout(timeout, reading)
        .await
        .map_err(|_| StatusCode::REQUEST_TIMEOUT)??;
    Ok(Request::from_parts(parts, body))
}
