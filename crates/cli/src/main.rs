//! `intake`: operate intake consumers from a shell or a script.
//!
//! ```text
//! intake lag --broker URL --source NAME --group GROUP [--json] [--timeout SECS] [KAFKA]
//! intake dlq count  --broker URL --source NAME --group GROUP [FILTERS] [--json]
//! intake dlq list   --broker URL --source NAME --group GROUP [FILTERS] [--limit N] [--after ID] [--json]
//! intake dlq show   --broker URL --source NAME --group GROUP ID [--json]
//! intake dlq replay --broker URL --source NAME --group GROUP [FILTERS | --id ID...] [--to-origin | --to DEST] [--max-replays N] [--dry-run] [--json]
//! intake dlq purge  --broker URL --source NAME --group GROUP [FILTERS | --id ID...] [--dry-run] [--yes] [--json]
//! intake pause  --broker URL --group GROUP --route ROUTE [--source NAME --partition N] [--json] [--timeout SECS] [KAFKA]
//! intake resume --broker URL --group GROUP --route ROUTE [--source NAME --partition N] [--json] [--timeout SECS] [KAFKA]
//! intake group  --broker URL --group GROUP [--json] [--timeout SECS] [KAFKA]
//! ```
//!
//! Every `dlq` command takes `[KAFKA]` too, and `--dead-letters NAME`
//! (`--amqp-max-letters N` on RabbitMQ). `KAFKA` is `--kafka-config FILE`
//! and `--kafka-setting KEY=VALUE...` (below).
//!
//! `FILTERS` are `--class permanent|retryable`, `--since TIME`, `--until
//! TIME` (an age such as `15m`, RFC 3339 UTC, or Unix seconds) and `--key
//! KEY`; every one given must hold.
//!
//! `--broker` takes the URL schemes of the examples: `kafka://HOST:PORT`,
//! `redis://[:PASS@]HOST:PORT[/DB]` (`rediss://` for TLS),
//! `amqp://USER:PASS@HOST:PORT/VHOST` (`amqps://`), `nats://[USER:PASS@]HOST:PORT`
//! (`tls://`). It may come from the `INTAKE_BROKER` environment variable
//! instead, which keeps a password out of the shell history and of `ps`.
//! No password or token is ever printed: every URL shown is redacted.
//!
//! Kafka's TLS and SASL (and any other librdkafka setting) are not in the
//! URL: `--kafka-config FILE` reads librdkafka settings, `KEY=VALUE` a line
//! (`#` starts a comment, as `kcat -F` reads them), from the file named, or
//! else from the file `INTAKE_KAFKA_CONFIG` names; `--kafka-setting
//! KEY=VALUE` (repeated) adds or replaces one. Every Kafka client of the
//! command uses them (the store's reader, the replay's producer, the lag
//! probe):
//!
//! ```text
//! # /etc/intake/kafka.properties
//! security.protocol=SASL_SSL
//! ssl.ca.location=/etc/intake/ca.pem
//! sasl.mechanisms=SCRAM-SHA-512
//! sasl.username=ops
//! sasl.password=...
//! ```
//!
//! A password belongs in the file: on the command line it shows in `ps`
//! and the shell history. No value is ever printed: a malformed line or
//! argument is named by its number, librdkafka's refusals hide the values of
//! secret settings, and `--kafka-setting` values never reach a usage error.
//! `bootstrap.servers` comes from `--broker` and `group.id` from `--group`.
//! Both options are refused for another broker (the environment variable is
//! ignored there).
//!
//! What each broker counts as lag is in `intake_core::lag`. Beside the lag,
//! `intake lag` shows the group's parked backlog and, where the backend
//! tells more than a total, each delay tier's count (`parked_tiers` in
//! `--json`, with `next_due_unix_ms` where it is known: Redis). On RabbitMQ the
//! source is the queue and the group names nothing (every consumer of a
//! queue shares its messages); on NATS the group is the durable consumer.
//!
//! `intake dlq` works on the dead-letter destination through the backend's
//! `DeadLetterStore` (see `intake_core::dead_letter::store`): on Redis
//! GROUP's letters of the stream `SOURCE:dlq` the sink writes by default
//! (every group's letters share it; `intake.origin.group` tells them apart,
//! and the command counts, lists, shows, replays and purges GROUP's alone),
//! on RabbitMQ the queue `SOURCE.dlq` (the examples'
//! convention: an AMQP sink publishes where it is told), or `--dead-letters
//! NAME` on either; on NATS the subject `SOURCE.GROUP.dlq` on the stream
//! `SOURCE_dlq` the sink writes by default, or every subject of the stream
//! `--dead-letters NAME` (a replay to the origin goes to each message's own
//! subject; see `intake_nats::NatsDeadLetters`). On RabbitMQ every
//! operation but a plain count takes the queue's messages unacknowledged for
//! its pass and puts back what it leaves (see
//! `intake_amqp::AmqpDeadLetterStore`). A pass holds at most
//! `--amqp-max-letters` (default 10,000) letters it leaves in the queue; an
//! operation that needs every letter (a count, a listing to its end, a
//! replay or purge by filter that leaves that many before the rest) stops
//! there with exit code 3, saying how far it got and what it did: raise
//! the bound, or remove the letters before them first (`purge --yes`
//! removes as it goes and is not held back). On Kafka the topic
//! `SOURCE.GROUP.dlq` the sink writes by default, or the topic
//! `--dead-letters NAME`; ids are `PARTITION:OFFSET`, and a letter removed
//! out of order is marked in the topic's side topic `NAME.removed` (see
//! `intake_kafka::KafkaDeadLetters`). A replay publishes each letter's
//! message again and removes the letter only once the broker confirmed the
//! publish; a letter replayed `--max-replays` times already (3 by default)
//! is skipped, so a message that fails on every replay does not circle for
//! ever.
//!
//! `intake pause` and `intake resume` steer every instance of a consumer
//! group through the broker, without reaching any instance's HTTP: they
//! append a pause or resume of the route (every partition of it, those
//! assigned later too) or of one partition (`--source` and `--partition`
//! together) to the group's commands log (see `intake_core::group_control`:
//! a Kafka topic `GROUP.intake-control`, a Redis stream
//! `GROUP:intake-control`, a RabbitMQ stream queue `GROUP.intake-control`,
//! a NATS stream `INTAKE_CONTROL_GROUP`), and print what they sent, `by`
//! `intake@HOST`. Every instance of an app with group control reads that
//! log from its start and applies each command, so a pause holds wherever
//! the group assigns the partition, now and after a rebalance, until a
//! resume. A route's pause or resume replaces the route's partition
//! pauses. `intake group` reads the commands log and the status log (each
//! instance's console writes its routes and partitions there at every
//! sample) from their start until no record came for about a second (3 s
//! before the first one), all within `--timeout`, and prints the pauses in
//! effect and each instance's newest status: how long ago it wrote it, and
//! per route its partitions with their liveness, handled position and
//! messages in flight. A log not read to its end within `--timeout` exits
//! 1 rather than show older pauses as the current ones. Where the backend
//! creates a log on first use (a Kafka topic, a RabbitMQ stream queue, a
//! NATS stream), a first `pause` or `group` for a group creates it.
//!
//! A replay goes back to GROUP alone by default (`Replay::to_group`):
//! through the group's own way back in, which no other group reads (on
//! RabbitMQ the queue the letter came from, which is the group's; on Redis
//! the group's return stream `SOURCE:GROUP:returned` when the group reads
//! it, as its parking makes it). A topic,
//! stream or subject is read by every consumer group of it, so where the
//! store knows no way back for the group alone it refuses with exit code 3,
//! replays nothing of that origin, and says so: `--to-origin` then
//! publishes each message back to its source, where **every** consumer
//! group of it handles it again, which must be meant; `--to DEST` publishes
//! to another destination. A replay the broker refuses (the origin queue
//! or topic is gone, a message too large, not allowed) stops with exit code
//! 3, the letters not confirmed still in the store; one it did not confirm
//! in time stops with 1. `--dry-run` on `replay` and `purge` moves nothing and shows the
//! counts per error class. `purge` asks on the terminal first; with stdin
//! not a terminal it refuses unless `--yes` is given. A purge by filter
//! that asks deletes exactly the letters it counted in the question (it
//! lists them first): letters given up while the question waits are left
//! for the next purge, so `purged` never exceeds the count confirmed (it is
//! lower when some were replayed or purged meanwhile). With `--yes` no
//! count is shown: the store takes the letters it holds when the purge
//! starts. A long replay shows a
//! progress bar on stderr when stderr is a terminal.
//!
//! # Output
//!
//! A table for people on stdout by default; `--json` prints one JSON
//! document on stdout instead, for scripts (`| jq .total`). Errors,
//! prompts and progress go to stderr, so stdout holds only the answer.
//! `RUST_LOG=debug` shows the clients' logs on stderr.
//!
//! Nothing a producer wrote reaches the terminal as it is. A letter's
//! source, key, error text, header names and values, payload and id, what
//! a group's logs hold (instance, route and source names, positions), and
//! a broker's error text, may hold escape sequences (a window title, the
//! clipboard through OSC 52, erased or hidden lines), a carriage return or
//! newline that forges a line, or a bidi control that reorders one. In
//! tables, `show` and errors every control character (newline and tab
//! included, but in a payload) and bidi control is printed as an escape:
//! `\x1b`, `\r`, `\n`, `\u{9b}`, `\u{202e}`, and bytes that are not
//! UTF-8 as `\xff`; a payload's further lines are indented, so that no line
//! of it can pass for a field. `--json` carries the exact text (bytes that
//! are not UTF-8 escaped as above) and writes every such character as a
//! JSON escape (`\u001b`), so the document is as safe on a terminal; `jq
//! -r` prints them raw, as asked.
//!
//! # Exit codes
//!
//! | code | meaning |
//! |---|---|
//! | 0 | done |
//! | 1 | the broker could not be reached, did not answer within `--timeout`, or the connection broke: trying again later may succeed |
//! | 2 | usage: wrong arguments or an unusable `--broker` URL |
//! | 3 | the broker refused or knows nothing of what was asked (unknown source, group, queue or consumer, letter id; a permission; a replay it refused), or a replay to the group has no way back to the group alone: trying again will not help until something changes |
//! | 4 | the command is not supported yet for this broker (`intake dlq` where the backend has no dead-letter store yet) |
//! | 5 | a purge was not confirmed at the prompt: nothing was deleted |
//!
//! # Why clap
//!
//! clap's derive turns the argument structs into the parser, `--help` and
//! the usage errors (exit code 2, the convention scripts expect) in one
//! place, with `env` fallbacks and typed values checked before anything
//! connects. The workspace already builds clap for criterion's benches;
//! the derive adds only `clap_derive` on the `syn` that thiserror needs. A
//! hand-written parser for subcommands with a dozen options each would be
//! more code to get wrong and a worse `--help`.
//!
//! This crate is a binary: the doc's examples are the commands above, run
//! end to end against the real brokers by `tests/cli.rs` and (the group
//! commands) `tests/group.rs`.
#![warn(missing_docs)]

