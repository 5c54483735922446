//! [`Trace`]: the service that runs each message in a span of its own.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use tower::Service;
use tracing::Span;
use tracing::field::Empty;

#[cfg(feature = "opentelemetry")]
use super::otel;
use super::{ResponseFuture, TRACEPARENT, TraceParent};
use crate::error::HandlerError;
use crate::message::Message;
use crate::redact::Capped;

/// Runs each message of `S` in a span of its own. See the
/// [module docs](super).
#[derive(Clone, Debug)]
pub struct Trace<S> {
    inner: S,
    handler: Arc<str>,
    record_key: bool,
}

impl<S> Trace<S> {
    /// Most bytes of a message's key that its span shows.
    pub const KEY_LIMIT: usize = 256;

    /// Wraps `inner`; spans name it `handler` and record message keys.
    pub fn new(inner: S, handler: impl Into<Arc<str>>) -> Self {
        Self {
            inner,
            handler: handler.into(),
            record_key: true,
        }
    }

    /// Whether spans record the message's key (default `true`); see
    /// [`TraceLayer::record_key`](super::TraceLayer::record_key).
    pub fn record_key(mut self, record: bool) -> Self {
        self.record_key = record;
        self
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    pub(super) fn span(&self, message: &Message) -> Span {
        let metadata = message.metadata();
        // The macro evaluates (and formats) the fields only when a
        // subscriber is interested in the span.
        let span = tracing::info_span!(
            "message",
            handler = %self.handler,
            source = %metadata.source(),
            partition = metadata.partition(),
            position = %metadata.position(),
            key = message
                .key()
                .filter(|_| self.record_key)
                .map(|key| tracing::field::display(KeyText(key))),
            attempt = metadata.attempt(),
            trace_id = Empty,
            parent_span_id = Empty,
            error = Empty,
            error.class = Empty,
            // OpenTelemetry's span kind and messaging attributes, recorded
            // with the `opentelemetry` feature only.
            otel.kind = Empty,
            messaging.operation.type = Empty,
            messaging.destination.name = Empty,
            messaging.destination.partition.id = Empty,
        );
        if !span.is_disabled() {
            #[cfg(feature = "opentelemetry")]
            {
                span.record("otel.kind", "consumer")
                    .record("messaging.operation.type", "process")
                    .record(
                        "messaging.destination.name",
                        tracing::field::display(metadata.source()),
                    )
                    .record("messaging.destination.partition.id", metadata.partition());
                otel::parent_on_remote(&span, message.headers());
            }
            let parent = message
                .headers()
                .get(TRACEPARENT)
                .and_then(|value| TraceParent::parse(value));
            if let Some(parent) = parent {
                span.record("trace_id", parent.trace_id)
                    .record("parent_span_id", parent.parent_id);
            }
        }
        span
    }
}

/// A key as span text: as is when it is UTF-8, escaped otherwise; its
/// first [`Trace::KEY_LIMIT`] bytes.
struct KeyText<'a>(&'a Bytes);

impl fmt::Display for KeyText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const LIMIT: usize = Trace::<()>::KEY_LIMIT;
        match std::str::from_utf8(self.0) {
            Ok(text) => write!(f, "{}", Capped::new(text, LIMIT)),
            Err(_) => {
                let shown = &self.0[..self.0.len().min(LIMIT)];
                write!(f, "{}", shown.escape_ascii())?;
                if self.0.len() > LIMIT {
                    write!(f, "… ({} more bytes)", self.0.len() - LIMIT)?;
                }
                Ok(())
            }
        }
    }
}

impl<S> Service<Message> for Trace<S>
where
    S: Service<Message, Response = ()>,
    S::Error: Into<HandlerError>,
{
    type Response = ();
    type Error = HandlerError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, message: Message) -> Self::Future {
        let span = self.span(&message);
        let future = {
            let _entered = span.enter();
            self.inner.call(message)
        };
        ResponseFuture::new(future, span)
    }
}
