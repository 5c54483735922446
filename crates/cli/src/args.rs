//! The command line, as clap reads it.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Parser, Subcommand, ValueEnum};
use intake_core::ErrorClass;
use intake_core::dead_letter::store::{Filter, LetterId};

use crate::group::args::{GroupArgs, SteerArgs};
use crate::kafka_settings::{RawSetting, raw_setting};

/// Operate intake consumers: broker-side lag, dead letters, and a group's
/// pauses through the broker.
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
    /// The group's dead letters: count, list, show, replay, purge.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Pause a route, or one partition of it, on every instance of the
    /// group, through the group's commands log on the broker.
    Pause(SteerArgs),
    /// Resume what `pause` paused, on every instance of the group.
    Resume(SteerArgs),
    /// The pauses in effect in the group and each instance's newest status,
    /// read from the group's logs on the broker.
    Group(GroupArgs),
}

impl Command {
    /// The `--broker` URL the command was given (for the error report,
    /// which scrubs its secrets).
    pub fn broker(&self) -> &str {
        match self {
            Command::Lag(args) => &args.target.broker,
            Command::Dlq(command) => &command.target().broker,
            Command::Pause(args) | Command::Resume(args) => &args.target.broker,
            Command::Group(args) => &args.target.broker,
        }
    }
}

/// Where to look: the options every subcommand takes.
#[derive(Debug, Args)]
pub struct Target {
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
    /// The topic, stream or queue.
    #[arg(long, value_name = "NAME")]
    pub source: String,
    /// The consumer group: on Kafka and Redis the group, on NATS the
    /// durable consumer; RabbitMQ has none (the consumers of a queue share
    /// it), any name will do. `dlq` reads this group's letters only: on
    /// Kafka and NATS its own topic or subject, on Redis its letters of the
    /// stream every group shares (`SOURCE:dlq`), on RabbitMQ the queue's.
    #[arg(long, value_name = "GROUP")]
    pub group: String,
    /// Longest wait for the broker, per query, connecting included.
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = parse_secs)]
    pub timeout: Duration,
    /// One JSON document on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    /// librdkafka settings, for `kafka://`.
    #[command(flatten)]
    pub kafka: KafkaArgs,
}

/// librdkafka settings of a `kafka://` broker: TLS, SASL, anything
/// librdkafka takes, for every client the command makes.
#[derive(Debug, Args)]
pub struct KafkaArgs {
    /// A file of librdkafka settings, KEY=VALUE a line (`#` starts a
    /// comment), as `kcat -F` reads it: `security.protocol=SASL_SSL`,
    /// `ssl.ca.location=/etc/ca.pem`, `sasl.mechanisms=SCRAM-SHA-512`,
    /// `sasl.username=...`, `sasl.password=...`. Default: the file
    /// `INTAKE_KAFKA_CONFIG` names, if set. The place for a password: it
    /// stays out of `ps` and the shell history. `kafka://` only.
    #[arg(long = "kafka-config", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// One librdkafka setting, KEY=VALUE (repeat the option); it replaces
    /// the file's. A value given here shows in `ps` and the shell history:
    /// give secrets in the file. `kafka://` only.
    #[arg(long = "kafka-setting", value_name = "KEY=VALUE", value_parser = raw_setting)]
    pub settings: Vec<RawSetting>,
}

/// `intake lag`.
#[derive(Debug, Args)]
pub struct LagArgs {
    /// Broker, source, group and output.
    #[command(flatten)]
    pub target: Target,
}

