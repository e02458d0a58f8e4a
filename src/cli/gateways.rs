//! `hermes gateways`: the demo's simulated gateways against a real cluster.

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Kafka bootstrap servers.
    #[arg(long)]
    bootstrap: String,
    /// Redis holding the weights (Hermes' `redis.url`).
    #[arg(long)]
    redis: String,
    /// The scenario: channels, traffic, faults (at their times from the
    /// start). Its group and channels must be in Hermes' config.
    #[arg(long)]
    scenario: PathBuf,
    #[arg(long, default_value = "hermes.requests")]
    topic: String,
    /// Wall-clock seconds to run; 0: until interrupted.
    #[arg(long, default_value_t = 0)]
    seconds: u64,
}

pub fn run(a: &Args) -> anyhow::Result<ExitCode> {
    let (_, scenario) = super::read_scenario(&a.scenario)?;
    let sent = super::async_runtime()?.block_on(hermes::demo::run_gateways(
        hermes::demo::GatewaysOptions {
            scenario,
            bootstrap: a.bootstrap.clone(),
            topic: a.topic.clone(),
            redis_url: a.redis.clone(),
            seconds: a.seconds,
        },
    ))?;
    println!("{sent} events produced");
    Ok(ExitCode::SUCCESS)
}
