//! [`Json<T>`]: a JSON payload, decoded with serde_json.

use bytes::Bytes;
use serde::de::DeserializeOwned;

use super::{Decode, DecodeError};
use crate::error::HandlerError;
use crate::handler::FromMessage;
use crate::message::Message;

/// A payload decoded from JSON into `T`; as a handler argument it is the
/// last one (it consumes the payload).
///
/// Decoding reads the payload in place: a struct of numbers and booleans
/// costs no allocation; `String`, `Vec` and map fields allocate as serde_json
/// needs. A payload that is not valid JSON for `T` fails the
/// message with a [permanent](HandlerError::permanent) [`DecodeError`].
///
/// ```
/// use intake_core::{handler_fn, Json};
/// use serde::Deserialize;
///
/// #[derive(Deserialize)]
/// struct Order {
///     id: u64,
///     quantity: u32,
/// }
///
/// let handler = handler_fn(async |Json(order): Json<Order>| {
///     assert!(order.quantity > 0 || order.id == 0);
/// });
/// # drop(handler);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Json<T>(pub T);

impl<T: DeserializeOwned> Decode for Json<T> {
    fn decode(payload: &Bytes) -> Result<Self, DecodeError> {
        match serde_json::from_slice(payload) {
            Ok(value) => Ok(Json(value)),
            Err(error) => Err(DecodeError::new::<T>("JSON", payload, error)),
        }
    }
}

impl<T: DeserializeOwned> FromMessage for Json<T> {
    fn from_message(message: Message) -> Result<Self, HandlerError> {
        Ok(Self::decode(message.payload())?)
    }
}
