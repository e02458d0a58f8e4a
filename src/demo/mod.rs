//! `hermes demo`: the whole service on one machine with nothing installed.
//!
//! - librdkafka's in-process mock cluster carries the request, alert,
//!   dead-letter and health topics;
//! - the service itself (`service::Service`, the same loops `hermes run`
//!   runs) consumes, dead-letters, evaluates, reports health, plans and
//!   publishes, with the weights in process, or in Redis through the fenced
//!   Lua write when `--redis` is given;
//! - simulated gateways (the simulator's channel model, on the wall clock)
//!   produce Avro request events keyed by channel, route every request by
//!   the published weights (their static trust-tier table until the first
//!   snapshot: Hermes publishes nothing before warm-up), and now and then
//!   send an undecodable record;
//! - a status table (the service's `/status` view) refreshes every second.
//!
//! `gateways` holds the simulated gateways (also `hermes gateways`).

use crate::alert::AlertEvent;
use crate::config::{ConfigFile, KafkaConfig};
use crate::service::metrics::Metrics;
use crate::service::Service;
use crate::sim::scenario::Scenario;
use anyhow::{anyhow, Context};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, Producer};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
mod gateways;
pub use gateways::*;

/// Demo settings.
pub struct DemoOptions {
    pub scenario: Scenario,
    /// Wall-clock seconds to run.
    pub seconds: u64,
    /// Publish to (and read weights from) this Redis instead of in process.
    pub redis_url: Option<String>,
    /// Redraw the status table in place (ANSI) instead of appending it.
    pub redraw: bool,
    /// Print the status table every second.
    pub show_status: bool,
    /// One garbage record per this many events (0: none).
    pub garbage_every: u64,
    /// Serve `/metrics` and `/status` here (ip:port; port 0 picks one).
    pub http_listen: Option<String>,
    /// Told where the HTTP API listens once it does (a caller that asked
    /// for port 0 learns the port).
    pub http_bound: Option<std::sync::mpsc::Sender<std::net::SocketAddr>>,
    /// Operator commands to send the service, each at this many seconds
    /// into the run (a scripted override: a pin, a freeze).
    pub commands: Vec<(
        u64,
        crate::service::overrides::Target,
        crate::service::overrides::Request,
    )>,
    /// Run on this config file instead of the scenario's, and reload it
    /// when it changes (`service.reload_check_ms`), as `hermes run` does:
    /// the soak benchmark edits it while the service runs. Its `[kafka]`
    /// brokers and topics are replaced by the mock cluster's.
    pub config_path: Option<std::path::PathBuf>,
}

/// What a demo run did, for its caller and tests.
#[derive(Debug, Clone, Default)]
pub struct DemoSummary {
    pub produced: u64,
    pub consumed: u64,
    pub applied: u64,
    pub dead_lettered: u64,
    pub duplicates: u64,
    pub too_late: u64,
    pub garbage_sent: u64,
    pub alerts_produced: u64,
    pub final_states: BTreeMap<String, String>,
    pub snapshot_versions: Vec<u64>,
    /// Alerts read back from the alert topic that decode as `AlertEvent`s,
    /// and their transitions (channel, from, to).
    pub alerts_read_back: u64,
    pub transitions_read_back: Vec<(String, String, String)>,
    /// OVERRIDE alerts read back: (channel, or the group for a freeze;
    /// reason; message, which names the operator and their reason).
    pub overrides_read_back: Vec<(String, String, String)>,
    /// Records read back from the dead-letter topic with a `reason` header.
    pub dead_letters_read_back: u64,
    /// Alerts read back by kind, and those that page.
    pub alert_kinds_read_back: BTreeMap<String, u64>,
    pub pages_read_back: u64,
    /// Request records the service had consumed but not committed when it
    /// stopped (each partition's end minus the group's committed offset):
    /// whoever takes the partitions over would handle them again.
    pub uncommitted_at_stop: u64,
}

