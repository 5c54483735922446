//! What `intake group` makes of the two logs: the pauses in effect (the
//! commands folded in log order, as every instance applies them) and each
//! instance's newest status.

use std::collections::BTreeMap;

use intake_core::group_control::{CommandTarget, GroupCommand};
use serde::{Deserialize, Serialize};

/// The status record's format version this build reads (core's console
/// writes it).
const STATUS_VERSION: u32 = 1;

/// The largest status record read (as the console reads them); larger ones
/// are skipped.
const MAX_STATUS_RECORD: usize = 4 << 20;

/// A pause in effect.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Pause {
    /// The route.
    pub route: String,
    /// `route` (every partition of it) or `partition`.
    pub scope: &'static str,
    /// The partition's source, for a partition's pause.
    pub source: Option<String>,
    /// The partition, for a partition's pause.
    pub partition: Option<u32>,
    /// Who sent it.
    pub by: String,
    /// When, by the sender's clock, in Unix milliseconds.
    pub at_unix_ms: u64,
}

/// A route's pauses, as `ConsumerControl` keeps them.
#[derive(Default)]
struct RoutePauses {
    /// The route's own pause, when it is paused whole.
    all: Option<Pause>,
    /// The partitions paused one by one.
    partitions: BTreeMap<(String, u32), Pause>,
}

/// The commands log folded: what every instance holds paused once it has
/// applied them all.
#[derive(Default)]
pub struct Pauses {
    routes: BTreeMap<String, RoutePauses>,
    /// Records that are neither a command nor a mark this build reads.
    pub unreadable: u64,
}

impl Pauses {
    /// Applies one record of the commands log. An instance's start mark is
    /// passed over quietly; anything else unreadable is counted.
    pub fn apply_record(&mut self, record: &[u8]) {
        match GroupCommand::decode(record) {
            Ok(command) => self.apply(&command),
            Err(_) if is_mark(record) => {}
            Err(_) => self.unreadable += 1,
        }
    }

    /// Applies `command` as `ConsumerControl` does: a route's pause or
    /// resume replaces the route's partition pauses.
    fn apply(&mut self, command: &GroupCommand) {
        let route = self.routes.entry(command.route.clone()).or_default();
        let pause = |source: Option<String>, partition: Option<u32>| Pause {
            route: command.route.clone(),
            scope: if partition.is_some() {
                "partition"
            } else {
                "route"
            },
            source,
            partition,
            by: command.by.clone(),
            at_unix_ms: command.at_unix_ms,
        };
        match &command.target {
            CommandTarget::Route => {
                route.partitions.clear();
                route.all = command.pause.then(|| pause(None, None));
            }
            CommandTarget::Partition { source, partition } => {
                let key = (source.clone(), *partition);
                if command.pause {
                    let paused = pause(Some(source.clone()), Some(*partition));
                    route.partitions.insert(key, paused);
                } else {
                    route.partitions.remove(&key);
                }
            }
            // A target of a newer core: nothing this build can fold.
            _ => self.unreadable += 1,
        }
    }

    /// The pauses in effect, by route, a route's own first.
    pub fn in_effect(&self) -> Vec<Pause> {
        self.routes
            .values()
            .flat_map(|route| route.all.iter().chain(route.partitions.values()))
            .cloned()
            .collect()
    }
}

/// Whether `record` is an instance's start mark (`{"v":1,"mark":…}`).
fn is_mark(record: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Probe {
        mark: Option<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Probe>(record).is_ok_and(|probe| probe.mark.is_some())
}

/// A status record as an instance's console writes it; only the fields
/// shown are read, and each may be missing.
#[derive(Deserialize)]
struct StatusRecord {
    v: u32,
    instance: String,
    at_unix_ms: u64,
    #[serde(default)]
    routes: Vec<RouteStatus>,
}

/// A route of an instance's status.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct RouteStatus {
    /// The route's name.
    #[serde(default)]
    pub name: String,
    /// Every partition of it on the instance is paused.
    #[serde(default)]
    pub paused: bool,
    /// Its partitions on the instance.
    #[serde(default, rename(deserialize = "partition_list"))]
    pub partitions: Vec<PartitionStatus>,
}

/// A partition of a route of an instance's status.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct PartitionStatus {
    /// Topic, stream or queue.
    #[serde(default)]
    pub source: String,
    /// The partition.
    #[serde(default)]
    pub partition: u32,
    /// How it fares (`ok`, `idle`, `stalled`, `paused`, ...).
    #[serde(default)]
    pub liveness: Option<String>,
    /// The position handled (every message up to it is done).
    #[serde(default)]
    pub handled: Option<String>,
    /// The position the broker confirmed committed.
    #[serde(default)]
    pub committed: Option<String>,
    /// Messages whose handler has not finished.
    #[serde(default)]
    pub in_flight: u64,
    /// Paused on the instance.
    #[serde(default)]
    pub paused: bool,
}

