//! Health (and metrics) over HTTP: a tower service that mounts in axum, and
//! a small listener for services without a web stack.
//!
//! `GET /health/live` and `GET /health/ready` answer `200 OK` or `503
//! Service Unavailable`, with one line per route saying what is wrong;
//! `GET /metrics` (with the `metrics` feature and a registry) answers the
//! prometheus text format. Anything else is `404`.
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

/// Answers the health probes (and `/metrics`) from a [`Health`]. See the
/// [module docs](self).
#[derive(Clone, Debug)]
pub struct HealthService {
    health: Health,
    #[cfg(feature = "metrics")]
    registry: Option<prometheus::Registry>,
}

impl HealthService {
    /// Answers from `health`.
    pub fn new(health: Health) -> Self {
        Self {
            health,
            #[cfg(feature = "metrics")]
            registry: None,
        }
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
        ready(Ok(self.respond(request.method(), request.uri().path())))
    }
}

/// A small HTTP/1 listener serving a [`HealthService`], for services
/// without a web stack (feature `health-server`).
#[cfg(feature = "health-server")]
#[derive(Debug)]
pub struct HealthListener {
    listener: tokio::net::TcpListener,
}

#[cfg(feature = "health-server")]
impl HealthListener {
    /// Binds `address` (such as `127.0.0.1:9898`; port 0 picks a free one).
    pub async fn bind(address: impl tokio::net::ToSocketAddrs) -> std::io::Result<Self> {
        Ok(Self {
            listener: tokio::net::TcpListener::bind(address).await?,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves `service` until `shutdown` fires: one task per connection
    /// (probes, not messages), each bounded by the connection's life.
    pub async fn serve(
        self,
        service: HealthService,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        use hyper_util::rt::TokioIo;

        let mut connections = tokio::task::JoinSet::new();
        loop {
            let accepted = tokio::select! {
                () = shutdown.cancelled() => break,
                accepted = self.listener.accept() => accepted,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // A full file table, say: the next accept may work.
                    tracing::warn!(%error, "accepting a health connection failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let service = service.clone();
            let shutdown = shutdown.clone();
            connections.spawn(async move {
                let answer =
                    hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                        let response = service.respond(request.method(), request.uri().path());
                        ready(Ok::<_, Infallible>(response))
                    });
                let connection = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), answer);
                tokio::select! {
                    result = connection => if let Err(error) = result {
                        tracing::debug!(%error, "a health connection ended with an error");
                    },
                    () = shutdown.cancelled() => {}
                }
            });
            // Reap finished connections so the set does not grow.
            while connections.try_join_next().is_some() {}
        }
        connections.shutdown().await;
    }
}
