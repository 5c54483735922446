//! [`PublishFuture`]: the future of [`PublishService`](super::PublishService).

use std::future::Future;
use std::pin::Pin;

use crate::error::HandlerError;

/// The future of [`PublishService`](super::PublishService). Boxed:
/// publishing allocates per output anyway (the output, the client's record,
/// the confirmation), and the publisher's send future has no name to store.
pub type PublishFuture = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>;
