//! [`Publish<P>`]: a publisher as a handler argument, within the scope of
//! the input it is called for.

use bytes::Bytes;

use super::output::{Output, Outputs};
use super::service::publish_confirmed;
use super::{Confirmation, PublishError, Publisher};
use crate::error::HandlerError;
use crate::handler::FromRef;
use crate::handler::state::{FromMessageAndState, FromMessagePartsAndState, ViaState};
use crate::message::Message;
use crate::trace::TRACEPARENT;

/// A handler argument that publishes on behalf of the input being handled:
/// the publisher `P` taken from the handler's state (like
/// [`State<P>`](crate::State)), and the input's trace context, which every
/// output without a `traceparent` of its own carries on.
///
/// Await each publish before the handler returns: the handler's answer is
/// what completes the input, so an input whose handler awaited its outputs
/// is committed only after they are confirmed. A publish left running when
/// the handler returns has no such guarantee. In key or partition order the
/// key's next input runs once the handler returned, so after these
/// confirmations ([`PublishLayer`](super::PublishLayer) lets it run once
/// the outputs are sent).
#[derive(Clone, Debug)]
pub struct Publish<P> {
    publisher: P,
    trace: Option<Bytes>,
}

impl<P: Publisher> Publish<P> {
    /// Sends `output` and waits for its confirmation.
    pub async fn publish(&self, mut output: Output) -> Result<Confirmation, PublishError> {
        output.continue_trace(self.trace.as_ref());
        self.publisher.publish(output).await
    }

    /// Sends `outputs` in order and waits until every one is confirmed (the
    /// sends overlap the broker's round trips).
    pub async fn publish_all(&self, outputs: impl Into<Outputs>) -> Result<(), PublishError> {
        publish_confirmed(&self.publisher, outputs.into(), self.trace.as_ref()).await
    }

    /// The publisher itself.
    pub fn publisher(&self) -> &P {
        &self.publisher
    }
}

impl<S, P: FromRef<S>> FromMessagePartsAndState<S> for Publish<P> {
    #[inline]
    fn from_parts_and_state(message: &Message, state: &S) -> Result<Self, HandlerError> {
        Ok(Publish {
            publisher: P::from_ref(state),
            trace: message.headers().get(TRACEPARENT).cloned(),
        })
    }
}

impl<S, P: FromRef<S>> FromMessageAndState<S, ViaState> for Publish<P> {
    #[inline]
    fn from_message_and_state(message: Message, state: &S) -> Result<Self, HandlerError> {
        Self::from_parts_and_state(&message, state)
    }
}