/// `intake dlq ...`.
#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// How many letters there are, per error class, and the oldest one's age.
    Count {
        /// Broker, source, group and output.
        #[command(flatten)]
        target: Target,
        /// Where the letters are.
        #[command(flatten)]
        store: StoreArgs,
        /// Which letters.
        #[command(flatten)]
        filter: FilterArgs,
    },
    /// The letters, oldest first, a page at a time.
    List {
        /// Broker, source, group and output.
        #[command(flatten)]
        target: Target,
        /// Where the letters are.
        #[command(flatten)]
        store: StoreArgs,
        /// Which letters.
        #[command(flatten)]
        filter: FilterArgs,
        /// Most letters shown.
        #[arg(long, default_value = "20", value_parser = clap::value_parser!(u32).range(1..=10_000))]
        limit: u32,
        /// Start after this letter id (the `more: --after ID` of a page).
        #[arg(long, value_name = "ID")]
        after: Option<String>,
    },
    /// One letter, with its payload and headers.
    Show {
        /// Broker, source, group and output.
        #[command(flatten)]
        target: Target,
        /// Where the letters are.
        #[command(flatten)]
        store: StoreArgs,
        /// The letter's id, as `list` shows it.
        id: String,
    },
    /// Publish the letters' messages again for the group to handle (or,
    /// with `--to-origin`, every group of their source), removing each
    /// letter once its publish is confirmed.
    ///
    /// By default a message goes back to GROUP alone: through the group's
    /// own way back in, which no other group reads (RabbitMQ: the queue it
    /// came from, which is the group's). A backend that has none for the
    /// group refuses (exit 3) and replays nothing: a topic, stream or
    /// subject is read by every consumer group of it.
    Replay {
        /// Broker, source, group and output.
        #[command(flatten)]
        target: Target,
        /// Where the letters are.
        #[command(flatten)]
        store: StoreArgs,
        /// Which letters.
        #[command(flatten)]
        filter: FilterArgs,
        /// Only these letters (repeat the option); the filters then do not apply.
        #[arg(long = "id", value_name = "ID", conflicts_with_all = ["class", "since", "until", "key"])]
        ids: Vec<String>,
        /// Publish each message back to its source (topic, stream, subject,
        /// queue), where EVERY consumer group of it handles it again, not
        /// GROUP alone: for letters that all of them should see again.
        #[arg(long, conflicts_with = "to")]
        to_origin: bool,
        /// Publish to this destination instead (every consumer of it
        /// handles the messages).
        #[arg(long, value_name = "DESTINATION")]
        to: Option<String>,
        /// Skip letters whose message was replayed this often already.
        #[arg(long, value_name = "N", default_value_t = intake_core::dead_letter::DEFAULT_MAX_REPLAYS)]
        max_replays: u32,
        /// Move nothing: show what would be replayed, counted by error class.
        #[arg(long)]
        dry_run: bool,
    },
    /// Delete letters for good (asks first, unless `--yes`).
    Purge {
        /// Broker, source, group and output.
        #[command(flatten)]
        target: Target,
        /// Where the letters are.
        #[command(flatten)]
        store: StoreArgs,
        /// Which letters.
        #[command(flatten)]
        filter: FilterArgs,
        /// Only these letters (repeat the option); the filters then do not apply.
        #[arg(long = "id", value_name = "ID", conflicts_with_all = ["class", "since", "until", "key"])]
        ids: Vec<String>,
        /// Delete nothing: show how many would go, counted by error class.
        #[arg(long)]
        dry_run: bool,
        /// Do not ask. Without it the command asks on the terminal, and
        /// refuses (exit 2) when stdin is not one.
        #[arg(long)]
        yes: bool,
    },
}

impl DlqCommand {
    /// The broker, source, group and output options.
    pub fn target(&self) -> &Target {
        match self {
            DlqCommand::Count { target, .. }
            | DlqCommand::List { target, .. }
            | DlqCommand::Show { target, .. }
            | DlqCommand::Replay { target, .. }
            | DlqCommand::Purge { target, .. } => target,
        }
    }

    /// Where the letters are.
    pub fn store(&self) -> &StoreArgs {
        match self {
            DlqCommand::Count { store, .. }
            | DlqCommand::List { store, .. }
            | DlqCommand::Show { store, .. }
            | DlqCommand::Replay { store, .. }
            | DlqCommand::Purge { store, .. } => store,
        }
    }

    /// The command as typed, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            DlqCommand::Count { .. } => "dlq count",
            DlqCommand::List { .. } => "dlq list",
            DlqCommand::Show { .. } => "dlq show",
            DlqCommand::Replay { .. } => "dlq replay",
            DlqCommand::Purge { .. } => "dlq purge",
        }
    }
}

/// Where a dlq command finds the letters, when not where the backend's
/// sink writes them by default.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// The dead-letter destination, when the consumer's sink was given one
    /// (default: the topic `SOURCE.GROUP.dlq` on Kafka; the stream
    /// `SOURCE:dlq` on Redis, of which GROUP's letters alone, as of a stream
    /// named here; the queue `SOURCE.dlq` on RabbitMQ; the subject
    /// `SOURCE.GROUP.dlq` of the stream `SOURCE_dlq` on NATS, and a NATS
    /// stream named here is read whole).
    #[arg(long, value_name = "NAME")]
    pub dead_letters: Option<String>,
    /// RabbitMQ: the most letters one pass over the queue takes (default
    /// 10000). A pass holds each one, payload included, in the broker and
    /// in this command's memory until it ends; letters behind them are not
    /// read, which the command then says. `amqp://` only.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub amqp_max_letters: Option<u64>,
}

