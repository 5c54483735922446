//! The command line, as clap reads it.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Operate intake consumers: broker-side lag and dead letters.
#[derive(Debug, Parser)]
#[command(name = "intake", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// How many messages a consumer group has not committed, per partition.
    Lag(LagArgs),
}

/// Where to look: the options every subcommand takes.
#[derive(Debug, Args)]
pub struct Target {
    /// kafka://HOST:PORT, redis://[:PASS@]HOST:PORT[/DB],
    /// amqp://USER:PASS@HOST:PORT/VHOST or nats://[USER:PASS@]HOST:PORT.
    #[arg(
        long,
        value_name = "URL",
        env = "INTAKE_BROKER",
        hide_env_values = true
    )]
    pub broker: String,
    /// The topic, stream or queue.
    #[arg(long, value_name = "NAME")]
    pub source: String,
    /// The consumer group (RabbitMQ: ignored, the queue is the group;
    /// NATS: the durable consumer).
    #[arg(long, value_name = "GROUP")]
    pub group: String,
    /// Longest wait for the broker, per query, connecting included.
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = parse_secs)]
    pub timeout: Duration,
    /// One JSON document on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `intake lag`.
#[derive(Debug, Args)]
pub struct LagArgs {
    /// Broker, source, group and output.
    #[command(flatten)]
    pub target: Target,
}

/// Seconds, fractions allowed (`0.5`), more than zero and at most a day.
fn parse_secs(text: &str) -> Result<Duration, String> {
    let secs: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    if !(secs > 0.0 && secs <= 86_400.0) {
        return Err(format!(
            "`{text}`: give more than 0 and at most 86400 seconds"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("intake").chain(args.iter().copied()))
    }

    #[test]
    fn lag_takes_broker_source_and_group() {
        let cli = parse(&[
            "lag",
            "--broker",
            "kafka://127.0.0.1:9092",
            "--source",
            "orders",
            "--group",
            "billing",
            "--json",
            "--timeout",
            "2.5",
        ])
        .unwrap();
        let Command::Lag(lag) = cli.command;
        assert_eq!(lag.target.broker, "kafka://127.0.0.1:9092");
        assert_eq!(lag.target.source, "orders");
        assert_eq!(lag.target.group, "billing");
        assert!(lag.target.json);
        assert_eq!(lag.target.timeout, Duration::from_millis(2_500));
    }

    #[test]
    fn a_missing_group_or_a_bad_timeout_is_a_usage_error() {
        for args in [
            &["lag", "--broker", "kafka://h:1", "--source", "s"][..],
            &[
                "lag",
                "--broker",
                "kafka://h:1",
                "--source",
                "s",
                "--group",
                "g",
                "--timeout",
                "0",
            ],
            &[
                "lag",
                "--broker",
                "kafka://h:1",
                "--source",
                "s",
                "--group",
                "g",
                "--timeout",
                "soon",
            ],
        ] {
            let error = parse(args).unwrap_err();
            assert_eq!(error.exit_code(), 2, "{args:?}");
        }
    }
}
