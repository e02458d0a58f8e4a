//! The `hermes` command line: one file per command, each with its
//! arguments and its `run`; this module parses, sets up logging, dispatches
//! and turns an error into the exit-code convention.

mod bench;
mod catalogue;
mod check_config;
mod control_client;
mod ctl;
mod demo;
mod gateways;
mod litellm_config;
mod replay;
mod report;
mod run;
mod simulate;
mod status;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "hermes",
    version,
    about = "Keeps LLM gateways routing around sick upstreams"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the service: consume request events from Kafka, publish weights
    /// to Redis and alerts to Kafka (brokers, topics and Redis come from the
    /// config; see hermes.example.toml). The config is reloaded on change.
    Run(run::Args),
    /// The fleet as Redis holds it, no instance needed: per group the
    /// writer epoch, snapshot version and age; per channel the state, score
    /// and its top signals, weights per class and any operator pin.
    Status(status::Args),
    /// The channel report (incident 003's weekly review) from the alert stream:
    /// per channel availability, incidents (time to drain, time drained,
    /// time to recover, worst signals), time in each state and overrides;
    /// written as PREFIX.md and a self-contained PREFIX.html.
    Report(report::Args),
    /// Steer Hermes through an instance's control API: pin a channel,
    /// freeze a group, clear, list. Every change is stored in Redis (it
    /// survives restarts and takeovers), reaches whichever instance owns the
    /// channel or writes the group, and is recorded as an OVERRIDE alert
    /// naming the actor and the reason.
    Ctl(ctl::Args),
    /// Validate a config file as `hermes run` would; every problem is
    /// listed with the key at fault.
    CheckConfig(check_config::Args),
    /// Write the route groups and channels of hermes.toml from a gateway's
    /// own config (a LiteLLM config.yaml): one catalogue, not two.
    Catalogue(catalogue::Args),
    /// Run the whole loop on this machine with nothing installed: an
    /// in-process Kafka mock cluster, simulated gateways producing Avro
    /// events (a fault after a minute), the engine and scheduler consuming
    /// them, weights published in process (or to Redis), a live status table.
    Demo(demo::Args),
    /// The demo's simulated gateways against a real cluster and Redis: the
    /// scenario's traffic as Avro events to the request topic, routed by
    /// the weights Hermes publishes (a traffic source for the compose
    /// stack, or for trying a config against a real broker).
    Gateways(gateways::Args),
    /// Replay a fault scenario on a simulated clock through the engine and
    /// scheduler, closed loop, and report time to detect / drain / recover,
    /// flaps, false drains, harm and cost.
    Simulate(simulate::Args),
    /// Run recorded request events (Avro container file) through a config and
    /// report the decisions it would have made.
    Replay(replay::Args),
    /// Measure the request path (decode, dedup, engine, outputs) at steady
    /// state on one thread, for capacity planning: the windows are filled
    /// first (the long window of event time, not timed), then `--seconds`
    /// of event time are measured. Prints events/s, decode-only events/s,
    /// resident bytes per channel and the longest pause (wall and CPU time).
    Bench(bench::Args),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // The service logs its decisions; the interactive commands only warnings.
    let (default_level, format) = match &cli.command {
        Command::Run(a) => ("info", a.log_format),
        Command::Gateways(_) => ("info", LogFormat::Text),
        _ => ("warn", LogFormat::Text),
    };
    init_logs(default_level, format);
    let done = match &cli.command {
        Command::Run(a) => run::run(a),
        Command::Status(a) => status::run(a),
        Command::Report(a) => report::run(a),
        Command::Ctl(a) => ctl::run(a),
        Command::CheckConfig(a) => check_config::run(a),
        Command::Catalogue(a) => catalogue::run(a),
        Command::Demo(a) => demo::run(a),
        Command::Gateways(a) => gateways::run(a),
        Command::Simulate(a) => simulate::run(a),
        Command::Replay(a) => replay::run(a),
        Command::Bench(a) => bench::run(a),
    };
    match done {
        Ok(code) => code,
        Err(e) => {
            // The error and its causes, each said once (an HTTP error names
            // its URL again in every layer).
            let mut said = e.to_string();
            for cause in e.chain().skip(1) {
                let c = cause.to_string();
                if !said.contains(&c) {
                    said.push_str(": ");
                    said.push_str(&c);
                }
            }
            eprintln!("error: {said}");
            exit_code(&e)
        }
    }
}

/// Logs to stderr: text (colours only on a terminal) or JSON lines.
fn init_logs(default_level: &str, format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| default_level.into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().with_current_span(false).init(),
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
    }
}

/// Input a person must fix (a scenario file, a date, an argument): exit 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct BadInput(String);

fn bad_input(msg: impl Into<String>) -> anyhow::Error {
    BadInput(msg.into()).into()
}

/// One exit-code convention for every command: 0 done, 2 for a usage or
/// input error (arguments, which clap reports with 2 as well; a config,
/// scenario or date that does not hold), 1 for a failure while running (a
/// dependency down, a file that cannot be written).
fn exit_code(e: &anyhow::Error) -> ExitCode {
    let input = e.chain().any(|c| {
        c.is::<BadInput>()
            || c.is::<hermes::config::ConfigError>()
            || matches!(
                c.downcast_ref::<control_client::CtlError>(),
                Some(control_client::CtlError::Usage(_))
            )
    });
    ExitCode::from(if input { 2 } else { 1 })
}

/// A multi-threaded async runtime for a command that runs the service or
/// the demo.
fn async_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    use anyhow::Context;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// A scenario file, its problems reported as input errors.
fn read_scenario(
    path: &std::path::Path,
) -> anyhow::Result<(String, hermes::sim::scenario::Scenario)> {
    use anyhow::Context;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let sc = hermes::sim::scenario::Scenario::from_toml(&text)
        .map_err(|e| bad_input(format!("{}: {e}", path.display())))?;
    Ok((text, sc))
}
