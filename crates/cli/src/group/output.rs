//! What the group commands print: a table for people, JSON for scripts.
//! Every name in them came from the broker's logs (or was typed), so each
//! goes through [`escaped`] in a table and [`json`] in a document.

use std::time::Duration;

use intake_core::group_control::{CommandTarget, GroupCommand};
use serde::Serialize;

use super::view::{InstanceStatus, Pause};
use crate::output::{Table, escaped, human_duration, json};

/// `intake pause --json` and `intake resume --json`: what was sent.
#[derive(Serialize)]
struct Sent<'a> {
    broker: &'a str,
    group: &'a str,
    /// `pause` or `resume`.
    action: &'static str,
    route: &'a str,
    /// `route` or `partition`.
    scope: &'static str,
    source: Option<&'a str>,
    partition: Option<u32>,
    by: &'a str,
    at_unix_ms: u64,
}

fn action(command: &GroupCommand) -> &'static str {
    if command.pause { "pause" } else { "resume" }
}

/// The scope, source and partition of `command`.
fn target(command: &GroupCommand) -> (&'static str, Option<&str>, Option<u32>) {
    match &command.target {
        CommandTarget::Partition { source, partition } => {
            ("partition", Some(source.as_str()), Some(*partition))
        }
        _ => ("route", None, None),
    }
}

/// The JSON of a command sent.
pub fn sent_json(broker: &str, group: &str, command: &GroupCommand) -> String {
    let (scope, source, partition) = target(command);
    json(&Sent {
        broker,
        group,
        action: action(command),
        route: &command.route,
        scope,
        source,
        partition,
        by: &command.by,
        at_unix_ms: command.at_unix_ms,
    })
}

/// `every partition`, or `partition N of SOURCE`, escaped.
fn target_text(source: Option<&str>, partition: Option<u32>) -> String {
    match (source, partition) {
        (Some(source), Some(partition)) => {
            format!("partition {partition} of {}", escaped(source))
        }
        _ => "every partition".to_owned(),
    }
}

/// The table of a command sent.
pub fn sent_table(group: &str, command: &GroupCommand) -> String {
    let (_, source, partition) = target(command);
    let mut table = Table::new(&["SENT", "GROUP", "ROUTE", "TARGET", "BY"]);
    table.row(vec![
        action(command).to_owned(),
        escaped(group).into_owned(),
        escaped(&command.route).into_owned(),
        target_text(source, partition),
        escaped(&command.by).into_owned(),
    ]);
    table.render()
}

/// `intake group --json`.
#[derive(Debug, Serialize)]
pub struct GroupReport {
    /// The broker URL, redacted.
    pub broker: String,
    /// The group.
    pub group: String,
    /// The pauses in effect, by route.
    pub pauses: Vec<Pause>,
    /// Each instance's newest status, by name.
    pub instances: Vec<InstanceStatus>,
    /// Records of either log this build could not read (written by
    /// another version, or not by intake).
    pub unreadable_records: u64,
}

/// The table of `intake group`: the pauses, then a line per partition of
/// each instance.
pub fn group_table(report: &GroupReport) -> String {
    let mut out = String::from("Pauses in effect:\n");
    if report.pauses.is_empty() {
        out.push_str("  none\n");
    } else {
        let mut pauses = Table::new(&["ROUTE", "TARGET", "BY", "SENT"]);
        let now = now_unix_ms();
        for pause in &report.pauses {
            pauses.row(vec![
                escaped(&pause.route).into_owned(),
                target_text(pause.source.as_deref(), pause.partition),
                escaped(&pause.by).into_owned(),
                ago(now.saturating_sub(pause.at_unix_ms)),
            ]);
        }
        out.push_str(&pauses.render());
    }
    out.push_str("\nInstances:\n");
    if report.instances.is_empty() {
        out.push_str("  none heard (no status in the group's status log)\n");
    } else {
        out.push_str(&instances_table(&report.instances));
    }
    if report.unreadable_records > 0 {
        out.push_str(&format!(
            "\n{} records of the logs were not read (another version's, or not intake's)\n",
            report.unreadable_records
        ));
    }
    out
}

