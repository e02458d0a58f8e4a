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

use crate::alert::AlertEvent;
use crate::client::{ClientOptions, WeightClient};
use crate::codec::Encoder;
use crate::config::{Config, ConfigFile, KafkaConfig};
use crate::event::Dispatch;
use crate::publish::{InProcessStore, WeightSnapshot};
use crate::routing::{Pick, RoutingTable};
use crate::service::metrics::Metrics;
use crate::service::{Service, Store};
use crate::sim::scenario::{Behavior, Scenario};
use crate::sim::{answer, Request, Rng};
use anyhow::{anyhow, Context};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

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

/// Where gateways get their routing table from: the service's weight store
/// (in process or Redis), with the static trust-tier table from the config
/// as the fallback until the first snapshot (what a real gateway's own
/// config gives it: Hermes never publishes before warm-up).
#[derive(Clone)]
struct WeightSource {
    group: String,
    store: StoreReader,
    fallback: Arc<RoutingTable>,
    current: Arc<RwLock<Option<Arc<RoutingTable>>>>,
    versions: Arc<RwLock<Vec<u64>>>,
}

#[derive(Clone)]
enum StoreReader {
    InProcess(Arc<InProcessStore>),
    Redis(WeightClient),
}

impl WeightSource {
    fn table(&self) -> Arc<RoutingTable> {
        let latest = match &self.store {
            StoreReader::InProcess(s) => s.get(&self.group),
            StoreReader::Redis(c) => c.table().map(|t| t.snapshot.clone()),
        };
        let Some(snap) = latest else {
            return self.fallback.clone();
        };
        let mut cur = self.current.write().unwrap_or_else(|p| p.into_inner());
        let stale = cur
            .as_ref()
            .is_none_or(|t| (t.snapshot.epoch, t.snapshot.version) != (snap.epoch, snap.version));
        if stale {
            let mut v = self.versions.write().unwrap_or_else(|p| p.into_inner());
            if v.last() != Some(&snap.version) {
                v.push(snap.version);
            }
            *cur = Some(Arc::new(RoutingTable::new(snap)));
        }
        cur.clone().unwrap_or_else(|| self.fallback.clone())
    }
}

/// Simulated gateways: arrivals every 100 ms, routed by the current table,
/// answered by the scenario's channel model, produced to Kafka.
#[allow(clippy::too_many_arguments)]
async fn gateways(
    sc: Arc<Scenario>,
    topic: String,
    producer: FutureProducer,
    weights: WeightSource,
    started: Instant,
    seconds: u64,
    garbage_every: u64,
    counters: Arc<Counters>,
) {
    let mut g = Gateways {
        bases: sc
            .channels
            .iter()
            .map(|c| Behavior::base().with(&c.normal))
            .collect(),
        rng: Rng::new(sc.seed),
        encoder: Encoder::default(),
        buf: Vec::with_capacity(256),
        seq: 0,
        loads: vec![[0u32; 10]; sc.channels.len()],
        sc,
        topic,
        producer,
        garbage_every,
        counters,
    };
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut next_probe = vec![0.0f64; g.sc.channels.len()];
    let mut step = 0usize;
    while started.elapsed() < Duration::from_secs(seconds) {
        tick.tick().await;
        step += 1;
        let t_s = started.elapsed().as_secs_f64();
        for l in g.loads.iter_mut() {
            l[step % 10] = 0;
        }
        let mut requests = g.arrivals(&weights.table());
        for (j, next) in next_probe.iter_mut().enumerate() {
            if g.sc.gateway.probe_interval_s > 0.0 && *next <= t_s {
                *next = t_s + g.sc.gateway.probe_interval_s;
                requests.push(Request::probe(j));
            }
        }
        for req in requests {
            g.attempt(req, t_s, step);
        }
    }
}

/// Records produced by the gateways: (events, garbage).
type Counters = (std::sync::atomic::AtomicU64, std::sync::atomic::AtomicU64);

/// The simulated gateways' state between ticks.
struct Gateways {
    sc: Arc<Scenario>,
    topic: String,
    producer: FutureProducer,
    garbage_every: u64,
    counters: Arc<Counters>,
    bases: Vec<Behavior>,
    rng: Rng,
    encoder: Encoder,
    buf: Vec<u8>,
    seq: u64,
    /// Per channel: attempts in each 100 ms step of the last second.
    loads: Vec<[u32; 10]>,
}

