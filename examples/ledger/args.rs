//! The command line, parsed by hand: two subcommands and a few flags.

use std::fmt;
use std::time::Duration;

pub const USAGE: &str = "\
usage:
  ledger produce --broker URL --source NAME --count N [--partitions P]
  ledger consume --broker URL --source NAME --group GROUP --ledger FILE
                 [--max-in-flight N] [--idle-exit-secs S] [--fail-every K]
                 [--later-every K [--later-secs S]] [--effects-db POSTGRES_URL]
                 [--ordering key|unordered]
  ledger relay --broker URL --source NAME --group GROUP --to NAME2
               [--max-in-flight N] [--idle-exit-secs S]
               [--exactly-once [--effects-db POSTGRES_URL]]

URL: kafka://HOST:PORT | redis://[USER:PASS@]HOST:PORT | amqp://USER:PASS@HOST:PORT/VHOST
   | nats://[USER:PASS@]HOST:PORT";

pub use crate::broker_url::Broker;

#[derive(Debug)]
pub struct Produce {
    pub broker: Broker,
    pub source: String,
    pub count: u64,
    pub partitions: i32,
}

#[derive(Debug)]
pub struct Consume {
    pub broker: Broker,
    pub source: String,
    pub group: String,
    pub ledger: String,
    pub max_in_flight: usize,
    pub idle_exit: Duration,
    /// Every K-th first attempt fails retryably; `None`: none fails.
    pub fail_every: Option<u64>,
    /// Every K-th first attempt asks to be retried after `later`, and is
    /// parked; `None`: none is.
    pub later_every: Option<u64>,
    pub later: Duration,
    pub effects_db: Option<String>,
    /// `--ordering key`: each key's messages one after the other, and a
    /// parked key's later messages parked behind it; `unordered` (the
    /// default): ids have no order to keep.
    pub key_order: bool,
}

/// Consumes `source` and publishes each payload, key and headers unchanged
/// to `to` on the same broker, acknowledging an input only once its output
/// is confirmed.
#[derive(Debug)]
pub struct Relay {
    pub broker: Broker,
    pub source: String,
    pub group: String,
    pub to: String,
    pub max_in_flight: usize,
    pub idle_exit: Duration,
    /// Each output exactly once: Kafka transactions on Kafka; elsewhere the
    /// PostgreSQL outbox of `effects_db`, whose ids let readers drop repeats.
    pub exactly_once: bool,
    /// The outbox's database; required with `exactly_once` off Kafka.
    pub effects_db: Option<String>,
}

#[derive(Debug)]
pub enum Command {
    Produce(Produce),
    Consume(Consume),
    Relay(Relay),
}

/// Kafka topics are created with this many partitions unless `--partitions`
/// says otherwise.
pub const DEFAULT_PARTITIONS: i32 = 4;
pub const DEFAULT_MAX_IN_FLIGHT: usize = 256;
pub const DEFAULT_IDLE_EXIT: Duration = Duration::from_secs(5);

/// A command line that cannot be run; main prints it with the usage and
/// exits 2.
#[derive(Debug)]
pub struct UsageError(String);

impl UsageError {
    fn new(problem: impl Into<String>) -> Self {
        Self(problem.into())
    }
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The flags after the subcommand, as `--name value` pairs.
struct Flags {
    pairs: Vec<(String, String)>,
}

/// Flags that take no value: present or not.
/// How long a parked message waits by default (`--later-secs`).
pub const DEFAULT_LATER_SECS: u64 = 2;

const SWITCHES: &[&str] = &["--exactly-once"];

impl Flags {
    fn parse(args: impl Iterator<Item = String>, known: &[&str]) -> Result<Self, UsageError> {
        let mut pairs: Vec<(String, String)> = Vec::new();
        let mut args = args.peekable();
        while let Some(flag) = args.next() {
            // `--flag=value` and `--flag value` both work.
            let (name, inline) = match flag.split_once('=') {
                Some((name, value)) => (name.to_owned(), Some(value.to_owned())),
                None => (flag, None),
            };
            let is_switch = SWITCHES.contains(&name.as_str());
            if !known.contains(&name.as_str()) {
                return Err(UsageError::new(format!("unknown argument `{name}`")));
            }
            let value = match (inline, is_switch) {
                (Some(_), true) => {
                    return Err(UsageError::new(format!("{name} takes no value")));
                }
                (None, true) => String::new(),
                (Some(value), false) => value,
                (None, false) => args
                    .next()
                    .ok_or_else(|| UsageError::new(format!("{name} needs a value")))?,
            };
            if pairs.iter().any(|(seen, _)| *seen == name) {
                return Err(UsageError::new(format!("{name} given twice")));
            }
            pairs.push((name, value));
        }
        Ok(Self { pairs })
    }

    /// Whether a [switch](SWITCHES) was given.
    fn switch(&self, name: &str) -> bool {
        self.pairs.iter().any(|(flag, _)| flag == name)
    }

    fn optional(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(flag, _)| flag == name)
            .map(|(_, value)| value.as_str())
    }

    fn required(&self, name: &str) -> Result<&str, UsageError> {
        match self.optional(name) {
            Some(value) if !value.is_empty() => Ok(value),
            Some(_) => Err(UsageError::new(format!("{name} must not be empty"))),
            None => Err(UsageError::new(format!("{name} is required"))),
        }
    }

