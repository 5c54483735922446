//! The handlers the scenarios run: each records what it received.

use std::time::Duration;

use crate::backend::testkit::harness::{Ledger, id_of};
use crate::error::HandlerError;
use crate::message::Message;

type Outcome = Result<(), HandlerError>;

pub(super) fn recording(
    ledger: &Ledger,
) -> impl tower::Service<
    Message,
    Response = (),
    Error = HandlerError,
    Future = impl Future<Output = Outcome> + Send + use<>,
> + Clone
+ Send
+ use<> {
    recording_after(ledger, None)
}

/// Like [`recording`], each handler first waiting `pause` (so that
/// deliveries overlap and fill a budget).
pub(super) fn recording_after(
    ledger: &Ledger,
    pause: Option<Duration>,
) -> impl tower::Service<
    Message,
    Response = (),
    Error = HandlerError,
    Future = impl Future<Output = Outcome> + Send + use<>,
> + Clone
+ Send
+ use<> {
    let ledger = ledger.clone();
    tower::service_fn(move |message: Message| {
        let ledger = ledger.clone();
        async move {
            if let Some(pause) = pause {
                tokio::time::sleep(pause).await;
            }
            ledger.record(id_of(&message)?);
            Ok(())
        }
    })
}