impl Gateways {
    /// One tick's new requests (Poisson per class), routed by `table`; the
    /// ones not sent (shed by the plan, or no channel) are reported so
    /// Hermes measures demand.
    fn arrivals(&mut self, table: &RoutingTable) -> Vec<Request> {
        let sc = self.sc.clone();
        let mut requests = Vec::new();
        for tr in &sc.traffic {
            let n = self.rng.poisson(tr.rps * 0.1);
            for _ in 0..n {
                let class = tr.class.class();
                let (u1, u2) = (self.rng.f64(), self.rng.f64());
                let (channel, unsent) = match table.pick(class, self.rng.f64(), u1, u2) {
                    Pick::Channel(id) => (sc.channels.iter().position(|c| c.id == id), None),
                    Pick::Shed => (None, Some(Dispatch::Shed)),
                    Pick::NoRoute => (None, Some(Dispatch::NoChannel)),
                };
                if let (Some(how), Some(key)) = (unsent, table.unsent_channel(class, u1, u2)) {
                    self.report_unsent(class, how, key);
                }
                if let Some(channel) = channel {
                    requests.push(Request {
                        class,
                        long: self.rng.chance(tr.long_share),
                        structured: self.rng.chance(tr.structured_share),
                        probe: false,
                        attempt: 0,
                        channel,
                    });
                }
            }
        }
        requests
    }

    fn report_unsent(&mut self, class: crate::event::TrafficClass, how: Dispatch, key: &str) {
        self.seq += 1;
        let id = format!("demo-unsent-{}", self.seq);
        let ev = crate::event::RequestEvent::unsent(crate::event::Unsent {
            event_id: &id,
            event_time_ms: crate::wall_clock::now_ms(),
            gateway_id: "demo-gw",
            channel_id: key,
            route_group: &self.sc.gateway.group,
            traffic_class: class,
            attempt: 0,
            dispatch: how,
        });
        self.buf.clear();
        if self.encoder.encode_plain(&ev, &mut self.buf).is_ok() {
            let buf = std::mem::take(&mut self.buf);
            self.send(key, &buf, false);
            self.buf = buf;
        }
    }

    /// Sends one attempt to its channel model and produces its event (and,
    /// every `garbage_every` events, a garbage record for the dead-letter
    /// path).
    fn attempt(&mut self, req: Request, t_s: f64, step: usize) {
        let j = req.channel;
        self.loads[j][step % 10] += 1;
        let load: u32 = self.loads[j].iter().sum();
        let sc = self.sc.clone();
        let c = &sc.channels[j];
        let done = answer(
            c,
            &self.bases[j],
            &req,
            t_s,
            load as f64,
            true,
            &mut self.rng,
        );
        self.seq += 1;
        let id = format!("demo-{}", self.seq);
        let now = crate::wall_clock::now_ms();
        let ev = done.event(&id, now, &c.id, &sc.gateway.group, "demo-gw");
        self.buf.clear();
        if self.encoder.encode_plain(&ev, &mut self.buf).is_err() {
            return;
        }
        let buf = std::mem::take(&mut self.buf);
        self.send(&c.id, &buf, false);
        self.buf = buf;
        if self.garbage_every > 0 && self.seq.is_multiple_of(self.garbage_every) {
            let garbage = [0x7fu8, 0x01, 0x02, 0x03, (self.seq & 0xff) as u8];
            self.send(&c.id, &garbage, true);
        }
    }

