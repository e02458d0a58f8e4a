//! `hermes demo`: the whole loop on one machine with nothing installed.
//!
//! - librdkafka's in-process mock cluster carries the request topic, the
//!   alert topic and the dead-letter topic;
//! - simulated gateways (the simulator's channel model, on the wall clock)
//!   produce Avro request events keyed by channel, route every request by
//!   the weights currently published, and now and then send an undecodable
//!   record;
//! - a Kafka consumer decodes, applies events to the same `Pipeline` the
//!   simulator drives, sends bad records to the dead-letter topic with their
//!   reason, and stores offsets only after an event was applied (at least
//!   once);
//! - after every re-plan the snapshot goes to the weight store: in process,
//!   or Redis through the fenced Lua write when `--redis` is given (gateways
//!   then read it with `client::WeightClient`, one GET per refresh);
//! - every alert is produced to the alert topic as Avro;
//! - a status table refreshes every second.
//!
//! Scope: one Hermes instance owning every partition. Multi-instance
//! consumer groups (the per-group health topic, rebalance restore, state
//! persistence) are the service's job and not built yet.

use crate::alert::AlertEvent;
use crate::client::{ClientOptions, Pick, RoutingTable, WeightClient};
use crate::codec::{Decoder, Encoder, SchemaCache, WireFormat};
use crate::config::Config;
use crate::event::TrafficClass;
use crate::pipeline::Pipeline;
use crate::publish::redis::{PublisherOptions, RedisPublisher};
use crate::publish::WeightSnapshot;
use crate::sim::scenario::{Behavior, Scenario};
use crate::sim::{answer, Request, Rng};
use anyhow::{anyhow, Context};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

pub const REQUEST_TOPIC: &str = "hermes.requests";
pub const ALERT_TOPIC: &str = "hermes.alerts";
pub const DEAD_LETTER_TOPIC: &str = "hermes.dead-letters";

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
}

