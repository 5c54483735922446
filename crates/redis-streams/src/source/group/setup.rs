//! Creating the consumer group on every stream, at the start and again
//! where it vanished, and refusing `delete_acked` on a stream another group
//! reads.

use std::time::Duration;

use redis::Value;
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use super::GroupReader;

use crate::connection::Connector;
use crate::error::Error;
use crate::source::settings::{Settings, StartFrom};
use crate::stream_id::StreamId;

/// Creates the group on every stream (and the stream where missing) at
/// `settings.start`. An existing group is kept as it is.
pub(in crate::source) async fn create_groups(
    connection: &mut MultiplexedConnection,
    connector: &Connector,
    settings: &Settings,
) -> Result<(), Error> {
    create_groups_at(connection, connector, settings, |_| None)
        .await
        .map(drop)
}

/// Creates the group on every stream (and the stream where missing), on
/// stream `index` after the id `after(index)` gives, or at
/// `settings.start` for `None`; returns how many it created. An existing
/// group is kept as it is.
pub(super) async fn create_groups_at(
    connection: &mut MultiplexedConnection,
    connector: &Connector,
    settings: &Settings,
    after: impl Fn(usize) -> Option<StreamId>,
) -> Result<usize, Error> {
    let Some(group) = settings.group.as_deref() else {
        return Ok(0);
    };
    let configured = match settings.start {
        StartFrom::Beginning => "0",
        StartFrom::NewEntries => "$",
    };
    let mut created_count = 0;
    for (index, stream) in settings.streams.iter().enumerate() {
        let mut formatted = [0_u8; 41];
        let start: &[u8] = match after(index) {
            Some(id) => id.format(&mut formatted),
            None => configured.as_bytes(),
        };
        let created: Result<(), redis::RedisError> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&**stream)
            .arg(group)
            .arg(start)
            .arg("MKSTREAM")
            .query_async(connection)
            .await;
        match created {
            Ok(()) => {
                created_count += 1;
                let start = String::from_utf8_lossy(start);
                tracing::info!(%stream, group, %start, "created consumer group");
            }
            Err(error) if error.code() == Some("BUSYGROUP") => {}
            Err(error) => return Err(connector.key_error(error, "XGROUP CREATE", stream)),
        }
    }
    Ok(created_count)
}

/// Refuses `delete_acked` on a stream that another consumer group reads:
/// what this group acknowledged and deleted, that group would never read.
pub(in crate::source) async fn refuse_shared_streams(
    connection: &mut MultiplexedConnection,
    connector: &Connector,
    settings: &Settings,
) -> Result<(), Error> {
    let Some(group) = settings.group.as_deref() else {
        return Ok(());
    };
    for stream in &settings.streams {
        let reply: Value = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&**stream)
            .query_async(connection)
            .await
            .map_err(|error| connector.key_error(error, "XINFO GROUPS", stream))?;
        let others = crate::source::convert::group_names(reply)?
            .into_iter()
            .filter(|name| name != group)
            .collect::<Vec<_>>();
        if !others.is_empty() {
            return Err(intake_core::ConfigError::new(
                "delete_acked",
                format!(
                    "deletes each entry once `{group}` acknowledged it, but `{stream}` is read \
                     by other consumer groups too ({}), which would lose the entries they \
                     have not read; turn it off (trim on the producer side, `XADD MAXLEN ~`)",
                    others.join(", ")
                ),
            )
            .into());
        }
    }
    Ok(())
}

/// How long a vanished group is remembered: one that vanishes again within
/// it is created again only after a wait, longer each time.
const LOST_GROUP_MEMORY: Duration = Duration::from_secs(60);

impl GroupReader {
    /// Creates the group again where it vanished (`NOGROUP`: `XGROUP
    /// DESTROY`, the stream deleted), after the newest entry this consumer
    /// read of each stream: what the group had read up to there is not read
    /// again (at the configured start, the default `Beginning`, it would
    /// be: the whole stream, handled twice). A stream this consumer read
    /// nothing of starts at the configured start. The group's pending
    /// entries went with it, so entries other consumers held, and those
    /// written before that id while the group was gone, are not delivered
    /// again: logged at error level. A group that keeps vanishing is
    /// created again after the reconnect policy's waits.
    pub(super) async fn create_group_again(&mut self, error: Error) -> Result<(), Error> {
        let now = Instant::now();
        self.lost_groups = match self.last_lost_group {
            Some(last) if now.duration_since(last) < LOST_GROUP_MEMORY => {
                self.lost_groups.saturating_add(1)
            }
            _ => 1,
        };
        self.last_lost_group = Some(now);
        if self.lost_groups > 1 {
            let Some(delay) = self.settings.reconnect.delay(self.lost_groups - 1) else {
                return Err(error);
            };
            tracing::warn!(
                %error,
                times = self.lost_groups,
                ?delay,
                "the consumer group keeps vanishing; waiting before creating it again"
            );
            tokio::time::sleep(delay).await;
        }
        let after: Vec<Option<StreamId>> =
            self.streams.iter().map(|stream| stream.decoded).collect();
        let connector = self.connection.connector().clone();
        let (connection, _) = self.connection.get().await?;
        let created = create_groups_at(connection, &connector, &self.settings, |index| {
            after.get(index).copied().flatten()
        })
        .await?;
        self.settings.counters.add_groups_created_again(1);
        tracing::error!(
            %error,
            group = %self.group,
            streams = created,
            "the consumer group or its stream vanished (XGROUP DESTROY, the key deleted); \
             created it again after the newest entry this consumer had read: entries \
             other consumers held and entries before that id are not delivered again"
        );
        Ok(())
    }
}
