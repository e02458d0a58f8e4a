//! `hermes catalogue`: the `[[groups]]` catalogue of `hermes.toml` written
//! from a gateway's own config, so the two cannot drift apart.

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// A LiteLLM config.yaml (the Proxy's, or a Router's model_list):
    /// model groups become route groups, deployments channels
    /// (docs/integration.md#the-litellm-proxy).
    #[arg(long, value_name = "CONFIG_YAML")]
    litellm: PathBuf,
    /// Write the catalogue here instead of standard output.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

pub fn run(a: &Args) -> anyhow::Result<ExitCode> {
    let deployments = match super::litellm_config::read(&a.litellm) {
        Ok(d) => d,
        Err(problems) => {
            for p in problems {
                eprintln!("{}: {p}", a.litellm.display());
            }
            return Ok(ExitCode::from(2));
        }
    };
    let text = format!(
        "# Route groups and channels from {} (`hermes catalogue --litellm`):\n\
         # regenerate it when the LiteLLM config changes.\n\n{}",
        a.litellm.display(),
        super::litellm_config::catalogue_toml(&deployments)
    );
    match &a.out {
        Some(path) => std::fs::write(path, text)?,
        None => print!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}
