//! `hermes status`: the fleet as Redis holds it, no instance needed.

use anyhow::{bail, Context};
use hermes::service::status::StatusView;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Redis URL (default: the config's `redis.url`).
    #[arg(long)]
    redis: Option<String>,
    /// Read `redis.url` from this config file.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// One JSON object instead of tables.
    #[arg(long)]
    json: bool,
}

pub fn run(a: &Args) -> anyhow::Result<ExitCode> {
    let url = match (&a.redis, &a.config) {
        (Some(u), _) => u.to_string(),
        (None, Some(p)) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            let file = hermes::config::ConfigFile::from_toml(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
            file.runtime.redis.url.clone()
        }
        (None, None) => bail!("say where the fleet is: --redis URL or --config FILE"),
    };
    if url.is_empty() {
        bail!("the config has no redis.url; pass --redis URL");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let view = runtime.block_on(StatusView::from_redis(&url))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&view)?);
    } else {
        print!("{}", view.render());
    }
    Ok(ExitCode::SUCCESS)
}
