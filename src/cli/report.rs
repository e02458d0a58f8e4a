//! `hermes report`: the weekly channel report from the alert stream.

use super::bad_input;
use anyhow::{bail, Context};
use hermes::channel_report::{build, read_json_lines};
use hermes::config::KafkaConfig;
use hermes::wall_clock::parse_utc_ms;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// Alerts as JSON lines (`hermes simulate --alerts`); otherwise the
    /// alert topic is read.
    #[arg(long)]
    alerts: Option<PathBuf>,
    /// The config: its channels are all reported (quiet ones too), and
    /// without --alerts its `[kafka]` section says where the alerts are.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Brokers to read the alert topic from (instead of a config).
    #[arg(long)]
    bootstrap: Option<String>,
    /// The alert topic (default: the config's, else hermes.alerts).
    #[arg(long)]
    topic: Option<String>,
    /// Start of the period: 2026-11-24, 2026-11-24T08:00:00Z or epoch ms
    /// (default: 7 days before --to).
    #[arg(long)]
    from: Option<String>,
    /// End of the period (default: now).
    #[arg(long)]
    to: Option<String>,
    /// Output path prefix: PREFIX.md and PREFIX.html.
    #[arg(long, default_value = "hermes-report")]
    out: PathBuf,
}

pub fn run(a: &Args) -> anyhow::Result<ExitCode> {
    let to = match &a.to {
        Some(t) => parse_utc_ms(t).map_err(bad_input)?,
        None => hermes::wall_clock::now_ms(),
    };
    let from = match &a.from {
        Some(t) => parse_utc_ms(t).map_err(bad_input)?,
        None => to - 7 * 86_400_000,
    };
    if from >= to {
        bail!("--from must be before --to");
    }
    let file = a
        .config
        .as_ref()
        .map(|p| hermes::config::ConfigFile::from_file(p).map_err(|e| anyhow::anyhow!("{e}")))
        .transpose()?;
    let catalogue: Vec<(String, String)> = file
        .iter()
        .flat_map(|f| f.policy.groups.iter())
        .flat_map(|g| g.channels.iter().map(move |c| (c.id.clone(), g.id.clone())))
        .collect();
    let alerts = match &a.alerts {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            read_json_lines(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?
        }
        None => from_topic(a, file.as_ref())?,
    };
    let r = build(&alerts, from, to, &catalogue);
    let md = a.out.with_extension("md");
    let html = a.out.with_extension("html");
    std::fs::write(&md, r.markdown()).with_context(|| format!("writing {}", md.display()))?;
    std::fs::write(&html, r.html()).with_context(|| format!("writing {}", html.display()))?;
    println!(
        "{} alerts, {} channels: wrote {} and {}",
        alerts.len(),
        r.channels.len(),
        md.display(),
        html.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// The alerts on the topic the arguments or the config name.
fn from_topic(
    a: &Args,
    file: Option<&hermes::config::ConfigFile>,
) -> anyhow::Result<Vec<hermes::alert::AlertEvent>> {
    let mut kafka = match file {
        Some(f) => f.runtime.kafka.clone(),
        None => KafkaConfig::default(),
    };
    if let Some(b) = &a.bootstrap {
        kafka.brokers = b.to_string();
    }
    if kafka.brokers.is_empty() {
        bail!("say where the alerts are: --alerts FILE, --config FILE or --bootstrap BROKERS");
    }
    let topic = a.topic.clone().unwrap_or(kafka.alert_topic.clone());
    let (alerts, bad) = hermes::service::read_alerts(&kafka, &topic, Duration::from_secs(60))?;
    if bad > 0 {
        eprintln!("{bad} records on {topic} did not decode as alerts; left out");
    }
    Ok(alerts)
}