/// Which letters a dlq command applies to; every option given must hold.
#[derive(Debug, Args)]
pub struct FilterArgs {
    /// Only letters whose last failure was of this class.
    #[arg(long, value_enum)]
    pub class: Option<ClassArg>,
    /// Only letters given up at or after TIME: an age (`90s`, `15m`, `2h`,
    /// `7d`: that long ago), RFC 3339 UTC (`2026-12-02T10:00:00Z`) or Unix
    /// seconds.
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub since: Option<SystemTime>,
    /// Only letters given up before TIME (as `--since`).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub until: Option<SystemTime>,
    /// Only letters of messages with this key (its bytes as UTF-8).
    #[arg(long)]
    pub key: Option<String>,
}

impl FilterArgs {
    /// The store's filter.
    pub fn filter(&self) -> Filter {
        let mut filter = Filter::all();
        if let Some(class) = self.class {
            filter = filter.with_class(class.into());
        }
        if self.since.is_some() || self.until.is_some() {
            filter = filter.failed_between(self.since, self.until);
        }
        if let Some(key) = &self.key {
            filter = filter.with_key(key.clone().into_bytes());
        }
        filter
    }
}

/// `--class`: the class of a letter's last failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ClassArg {
    /// Failed for good at once.
    Permanent,
    /// Retries used up.
    Retryable,
}

impl From<ClassArg> for ErrorClass {
    fn from(class: ClassArg) -> Self {
        match class {
            ClassArg::Permanent => ErrorClass::Permanent,
            ClassArg::Retryable => ErrorClass::Retryable,
        }
    }
}

/// Letter ids as the store takes them.
pub fn letter_ids(ids: &[String]) -> Vec<LetterId> {
    ids.iter().map(|id| LetterId::new(id.as_str())).collect()
}

/// A point in time: an age (`15m` ago), RFC 3339 in UTC, or Unix seconds.
fn parse_time(text: &str) -> Result<SystemTime, String> {
    parse_time_at(text, SystemTime::now())
}

fn parse_time_at(text: &str, now: SystemTime) -> Result<SystemTime, String> {
    let wrong = || {
        format!(
            "`{text}`: give an age (90s, 15m, 2h, 7d), RFC 3339 UTC (2026-12-02T10:00:00Z) \
             or Unix seconds"
        )
    };
    if let Ok(secs) = text.parse::<u64>() {
        return UNIX_EPOCH
            .checked_add(Duration::from_secs(secs))
            .ok_or_else(wrong);
    }
    if let Some(unit) = text.chars().last().filter(|c| "smhd".contains(*c)) {
        let amount: u64 = text[..text.len() - 1].parse().map_err(|_| wrong())?;
        let scale = match unit {
            's' => 1,
            'm' => 60,
            'h' => 3_600,
            _ => 86_400,
        };
        let ago = Duration::from_secs(amount.checked_mul(scale).ok_or_else(wrong)?);
        return now.checked_sub(ago).ok_or_else(wrong);
    }
    rfc3339_utc(text)
        .and_then(|secs| UNIX_EPOCH.checked_add(Duration::from_secs(secs)))
        .ok_or_else(wrong)
}