    fn number<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>, UsageError> {
        self.optional(name)
            .map(|value| {
                value
                    .parse()
                    .map_err(|_| UsageError::new(format!("{name} expects a number, not `{value}`")))
            })
            .transpose()
    }

    /// `--idle-exit-secs`, in seconds (fractions allowed).
    fn idle_exit(&self) -> Result<Duration, UsageError> {
        Ok(self
            .number::<f64>("--idle-exit-secs")?
            .map(|secs| {
                Duration::try_from_secs_f64(secs)
                    .map_err(|_| UsageError::new("--idle-exit-secs must be a non-negative number"))
            })
            .transpose()?
            .unwrap_or(DEFAULT_IDLE_EXIT))
    }

    fn positive<T>(&self, name: &str) -> Result<Option<T>, UsageError>
    where
        T: std::str::FromStr + PartialOrd + Default,
    {
        match self.number::<T>(name)? {
            Some(value) if value <= T::default() => {
                Err(UsageError::new(format!("{name} must be at least 1")))
            }
            value => Ok(value),
        }
    }
}

/// Parses the arguments after the program name.
pub fn parse(mut args: impl Iterator<Item = String>) -> Result<Command, UsageError> {
    let command = args
        .next()
        .ok_or_else(|| UsageError::new("name a command: produce, consume or relay"))?;
    match command.as_str() {
        "produce" => {
            let flags = Flags::parse(args, &["--broker", "--source", "--count", "--partitions"])?;
            Ok(Command::Produce(Produce {
                broker: Broker::parse(flags.required("--broker")?).map_err(UsageError::new)?,
                source: flags.required("--source")?.to_owned(),
                count: flags
                    .number("--count")?
                    .ok_or_else(|| UsageError::new("--count is required"))?,
                partitions: flags
                    .positive("--partitions")?
                    .unwrap_or(DEFAULT_PARTITIONS),
            }))
        }
        "consume" => {
            let flags = Flags::parse(
                args,
                &[
                    "--broker",
                    "--source",
                    "--group",
                    "--ledger",
                    "--max-in-flight",
                    "--idle-exit-secs",
                    "--fail-every",
                    "--later-every",
                    "--later-secs",
                    "--effects-db",
                    "--ordering",
                ],
            )?;
            let key_order = match flags.optional("--ordering") {
                None | Some("unordered") => false,
                Some("key") => true,
                Some(other) => {
                    return Err(UsageError::new(format!(
                        "--ordering is `key` or `unordered`, not `{other}`"
                    )));
                }
            };
            let later_every = flags.positive("--later-every")?;
            let later_secs: Option<u64> = flags.positive("--later-secs")?;
            if later_secs.is_some() && later_every.is_none() {
                return Err(UsageError::new("--later-secs needs --later-every"));
            }
            Ok(Command::Consume(Consume {
                broker: Broker::parse(flags.required("--broker")?).map_err(UsageError::new)?,
                source: flags.required("--source")?.to_owned(),
                group: flags.required("--group")?.to_owned(),
                ledger: flags.required("--ledger")?.to_owned(),
                max_in_flight: flags
                    .positive("--max-in-flight")?
                    .unwrap_or(DEFAULT_MAX_IN_FLIGHT),
                idle_exit: flags.idle_exit()?,
                fail_every: flags.positive("--fail-every")?,
                later_every,
                later: Duration::from_secs(later_secs.unwrap_or(DEFAULT_LATER_SECS)),
                effects_db: flags.optional("--effects-db").map(str::to_owned),
                key_order,
            }))
        }
        "relay" => {
            let flags = Flags::parse(
                args,
                &[
                    "--broker",
                    "--source",
                    "--group",
                    "--to",
                    "--max-in-flight",
                    "--idle-exit-secs",
                    "--exactly-once",
                    "--effects-db",
                ],
            )?;
            let relay = Relay {
                broker: Broker::parse(flags.required("--broker")?).map_err(UsageError::new)?,
                source: flags.required("--source")?.to_owned(),
                group: flags.required("--group")?.to_owned(),
                to: flags.required("--to")?.to_owned(),
                max_in_flight: flags
                    .positive("--max-in-flight")?
                    .unwrap_or(DEFAULT_MAX_IN_FLIGHT),
                idle_exit: flags.idle_exit()?,
                exactly_once: flags.switch("--exactly-once"),
                effects_db: flags.optional("--effects-db").map(str::to_owned),
            };
            if relay.to == relay.source {
                return Err(UsageError::new(
                    "--to must name another source than --source (a relay into its own input never ends)",
                ));
            }
            let on_kafka = matches!(relay.broker, Broker::Kafka { .. });
            match (relay.exactly_once, on_kafka, relay.effects_db.is_some()) {
                (false, _, true) => {
                    return Err(UsageError::new(
                        "--effects-db goes with --exactly-once (the outbox it names is how outputs go out exactly once)",
                    ));
                }
                (true, true, true) => {
                    return Err(UsageError::new(
                        "--effects-db is not used on Kafka: --exactly-once uses Kafka transactions there",
                    ));
                }
                (true, false, false) => {
                    return Err(UsageError::new(
                        "--exactly-once needs --effects-db POSTGRES_URL off Kafka: the outbox lives there",
                    ));
                }
                _ => {}
            }
            Ok(Command::Relay(relay))
        }
        "-h" | "--help" | "help" => Err(UsageError::new("")),
        other => Err(UsageError::new(format!(
            "unknown command `{other}`; expected produce, consume or relay"
        ))),
    }
}
