//! [`Settles`]: what a handler service the consumer runs answers.

/// What a handler service answers when its answer alone completes the
/// message: `()`. The consumer runs services that answer it, so that
/// nothing a handler returns is dropped unseen.
///
/// A handler fn that returns outputs to publish ([`Output`], [`Outputs`],
/// `Option<Output>`, `Vec<Output>`, or a `Result` of one) answers
/// [`Outputs`]; [`PublishLayer`] publishes them and answers `()` once the
/// broker confirmed every one. Implemented for `()` only (sealed); it
/// exists to say so in the compile error when the layer is missing.
///
/// [`Output`]: crate::publish::Output
/// [`Outputs`]: crate::publish::Outputs
/// [`PublishLayer`]: crate::publish::PublishLayer
#[diagnostic::on_unimplemented(
    message = "the consumer runs a handler that answers `()`, and this one answers `{Self}`",
    label = "this handler returns outputs that nothing publishes",
    note = "a handler fn returning `Output`, `Outputs`, `Option<Output>` or `Vec<Output>` (or a \
            `Result` of one) answers `Outputs`: wrap it in `PublishLayer::new(publisher)`, which \
            publishes them and completes the message once the broker confirmed them",
    note = "`ServiceBuilder::new().layer(PublishLayer::new(broker.publisher().await?)).service(handler)`, \
            innermost: inside the retry and dead-letter layers"
)]
pub trait Settles: sealed::Sealed {}

impl Settles for () {}

mod sealed {
    /// Keeps [`Settles`](super::Settles) to `()`: the runtime completes a
    /// message from a `()` answer only.
    pub trait Sealed {}

    impl Sealed for () {}
}
