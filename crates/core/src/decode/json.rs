//! [`Json<T>`]: a JSON payload, decoded as serde_json decodes it.

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
/// needs. The value and every error are serde_json's: a leaner reader of
/// intake's decodes the payloads it reads exactly as serde_json does
/// (objects, arrays, numbers, strings without escapes) in about 60 % of
/// serde_json's instructions on a small object, and hands everything else
/// (an escape, a number serde_json reads its own way, any error) to
/// serde_json, whose answer is the one given. `T` implements serde's
/// `Deserialize`, as for serde_json. A payload that is not valid JSON for
/// `T` fails the message with a [permanent](HandlerError::permanent)
/// [`DecodeError`], and so does a [tombstone](Message::is_tombstone) (no
/// payload at all); take `Option<Json<T>>` to receive tombstones as `None`.
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
        // The fast path answers only where it gives serde_json's value;
        // everything else, every error included, is serde_json's answer.
        if let Some(value) = super::fast_json::from_slice(payload) {
            return Ok(Json(value));
        }
        match serde_json::from_slice(payload) {
            Ok(value) => Ok(Json(value)),
            Err(error) => Err(DecodeError::new::<T>("JSON", payload, error)),
        }
    }
}

impl<T: DeserializeOwned> FromMessage for Json<T> {
    fn from_message(message: Message) -> Result<Self, HandlerError> {
        match Self::decode(message.payload()) {
            Ok(json) => Ok(json),
            // Asked only once decoding failed, as it always does on a
            // tombstone's empty payload: the path of every message pays
            // nothing for it (7 to 9 instructions per message in
            // `pipeline_json` when asked first).
            Err(_) if message.is_tombstone() => {
                Err(DecodeError::tombstone::<T>("JSON", "Option<Json<T>>").into())
            }
            Err(error) => Err(error.into()),
        }
    }
}

/// `None` for a [tombstone](Message::is_tombstone) (a Kafka record with a
/// null value: a compacted topic's "delete this key"), the decoded payload
/// otherwise; a payload that does not decode fails as it does for
/// `Json<T>`.
///
/// ```
/// use intake_core::{handler_fn, Json, Key};
/// use serde::Deserialize;
///
/// #[derive(Deserialize)]
/// struct Customer {
///     name: String,
/// }
///
/// let handler = handler_fn(async |Key(id): Key, customer: Option<Json<Customer>>| {
///     match customer {
///         Some(Json(customer)) => tracing::info!(?id, name = %customer.name, "upsert"),
///         None => tracing::info!(?id, "delete"),
///     }
/// });
/// # drop(handler);
/// ```
impl<T: DeserializeOwned> FromMessage for Option<Json<T>> {
    fn from_message(message: Message) -> Result<Self, HandlerError> {
        if message.is_tombstone() {
            return Ok(None);
        }
        Ok(Some(Json::decode(message.payload())?))
    }
}
