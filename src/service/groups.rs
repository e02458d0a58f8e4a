//! The group writers.
//!
//! Every instance reads the whole health topic (no consumer group: plain
//! assignment of every partition, from the end) and keeps the newest report
//! of every channel ([`GroupBoard`]). The writer of route group G is the
//! instance that owns request partition [`writer_partition`]`(G)` in the
//! request consumer group, so there is exactly one membership protocol and
//! the writer role moves exactly when that partition moves. The writer
//! re-plans G once per evaluation tick and writes the snapshot to Redis:
//!
//! - on taking G it `INCR`s G's epoch (fencing every older writer through
//!   the Lua script) and continues the stored version;
//! - it publishes nothing for G until G is ready (every channel reported, or
//!   the warm-up passed and no silent channel was unhealthy in the stored
//!   snapshot): no regression to default weights;
//! - a new version on every routing change, a heartbeat refresh otherwise;
//! - a write refused as stale means another writer owns G: this one stops
//!   writing it until it takes G again.
//!
//! Redis being down delays writes (retried every round) but never the
//! request loop, which runs on its own thread.

use super::kafka;
use super::metrics::{GroupGauges, Metrics};
use crate::board::{writer_partition, GroupBoard, NotReady};
use crate::config::Config;
use crate::health::HealthReport;
use crate::publish::redis::{PublishError, PublisherOptions, RedisPublisher};
use crate::publish::{InProcessStore, WeightSnapshot, WriteOutcome};
use crate::schedule::Scheduler;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::Message;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The request partitions this instance owns, as the request loop last
/// saw them, and how many the topic has.
#[derive(Default)]
pub struct Ownership {
    owned: Mutex<BTreeSet<i32>>,
    pub request_partitions: AtomicU32,
}

