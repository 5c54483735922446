//! `intake pause`, `intake resume` and `intake group`: a consumer group's
//! pauses through the group's control logs on the broker (core's
//! `group_control`), so that an operator steers every instance of a group
//! without reaching any instance's HTTP.
//!
//! `pause` and `resume` append a `GroupCommand` to the group's commands
//! log, which every instance reads from its start and applies to its own
//! routes: the pause holds wherever the partition goes, and for instances
//! started later. `group` reads the commands log and the status log (each
//! instance's console writes what it runs at every sample) from their
//! start until they stay quiet.

pub mod args;
mod channel;
mod output;
mod view;

use std::time::{SystemTime, UNIX_EPOCH};

use intake_core::group_control::{ControlLog, GroupCommand};
use tokio::time::Instant;

use self::args::{GroupArgs, GroupTarget, SteerArgs};
use self::channel::Channel;
use self::view::{Pauses, Statuses};
use crate::broker::Broker;
use crate::failure::Failure;

/// The longest `--by` name kept of the host name.
const MAX_HOST: usize = 64;

/// `intake pause` (`pause`) or `intake resume`: sends the command and
/// returns what to print.
pub async fn steer(args: &SteerArgs, pause: bool) -> Result<String, Failure> {
    let target = &args.target;
    let broker = broker_of(target)?;
    let by = format!("intake@{}", host_name());
    let command = match (&args.source, args.partition, pause) {
        (Some(source), Some(partition), true) => {
            GroupCommand::pause_partition(&args.route, source, partition, &by)
        }
        (Some(source), Some(partition), false) => {
            GroupCommand::resume_partition(&args.route, source, partition, &by)
        }
        (None, None, true) => GroupCommand::pause_route(&args.route, &by),
        (None, None, false) => GroupCommand::resume_route(&args.route, &by),
        // clap requires each with the other.
        _ => {
            return Err(Failure::Usage(
                "--partition and --source go together".to_owned(),
            ));
        }
    };
    let action = if pause { "pause" } else { "resume" };
    let what = format!("{action} sent to group {}", target.group);
    let channel = Channel::open(
        &broker,
        &target.group,
        ControlLog::Commands,
        target.timeout,
        &what,
    )
    .await?;
    channel.send(&command, target.timeout, &what).await?;
    Ok(if target.json {
        output::sent_json(&broker.endpoint(), &target.group, &command)
    } else {
        output::sent_table(&target.group, &command)
    })
}

/// `intake group`: reads both logs, both bounded by one `--timeout`, and
/// returns what to print.
pub async fn show(args: &GroupArgs) -> Result<String, Failure> {
    let target = &args.target;
    let broker = broker_of(target)?;
    let timeout = target.timeout;
    let deadline = Instant::now() + timeout;
    let group = &target.group;
    let commands_what = format!("reading group {group}'s commands log");
    let status_what = format!("reading group {group}'s status log");
    let mut pauses = Pauses::default();
    let mut statuses = Statuses::default();
    let commands = async {
        let channel = Channel::open(
            &broker,
            group,
            ControlLog::Commands,
            timeout,
            &commands_what,
        )
        .await?;
        channel
            .read_to_end(deadline, timeout, &commands_what, |record| {
                pauses.apply_record(record);
            })
            .await
    };
    let status = async {
        let channel =
            Channel::open(&broker, group, ControlLog::Status, timeout, &status_what).await?;
        channel
            .read_to_end(deadline, timeout, &status_what, |record| {
                statuses.apply_record(record);
            })
            .await
    };
    tokio::try_join!(commands, status)?;
    let now_unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        });
    let unreadable = pauses.unreadable + statuses.unreadable;
    let report = output::GroupReport {
        broker: broker.endpoint(),
        group: group.clone(),
        pauses: pauses.in_effect(),
        instances: statuses.newest(now_unix_ms),
        unreadable_records: unreadable,
    };
    Ok(if target.json {
        crate::output::json(&report)
    } else {
        output::group_table(&report)
    })
}

fn broker_of(target: &GroupTarget) -> Result<Broker, Failure> {
    Broker::parse(&target.broker)?.with_kafka_settings(&target.kafka)
}

/// This host's name, as `by` names the command's sender; `cli` when it
/// cannot be told.
fn host_name() -> String {
    let from_env = std::env::var("HOSTNAME").ok();
    let from_file = || {
        ["/proc/sys/kernel/hostname", "/etc/hostname"]
            .iter()
            .find_map(|path| std::fs::read_to_string(path).ok())
    };
    let name = from_env
        .filter(|name| !name.trim().is_empty())
        .or_else(from_file)
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "cli".to_owned());
    // Instances log and show it: one short line.
    name.chars()
        .filter(|c| !c.is_control())
        .take(MAX_HOST)
        .collect()
}
