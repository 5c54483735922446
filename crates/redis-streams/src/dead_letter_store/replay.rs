//! The way back into a group for a replay: the group's return stream of
//! the letter's origin, when the group reads it.

use std::sync::Arc;

use intake_core::dead_letter::store::StoreError;
use redis::Value;

use super::RedisDeadLetters;

impl RedisDeadLetters {
    /// The group's return stream of `origin` (`<origin>:<group>:returned`,
    /// or the one set with
    /// [`return_stream`](super::RedisDeadLettersBuilder::return_stream)) when the
    /// group reads it: the group exists there, which its source makes sure
    /// of when it reads the stream, and the parking's mover when it moves a
    /// copy there. `None` without a scope, or when the group does not read
    /// it: a message written there would never be read (or, by a group
    /// created there later at `$`, skipped).
    pub(super) async fn way_back(&self, origin: &str) -> Result<Option<Arc<str>>, StoreError> {
        let Some(group) = &self.group else {
            return Ok(None);
        };
        let returned = self
            .returns
            .iter()
            .find(|(stream, _)| stream == origin)
            .map_or_else(
                || crate::RedisParking::return_stream(origin, group),
                |(_, returned)| returned.clone(),
            );
        let mut connection = self.connection.get();
        // The summary form answers NOGROUP when the stream or the group
        // on it is missing.
        let read: Result<Value, _> = redis::cmd("XPENDING")
            .arg(&returned)
            .arg(&**group)
            .query_async(&mut connection)
            .await;
        match read {
            Ok(_) => Ok(Some(returned.into())),
            Err(error) if error.code() == Some("NOGROUP") => Ok(None),
            Err(error) => {
                let error = self
                    .connection
                    .connector()
                    .key_error(error, "XPENDING", &returned);
                Err(StoreError::broker(
                    "look for the way back to",
                    &*self.stream,
                    error,
                ))
            }
        }
    }
}