mod args;
mod broker;
mod dlq;
mod failure;
mod group;
mod kafka_settings;
mod lag;
mod output;
mod stores;

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::process::ExitCode;
use std::time::SystemTime;

use clap::Parser as _;
use intake_core::dead_letter::store::{LetterId, Replay, Selection};

use crate::args::{Cli, Command, DlqCommand, LagArgs, letter_ids};
use crate::broker::Broker;
use crate::failure::Failure;

/// The longest the runtime's leftover work may delay the exit.
const SHUTDOWN: std::time::Duration = std::time::Duration::from_millis(500);

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // `--help` and `--version` exit 0 through here, usage errors 2.
        Err(error) => error.exit(),
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: could not start the async runtime: {error}");
            return ExitCode::from(failure::EXIT_UNAVAILABLE);
        }
    };
    let url = cli.command.broker().to_owned();
    let result = runtime.block_on(run(cli));
    // A client's call given up at --timeout may still run on the blocking
    // pool (a Kafka metadata lookup waits up to its own 10 s), and dropping
    // the runtime would wait for it: the answer is printed by now, and the
    // exit must come within --timeout.
    runtime.shutdown_timeout(SHUTDOWN);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("{}", failure.report(Some(&url)));
            failure.exit()
        }
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Lag(args) => lag(args).await,
        Command::Dlq(command) => dlq_command(command).await,
        Command::Pause(args) => print(&group::steer(&args, true).await?),
        Command::Resume(args) => print(&group::steer(&args, false).await?),
        Command::Group(args) => print(&group::show(&args).await?),
    }
}

