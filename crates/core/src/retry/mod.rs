//! Retry a handler's retryable failures on a [`BackoffPolicy`]'s schedule.
//!
//! Only [`ErrorClass::Retryable`] failures are retried; permanent ones (a
//! payload that cannot be decoded, a violated constraint) and the other
//! classes pass through at once. The handler sees the attempt it is on in
//! [`Metadata::attempt`], and the final error carries the number of attempts
//! ([`HandlerError::attempts`]).
//!
//! Retries are capped unless the policy says otherwise: the built-in
//! policies give up after [`Exponential::DEFAULT_MAX_RETRIES`] and retry
//! forever only when asked with `retry_forever()`.
//!
//! A retry that is sleeping when the consumer starts to shut down, and
//! would wake after the drain (`shutdown_deadline`), ends at once with
//! [`HandlerError::interrupted`]: the message is neither acknowledged nor
//! dead-lettered, and the broker delivers it again. One that wakes within
//! the drain makes its attempt there: interrupted, it would leave a hole
//! that holds back the commit of everything after it (on Kafka the next
//! owner would repeat all of that work).
//!
//! # Why not `tower::retry`
//!
//! tower's `Retry` calls the service again as soon as its policy's sleep
//! ends; it has no way to end with a different outcome when the consumer
//! shuts down mid-sleep, so a shutdown would still run the handler once more.
//! It also clones its policy for every request. This layer keeps tower's
//! shape (a named future, the inner service cloned per call so that retries
//! can call it again) and adds those two things.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use intake_core::retry::RetryLayer;
//! use intake_core::{Exponential, HandlerError, Message};
//! use tower::{ServiceBuilder, service_fn};
//!
//! let handler = ServiceBuilder::new()
//!     // At most 5 retries, 100 ms doubling up to 10 s; each attempt at most 2 s.
//!     .layer(RetryLayer::new(
//!         Exponential::new(Duration::from_millis(100), Duration::from_secs(10)).max_retries(5),
//!     ))
//!     .timeout(Duration::from_secs(2))
//!     .service(service_fn(|message: Message| async move {
//!         if message.payload().is_empty() {
//!             return Err(HandlerError::permanent("empty payload"));
//!         }
//!         Ok::<(), HandlerError>(())
//!     }));
//! # let _ = handler;
//! ```
//!
//! [`ErrorClass::Retryable`]: crate::error::ErrorClass::Retryable
//! [`Metadata::attempt`]: crate::message::Metadata::attempt
//! [`Exponential::DEFAULT_MAX_RETRIES`]: crate::backoff::Exponential::DEFAULT_MAX_RETRIES
//! [`BackoffPolicy`]: crate::backoff::BackoffPolicy
//! [`HandlerError::attempts`]: crate::error::HandlerError::attempts
//! [`HandlerError::interrupted`]: crate::error::HandlerError::interrupted

mod future;
mod layer;
mod observer;
mod service;

pub use self::future::ResponseFuture;
pub use self::layer::RetryLayer;
pub use self::observer::RetryObserver;
pub use self::service::Retry;

#[cfg(test)]
mod tests;