fn instances_table(instances: &[InstanceStatus]) -> String {
    let mut table = Table::new(&[
        "INSTANCE",
        "HEARD",
        "ROUTE",
        "SOURCE",
        "PARTITION",
        "LIVENESS",
        "HANDLED",
        "IN FLIGHT",
    ])
    .right_aligned(4)
    .right_aligned(7);
    let dash = || "-".to_owned();
    for instance in instances {
        let name = escaped(&instance.instance).into_owned();
        let heard = ago(instance.age_ms);
        if instance.routes.is_empty() {
            table.row(vec![name.clone(), heard.clone(), dash()]);
        }
        for route in &instance.routes {
            let route_name = escaped(&route.name).into_owned();
            if route.partitions.is_empty() {
                table.row(vec![
                    name.clone(),
                    heard.clone(),
                    route_name.clone(),
                    dash(),
                ]);
            }
            for partition in &route.partitions {
                table.row(vec![
                    name.clone(),
                    heard.clone(),
                    route_name.clone(),
                    escaped(&partition.source).into_owned(),
                    partition.partition.to_string(),
                    partition
                        .liveness
                        .as_deref()
                        .map_or_else(dash, |text| escaped(text).into_owned()),
                    partition
                        .handled
                        .as_deref()
                        .map_or_else(dash, |text| escaped(text).into_owned()),
                    partition.in_flight.to_string(),
                ]);
            }
        }
    }
    table.render()
}

/// `3.2s ago`.
fn ago(millis: u64) -> String {
    format!("{} ago", human_duration(Duration::from_millis(millis)))
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

#[cfg(test)]
mod tests {
    use super::super::view::{PartitionStatus, RouteStatus};
    use super::*;

    #[test]
    fn hostile_names_from_the_logs_are_escaped_in_the_table() {
        let hostile = "\x1b]0;owned\x07<script>\u{202e}\nforged";
        let report = GroupReport {
            broker: "redis://h".to_owned(),
            group: "g".to_owned(),
            pauses: vec![Pause {
                route: hostile.to_owned(),
                scope: "partition",
                source: Some(hostile.to_owned()),
                partition: Some(1),
                by: hostile.to_owned(),
                at_unix_ms: 0,
            }],
            instances: vec![InstanceStatus {
                instance: hostile.to_owned(),
                at_unix_ms: 0,
                age_ms: 1_500,
                routes: vec![RouteStatus {
                    name: hostile.to_owned(),
                    paused: false,
                    partitions: vec![PartitionStatus {
                        source: hostile.to_owned(),
                        partition: 3,
                        liveness: Some(hostile.to_owned()),
                        handled: Some(hostile.to_owned()),
                        committed: None,
                        in_flight: 4,
                        paused: false,
                    }],
                }],
            }],
            unreadable_records: 1,
        };
        let table = group_table(&report);
        assert!(
            !table.contains('\x1b') && !table.contains('\u{202e}'),
            "{table}"
        );
        assert!(
            table.contains("\\x1b]0;owned\\x07<script>\\u{202e}\\nforged"),
            "{table}"
        );
        assert!(
            !table.lines().any(|line| line.starts_with("forged")),
            "{table}"
        );
        assert!(table.contains("1.5s ago"), "{table}");
        let document = json(&report);
        assert!(!document.contains('\x1b'), "{document}");
        let value: serde_json::Value = serde_json::from_str(&document).unwrap();
        assert_eq!(value["instances"][0]["instance"], hostile);
        assert_eq!(
            value["instances"][0]["routes"][0]["partitions"][0]["in_flight"],
            4
        );
    }

    #[test]
    fn a_command_sent_shows_its_route_target_and_sender() {
        let command = GroupCommand::pause_partition("orders", "orders", 2, "intake@h");
        let table = sent_table("billing", &command);
        assert!(
            table
                .lines()
                .nth(1)
                .is_some_and(|line| line
                    .starts_with("pause  billing  orders  partition 2 of orders  intake@h")),
            "{table}"
        );
        let value: serde_json::Value =
            serde_json::from_str(&sent_json("redis://h", "billing", &command)).unwrap();
        assert_eq!(value["scope"], "partition");
        assert_eq!(value["partition"], 2);
        assert_eq!(value["by"], "intake@h");
        let resume = GroupCommand::resume_route("orders", "intake@h");
        let value: serde_json::Value =
            serde_json::from_str(&sent_json("redis://h", "billing", &resume)).unwrap();
        assert_eq!(
            (value["action"].as_str(), value["scope"].as_str()),
            (Some("resume"), Some("route"))
        );
        assert!(sent_table("billing", &resume).contains("every partition"));
    }
}
