//! One tracing span per message.
//!
//! The span, `message` at level `INFO`, carries the message's `source`,
//! `partition`, `position`, `key` (as text, escaped where it is not UTF-8),
//! `attempt` and the `handler` name. A W3C `traceparent` header is parsed and
//! its ids recorded as `trace_id` and `parent_span_id`, so logs join the
//! producer's trace. A failure is recorded as `error` (its text) and
//! `error.class`.
//!
//! Outside input is bounded: the key shows its first
//! [`KEY_LIMIT`](Trace::KEY_LIMIT) bytes and the error text at most
//! [`HandlerError::TEXT_LIMIT`] bytes of its cause, each followed by
//! `… (N more bytes)` when cut. Keys that are personal data (an email
//! address, an account number) can be left out of spans with
//! [`TraceLayer::record_key`]; they are recorded by default, because a key
//! is most often the id that makes a span findable. The error text of a
//! payload that did not decode shows the start of the payload: set
//! [`PayloadPreview`](crate::decode::PayloadPreview) to show nothing of it,
//! a fingerprint, or a text of your own (there, in the runtime's log line
//! and in the dead letter's error alike).
//!
//! With the `opentelemetry` feature, the span is also parented on the remote
//! context the headers carry, read by the global propagator (W3C trace
//! context unless the application sets another), and it records the span
//! kind (`consumer`) and the messaging attributes
//! `messaging.operation.type`, `messaging.destination.name` and
//! `messaging.destination.partition.id`; a `tracing-opentelemetry` layer
//! in the application's subscriber exports it. Outputs published within
//! the span carry its context (see [`publish`](crate::publish)).
//!
//! With no subscriber interested in the span, a message costs one level check:
//! no field is formatted and no header is read.
//!
//! Outside the retry layer, a message has one span: `attempt` starts as the
//! first attempt and a failure records the last one. Inside it, each attempt
//! has its own span.
//!
//! # Example
//!
//! ```
//! use intake_core::trace::TraceLayer;
//! use intake_core::{HandlerError, Message};
//! use tower::{ServiceBuilder, service_fn};
//!
//! let handler = ServiceBuilder::new()
//!     .layer(TraceLayer::new("orders"))
//!     .service(service_fn(|message: Message| async move {
//!         // Inside the message's span: this event carries its fields.
//!         tracing::info!(bytes = message.payload().len(), "order received");
//!         Ok::<(), HandlerError>(())
//!     }));
//! # let _ = handler;
//! ```
//!
//! [`HandlerError::TEXT_LIMIT`]: crate::error::HandlerError::TEXT_LIMIT

mod future;
mod layer;
#[cfg(feature = "opentelemetry")]
pub(crate) mod otel;
mod service;
mod traceparent;

pub use self::future::ResponseFuture;
pub use self::layer::TraceLayer;
pub use self::service::Trace;
pub use self::traceparent::{TRACEPARENT, TraceParent};

#[cfg(test)]
mod tests;
