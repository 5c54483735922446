//! `intake`: operate intake consumers from a shell or a script.
//!
//! ```text
//! intake lag --broker URL --source NAME --group GROUP [--json] [--timeout SECS]
//! ```
//!
//! `--broker` takes the URL schemes of the examples: `kafka://HOST:PORT`,
//! `redis://[:PASS@]HOST:PORT[/DB]` (`rediss://` for TLS),
//! `amqp://USER:PASS@HOST:PORT/VHOST` (`amqps://`), `nats://[USER:PASS@]HOST:PORT`
//! (`tls://`). It may come from the `INTAKE_BROKER` environment variable
//! instead, which keeps a password out of the shell history and of `ps`.
//! No password or token is ever printed: every URL shown is redacted.
//!
//! What each broker counts as lag is in `intake_core::lag`. On RabbitMQ the
//! source is the queue and the group names nothing (every consumer of a
//! queue shares its messages); on NATS the group is the durable consumer.
//!
//! # Output
//!
//! A table for people on stdout by default; `--json` prints one JSON
//! document on stdout instead, for scripts (`| jq .total`). Errors,
//! prompts and progress go to stderr, so stdout holds only the answer.
//! `RUST_LOG=debug` shows the clients' logs on stderr.
//!
//! # Exit codes
//!
//! | code | meaning |
//! |---|---|
//! | 0 | done |
//! | 1 | the broker could not be reached, did not answer within `--timeout`, or the connection broke: trying again later may succeed |
//! | 2 | usage: wrong arguments or an unusable `--broker` URL |
//! | 3 | the broker refused or knows nothing of what was asked (unknown source, group, queue or consumer; a permission): trying again will not help until something changes |
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
//! end to end against the real brokers by `tests/cli.rs`.
#![warn(missing_docs)]

mod args;
mod broker;
mod failure;
mod lag;
mod output;

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser as _;

use crate::args::{Cli, Command, LagArgs};
use crate::broker::Broker;
use crate::failure::Failure;

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
    let url = match &cli.command {
        Command::Lag(args) => args.target.broker.clone(),
    };
    match runtime.block_on(run(cli)) {
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
    }
}

async fn lag(args: LagArgs) -> Result<(), Failure> {
    let target = &args.target;
    let broker = Broker::parse(&target.broker)?;
    let lags = lag::query(&broker, &target.source, &target.group, target.timeout).await?;
    let text = if target.json {
        output::lag_json(&broker.endpoint(), &target.source, &target.group, &lags)
    } else {
        output::lag_table(&lags)
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
