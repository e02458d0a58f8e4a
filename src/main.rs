//! The `hermes` command line: the imperative shell around the engine.

use anyhow::Context;
use clap::{Parser, Subcommand};
use hermes::config::Config;
use std::path::PathBuf;
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

#[derive(Subcommand)]
enum Command {
    /// Validate a config file; every problem is listed with the key at fault.
    CheckConfig {
        /// The TOML config file.
        file: PathBuf,
    },
}

fn check_config(file: &std::path::Path) -> anyhow::Result<ExitCode> {
    match Config::from_file(file) {
        Ok(cfg) => {
            let channels = cfg.channels().count();
            println!(
                "{}: ok ({} route groups, {} channels)",
                file.display(),
                cfg.groups.len(),
                channels
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
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            Ok(ExitCode::from(2))
        }
    }
}

fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    match &cli.command {
        Command::CheckConfig { file } => check_config(file).context("check-config"),
    }
}
