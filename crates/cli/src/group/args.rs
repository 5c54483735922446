//! The options of `intake pause`, `intake resume` and `intake group`.

use std::time::Duration;

use clap::Args;

use crate::args::{KafkaArgs, parse_secs};

/// Where the group's control logs are: the options the group commands
/// share. Unlike [`Target`](crate::args::Target) there is no source: a
/// group's logs are the group's, whatever it reads.
#[derive(Debug, Args)]
pub struct GroupTarget {
    /// The broker's URL (see the crate docs for the schemes).
    #[arg(
        long,
        help = "kafka://HOST:PORT, redis://[:PASS@]HOST:PORT[/DB], \
                amqp://USER:PASS@HOST:PORT/VHOST or nats://[USER:PASS@]HOST:PORT",
        value_name = "URL",
        env = "INTAKE_BROKER",
        hide_env_values = true
    )]
    pub broker: String,
    /// The consumer group whose instances share the control logs (the
    /// name the apps give their group control).
    #[arg(long, value_name = "GROUP", value_parser = not_empty)]
    pub group: String,
    /// Longest wait for the broker, connecting included; for `group`, the
    /// longest the whole reading of both logs may take.
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = parse_secs)]
    pub timeout: Duration,
    /// One JSON document on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    /// librdkafka settings, for `kafka://`.
    #[command(flatten)]
    pub kafka: KafkaArgs,
}

/// `intake pause` and `intake resume`: what to steer.
#[derive(Debug, Args)]
pub struct SteerArgs {
    /// Broker, group and output.
    #[command(flatten)]
    pub target: GroupTarget,
    /// The route (the name the app gave it).
    #[arg(long, value_name = "ROUTE", value_parser = not_empty)]
    pub route: String,
    /// The topic, stream or queue of the one partition to steer (with
    /// `--partition`); without both, every partition of the route.
    #[arg(long, value_name = "NAME", requires = "partition", value_parser = not_empty)]
    pub source: Option<String>,
    /// The partition (0 for a source without partitions); needs `--source`.
    #[arg(long, value_name = "N", requires = "source")]
    pub partition: Option<u32>,
}

/// `intake group`.
#[derive(Debug, Args)]
pub struct GroupArgs {
    /// Broker, group and output.
    #[command(flatten)]
    pub target: GroupTarget,
}

/// A name that says something: an empty group or route names no log.
fn not_empty(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        Err("give a name, not an empty one".to_owned())
    } else {
        Ok(text.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use crate::args::{Cli, Command};

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("intake").chain(args.iter().copied()))
    }

    #[test]
    fn a_partition_needs_its_source_and_the_other_way_round() {
        let base = ["--broker", "redis://h", "--group", "g", "--route", "r"];
        let cli = parse(
            &[
                &["pause"][..],
                &base,
                &["--source", "s", "--partition", "3"],
            ]
            .concat(),
        )
        .unwrap();
        let Command::Pause(steer) = cli.command else {
            panic!("parsed as pause");
        };
        assert_eq!(steer.source.as_deref(), Some("s"));
        assert_eq!(steer.partition, Some(3));
        assert_eq!(steer.target.group, "g");
        let cli = parse(&[&["resume"][..], &base].concat()).unwrap();
        assert!(matches!(cli.command, Command::Resume(ref steer) if steer.source.is_none()));
        for extra in [&["--partition", "3"][..], &["--source", "s"]] {
            let error = parse(&[&["pause"][..], &base, extra].concat()).unwrap_err();
            assert_eq!(error.exit_code(), 2, "{extra:?}");
        }
        let empty = [
            "pause",
            "--broker",
            "redis://h",
            "--group",
            " ",
            "--route",
            "r",
        ];
        assert_eq!(parse(&empty).unwrap_err().exit_code(), 2);
        assert_eq!(
            parse(&["pause", "--broker", "redis://h", "--group", "g"])
                .unwrap_err()
                .exit_code(),
            2
        );
    }

    #[test]
    fn group_takes_no_source() {
        let cli = parse(&["group", "--broker", "nats://h", "--group", "g", "--json"]).unwrap();
        assert!(matches!(cli.command, Command::Group(ref args) if args.target.json));
        let error = parse(&[
            "group", "--broker", "nats://h", "--group", "g", "--source", "s",
        ])
        .unwrap_err();
        assert_eq!(error.exit_code(), 2);
    }
}
