//! [`GroupCommand`]: a pause or a resume, as the commands log carries it.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// The version this build writes and reads; a record of another version is
/// [`MalformedCommand`] (an instance of a newer build wrote it).
const VERSION: u32 = 1;

/// What a command pauses or resumes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "scope", rename_all = "snake_case")]
#[non_exhaustive]
pub enum CommandTarget {
    /// Every partition of the route, those assigned later too.
    Route,
    /// One partition of the route.
    Partition {
        /// The topic, stream or queue.
        source: String,
        /// The partition (0 for a source without partitions).
        partition: u32,
    },
}

/// A pause or a resume of a route or one of its partitions, for every
/// instance of the group (see the [module docs](super)).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GroupCommand {
    /// The route (an [`App`](crate::app::App) route's name).
    pub route: String,
    /// What of it.
    #[serde(flatten)]
    pub target: CommandTarget,
    /// `true`: pause; `false`: resume.
    pub pause: bool,
    /// The instance that issued it.
    pub by: String,
    /// When, in milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
}

/// The record as written: the command and its format's version.
#[derive(Serialize, Deserialize)]
struct Record {
    v: u32,
    #[serde(flatten)]
    command: GroupCommand,
}

/// A record of the commands log that is not a command this build reads:
/// written by a newer build, or not by intake. The follower skips it and
/// says so.
#[derive(Debug, thiserror::Error)]
#[error("a record of the group's commands log is not a command this version reads")]
pub struct MalformedCommand(#[source] serde_json::Error);

impl GroupCommand {
    fn new(route: &str, target: CommandTarget, pause: bool, by: &str) -> Self {
        let at_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
            });
        Self {
            route: route.to_owned(),
            target,
            pause,
            by: by.to_owned(),
            at_unix_ms,
        }
    }

    /// Pause every partition of `route`, issued by instance `by`.
    pub fn pause_route(route: &str, by: &str) -> Self {
        Self::new(route, CommandTarget::Route, true, by)
    }

    /// Resume every partition of `route`.
    pub fn resume_route(route: &str, by: &str) -> Self {
        Self::new(route, CommandTarget::Route, false, by)
    }

    /// Pause partition `partition` of `source` in `route`.
    pub fn pause_partition(route: &str, source: &str, partition: u32, by: &str) -> Self {
        let target = CommandTarget::Partition {
            source: source.to_owned(),
            partition,
        };
        Self::new(route, target, true, by)
    }

    /// Resume partition `partition` of `source` in `route`.
    pub fn resume_partition(route: &str, source: &str, partition: u32, by: &str) -> Self {
        let target = CommandTarget::Partition {
            source: source.to_owned(),
            partition,
        };
        Self::new(route, target, false, by)
    }

    /// The record the commands log carries (JSON, versioned).
    pub fn encode(&self) -> Bytes {
        let record = Record {
            v: VERSION,
            command: self.clone(),
        };
        // Strings, numbers and a bool: serializing them cannot fail.
        Bytes::from(serde_json::to_vec(&record).unwrap_or_default())
    }

    /// The command in `record`, if it is one this build reads.
    pub fn decode(record: &[u8]) -> Result<Self, MalformedCommand> {
        let record: Record = serde_json::from_slice(record).map_err(MalformedCommand)?;
        if record.v != VERSION {
            return Err(MalformedCommand(serde::de::Error::custom(format_args!(
                "version {} (this build reads {VERSION})",
                record.v
            ))));
        }
        Ok(record.command)
    }
}

/// A record of the commands log: a command, or an instance's mark.
#[derive(Debug)]
pub(super) enum Entry {
    /// A pause or a resume.
    Command(GroupCommand),
    /// An instance starting wrote this to learn where the log ended: once
    /// it reads its own mark back it has read every command before it.
    Mark {
        /// The instance's random token for this start.
        token: String,
    },
}

/// The mark's record.
#[derive(Serialize, Deserialize)]
struct MarkRecord {
    v: u32,
    mark: String,
    by: String,
}

/// Only what tells the two apart.
#[derive(Deserialize)]
struct Probe {
    v: u32,
    #[serde(default)]
    mark: Option<String>,
}

impl Entry {
    /// The mark record of instance `by` with `token`.
    pub(super) fn encode_mark(token: &str, by: &str) -> Bytes {
        let record = MarkRecord {
            v: VERSION,
            mark: token.to_owned(),
            by: by.to_owned(),
        };
        Bytes::from(serde_json::to_vec(&record).unwrap_or_default())
    }

    /// What `record` holds, if this build reads it.
    pub(super) fn decode(record: &[u8]) -> Result<Self, MalformedCommand> {
        let probe: Probe = serde_json::from_slice(record).map_err(MalformedCommand)?;
        match probe.mark {
            Some(token) if probe.v == VERSION => Ok(Self::Mark { token }),
            _ => GroupCommand::decode(record).map(Self::Command),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_survives_its_record() {
        let pause = GroupCommand::pause_partition("orders", "orders.v2", 3, "a");
        assert_eq!(GroupCommand::decode(&pause.encode()).unwrap(), pause);
        let resume = GroupCommand::resume_route("orders", "b");
        assert_eq!(GroupCommand::decode(&resume.encode()).unwrap(), resume);
    }

    #[test]
    fn another_version_or_garbage_is_malformed() {
        let record = br#"{"v":2,"route":"r","scope":"route","pause":true,"by":"a","at_unix_ms":1}"#;
        let error = GroupCommand::decode(record).unwrap_err();
        assert!(error.to_string().contains("not a command"));
        assert!(GroupCommand::decode(b"\x1b[2J<script>").is_err());
    }

    #[test]
    fn a_mark_is_told_from_a_command() {
        let mark = Entry::encode_mark("t0k3n", "a");
        assert!(matches!(Entry::decode(&mark).unwrap(), Entry::Mark { token } if token == "t0k3n"));
        let pause = GroupCommand::pause_route("orders", "a");
        assert!(
            matches!(Entry::decode(&pause.encode()).unwrap(), Entry::Command(command) if command == pause)
        );
        assert!(GroupCommand::decode(&mark).is_err());
    }
}
