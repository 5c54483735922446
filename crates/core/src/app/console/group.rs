//! The group view: what every instance of the group runs, as each published
//! it through the group's status log (`GET /console/api/v1/group`).
//!
//! At each sample an instance with a status log
//! ([`GroupControl::with_status`](crate::group_control::GroupControl::with_status))
//! appends its routes and their partitions; every instance's console
//! follows the log and keeps the newest record of each instance. Without a
//! status log the view is this instance's alone.

use std::collections::BTreeMap;
use std::time::Instant;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::view::{Now, PartitionView, RouteView};
use super::{Console, lock};

/// The status record's format version.
const VERSION: u32 = 1;
/// The most instances the view keeps (the least recently heard go first).
pub(super) const MAX_INSTANCES: usize = 256;
/// The most partitions of a route an instance publishes.
const MAX_PARTITIONS: usize = 1_000;
/// The largest status record read; larger ones are skipped.
const MAX_RECORD: usize = 4 << 20;

/// A route as an instance publishes it: its view and its partitions.
#[derive(Serialize)]
struct PublishedRoute {
    #[serde(flatten)]
    route: RouteView,
    partition_list: Vec<PartitionView>,
}

#[derive(Serialize)]
struct Published<'a> {
    v: u32,
    instance: &'a str,
    at_unix_ms: u64,
    routes: Vec<PublishedRoute>,
}

/// A status record as read: the routes are relayed as they came.
#[derive(Deserialize)]
struct Heard {
    v: u32,
    instance: String,
    at_unix_ms: u64,
    routes: serde_json::Value,
}

/// The newest record of each instance.
#[derive(Default)]
pub(super) struct GroupView {
    instances: BTreeMap<String, Latest>,
}

struct Latest {
    at_unix_ms: u64,
    heard_at: Instant,
    routes: serde_json::Value,
}

/// One instance in `GET /console/api/v1/group`.
#[derive(Serialize)]
pub(super) struct InstanceView {
    instance: String,
    /// When it published this, by its clock.
    at_unix_ms: u64,
    /// How long ago this console read it.
    heard_ms_ago: u64,
    /// Its routes, each with `partition_list`.
    routes: serde_json::Value,
}

/// `GET /console/api/v1/group`.
#[derive(Serialize)]
pub(super) struct GroupAnswer {
    /// The instance answering.
    instance: String,
    /// Whether the instances share a status log (else: this one only).
    shared: bool,
    instances: Vec<InstanceView>,
}

impl GroupView {
    fn record(&mut self, heard: Heard) {
        if let Some(known) = self.instances.get(&heard.instance)
            && known.at_unix_ms > heard.at_unix_ms
        {
            return;
        }
        if !self.instances.contains_key(&heard.instance) && self.instances.len() >= MAX_INSTANCES {
            let stalest = self
                .instances
                .iter()
                .min_by_key(|(_, latest)| latest.heard_at)
                .map(|(name, _)| name.clone());
            if let Some(stalest) = stalest {
                self.instances.remove(&stalest);
            }
        }
        self.instances.insert(
            heard.instance,
            Latest {
                at_unix_ms: heard.at_unix_ms,
                heard_at: Instant::now(),
                routes: heard.routes,
            },
        );
    }
}

impl Console {
    /// This instance's routes, each with its partitions.
    fn published_routes(&self) -> Vec<PublishedRoute> {
        self.routes()
            .into_iter()
            .map(|route| {
                let partition_list = self
                    .partitions(&route.name, 0, MAX_PARTITIONS)
                    .map(|page| page.partitions)
                    .unwrap_or_default();
                PublishedRoute {
                    route,
                    partition_list,
                }
            })
            .collect()
    }

    /// This instance's routes and partitions, as a status record.
    fn status_record(&self) -> Bytes {
        let record = Published {
            v: VERSION,
            instance: self.settings().instance_id(),
            at_unix_ms: Now::new().unix_now_ms(),
            routes: self.published_routes(),
        };
        // Plain data: serializing it cannot fail.
        Bytes::from(serde_json::to_vec(&record).unwrap_or_default())
    }

    /// Publishes this instance's view to the group's status log, if the
    /// app has one (each sample).
    pub(super) async fn publish_status(&self) {
        let Some(group) = lock(&self.inner.group).clone() else {
            return;
        };
        if !group.has_status() {
            return;
        }
        if let Some(Err(error)) = group.publish_status(self.status_record()).await {
            tracing::warn!(
                instance = %group.instance(),
                error = %crate::error::ErrorChain::new(&error),
                "could not publish this instance's status to the group"
            );
        }
    }

    /// Reads the group's status log until `stop` (nothing without one).
    pub(super) async fn follow_group_until(&self, stop: &CancellationToken) {
        let Some(group) = lock(&self.inner.group).clone() else {
            return;
        };
        group
            .follow_status_until(stop, |record| {
                if record.len() > MAX_RECORD {
                    return;
                }
                match serde_json::from_slice::<Heard>(&record) {
                    Ok(heard) if heard.v == VERSION => lock(&self.inner.group_view).record(heard),
                    Ok(_) | Err(_) => {
                        tracing::debug!("skipped a status record this version does not read");
                    }
                }
            })
            .await;
    }

    /// `GET /console/api/v1/group`: every instance heard, this one first
    /// as it is now.
    pub(super) fn group_answer(&self) -> GroupAnswer {
        let here = self.settings().instance_id().to_owned();
        let shared = lock(&self.inner.group)
            .as_ref()
            .is_some_and(|group| group.has_status());
        let now = Instant::now();
        let mut instances = Vec::new();
        instances.push(InstanceView {
            instance: here.clone(),
            at_unix_ms: Now::new().unix_now_ms(),
            heard_ms_ago: 0,
            // Plain data: converting it cannot fail.
            routes: serde_json::to_value(self.published_routes()).unwrap_or_default(),
        });
        for (name, latest) in &lock(&self.inner.group_view).instances {
            if *name == here {
                continue;
            }
            instances.push(InstanceView {
                instance: name.clone(),
                at_unix_ms: latest.at_unix_ms,
                heard_ms_ago: u64::try_from(now.duration_since(latest.heard_at).as_millis())
                    .unwrap_or(u64::MAX),
                routes: latest.routes.clone(),
            });
        }
        GroupAnswer {
            instance: here,
            shared,
            instances,
        }
    }
}