/// An instance's newest status.
#[derive(Clone, Debug, Serialize)]
pub struct InstanceStatus {
    /// The instance's name.
    pub instance: String,
    /// When it wrote it, by its clock, in Unix milliseconds.
    pub at_unix_ms: u64,
    /// How long before this command read the logs, by this clock.
    pub age_ms: u64,
    /// Its routes.
    pub routes: Vec<RouteStatus>,
}

/// The status log folded: each instance's newest record.
#[derive(Default)]
pub struct Statuses {
    instances: BTreeMap<String, (u64, Vec<RouteStatus>)>,
    /// Records this build does not read (another version, too large).
    pub unreadable: u64,
}

impl Statuses {
    /// Keeps `record` if it is its instance's newest so far.
    pub fn apply_record(&mut self, record: &[u8]) {
        let status = (record.len() <= MAX_STATUS_RECORD)
            .then(|| serde_json::from_slice::<StatusRecord>(record).ok())
            .flatten()
            .filter(|status| status.v == STATUS_VERSION);
        let Some(status) = status else {
            self.unreadable += 1;
            return;
        };
        match self.instances.get(&status.instance) {
            Some((at, _)) if *at > status.at_unix_ms => {}
            _ => {
                self.instances
                    .insert(status.instance, (status.at_unix_ms, status.routes));
            }
        }
    }

    /// Each instance's newest status, by name, aged against `now_unix_ms`.
    pub fn newest(self, now_unix_ms: u64) -> Vec<InstanceStatus> {
        self.instances
            .into_iter()
            .map(|(instance, (at_unix_ms, routes))| InstanceStatus {
                instance,
                at_unix_ms,
                age_ms: now_unix_ms.saturating_sub(at_unix_ms),
                routes,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_command_replaces_the_routes_partition_pauses() {
        let mut pauses = Pauses::default();
        for command in [
            GroupCommand::pause_partition("orders", "orders", 1, "a"),
            GroupCommand::pause_partition("orders", "orders", 2, "a"),
            GroupCommand::pause_partition("audit", "audit", 0, "b"),
            GroupCommand::resume_partition("orders", "orders", 2, "b"),
        ] {
            pauses.apply_record(&command.encode());
        }
        pauses.apply_record(br#"{"v":1,"mark":"t0k3n","by":"a"}"#);
        let shown: Vec<_> = pauses
            .in_effect()
            .into_iter()
            .map(|pause| (pause.route, pause.scope, pause.partition))
            .collect();
        assert_eq!(
            shown,
            [
                ("audit".to_owned(), "partition", Some(0)),
                ("orders".to_owned(), "partition", Some(1))
            ]
        );
        assert_eq!(pauses.unreadable, 0, "a mark is skipped quietly");
        pauses.apply_record(&GroupCommand::pause_route("orders", "c").encode());
        pauses.apply_record(&GroupCommand::pause_partition("orders", "orders", 3, "c").encode());
        let orders: Vec<_> = pauses
            .in_effect()
            .into_iter()
            .filter(|pause| pause.route == "orders")
            .map(|pause| (pause.scope, pause.partition))
            .collect();
        assert_eq!(orders, [("route", None), ("partition", Some(3))]);
        pauses.apply_record(&GroupCommand::resume_route("orders", "c").encode());
        assert_eq!(
            pauses.in_effect().len(),
            1,
            "the resume cleared partition 3 too"
        );
        pauses.apply_record(b"\x1b[2J not json");
        pauses.apply_record(
            br#"{"v":2,"route":"r","scope":"route","pause":true,"by":"a","at_unix_ms":1}"#,
        );
        assert_eq!(pauses.unreadable, 2);
    }

    #[test]
    fn each_instance_keeps_its_newest_status() {
        let mut statuses = Statuses::default();
        let record = |instance: &str, at: u64, handled: &str| {
            serde_json::to_vec(&serde_json::json!({
                "v": 1, "instance": instance, "at_unix_ms": at,
                "routes": [{"name": "orders", "paused": false, "in_flight": 0,
                    "partition_list": [{"source": "orders", "partition": 0,
                        "liveness": "ok", "handled": handled, "in_flight": 2}]}]
            }))
            .unwrap()
        };
        statuses.apply_record(&record("b", 2_000, "7"));
        statuses.apply_record(&record("a", 1_000, "1"));
        statuses.apply_record(&record("b", 1_500, "5"));
        statuses.apply_record(br#"{"v":2,"instance":"c","at_unix_ms":1,"routes":[]}"#);
        let newest = statuses.newest(3_000);
        assert_eq!(newest.len(), 2);
        assert_eq!(newest[1].instance, "b");
        assert_eq!(newest[1].age_ms, 1_000);
        let partition = &newest[1].routes[0].partitions[0];
        assert_eq!(partition.handled.as_deref(), Some("7"));
        assert_eq!(partition.in_flight, 2);
        assert_eq!(partition.liveness.as_deref(), Some("ok"));
    }
}