/// Reads a topic from the start until `expected` records or the timeout.
async fn read_back(
    bootstrap: &str,
    topic: &str,
    expected: u64,
) -> anyhow::Result<Vec<rdkafka::message::OwnedMessage>> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("hermes-demo-readback-{topic}"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()?;
    consumer.subscribe(&[topic])?;
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while (out.len() as u64) < expected && Instant::now() < deadline {
        if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(500), consumer.recv()).await {
            out.push(m.detach());
        }
    }
    Ok(out)
}

fn status_table(
    metrics: &Metrics,
    overrides: &crate::service::overrides::Overrides,
    produced: u64,
    elapsed_s: f64,
    versions: &[u64],
) -> String {
    let mut out = format!(
        "hermes demo  t={elapsed_s:>5.0}s  events produced {produced}  weight versions seen by the gateways {}\n{}",
        versions.len(),
        metrics.status_view(overrides).render()
    );
    let recent = metrics.recent_alerts();
    if !recent.is_empty() {
        out.push_str("\nrecent alerts (newest last)\n");
        for line in recent {
            out.push_str("  ");
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

/// Runs the demo; returns what happened.
pub async fn run(opts: DemoOptions) -> anyhow::Result<DemoSummary> {
    let sc = Arc::new(opts.scenario.clone());
    let (file, mock) = demo_config(&opts, &sc)?;
    let bootstrap = mock.bootstrap_servers();
    let topics = file.runtime.kafka.clone();
    let (store, weights) = weight_source(&file.policy, opts.redis_url.as_deref())?;
    let service = Service::start(file, store, opts.config_path.clone()).await?;
    if let (Some(tx), Some(addr)) = (&opts.http_bound, service.http_addr) {
        let _ = tx.send(addr);
    }
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("linger.ms", "5")
        .create()
        .context("creating the gateways' producer")?;
    let counters: Arc<Counters> = Arc::new(Default::default());
    let service = drive(&opts, &sc, &topics, &producer, &weights, service, &counters).await?;
    let _ = producer.flush(Duration::from_secs(5));
    let mut summary = DemoSummary {
        produced: counters.0.load(std::sync::atomic::Ordering::Relaxed),
        garbage_sent: counters.1.load(std::sync::atomic::Ordering::Relaxed),
        ..DemoSummary::default()
    };
    let m = service.metrics.clone();
    drain_and_stop(service, summary.produced + summary.garbage_sent).await?;
    account(&m, &mut summary);
    summary.snapshot_versions = weights
        .versions
        .read()
        .map(|v| v.clone())
        .unwrap_or_default();
    summary.uncommitted_at_stop = {
        let (bootstrap, topics) = (bootstrap.clone(), topics.clone());
        tokio::task::spawn_blocking(move || uncommitted(&bootstrap, &topics)).await??
    };
    read_outputs(&bootstrap, &topics, &mut summary).await?;
    // Clients before the cluster they talk to, or librdkafka reports every
    // broker down on the way out.
    drop(producer);
    drop(mock);
    Ok(summary)
}

/// The demo's config (the user's file, or the scenario's) pointed at a
/// fresh in-process cluster with the topics it needs.
fn demo_config(
    opts: &DemoOptions,
    sc: &Scenario,
) -> anyhow::Result<(
    ConfigFile,
    MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
)> {
    let mut file = match &opts.config_path {
        Some(path) => {
            ConfigFile::from_file(path).map_err(|e| anyhow!("{}: {e}", path.display()))?
        }
        None => {
            let cfg_text = sc.hermes_config_text(None).map_err(|e| anyhow!(e))?;
            ConfigFile::from_toml(&cfg_text).map_err(|e| anyhow!("demo config: {e}"))?
        }
    };
    let mock = MockCluster::new(1).context("starting the in-process Kafka mock cluster")?;
    let rt = &mut file.runtime;
    for (topic, partitions) in [
        (&rt.kafka.request_topic, 3),
        (&rt.kafka.alert_topic, 1),
        (&rt.kafka.dead_letter_topic, 1),
        (&rt.kafka.health_topic, 1),
    ] {
        mock.create_topic(topic, partitions, 1)?;
    }
    rt.kafka.brokers = mock.bootstrap_servers();
    rt.kafka.session_timeout_ms = 6_000;
    rt.service.http_listen = opts.http_listen.clone().unwrap_or_default();
    if opts.config_path.is_none() {
        rt.service.reload_check_ms = 0;
    }
    if let Some(url) = &opts.redis_url {
        rt.redis.url = url.clone();
    }
    Ok((file, mock))
}

/// Lets the service consume the `expected` records produced (up to 10 s),
/// then stops it (it commits).
async fn drain_and_stop(service: Service, expected: u64) -> anyhow::Result<()> {
    let m = service.metrics.clone();
    let deadline = Instant::now() + Duration::from_secs(10);
    while m.events_consumed.load(std::sync::atomic::Ordering::Relaxed) < expected
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    service.stop().await
}

/// What the stopped service counted, into the summary.
fn account(m: &Metrics, summary: &mut DemoSummary) {
    use std::sync::atomic::Ordering::Relaxed;
    summary.consumed = m.events_consumed.load(Relaxed);
    summary.applied = m.events_applied.load(Relaxed) + m.events_replayed.load(Relaxed);
    summary.dead_lettered = m.dead_letters_total();
    summary.duplicates = m.duplicates.load(Relaxed);
    summary.too_late = m.too_late.load(Relaxed);
    summary.alerts_produced = m.alerts_produced.load(Relaxed);
    summary.final_states = m.channel_states();
}

/// The request records past the consumer group's committed offsets.
fn uncommitted(bootstrap: &str, topics: &KafkaConfig) -> anyhow::Result<u64> {
    use rdkafka::consumer::BaseConsumer;
    use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", &topics.group_id)
        .create()
        .context("creating the offsets reader")?;
    let timeout = Duration::from_secs(5);
    let meta = c.fetch_metadata(Some(&topics.request_topic), timeout)?;
    let mut tpl = TopicPartitionList::new();
    for t in meta.topics() {
        for p in t.partitions() {
            tpl.add_partition(&topics.request_topic, p.id());
        }
    }
    let mut behind = 0;
    for e in c.committed_offsets(tpl, timeout)?.elements() {
        let (_, end) = c.fetch_watermarks(&topics.request_topic, e.partition(), timeout)?;
        let committed = match e.offset() {
            Offset::Offset(o) => o,
            _ => 0,
        };
        behind += (end - committed).max(0) as u64;
    }
    Ok(behind)
}

/// What a downstream consumer of the output topics sees: the alerts (and
/// their transitions and overrides) and the dead letters with a reason.
async fn read_outputs(
    bootstrap: &str,
    topics: &KafkaConfig,
    summary: &mut DemoSummary,
) -> anyhow::Result<()> {
    for msg in read_back(bootstrap, &topics.alert_topic, summary.alerts_produced).await? {
        if let Some(a) = msg.payload().and_then(|p| AlertEvent::from_record(p).ok()) {
            summary.alerts_read_back += 1;
            summary.pages_read_back += a.pages() as u64;
            *summary
                .alert_kinds_read_back
                .entry(a.kind.as_str().to_string())
                .or_default() += 1;
            if a.kind == crate::alert::AlertKind::Override {
                let who = a
                    .channel_id
                    .clone()
                    .unwrap_or_else(|| a.route_group.clone());
                summary
                    .overrides_read_back
                    .push((who, a.reason.clone(), a.message.clone()));
            }
            if a.kind == crate::alert::AlertKind::Transition {
                summary.transitions_read_back.push((
                    a.channel_id.unwrap_or_default(),
                    a.from_state.unwrap_or_default(),
                    a.to_state.unwrap_or_default(),
                ));
            }
        }
    }
    use rdkafka::message::Headers;
    let dead = read_back(bootstrap, &topics.dead_letter_topic, summary.dead_lettered).await?;
    for msg in dead {
        let has_reason = msg.headers().is_some_and(|h| {
            h.iter()
                .any(|x| x.key == "reason" && x.value.is_some_and(|v| !v.is_empty()))
        });
        summary.dead_letters_read_back += has_reason as u64;
    }
    Ok(())
}