impl Ownership {
    pub fn set_owned(&self, owned: BTreeSet<i32>) {
        *self.owned.lock().unwrap_or_else(|p| p.into_inner()) = owned;
    }
    pub fn owned(&self) -> BTreeSet<i32> {
        self.owned.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Where snapshots are written: Redis (the service), or in process (the
/// embedded demo without Redis). Both fence by (epoch, version).
pub enum WeightSink {
    Redis(Box<RedisPublisher>),
    InProcess(Arc<InProcessStore>),
}

impl WeightSink {
    async fn take_epoch(
        &mut self,
        group: &str,
    ) -> Result<(u64, Option<WeightSnapshot>), PublishError> {
        match self {
            WeightSink::Redis(p) => p.take_epoch(group).await,
            WeightSink::InProcess(s) => Ok(s.take_epoch(group)),
        }
    }

    async fn write(&mut self, snap: &WeightSnapshot) -> Result<WriteOutcome, PublishError> {
        match self {
            WeightSink::Redis(p) => p.write(snap).await,
            WeightSink::InProcess(s) => Ok(s.write(snap)),
        }
    }
}

/// One group this instance writes.
struct Writer {
    epoch: Option<u64>,
    version: u64,
    /// Scheduler plan version last written.
    plan_version: Option<u64>,
    last_write_ms: i64,
    /// Refused as stale: another writer owns the group.
    fenced: bool,
    planned: bool,
    /// Wall time a reported state change was handled, until the snapshot
    /// that carries it is written (`hermes_decision_publish_seconds`).
    change_at_ms: Option<i64>,
}

/// The Redis sink of a config.
pub fn redis_sink(cfg: &Config) -> anyhow::Result<WeightSink> {
    Ok(WeightSink::Redis(Box::new(
        RedisPublisher::new(&cfg.redis.url, PublisherOptions::default())
            .map_err(|e| anyhow::anyhow!(e))?,
    )))
}

fn health_consumer(cfg: &Config) -> anyhow::Result<StreamConsumer> {
    let k = &cfg.kafka;
    let consumer: StreamConsumer = kafka::client_config(k)
        // Required by librdkafka; no membership (plain assignment).
        .set("group.id", format!("{}-health-readers", k.group_id))
        .set("enable.auto.commit", "false")
        // Reports are few and a drain is in one: a broker that holds an
        // empty fetch for the default 500 ms would add that to every drain.
        .set("fetch.wait.max.ms", "10")
        .create()?;
    let md = consumer.fetch_metadata(Some(&k.health_topic), Duration::from_secs(10))?;
    let topic = md
        .topics()
        .iter()
        .find(|t| t.name() == k.health_topic)
        .filter(|t| !t.partitions().is_empty())
        .ok_or_else(|| anyhow::anyhow!("health topic `{}` does not exist", k.health_topic))?;
    let mut tpl = TopicPartitionList::new();
    for p in topic.partitions() {
        tpl.add_partition_offset(&k.health_topic, p.id(), Offset::End)?;
    }
    consumer.assign(&tpl)?;
    Ok(consumer)
}

pub async fn run(
    mut cfg_rx: tokio::sync::watch::Receiver<Arc<Config>>,
    ownership: Arc<Ownership>,
    mut publisher: WeightSink,
    metrics: Arc<Metrics>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let mut cfg = cfg_rx.borrow_and_update().clone();
    let consumer = tokio::task::block_in_place(|| health_consumer(&cfg))?;
    let mut board = GroupBoard::new();
    let mut scheduler = Scheduler::new(cfg.clone());
    let mut writers: BTreeMap<String, Writer> = BTreeMap::new();
    let mut round = tokio::time::interval(Duration::from_millis(500));
    while !stop.load(Ordering::Relaxed) {
        tokio::select! {
            m = consumer.recv() => {
                let m = match m {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::warn!(error = %e, "health consumer error");
                        continue;
                    }
                };
                match m.payload().map(HealthReport::from_json) {
                    Some(Ok(r)) => {
                        let group = r.group.clone();
                        if !board.on_report(&cfg, r, crate::wall_clock::now_ms()) {
                            tracing::debug!(%group, "health report for a group not in the config");
                        }
                        // A state change is planned and published now, not
                        // at the next round.
                        if !(writers.contains_key(&group) && board.state_change_pending(&group)) {
                            continue;
                        }
                    }
                    Some(Err(e)) => {
                        tracing::warn!(partition = m.partition(), offset = m.offset(), error = %e, "unreadable health report skipped");
                        continue;
                    }
                    None => continue,
                }
            }
            _ = round.tick() => {}
        }
        if cfg_rx.has_changed().unwrap_or(false) {
            cfg = cfg_rx.borrow_and_update().clone();
            // Plans restart from the current health with the new policy
            // (smoothing memory is per config).
            scheduler = Scheduler::new(cfg.clone());
            for w in writers.values_mut() {
                w.plan_version = None;
                w.planned = false;
            }
        }
        // Which groups are ours now.
        let n = ownership.request_partitions.load(Ordering::Relaxed);
        let owned = ownership.owned();
        for g in &cfg.groups {
            let mine = n > 0 && owned.contains(&writer_partition(&g.id, n));
            match (mine, writers.contains_key(&g.id)) {
                (true, false) => {
                    writers.insert(
                        g.id.clone(),
                        Writer {
                            epoch: None,
                            version: 0,
                            plan_version: None,
                            last_write_ms: 0,
                            fenced: false,
                            planned: false,
                            change_at_ms: None,
                        },
                    );
                }
                (false, true) => {
                    writers.remove(&g.id);
                    metrics.forget_group(&g.id);
                    tracing::info!(group = %g.id, "no longer this group's writer");
                }
                _ => {}
            }
        }
        writers.retain(|g, _| cfg.groups.iter().any(|x| &x.id == g));
        let now = crate::wall_clock::now_ms();
        let groups: Vec<String> = writers.keys().cloned().collect();
        for group in groups {
            let Some(gi) = cfg.groups.iter().position(|g| g.id == group) else {
                continue;
            };
            let w = writers.get_mut(&group).expect("listed above");
            if w.fenced {
                continue;
            }
            if w.epoch.is_none() {
                match publisher.take_epoch(&group).await {
                    Ok((epoch, stored)) => {
                        let epoch = stored.as_ref().map_or(epoch, |s| epoch.max(s.epoch + 1));
                        w.epoch = Some(epoch);
                        w.version = stored.as_ref().map_or(0, |s| s.version);
                        board.set_previous_states(
                            &group,
                            stored
                                .map(|s| {
                                    s.channels
                                        .into_iter()
                                        .map(|(c, st)| (c, st.state))
                                        .collect()
                                })
                                .unwrap_or_default(),
                        );
                        tracing::info!(%group, epoch, from_version = w.version, "writing this group");
                    }
                    Err(e) => {
                        tracing::warn!(%group, error = %e, "cannot take the writer epoch yet");
                        continue;
                    }
                }
            }
            match board.ready(&cfg, &group, now) {
                Ok(()) => metrics.set_group_waiting(&group, Vec::new()),
                Err(NotReady::NoReports) => continue,
                Err(NotReady::Waiting(ch)) => {
                    metrics.set_group_waiting(&group, ch);
                    continue;
                }
            }
            let change = board.take_state_change(&group);
            if let Some(tick) = board.plan_due(&cfg, &group) {
                scheduler.plan_group(gi, tick, &board.health(&group), true);
                w.planned = true;
            } else if let Some((_, watermark)) = change {
                scheduler.plan_group(gi, watermark, &board.health(&group), true);
                w.planned = true;
            }
            if let Some((at, _)) = change {
                w.change_at_ms = Some(w.change_at_ms.map_or(at, |t| t.min(at)));
            }
            let Some(plan) = scheduler.plan(&group).filter(|_| w.planned) else {
                continue;
            };
            let changed = w.plan_version != Some(plan.version);
            if !changed {
                // The change moved no weight: there is no decision to time.
                w.change_at_ms = None;
            }
            let heartbeat_due = now - w.last_write_ms >= cfg.service.heartbeat_ms;
            if !changed && !heartbeat_due {
                continue;
            }
            let epoch = w.epoch.unwrap_or(1);
            let version = if changed { w.version + 1 } else { w.version };
            let mut snap = WeightSnapshot::from_plan(plan, epoch, now);
            snap.version = version;
            match publisher.write(&snap).await {
                Ok(WriteOutcome::Stale { stored_epoch, .. }) => {
                    Metrics::inc(&metrics.snapshots_refused_stale);
                    tracing::warn!(%group, epoch, stored_epoch, "fenced: another writer owns this group");
                    w.fenced = true;
                }
                Ok(outcome) => {
                    if outcome == WriteOutcome::Written {
                        Metrics::inc(&metrics.snapshots_written);
                        if let Some(at) = w.change_at_ms.take() {
                            metrics
                                .decision_publish
                                .observe_ms(crate::wall_clock::now_ms() - at);
                        }
                    } else {
                        Metrics::inc(&metrics.snapshot_heartbeats);
                    }
                    w.version = version;
                    w.plan_version = Some(plan.version);
                    w.last_write_ms = now;
                    let mut weights = BTreeMap::new();
                    let mut shed = BTreeMap::new();
                    for (class, cw) in &snap.classes {
                        shed.insert(class.clone(), cw.shed);
                        for (ch, x) in &cw.weights {
                            weights.insert((class.clone(), ch.clone()), *x);
                        }
                    }
                    metrics.set_group(
                        &group,
                        GroupGauges {
                            epoch,
                            version,
                            heartbeat_ms: now,
                            weights,
                            shed,
                            waiting_for: Vec::new(),
                        },
                    );
                }
                Err(e) => {
                    // Retried next round with the then-current plan; gateways
                    // keep the last snapshot meanwhile.
                    Metrics::inc(&metrics.snapshot_failures);
                    tracing::debug!(%group, error = %e, "snapshot not written yet");
                }
            }
        }
    }
    Ok(())
}
