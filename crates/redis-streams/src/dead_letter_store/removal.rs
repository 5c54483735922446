//! Deleting letters: `XDEL`, or for a log scoped to a group a script that
//! deletes only the ids whose letter is the group's.

use intake_core::dead_letter::envelope::ORIGIN_GROUP;
use intake_core::dead_letter::store::{LetterId, StoreError};
use redis::{Script, Value};

use super::RedisDeadLetters;
use super::ids::stream_id;
use crate::error::Error;
use crate::source::convert::integer_of;

/// `KEYS[1]` the dead-letter stream; `ARGV[1]` the group field's name,
/// `ARGV[2]` the group, then ids. Deletes those of the ids whose entry
/// belongs to the group (its first group field is the group); returns how
/// many it deleted.
static REMOVE_OF_GROUP: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| {
    Script::new(
        r"
local removed = 0
for i = 3, #ARGV do
  local entry = redis.call('XRANGE', KEYS[1], ARGV[i], ARGV[i])[1]
  if entry then
    local fields = entry[2]
    for j = 1, #fields - 1, 2 do
      if fields[j] == ARGV[1] then
        if fields[j + 1] == ARGV[2] then
          removed = removed + redis.call('XDEL', KEYS[1], ARGV[i])
        end
        break
      end
    end
  end
end
return removed
",
    )
});

/// Ids per removal script call (Lua's `unpack` limit is far above; this
/// keeps one call short, as a script holds the server).
const REMOVE_CHUNK: usize = 1_000;

impl RedisDeadLetters {
    /// Deletes the letters `ids` of this log; how many it deleted
    /// ([`DeadLetterLog::remove`]).
    ///
    /// [`DeadLetterLog::remove`]: intake_core::dead_letter::store::DeadLetterLog::remove
    pub(super) async fn delete(&self, ids: &[LetterId]) -> Result<u64, StoreError> {
        let ids = ids.iter().map(stream_id).collect::<Result<Vec<_>, _>>()?;
        if ids.is_empty() {
            return Ok(0);
        }
        if let Some(group) = &self.group {
            // Checked and deleted in one step on the server: an id of
            // another group's letter is left alone.
            let mut removed = 0;
            for chunk in ids.chunks(REMOVE_CHUNK) {
                let mut invocation = REMOVE_OF_GROUP.key(&*self.stream);
                invocation.arg(ORIGIN_GROUP).arg(&**group);
                for id in chunk {
                    invocation.arg(*id);
                }
                let mut connection = self.connection.get();
                let reply: Value = invocation
                    .invoke_async(&mut connection)
                    .await
                    .map_err(|error| self.failed("remove letters from", "XDEL", error))?;
                removed += integer_of(&reply).ok_or_else(|| {
                    StoreError::broker(
                        "remove letters from",
                        &*self.stream,
                        Error::UnexpectedReply {
                            command: "XDEL",
                            detail: format!("expected a count, got {reply:?}"),
                        },
                    )
                })?;
            }
            return Ok(removed);
        }
        let mut connection = self.connection.get();
        let reply: Value = redis::cmd("XDEL")
            .arg(&*self.stream)
            .arg(&ids)
            .query_async(&mut connection)
            .await
            .map_err(|error| self.failed("remove letters from", "XDEL", error))?;
        integer_of(&reply).ok_or_else(|| {
            StoreError::broker(
                "remove letters from",
                &*self.stream,
                Error::UnexpectedReply {
                    command: "XDEL",
                    detail: format!("expected a count, got {reply:?}"),
                },
            )
        })
    }
}
