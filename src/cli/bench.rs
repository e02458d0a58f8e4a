//! `hermes bench`: the request path at steady state, for capacity planning.

use anyhow::Context;
use hermes::bench::{BenchOptions, BenchReport, Mix};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Channels (in route groups of ten).
    #[arg(long, default_value_t = 1000)]
    channels: usize,
    /// Mean events per second per channel.
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    /// Event-time seconds measured after the warm-up.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Event-time seconds of warm-up (default: the long window).
    #[arg(long)]
    warmup: Option<u64>,
    /// Skewed traffic (Zipf: the busiest 1 % of channels carry about
    /// half) instead of the same rate everywhere.
    #[arg(long)]
    skewed: bool,
    /// Gateways sending the traffic, each event from one at random.
    #[arg(long, default_value_t = 1)]
    gateways: usize,
    /// How far apart the gateways' clocks are (ms), spread evenly:
    /// a channel's events arrive out of event-time order by up to this
    /// much, as they do from a real fleet (e.g. `--gateways 8
    /// --clock-spread-ms 3500`). Needs two gateways or more.
    #[arg(long, default_value_t = 0)]
    clock_spread_ms: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Use this config's policy (`[engine]` and the rest; its groups
    /// are replaced by the generated ones) instead of the defaults.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Split the channels over this many partitions and compare one
    /// thread with `--threads` (each thread owning its partitions, as
    /// request loops do).
    #[arg(long)]
    partitions: Option<usize>,
    /// Threads for `--partitions` (default: one per core).
    #[arg(long, requires = "partitions")]
    threads: Option<usize>,
}

pub fn run(a: &Args) -> anyhow::Result<ExitCode> {
    let base_config = match &a.config {
        Some(p) => {
            Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?)
        }
        None => None,
    };
    let opts = BenchOptions {
        base_config,
        channels: a.channels,
        rate: a.rate,
        seconds: a.seconds,
        warmup_seconds: a.warmup,
        mix: if a.skewed { Mix::Skewed } else { Mix::Uniform },
        gateways: a.gateways,
        clock_spread_ms: a.clock_spread_ms,
        seed: a.seed,
    };
    if let Some(partitions) = a.partitions {
        let threads = a
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let report = hermes::bench::scaling(&opts, partitions, threads)?;
        if a.json {
            println!("{}", serde_json::to_string(&report)?);
        } else {
            println!("{}", report.table());
        }
        return Ok(ExitCode::SUCCESS);
    }
    let report = hermes::bench::run(&opts)?;
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("{}\n{}", BenchReport::HEADER, report.line());
        if let Some(heap) = report.heap_lines() {
            println!("{heap}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
