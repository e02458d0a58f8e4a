//! `hermes run`: the service.

use super::LogFormat;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// The TOML config file.
    #[arg(long, short)]
    config: PathBuf,
    /// Log lines as text for people, or one JSON object per line for a
    /// log pipeline. Colours only when stderr is a terminal.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

pub fn run(a: &Args) -> anyhow::Result<ExitCode> {
    super::async_runtime()?.block_on(hermes::service::run(&a.config))?;
    Ok(ExitCode::SUCCESS)
}
