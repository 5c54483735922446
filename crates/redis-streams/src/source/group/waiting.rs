//! The reader's side of key order (`source/key_order.rs`): entries that
//! wait for an older entry of their key are handed to the staging queue
//! once nothing older of their key is in other hands.

use super::GroupReader;
use crate::error::Error;
use crate::source::key_order;

/// Whether entries just read may have to wait for an older entry of their
/// key (see `source/key_order.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Clearance {
    /// No other consumer had entries pending right after the read and this
    /// one gave none back: nothing older of any key is in other hands.
    Clear,
    /// Unknown: a look at the pending entries decides.
    Look,
}

impl GroupReader {
    /// Looks again at the waiting entries of every stream; how many it
    /// handed out.
    pub(super) async fn release_waiting_all(&mut self) -> Result<usize, Error> {
        let mut released = 0;
        for index in 0..self.streams.len() {
            if self
                .key_order
                .as_ref()
                .is_some_and(|key_order| key_order.is_waiting(index))
            {
                released += self.release_waiting(index).await?;
            }
        }
        Ok(released)
    }

    /// Hands the waiting entries of stream `index` that no older entry of
    /// their key holds back any more to the staging queue (see
    /// `source/key_order.rs`); returns how many.
    pub(super) async fn release_waiting(&mut self, index: usize) -> Result<usize, Error> {
        let (Some(key_order), Some(key_field)) = (&mut self.key_order, &self.settings.key_field)
        else {
            return Ok(0);
        };
        let Some(through) = key_order.newest(index) else {
            return Ok(0);
        };
        self.held.given_back(index, &mut self.given_back);
        self.given_back.retain(|id| *id <= through);
        if key_order::too_many_given_back(&self.given_back) {
            tracing::debug!(
                stream = %self.streams[index].name,
                given_back = self.given_back.len(),
                "entries wait until claims take back some of the entries given back for a retry"
            );
            key_order.put_off();
            return Ok(0);
        }
        let name = self.streams[index].name.clone();
        let connector = self.connection.connector().clone();
        let (connection, _) = self.connection.get().await?;
        let look = key_order::look(
            connection,
            &name,
            &self.group,
            &self.settings.consumer,
            key_field,
            through,
            &self.given_back,
        )
        .await
        .map_err(|error| connector.key_error(error, "EVALSHA", &name))?;
        let Some(key_order) = &mut self.key_order else {
            return Ok(0);
        };
        let (released, started) = key_order.release(index, &look, &mut self.staging.ready);
        self.held
            .forget_given_back(index, look.covered(), key_order.mine());
        self.settings.counters.add_key_order_waits(started);
        Ok(released)
    }
}
