//! `hermes check-config`: a config file validated as `hermes run` would.

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// The TOML config file.
    file: PathBuf,
    /// Only what the engine needs (a config for `simulate` or `replay`):
    /// skip the checks only `hermes run` makes (brokers, Redis URL).
    #[arg(long)]
    engine_only: bool,
    /// The gateway's own config (a LiteLLM config.yaml): warn about each
    /// deployment Hermes does not know and each channel the gateway never
    /// sends to.
    #[arg(long, value_name = "CONFIG_YAML")]
    gateway: Option<PathBuf>,
}

pub fn run(a: &Args) -> anyhow::Result<ExitCode> {
    let file = &a.file;
    let checked = hermes::config::ConfigFile::from_file(file)
        .map_err(|e| e.to_string())
        .and_then(|f| {
            if !a.engine_only {
                hermes::service::check_runnable(&f.runtime).map_err(|e| {
                    format!("{e} (--engine-only skips the checks only `hermes run` makes)")
                })?;
            }
            Ok(f)
        });
    let parsed = match checked {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            return Ok(ExitCode::from(2));
        }
    };
    for w in &parsed.warnings {
        eprintln!("{}: warning: {w}", file.display());
    }
    let cfg = parsed.policy;
    if let Some(gw) = &a.gateway {
        match super::litellm_config::read(gw) {
            Ok(deployments) => {
                for w in super::litellm_config::compare(&deployments, &cfg) {
                    eprintln!("{}: warning: {w}", gw.display());
                }
            }
            Err(problems) => {
                for p in problems {
                    eprintln!("{}: {p}", gw.display());
                }
                return Ok(ExitCode::from(2));
            }
        }
    }
    println!(
        "{}: ok ({} route groups, {} channels)",
        file.display(),
        cfg.groups.len(),
        cfg.channels().count()
    );
    for g in &cfg.groups {
        for c in &g.channels {
            println!(
                "  {:<12} {:<16} tier={:<4} price/1k={:<8} capacity_rps={:<8} initial_weight={}",
                g.id,
                c.id,
                c.tier.as_str(),
                c.price_per_1k_tokens,
                c.capacity_rps,
                c.initial_weight
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