async fn dlq_command(command: DlqCommand) -> Result<(), Failure> {
    let target = command.target();
    let broker = Broker::parse(&target.broker)?.with_kafka_settings(&target.kafka)?;
    if let DlqCommand::Purge {
        dry_run: false,
        yes: false,
        ..
    } = command
    {
        // Refused before connecting: a script that forgot `--yes` learns it
        // at once, whatever state the broker is in.
        if !std::io::stdin().is_terminal() {
            return Err(no_one_to_confirm());
        }
    }
    let store = stores::open(
        &broker,
        &target.source,
        &target.group,
        command.store().dead_letters.as_deref(),
        command.store().amqp_max_letters,
        target.timeout,
        command.name(),
    )
    .await?;
    let store = store.as_ref();
    let now = SystemTime::now();
    let as_json = target.json;
    let text = match &command {
        DlqCommand::Count { filter, .. } => {
            dlq::count(store, &filter.filter(), as_json, now).await?
        }
        DlqCommand::List {
            filter,
            limit,
            after,
            ..
        } => {
            let after = after.as_deref().map(LetterId::new);
            let limit = usize::try_from(*limit).unwrap_or(usize::MAX);
            dlq::list(store, &filter.filter(), limit, after.as_ref(), as_json, now).await?
        }
        DlqCommand::Show { id, .. } => {
            dlq::show(store, &LetterId::new(id.as_str()), as_json, now).await?
        }
        DlqCommand::Replay {
            filter,
            ids,
            to_origin,
            to,
            max_replays,
            dry_run,
            ..
        } => {
            let selection = selection(ids, filter);
            let mut replay = match (to, to_origin) {
                (Some(destination), _) => Replay::to(destination.as_str()),
                (None, true) => Replay::to_origin(),
                // The group alone: what "replay these letters" means for the
                // group named; every other group of the origin is left out.
                (None, false) => Replay::to_group(),
            }
            .dry_run(*dry_run)
            .max_replays(*max_replays);
            let bar = if *dry_run || !std::io::stderr().is_terminal() {
                None
            } else {
                Some(progress_bar(store, &selection).await?)
            };
            if let Some(bar) = &bar {
                let bar = bar.clone();
                replay = replay.on_progress(move |done| bar.set_position(done));
            }
            let replayed = dlq::replay(store, &selection, &replay, as_json).await;
            if let Some(bar) = bar {
                bar.finish_and_clear();
            }
            replayed?
        }
        DlqCommand::Purge {
            filter,
            ids,
            dry_run,
            yes,
            ..
        } => {
            let selection = selection(ids, filter);
            // With --yes nobody is shown a count to bound the purge by: the
            // store's own bound applies (the letters held when it starts).
            let confirm = (!*yes).then_some(ask);
            dlq::purge(store, &selection, *dry_run, as_json, confirm).await?
        }
    };
    print(&text)
}

