//! `hermes ctl`: pins and freezes through an instance's control API.

use super::bad_input;
use super::control_client::{parse_duration_s, render_list, Client};
use anyhow::bail;
use hermes::service::overrides::Action as Override;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// An instance's HTTP endpoint (its `service.http_listen`).
    #[arg(
        long,
        global = true,
        default_value = "http://127.0.0.1:9464",
        env = "HERMES_URL"
    )]
    url: String,
    /// The control token (`service.control_token`).
    #[arg(
        long,
        global = true,
        env = "HERMES_CONTROL_TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
    /// A file holding the control token (its first line), so the token
    /// is neither on the command line nor in the environment.
    #[arg(long, global = true, conflicts_with = "token")]
    token_file: Option<PathBuf>,
    /// Who is asking (goes into the OVERRIDE alert; default: $USER).
    #[arg(long, global = true)]
    actor: Option<String>,
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand)]
pub enum Action {
    /// Pin a channel: drain it, hold a weight, or force it healthy.
    #[command(group(
        clap::ArgGroup::new("how")
            .required(true)
            .args(["drain", "weight", "healthy"])
    ))]
    Pin {
        channel: String,
        /// Weight 0 whatever its health.
        #[arg(long)]
        drain: bool,
        /// Hold this health weight factor (0..1).
        #[arg(long, allow_negative_numbers = true)]
        weight: Option<f64>,
        /// Full weight whatever its health.
        #[arg(long)]
        healthy: bool,
        /// Lapse after this long (90s, 30m, 2h, 1d; a unit is required);
        /// default: until cleared.
        #[arg(long = "for", value_parser = duration_s)]
        for_: Option<u64>,
        /// Why (goes into the OVERRIDE alert).
        #[arg(long)]
        reason: String,
    },
    /// Release a channel's pin.
    Unpin {
        channel: String,
        #[arg(long)]
        reason: String,
    },
    /// Freeze a group's weights as published (manual mode).
    Freeze {
        group: String,
        /// Lapse after this long (90s, 30m, 2h, 1d); default: until cleared.
        #[arg(long = "for", value_parser = duration_s)]
        for_: Option<u64>,
        #[arg(long)]
        reason: String,
    },
    /// Give a frozen group back to Hermes.
    Unfreeze {
        group: String,
        #[arg(long)]
        reason: String,
    },
    /// The overrides in force and recent clears.
    List {
        /// The stored JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// `--for` as clap reads it: a duration with its unit, in seconds.
fn duration_s(text: &str) -> Result<u64, String> {
    parse_duration_s(text).map_err(|e| e.to_string())
}

pub fn run(a: &Args) -> anyhow::Result<ExitCode> {
    let token = match &a.token_file {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .map_err(|e| bad_input(format!("--token-file {}: {e}", p.display())))?
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string(),
        ),
        None => a.token.clone(),
    };
    let actor = a
        .actor
        .clone()
        .or_else(|| std::env::var("USER").ok())
        .filter(|a| !a.trim().is_empty())
        .unwrap_or_else(|| "unknown".to_string());
    let client = Client::new(&a.url, token.filter(|t| !t.is_empty()), actor);
    let answer = match &a.action {
        Action::Pin {
            channel,
            drain,
            weight,
            healthy,
            for_,
            reason,
        } => {
            if let Some(w) = weight.filter(|w| !(0.0..=1.0).contains(w)) {
                return Err(bad_input(format!(
                    "--weight {w}: a health weight factor is within 0..1"
                )));
            }
            let how = match (drain, weight, healthy) {
                (true, _, _) => Override::Drain,
                (_, Some(w), _) => Override::Weight { weight: *w },
                (_, _, true) => Override::Healthy,
                _ => bail!("say how: --drain, --weight W or --healthy"),
            };
            client.set("channels", channel, how, reason, *for_)?
        }
        Action::Unpin { channel, reason } => client.clear("channels", channel, reason)?,
        Action::Freeze {
            group,
            for_,
            reason,
        } => client.set("groups", group, Override::Freeze, reason, *for_)?,
        Action::Unfreeze { group, reason } => client.clear("groups", group, reason)?,
        Action::List { json } => {
            let v = client.list()?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", render_list(&v));
            }
            return Ok(ExitCode::SUCCESS);
        }
    };
    println!("{}", serde_json::to_string(&answer)?);
    Ok(ExitCode::SUCCESS)
}
