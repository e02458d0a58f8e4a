//! `hermes demo`: the whole loop on this machine with nothing installed.

use anyhow::Context;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Wall-clock seconds to run.
    #[arg(long, default_value_t = 180)]
    seconds: u64,
    /// Publish weights to this Redis (e.g. redis://127.0.0.1:6379/) and
    /// have the gateways read them from there.
    #[arg(long)]
    redis: Option<String>,
    /// Another scenario for the gateways and channels (default:
    /// scenarios/demo.toml, built in).
    #[arg(long)]
    scenario: Option<PathBuf>,
    /// Append status tables instead of redrawing the screen.
    #[arg(long)]
    plain: bool,
    /// Also serve Prometheus `/metrics` and `/status` on this address
    /// (e.g. 127.0.0.1:9464).
    #[arg(long)]
    http: Option<String>,
}

pub fn run(a: &Args) -> anyhow::Result<ExitCode> {
    use std::io::IsTerminal;
    let scenario = match &a.scenario {
        Some(p) => super::read_scenario(p)?.1,
        None => {
            hermes::sim::scenario::Scenario::from_toml(include_str!("../../scenarios/demo.toml"))
                .map_err(anyhow::Error::msg)
                .context("the built-in demo scenario")?
        }
    };
    let summary =
        super::async_runtime()?.block_on(hermes::demo::run(hermes::demo::DemoOptions {
            scenario,
            seconds: a.seconds,
            redis_url: a.redis.clone(),
            redraw: !a.plain && std::io::stdout().is_terminal(),
            show_status: true,
            garbage_every: 500,
            http_listen: a.http.clone(),
            http_bound: None,
            commands: Vec::new(),
            config_path: None,
        }))?;
    println!(
        "\ndemo finished: {} events produced ({} garbage records), {} consumed, {} applied, {} dead-lettered, {} alerts produced, {} left uncommitted at stop, weight versions {:?}\nfinal states: {:?}",
        summary.produced,
        summary.garbage_sent,
        summary.consumed,
        summary.applied,
        summary.dead_lettered,
        summary.alerts_produced,
        summary.uncommitted_at_stop,
        summary.snapshot_versions,
        summary.final_states
    );
    Ok(ExitCode::SUCCESS)
}
