//! The simulated gateways (also `hermes gateways`): the simulator's
//! channel model on the wall clock, routing by the weights they read, and
//! producing Avro request events keyed by channel.

use super::{status_table, DemoOptions};
use crate::client::{ClientOptions, WeightClient};
use crate::codec::Encoder;
use crate::config::{Config, KafkaConfig};
use crate::event::Dispatch;
use crate::publish::{InProcessStore, WeightSnapshot};
use crate::routing::{Pick, RoutingTable};
use crate::service::{Service, Store};
use crate::sim::scenario::{Behavior, Scenario};
use crate::sim::{answer, Request, Rng};
use anyhow::{anyhow, Context};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Where gateways get their routing table from: the service's weight store
/// (in process or Redis), with the static trust-tier table from the config
/// as the fallback until the first snapshot (what a real gateway's own
/// config gives it: Hermes never publishes before warm-up).
#[derive(Clone)]
pub(super) struct WeightSource {
    pub(super) group: String,
    pub(super) store: StoreReader,
    pub(super) fallback: Arc<RoutingTable>,
    pub(super) current: Arc<RwLock<Option<Arc<RoutingTable>>>>,
    pub(super) versions: Arc<RwLock<Vec<u64>>>,
}

#[derive(Clone)]
pub(super) enum StoreReader {
    InProcess(Arc<InProcessStore>),
    Redis(WeightClient),
}

impl WeightSource {
    pub(super) fn table(&self) -> Arc<RoutingTable> {
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
pub(super) async fn gateways(
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
pub(super) type Counters = (std::sync::atomic::AtomicU64, std::sync::atomic::AtomicU64);

/// The simulated gateways' state between ticks.
pub(super) struct Gateways {
    pub(super) sc: Arc<Scenario>,
    pub(super) topic: String,
    pub(super) producer: FutureProducer,
    pub(super) garbage_every: u64,
    pub(super) counters: Arc<Counters>,
    pub(super) bases: Vec<Behavior>,
    pub(super) rng: Rng,
    pub(super) encoder: Encoder,
    pub(super) buf: Vec<u8>,
    pub(super) seq: u64,
    /// Per channel: attempts in each 100 ms step of the last second.
    pub(super) loads: Vec<[u32; 10]>,
}

impl Gateways {
    /// One tick's new requests (Poisson per class), routed by `table`; the
    /// ones not sent (shed by the plan, or no channel) are reported so
    /// Hermes measures demand.
    pub(super) fn arrivals(&mut self, table: &RoutingTable) -> Vec<Request> {
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

    pub(super) fn report_unsent(
        &mut self,
        class: crate::event::TrafficClass,
        how: Dispatch,
        key: &str,
    ) {
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
    pub(super) fn attempt(&mut self, req: Request, t_s: f64, step: usize) {
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

    pub(super) fn send(&self, key: &str, payload: &[u8], garbage: bool) {
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
pub(super) fn weight_source(
    cfg: &Config,
    redis_url: Option<&str>,
) -> anyhow::Result<(Store, WeightSource)> {
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
pub(super) async fn drive(
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