    fn send(&self, key: &str, payload: &[u8], garbage: bool) {
        use std::sync::atomic::Ordering;
        let sent = self
            .producer
            .send_result(FutureRecord::to(&self.topic).key(key).payload(payload))
            .is_ok();
        if sent {
            let counter = if garbage {
                &self.counters.1
            } else {
                &self.counters.0
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }
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
    let bootstrap = mock.bootstrap_servers();
    rt.kafka.brokers = bootstrap.clone();
    rt.kafka.session_timeout_ms = 6_000;
    rt.service.http_listen = opts.http_listen.clone().unwrap_or_default();
    if opts.config_path.is_none() {
        rt.service.reload_check_ms = 0;
    }
    if let Some(url) = &opts.redis_url {
        rt.redis.url = url.clone();
    }
    let topics = rt.kafka.clone();
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
    // Let the service consume what was produced, then stop it (it commits).
    let m = service.metrics.clone();
    let expected = summary.produced + summary.garbage_sent;
    let deadline = Instant::now() + Duration::from_secs(10);
    while m.events_consumed.load(std::sync::atomic::Ordering::Relaxed) < expected
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    service.stop().await?;
    use std::sync::atomic::Ordering::Relaxed;
    summary.consumed = m.events_consumed.load(Relaxed);
    summary.applied = m.events_applied.load(Relaxed) + m.events_replayed.load(Relaxed);
    summary.dead_lettered = m.dead_letters_total();
    summary.duplicates = m.duplicates.load(Relaxed);
    summary.too_late = m.too_late.load(Relaxed);
    summary.alerts_produced = m.alerts_produced.load(Relaxed);
    summary.final_states = m.channel_states();
    summary.snapshot_versions = weights
        .versions
        .read()
        .map(|v| v.clone())
        .unwrap_or_default();
    read_outputs(&bootstrap, &topics, &mut summary).await?;
    // Clients before the cluster they talk to, or librdkafka reports every
    // broker down on the way out.
    drop(producer);
    drop(mock);
    Ok(summary)
}

/// `hermes gateways`: the demo's simulated gateways against a real cluster
/// and a real Redis (the compose stack's traffic source). They produce the
/// scenario's traffic as Avro events to `topic` and route by the weights
/// Hermes publishes for the scenario's group (by the static trust-tier
/// table until the first snapshot), so the loop is closed; faults happen at
/// the scenario's times from the start.
pub struct GatewaysOptions {
    pub scenario: Scenario,
    pub bootstrap: String,
    pub topic: String,
    pub redis_url: String,
    /// Wall-clock seconds to run; 0: until interrupted.
    pub seconds: u64,
}

pub async fn run_gateways(opts: GatewaysOptions) -> anyhow::Result<u64> {
    let sc = Arc::new(opts.scenario);
    let cfg_text = sc.hermes_config_text(None).map_err(|e| anyhow!(e))?;
    let cfg = Config::from_toml(&cfg_text).map_err(|e| anyhow!("scenario config: {e}"))?;
    let (_, weights) = weight_source(&cfg, Some(&opts.redis_url))?;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &opts.bootstrap)
        .set("linger.ms", "5")
        .create()
        .context("creating the gateways' producer")?;
    let counters: Arc<Counters> = Arc::new(Default::default());
    let seconds = if opts.seconds == 0 {
        u64::MAX / 4
    } else {
        opts.seconds
    };
    tracing::info!(group = %sc.gateway.group, bootstrap = %opts.bootstrap, "simulated gateways started");
    tokio::select! {
        _ = gateways(sc.clone(), opts.topic, producer.clone(), weights, Instant::now(), seconds, 0, counters.clone()) => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    let _ = producer.flush(Duration::from_secs(5));
    Ok(counters.0.load(std::sync::atomic::Ordering::Relaxed))
}

/// Where the service publishes and the gateways read: Redis, or an
/// in-process store. Until Hermes publishes, the gateways route by the
/// config's trust-tier shares (their static table).
fn weight_source(cfg: &Config, redis_url: Option<&str>) -> anyhow::Result<(Store, WeightSource)> {
    let group = cfg.groups[0].id.clone();
    let (store, reader) = match redis_url {
        Some(url) => {
            let client = WeightClient::start(
                url,
                &group,
                ClientOptions {
                    refresh_interval: Duration::from_secs(1),
                    ..ClientOptions::default()
                },
            )
            .map_err(|e| anyhow!(e))?;
            (Store::Redis, StoreReader::Redis(client))
        }
        None => {
            let s = Arc::new(InProcessStore::default());
            (Store::InProcess(s.clone()), StoreReader::InProcess(s))
        }
    };
    let mut scheduler = crate::schedule::Scheduler::new(Arc::new(cfg.clone()));
    let (initial, _) = scheduler.plan_group(0, 0, &[], false);
    let weights = WeightSource {
        group,
        store: reader,
        fallback: Arc::new(RoutingTable::new(WeightSnapshot::from_plan(initial, 0, 0))),
        current: Arc::new(RwLock::new(None)),
        versions: Arc::new(RwLock::new(Vec::new())),
    };
    Ok((store, weights))
}

/// Runs the gateways for the demo's length: the status table every second,
/// the scripted operator commands at their times. Returns the service, or
/// its error if a loop failed.
async fn drive(
    opts: &DemoOptions,
    sc: &Arc<Scenario>,
    topics: &KafkaConfig,
    producer: &FutureProducer,
    weights: &WeightSource,
    mut service: Service,
    counters: &Arc<Counters>,
) -> anyhow::Result<Service> {
    let started = Instant::now();
    let mut gateway_task = tokio::spawn(gateways(
        sc.clone(),
        topics.request_topic.clone(),
        producer.clone(),
        weights.clone(),
        started,
        opts.seconds,
        opts.garbage_every,
        Arc::clone(counters),
    ));
    let mut status = tokio::time::interval(Duration::from_secs(1));
    let mut commands = opts.commands.clone();
    commands.sort_by_key(|(at, _, _)| std::cmp::Reverse(*at));
    loop {
        while commands
            .last()
            .is_some_and(|(at, _, _)| started.elapsed() >= Duration::from_secs(*at))
        {
            let (_, target, req) = commands.pop().expect("checked");
            match service.control.set(target.clone(), &req).await? {
                Ok(_) => {}
                Err(refused) => {
                    anyhow::bail!("the scripted override on {target} was refused: {refused}")
                }
            }
        }
        tokio::select! {
            r = &mut gateway_task => {
                r.context("the gateways task")?;
                return Ok(service);
            }
            e = service.failed() => return Err(e),
            _ = status.tick() => {
                if opts.show_status {
                    let produced = counters.0.load(std::sync::atomic::Ordering::Relaxed);
                    let versions = weights.versions.read().map(|v| v.clone()).unwrap_or_default();
                    let table = status_table(&service.metrics, &service.control.current(), produced, started.elapsed().as_secs_f64(), &versions);
                    if opts.redraw {
                        print!("\x1b[2J\x1b[H{table}");
                    } else {
                        println!("{table}");
                    }
                }
            }
        }
    }
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
