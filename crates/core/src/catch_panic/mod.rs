//! Turn a panic in a handler into a retryable error, so the consumer keeps
//! running.
//!
//! A panic while the handler is called or while its future is polled is
//! caught, logged at `ERROR` with its message, and becomes a
//! [retryable](crate::error::ErrorClass::Retryable)
//! [`HandlerError::panicked`] whose cause is [`Panicked`]. The metrics layer
//! (feature `metrics`) counts it as a panic
//! ([`is_panic`](crate::error::HandlerError::is_panic)), whether a retry
//! later succeeds or not.
//!
//! Place it inside the retry layer (so a panic is retried like any transient
//! failure) and inside the metrics and tracing layers (so they see the
//! error). Binaries built with `panic = "abort"` cannot catch panics.
//!
//! Without this layer a panic is still caught: the consumer runtime catches
//! whatever unwinds out of the handler stack, counts it
//! ([`RunReport::panicked`](crate::consumer::RunReport::panicked),
//! `intake_consumer_panics_total`) and retries the message, so one bad
//! message never takes the consumer down. The layer is for a policy of your
//! own: panics the retry layer retries, and the dead-letter layer gives up
//! on, like any other failure.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use intake_core::catch_panic::CatchPanicLayer;
//! use intake_core::retry::RetryLayer;
//! use intake_core::{Constant, HandlerError, Message};
//! use tower::{ServiceBuilder, service_fn};
//!
//! let handler = ServiceBuilder::new()
//!     .layer(RetryLayer::new(Constant::new(Duration::from_secs(1)).max_retries(3)))
//!     .layer(CatchPanicLayer::new())
//!     .service(service_fn(|message: Message| async move {
//!         let text = std::str::from_utf8(message.payload()).map_err(HandlerError::permanent)?;
//!         assert!(!text.is_empty(), "a bug: empty orders are filtered upstream");
//!         Ok::<(), HandlerError>(())
//!     }));
//! # let _ = handler;
//! ```
//!
//! [`HandlerError::panicked`]: crate::error::HandlerError::panicked

mod error;
mod future;
mod layer;
mod service;

pub use self::error::Panicked;
pub use self::future::ResponseFuture;
pub use self::layer::CatchPanicLayer;
pub use self::service::CatchPanic;

#[cfg(test)]
mod tests;
