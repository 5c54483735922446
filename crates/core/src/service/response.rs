//! [`RouteResponse`]: what a route's handler answers, and how the service
//! settles it.

use std::sync::Arc;

use tower::{Layer, Service};

use crate::error::HandlerError;
use crate::message::Message;
use crate::publish::{Outputs, PublishLayer, PublishService, Publisher};

/// What a route's handler answers on success: `()` (the message is done) or
/// [`Outputs`] to publish, which the service publishes through the broker's
/// publisher before the message is done. Implemented for those two only;
/// a handler fn's return type picks one (see
/// [`IntoHandlerResult`](crate::IntoHandlerResult)).
#[diagnostic::on_unimplemented(
    message = "a route's handler answers `{Self}`, which the service cannot settle",
    note = "a handler fn returns `()`, `Result<(), E>`, or outputs to publish (`Output`, \
            `Option<Output>`, `Vec<Output>`, `Outputs`, or a `Result` of one)"
)]
pub trait RouteResponse: Sized + Send + 'static {
    /// Whether the route needs the broker's publisher.
    const PUBLISHES: bool;

    /// The handler, settled: answering `()` once its outputs (if any) are
    /// confirmed.
    type Settled<H, P>: Service<Message, Response = (), Error = HandlerError, Future: Send + 'static>
        + Clone
        + Send
        + 'static
    where
        H: Service<Message, Response = Self, Error = HandlerError> + Clone + Send + 'static,
        H::Future: Send + 'static,
        P: Publisher;

    /// Settles `handler`; `publisher` is the broker's when
    /// [`PUBLISHES`](Self::PUBLISHES), `None` otherwise.
    fn settle<H, P>(handler: H, publisher: Option<Arc<P>>) -> Option<Self::Settled<H, P>>
    where
        H: Service<Message, Response = Self, Error = HandlerError> + Clone + Send + 'static,
        H::Future: Send + 'static,
        P: Publisher;
}

impl RouteResponse for () {
    const PUBLISHES: bool = false;

    type Settled<H, P>
        = H
    where
        H: Service<Message, Response = (), Error = HandlerError> + Clone + Send + 'static,
        H::Future: Send + 'static,
        P: Publisher;

    fn settle<H, P>(handler: H, _publisher: Option<Arc<P>>) -> Option<H>
    where
        H: Service<Message, Response = (), Error = HandlerError> + Clone + Send + 'static,
        H::Future: Send + 'static,
        P: Publisher,
    {
        Some(handler)
    }
}

impl RouteResponse for Outputs {
    const PUBLISHES: bool = true;

    type Settled<H, P>
        = PublishService<H, P>
    where
        H: Service<Message, Response = Outputs, Error = HandlerError> + Clone + Send + 'static,
        H::Future: Send + 'static,
        P: Publisher;

    fn settle<H, P>(handler: H, publisher: Option<Arc<P>>) -> Option<PublishService<H, P>>
    where
        H: Service<Message, Response = Outputs, Error = HandlerError> + Clone + Send + 'static,
        H::Future: Send + 'static,
        P: Publisher,
    {
        publisher.map(|publisher| PublishLayer::shared(publisher).layer(handler))
    }
}
