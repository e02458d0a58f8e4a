//! `hermes simulate`: a fault scenario on a simulated clock, closed loop.

use super::bad_input;
use anyhow::Context;
use hermes::config::Config;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct Args {
    /// The scenario file (see scenarios/).
    scenario: PathBuf,
    /// Use this config's thresholds (its `groups` are replaced by the
    /// scenario's channels) instead of the scenario's `[config]`.
    #[arg(long)]
    config: Option<PathBuf>,
    /// RNG seed (default: the scenario's).
    #[arg(long)]
    seed: Option<u64>,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    /// Write a self-contained HTML timeline of weight, state and score.
    #[arg(long)]
    timeline: Option<PathBuf>,
    /// Record every request event of the Hermes run (Avro container file).
    #[arg(long)]
    record: Option<PathBuf>,
    /// Write the effective Hermes config (for `hermes replay`).
    #[arg(long)]
    write_config: Option<PathBuf>,
    /// Write every alert of the Hermes run as JSON lines.
    #[arg(long)]
    alerts: Option<PathBuf>,
}

pub fn run(a: &Args) -> anyhow::Result<ExitCode> {
    let (text, sc) = super::read_scenario(&a.scenario)?;
    let (cfg_text, cfg) = effective_config(a, &text, &sc)?;
    if let Some(p) = &a.write_config {
        std::fs::write(p, &cfg_text).with_context(|| format!("writing {}", p.display()))?;
    }
    let seed = a.seed.unwrap_or(sc.seed);
    let mut recorded = Vec::new();
    let started = std::time::Instant::now();
    let (report, run) = hermes::sim::drill(
        &sc,
        Arc::new(cfg),
        seed,
        a.record.as_ref().map(|_| &mut recorded),
    );
    tracing::info!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        "simulation finished"
    );
    if let Some(p) = &a.record {
        let file = std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
        hermes::replay::write_events(std::io::BufWriter::new(file), &recorded)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.alerts {
        let mut lines = String::new();
        for alert in &run.alerts {
            lines.push_str(&serde_json::to_string(alert)?);
            lines.push('\n');
        }
        std::fs::write(p, lines).with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.timeline {
        std::fs::write(p, hermes::sim::report::timeline_html(&sc, &run, &report))
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", hermes::sim::report::table(&report));
    }
    Ok(ExitCode::SUCCESS)
}

/// The Hermes config the drill runs (its text and parsed), from `--config`
/// over the scenario's channels or from the scenario's own `[config]`;
/// problems are reported against the file the user wrote.
fn effective_config(
    a: &Args,
    scenario_text: &str,
    sc: &hermes::sim::scenario::Scenario,
) -> anyhow::Result<(String, Config)> {
    let user = match &a.config {
        Some(p) => Some((
            p.as_path(),
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
        )),
        None => None,
    };
    let overrides = match &user {
        Some((p, t)) => Some(
            t.parse::<toml::Table>()
                .map_err(|e| bad_input(format!("{}: not valid TOML: {e}", p.display())))?,
        ),
        None => None,
    };
    let cfg_text = sc
        .hermes_config_text(overrides.as_ref())
        .map_err(bad_input)?;
    let cfg = Config::from_toml(&cfg_text).map_err(|e| match &user {
        Some((p, t)) => anyhow::Error::new(e.relocated(t, "")).context(format!(
            "{} over {}'s channels",
            p.display(),
            a.scenario.display()
        )),
        None => anyhow::Error::new(e.relocated(scenario_text, "config."))
            .context(format!("{}'s [config]", a.scenario.display())),
    })?;
    Ok((cfg_text, cfg))
}
