//! `hermes report`: the weekly channel report from the alert stream.

use super::bad_input;
use anyhow::{bail, Context};
use hermes::channel_report::{build, read_json_lines};
use hermes::config::KafkaConfig;
use hermes::wall_clock::parse_utc_ms;
use rdkafka::Message;
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
    let (alerts, bad) = read_alerts(&kafka, &topic, Duration::from_secs(60))?;
    if bad > 0 {
        eprintln!("{bad} records on {topic} did not decode as alerts; left out");
    }
    Ok(alerts)
}

/// Every alert on `topic`, from the beginning of each partition to the high
/// watermark it had when the read began (the alert topic is low-volume;
/// offsets-for-times is not relied on: tansu and the mock cluster cannot be
/// trusted with it). Returns the alerts and how many records did not
/// decode. A plain assignment: no consumer group is joined or committed.
fn read_alerts(
    kafka: &KafkaConfig,
    topic: &str,
    timeout: Duration,
) -> anyhow::Result<(Vec<hermes::alert::AlertEvent>, usize)> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let c: BaseConsumer = hermes::service::kafka::client_config(kafka)
        .set("group.id", "hermes-report")
        .set("enable.auto.commit", "false")
        .create()?;
    let meta = c.fetch_metadata(Some(topic), timeout)?;
    let partitions: Vec<i32> = meta
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        anyhow::bail!("topic {topic} has no partitions (does it exist?)");
    }
    let mut tpl = rdkafka::TopicPartitionList::new();
    let mut ends = std::collections::BTreeMap::new();
    for p in &partitions {
        let (low, high) = c.fetch_watermarks(topic, *p, timeout)?;
        if high > low {
            tpl.add_partition_offset(topic, *p, rdkafka::Offset::Beginning)?;
            ends.insert(*p, high);
        }
    }
    let (mut alerts, mut undecodable) = (Vec::new(), 0);
    if ends.is_empty() {
        return Ok((alerts, undecodable));
    }
    c.assign(&tpl)?;
    let deadline = std::time::Instant::now() + timeout;
    while !ends.is_empty() {
        if std::time::Instant::now() > deadline {
            anyhow::bail!(
                "reading {topic}: partitions {:?} not read to their end in {timeout:?}",
                ends.keys().collect::<Vec<_>>()
            );
        }
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                match m.payload().map(hermes::alert::AlertEvent::from_record) {
                    Some(Ok(a)) => alerts.push(a),
                    _ => undecodable += 1,
                }
                if ends
                    .get(&m.partition())
                    .is_some_and(|end| m.offset() + 1 >= *end)
                {
                    ends.remove(&m.partition());
                }
            }
            Some(Err(e)) => tracing::warn!(error = %e, "reading {topic}"),
            None => {}
        }
    }
    Ok((alerts, undecodable))
}