/// What a demo run did, for its caller and tests.
#[derive(Debug, Clone, Default)]
pub struct DemoSummary {
    pub produced: u64,
    pub consumed: u64,
    pub applied: u64,
    pub dead_lettered: u64,
    pub garbage_sent: u64,
    pub alerts_produced: u64,
    pub final_states: BTreeMap<String, String>,
    pub snapshot_versions: Vec<u64>,
    /// Alerts read back from the alert topic that decode as `AlertEvent`s,
    /// and their transitions (channel, from, to).
    pub alerts_read_back: u64,
    pub transitions_read_back: Vec<(String, String, String)>,
    /// Records read back from the dead-letter topic with a `reason` header.
    pub dead_letters_read_back: u64,
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

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Where gateways get their routing table from.
#[derive(Clone)]
enum WeightSource {
    InProcess(Arc<RwLock<Option<Arc<RoutingTable>>>>),
    Redis(WeightClient),
}

impl WeightSource {
    fn table(&self) -> Option<Arc<RoutingTable>> {
        match self {
            WeightSource::InProcess(t) => t.read().ok().and_then(|g| g.clone()),
            WeightSource::Redis(c) => c.table(),
        }
    }
}

/// Simulated gateways: arrivals every 100 ms, routed by the current table,
/// answered by the scenario's channel model, produced to Kafka.
async fn gateways(
    sc: Arc<Scenario>,
    producer: FutureProducer,
    weights: WeightSource,
    started: Instant,
    seconds: u64,
    garbage_every: u64,
    counters: Arc<(std::sync::atomic::AtomicU64, std::sync::atomic::AtomicU64)>,
) {
    use std::sync::atomic::Ordering;
    let bases: Vec<Behavior> = sc
        .channels
        .iter()
        .map(|c| Behavior::base().with(&c.normal))
        .collect();
    let mut rng = Rng::new(sc.seed);
    let mut encoder = Encoder::default();
    let mut buf = Vec::with_capacity(256);
    let mut seq = 0u64;
    let mut loads = vec![[0u32; 10]; sc.channels.len()];
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut next_probe = vec![0.0f64; sc.channels.len()];
    let mut step = 0usize;
    while started.elapsed() < Duration::from_secs(seconds) {
        tick.tick().await;
        step += 1;
        let t_s = started.elapsed().as_secs_f64();
        for l in loads.iter_mut() {
            l[step % 10] = 0;
        }
        let table = weights.table();
        let mut requests: Vec<Request> = Vec::new();
        for tr in &sc.traffic {
            let n = rng.poisson(tr.rps * 0.1);
            for _ in 0..n {
                let class = tr.class.class();
                let channel = match table
                    .as_ref()
                    .map(|t| t.pick(class, rng.f64(), rng.f64(), rng.f64()))
                {
                    Some(Pick::Channel(id)) => sc.channels.iter().position(|c| c.id == id),
                    _ => None,
                };
                if let Some(channel) = channel {
                    requests.push(Request {
                        class,
                        long: rng.chance(tr.long_share),
                        structured: rng.chance(tr.structured_share),
                        probe: false,
                        attempt: 0,
                        channel,
                    });
                }
            }
        }
        for (j, next) in next_probe.iter_mut().enumerate() {
            if sc.gateway.probe_interval_s > 0.0 && *next <= t_s {
                *next = t_s + sc.gateway.probe_interval_s;
                requests.push(Request::probe(j));
            }
        }
        for req in requests {
            let j = req.channel;
            loads[j][step % 10] += 1;
            let load: u32 = loads[j].iter().sum();
            let done = answer(
                &sc.channels[j],
                &bases[j],
                &req,
                t_s,
                load as f64,
                true,
                &mut rng,
            );
            seq += 1;
            let id = format!("demo-{seq}");
            let ev = done.event(
                &id,
                now_ms(),
                &sc.channels[j].id,
                &sc.gateway.group,
                "demo-gw",
            );
            buf.clear();
            if encoder.encode_plain(&ev, &mut buf).is_err() {
                continue;
            }
            let key = sc.channels[j].id.as_str();
            if producer
                .send_result(FutureRecord::to(REQUEST_TOPIC).key(key).payload(&buf))
                .is_ok()
            {
                counters.0.fetch_add(1, Ordering::Relaxed);
            }
            if garbage_every > 0 && seq % garbage_every == 0 {
                let garbage = [0x7fu8, 0x01, 0x02, 0x03, (seq & 0xff) as u8];
                if producer
                    .send_result(
                        FutureRecord::to(REQUEST_TOPIC)
                            .key(key)
                            .payload(&garbage[..]),
                    )
                    .is_ok()
                {
                    counters.1.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

fn status_table(p: &Pipeline, group: &str, summary: &DemoSummary, elapsed_s: f64) -> String {
    let plan = p.scheduler.plan(group);
    let mut s = format!(
        "hermes demo  t={elapsed_s:>5.0}s  events consumed {}  applied {}  dead-lettered {}  alerts {}  plan v{}\n",
        summary.consumed,
        summary.applied,
        summary.dead_lettered,
        summary.alerts_produced,
        plan.map_or(0, |p| p.version)
    );
    s.push_str(&format!(
        "{:<10} {:<11} {:>6} {:>7} {:>8} {:>8} {:>8} {:>8}  {}\n",
        "channel",
        "state",
        "score",
        "health",
        "core_w",
        "batch_w",
        "p99_ms",
        "err_%",
        "top signals"
    ));
    for h in p.engine.health_all() {
        let idx = p.engine.channel_index(&h.id);
        let why = idx
            .and_then(|i| p.engine.score(i))
            .map(|sc| {
                sc.breakdown()
                    .iter()
                    .take(3)
                    .map(|(k, c)| format!("{}={c:.2}", k.name()))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        s.push_str(&format!(
            "{:<10} {:<11} {:>6} {:>7.2} {:>8.2} {:>8.2} {:>8} {:>8}  {}\n",
            h.id,
            h.state.as_str(),
            h.score.map_or("-".into(), |v| format!("{v:.2}")),
            h.weight,
            plan.map_or(0.0, |p| p.weight(TrafficClass::Core, &h.id)),
            plan.map_or(0.0, |p| p.weight(TrafficClass::Batch, &h.id)),
            h.p99_ms.map_or("-".into(), |v| format!("{v:.0}")),
            h.error_rate
                .map_or("-".into(), |v| format!("{:.1}", v * 100.0)),
            why
        ));
    }
    s
}

/// Runs the demo; returns what happened.
pub async fn run(opts: DemoOptions) -> anyhow::Result<DemoSummary> {
    let sc = Arc::new(opts.scenario);
    let cfg_text = sc.hermes_config_text(None).map_err(|e| anyhow!(e))?;
    let cfg = Arc::new(Config::from_toml(&cfg_text).map_err(|e| anyhow!("demo config: {e}"))?);
    let group = cfg.groups[0].id.clone();

    let mock = MockCluster::new(1).context("starting the in-process Kafka mock cluster")?;
    mock.create_topic(REQUEST_TOPIC, 3, 1)?;
    mock.create_topic(ALERT_TOPIC, 1, 1)?;
    mock.create_topic(DEAD_LETTER_TOPIC, 1, 1)?;
    let bootstrap = mock.bootstrap_servers();
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("linger.ms", "5")
        .create()
        .context("creating the producer")?;
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "hermes")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "true")
        // Offsets are stored only after the event was applied.
        .set("enable.auto.offset.store", "false")
        .create()
        .context("creating the consumer")?;
    consumer
        .subscribe(&[REQUEST_TOPIC])
        .context("subscribing")?;

    let mut pipeline = Pipeline::new(cfg.clone());
    let mut publisher = match &opts.redis_url {
        Some(url) => {
            Some(RedisPublisher::new(url, PublisherOptions::default()).map_err(|e| anyhow!(e))?)
        }
        None => None,
    };
    let in_process = Arc::new(RwLock::new(None));
    let weights = match &opts.redis_url {
        Some(url) => WeightSource::Redis(
            WeightClient::start(
                url,
                &group,
                ClientOptions {
                    refresh_interval: Duration::from_secs(1),
                    ..ClientOptions::default()
                },
            )
            .map_err(|e| anyhow!(e))?,
        ),
        None => WeightSource::InProcess(in_process.clone()),
    };
    let mut summary = DemoSummary::default();
    // In-process store: swap in the new table (the Redis store is written
    // by the publisher below and read by the gateways' WeightClient).
    let publish = |plan: &crate::schedule::Plan, summary: &mut DemoSummary| {
        let snap = WeightSnapshot::from_plan(plan, 1, now_ms());
        if summary.snapshot_versions.last() != Some(&snap.version) {
            summary.snapshot_versions.push(snap.version);
        }
        if let Ok(mut g) = in_process.write() {
            *g = Some(Arc::new(RoutingTable::new(snap.clone())));
        }
        snap
    };
    if let Some(p) = pipeline.scheduler.plan(&group) {
        let snap = publish(p, &mut summary);
        if let Some(pb) = publisher.as_mut() {
            if let Err(e) = pb.write(&snap).await {
                tracing::warn!(error = %e, "initial snapshot not published; gateways wait");
            }
        }
    }

    let started = Instant::now();
    let counters = Arc::new(Default::default());
    let gateway_task = tokio::spawn(gateways(
        sc.clone(),
        producer.clone(),
        weights,
        started,
        opts.seconds,
        opts.garbage_every,
        Arc::clone(&counters),
    ));

    let decoder = Decoder::new(WireFormat::Auto);
    let registry = SchemaCache::default();
    let mut alerts_sent = 0usize;
    let mut replans = pipeline.replans();
    let mut next_status = Instant::now();
    let deadline = started + Duration::from_secs(opts.seconds) + Duration::from_secs(2);
    while Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_millis(200), consumer.recv()).await {
            Ok(Ok(m)) => {
                summary.consumed += 1;
                let payload = m.payload().unwrap_or(&[]);
                let outcome = match decoder.decode(payload, &registry) {
                    Ok(ev) => pipeline.apply(&ev).map_err(|e| (e.kind(), e.to_string())),
                    Err(e) => Err((e.kind(), e.to_string())),
                };
                match outcome {
                    Ok(()) => summary.applied += 1,
                    Err(("too_late", _)) => {}
                    Err((kind, reason)) => {
                        // Bad input never stalls the partition: the original
                        // bytes go to the dead-letter topic with the reason.
                        let headers = OwnedHeaders::new()
                            .insert(Header {
                                key: "reason",
                                value: Some(reason.as_str()),
                            })
                            .insert(Header {
                                key: "kind",
                                value: Some(kind),
                            })
                            .insert(Header {
                                key: "source.partition",
                                value: Some(&m.partition().to_string()),
                            })
                            .insert(Header {
                                key: "source.offset",
                                value: Some(&m.offset().to_string()),
                            });
                        let mut rec = FutureRecord::to(DEAD_LETTER_TOPIC)
                            .payload(payload)
                            .headers(headers);
                        if let Some(k) = m.key() {
                            rec = rec.key(k);
                        }
                        match producer.send(rec, Duration::from_secs(5)).await {
                            Ok(_) => summary.dead_lettered += 1,
                            Err((e, _)) => anyhow::bail!(
                                "dead-letter produce failed, not committing past it: {e}"
                            ),
                        }
                    }
                }
                consumer
                    .store_offset_from_message(&m)
                    .context("storing the offset")?;
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "consumer error"),
            Err(_) => {}
        }
        pipeline.advance_to(now_ms());
        if pipeline.replans() != replans {
            replans = pipeline.replans();
            if let Some(p) = pipeline.scheduler.plan(&group) {
                let snap = publish(p, &mut summary);
                if let Some(pb) = publisher.as_mut() {
                    // A new version, or the same one as a heartbeat: the
                    // fenced script tells which.
                    if let Err(e) = pb.write(&snap).await {
                        tracing::warn!(error = %e, "snapshot not published; gateways keep the last one");
                    }
                }
            }
        }
        while alerts_sent < pipeline.alerts.len() {
            let a: &AlertEvent = &pipeline.alerts[alerts_sent];
            let key = a
                .channel_id
                .clone()
                .unwrap_or_else(|| a.route_group.clone());
            let bytes = a.to_avro().map_err(|e| anyhow!(e))?;
            producer
                .send(
                    FutureRecord::to(ALERT_TOPIC).key(&key).payload(&bytes),
                    Duration::from_secs(5),
                )
                .await
                .map_err(|(e, _)| anyhow!("alert produce failed: {e}"))?;
            summary.alerts_produced += 1;
            alerts_sent += 1;
        }
        if opts.show_status && Instant::now() >= next_status {
            next_status += Duration::from_secs(1);
            let table = status_table(&pipeline, &group, &summary, started.elapsed().as_secs_f64());
            if opts.redraw {
                print!("\x1b[2J\x1b[H{table}");
            } else {
                println!("{table}");
            }
        }
    }
    gateway_task.await.ok();
    let _ = producer.flush(Duration::from_secs(5));
    summary.produced = counters.0.load(std::sync::atomic::Ordering::Relaxed);
    summary.garbage_sent = counters.1.load(std::sync::atomic::Ordering::Relaxed);
    for h in pipeline.engine.health_all() {
        summary
            .final_states
            .insert(h.id.clone(), h.state.as_str().to_string());
    }
    // What a downstream consumer of the output topics sees.
    for m in read_back(&bootstrap, ALERT_TOPIC, summary.alerts_produced).await? {
        if let Some(a) = m.payload().and_then(|p| AlertEvent::from_avro(p).ok()) {
            summary.alerts_read_back += 1;
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
    for m in read_back(&bootstrap, DEAD_LETTER_TOPIC, summary.dead_lettered).await? {
        let has_reason = m.headers().is_some_and(|h| {
            h.iter()
                .any(|x| x.key == "reason" && x.value.is_some_and(|v| !v.is_empty()))
        });
        summary.dead_letters_read_back += has_reason as u64;
    }
    // Clients before the cluster they talk to, or librdkafka reports every
    // broker down on the way out.
    drop(producer);
    drop(consumer);
    drop(mock);
    Ok(summary)
}
