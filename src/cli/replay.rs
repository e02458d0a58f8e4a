//! `hermes replay`: recorded request events through a config.

use anyhow::Context;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct Args {
    /// Events written by `hermes simulate --record` (or any Avro container
    /// file of request events).
    events: PathBuf,
    /// The config to try.
    #[arg(long)]
    config: PathBuf,
    #[arg(long)]
    json: bool,
}

pub fn run(a: &Args) -> anyhow::Result<ExitCode> {
    let cfg = match hermes::config::ConfigFile::from_file(&a.config) {
        Ok(f) => {
            for w in &f.warnings {
                eprintln!("{}: warning: {w}", a.config.display());
            }
            f.policy
        }
        Err(e) => {
            eprintln!("{}: {e}", a.config.display());
            return Ok(ExitCode::from(2));
        }
    };
    let bytes =
        std::fs::read(&a.events).with_context(|| format!("reading {}", a.events.display()))?;
    let report = hermes::replay::replay(&bytes, Arc::new(cfg)).map_err(anyhow::Error::msg)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", hermes::replay::table(&report));
    }
    Ok(ExitCode::SUCCESS)
}