/// The letters `--id` names, or else those the filters select.
fn selection(ids: &[String], filter: &args::FilterArgs) -> Selection {
    if ids.is_empty() {
        Selection::Matching(filter.filter())
    } else {
        Selection::Ids(letter_ids(ids))
    }
}

/// A bar on stderr as long as the replay's letters.
async fn progress_bar(
    store: &dyn intake_core::dead_letter::store::DeadLetterStore,
    selection: &Selection,
) -> Result<indicatif::ProgressBar, Failure> {
    let total = match selection {
        Selection::Ids(ids) => ids.len() as u64,
        Selection::Matching(filter) => store
            .count(filter)
            .await
            .map_err(|error| dlq::store_failure("dlq replay", error))?,
    };
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(total),
        indicatif::ProgressDrawTarget::stderr(),
    );
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "replaying {bar:40} {human_pos}/{human_len} ({eta} left)",
    ) {
        bar.set_style(style);
    }
    Ok(bar)
}

fn no_one_to_confirm() -> Failure {
    Failure::Usage(
        "dlq purge: stdin is not a terminal, so nobody can confirm; pass --yes to purge".to_owned(),
    )
}

/// Asks `question` on the terminal; anything but `y` or `yes` declines.
/// With stdin not a terminal there is nobody to ask: a script must say
/// `--yes` rather than pipe an answer by accident.
fn ask(question: &str) -> Result<(), Failure> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(no_one_to_confirm());
    }
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    // The wait for a person's answer is the one wait left unbounded: it is
    // what was asked for, and Ctrl-C ends it.
    tokio::task::block_in_place(|| stdin.lock().read_line(&mut answer)).map_err(|error| {
        Failure::Unavailable {
            what: "reading the answer from stdin".to_owned(),
            source: Box::new(error),
        }
    })?;
    match answer.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(()),
        _ => Err(Failure::NotConfirmed),
    }
}

async fn lag(args: LagArgs) -> Result<(), Failure> {
    let target = &args.target;
    let broker = Broker::parse(&target.broker)?.with_kafka_settings(&target.kafka)?;
    let lag = lag::query(&broker, &target.source, &target.group, target.timeout).await?;
    let text = if target.json {
        output::lag_json(&broker.endpoint(), &target.source, &target.group, &lag)
    } else {
        output::lag_table(&lag)
    };
    print(&text)
}

/// Writes `text` to stdout; a closed pipe (`| head`) is not an error worth
/// a panic, and is reported like any other failure to write.
fn print(text: &str) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|error| Failure::Unavailable {
            what: "writing the answer to stdout".to_owned(),
            source: Box::new(error),
        })
}