/// `YYYY-MM-DDTHH:MM:SSZ` (a space for `T` too) as Unix seconds.
fn rfc3339_utc(text: &str) -> Option<u64> {
    let text = text.strip_suffix('Z').or_else(|| text.strip_suffix('z'))?;
    let (date, time) = text.split_once(['T', 't', ' '])?;
    let mut date = date.splitn(3, '-').map(str::parse::<u64>);
    let (year, month, day) = (date.next()?.ok()?, date.next()?.ok()?, date.next()?.ok()?);
    let mut time = time.splitn(3, ':').map(str::parse::<u64>);
    let (hour, minute, second) = (time.next()?.ok()?, time.next()?.ok()?, time.next()?.ok()?);
    let valid = (1970..=9999).contains(&year)
        && (1..=12).contains(&month)
        && (1..=31).contains(&day)
        && hour < 24
        && minute < 60
        && second < 61;
    if !valid {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm), March-based
    // years so that the leap day ends a year.
    let (y, m) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y / 400;
    let year_of_era = y - era * 400;
    let day_of_year = (153 * m + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    Some(days * 86_400 + hour * 3_600 + minute * 60 + second)
}

/// Seconds, fractions allowed (`0.5`), more than zero and at most a day.
pub(crate) fn parse_secs(text: &str) -> Result<Duration, String> {
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
        let Command::Lag(lag) = cli.command else {
            panic!("parsed as lag");
        };
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

    fn dlq(args: &[&str]) -> Result<DlqCommand, clap::Error> {
        let target = ["--broker", "redis://h", "--source", "s", "--group", "g"];
        let all: Vec<&str> = std::iter::once("dlq")
            .chain(args.iter().copied())
            .chain(target)
            .collect();
        match parse(&all)?.command {
            Command::Dlq(command) => Ok(command),
            _ => panic!("parsed as another command"),
        }
    }

    #[test]
    fn dlq_filters_become_the_store_filter() {
        let DlqCommand::Count { filter, .. } = dlq(&[
            "count",
            "--class",
            "permanent",
            "--key",
            "k1",
            "--since",
            "0",
            "--until",
            "2026-12-02T10:00:00Z",
        ])
        .unwrap() else {
            panic!("count");
        };
        let filter = filter.filter();
        assert_eq!(filter.class, Some(ErrorClass::Permanent));
        assert_eq!(filter.key.as_deref(), Some(&b"k1"[..]));
        assert_eq!(filter.failed_from, Some(UNIX_EPOCH));
        assert_eq!(
            filter.failed_until,
            Some(UNIX_EPOCH + Duration::from_secs(1_796_205_600))
        );
    }

    #[test]
    fn times_are_ages_dates_or_unix_seconds() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(
            parse_time_at("15m", now),
            Ok(now - Duration::from_secs(900))
        );
        assert_eq!(
            parse_time_at("2d", now),
            Ok(now - Duration::from_secs(172_800))
        );
        assert_eq!(
            parse_time_at("2000-02-29T12:30:15Z", now),
            Ok(UNIX_EPOCH + Duration::from_secs(951_827_415))
        );
        assert_eq!(parse_time_at("1970-01-01 00:00:00Z", now), Ok(UNIX_EPOCH));
        for wrong in [
            "yesterday",
            "2026-13-01T00:00:00Z",
            "5w",
            "-3m",
            "2026-12-02T10:00:00",
        ] {
            assert!(parse_time_at(wrong, now).is_err(), "{wrong}");
        }
    }

    #[test]
    fn replay_takes_ids_or_filters_not_both() {
        let DlqCommand::Replay {
            ids,
            dry_run,
            max_replays,
            to,
            ..
        } = dlq(&["replay", "--id", "1-0", "--id", "2-0", "--dry-run"]).unwrap()
        else {
            panic!("replay");
        };
        assert_eq!(ids, ["1-0", "2-0"]);
        assert!(dry_run);
        assert_eq!(max_replays, 3);
        assert_eq!(to, None);
        let error = dlq(&["replay", "--id", "1-0", "--class", "permanent"]).unwrap_err();
        assert_eq!(error.exit_code(), 2);
    }

    #[test]
    fn purge_show_and_list_parse() {
        assert!(matches!(
            dlq(&["purge", "--yes", "--class", "retryable"]).unwrap(),
            DlqCommand::Purge {
                yes: true,
                dry_run: false,
                ..
            }
        ));
        assert!(matches!(
            dlq(&["show", "41"]).unwrap(),
            DlqCommand::Show { ref id, .. } if id == "41"
        ));
        assert!(matches!(
            dlq(&["list", "--limit", "5", "--after", "3"]).unwrap(),
            DlqCommand::List { limit: 5, .. }
        ));
        assert_eq!(dlq(&["list", "--limit", "0"]).unwrap_err().exit_code(), 2);
        assert_eq!(
            dlq(&["count", "--class", "fatal"]).unwrap_err().exit_code(),
            2
        );
        assert_eq!(dlq(&["show"]).unwrap_err().exit_code(), 2);
    }
}
