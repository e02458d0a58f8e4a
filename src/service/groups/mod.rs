//! The group writers.
//!
//! Every instance reads the whole health topic (no consumer group: plain
//! assignment of every partition, from the end) and keeps the newest report
//! of every channel ([`crate::board::GroupBoard`]). The writer of route
//! group G is the instance that owns request partition
//! [`writer_partition`](crate::board::writer_partition)`(G)` in the request consumer group, so there is
//! exactly one membership protocol and the writer role moves exactly when
//! that partition moves. The writer
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
//!
//! `writers` holds the groups this instance writes: it plans them, takes
//! the fenced epoch and writes the snapshot.

use super::kafka::{self, OutputProducer};
use super::metrics::Metrics;
use super::overrides::Overrides;
use super::ownership::Ownership;
use crate::alert::AlertEvent;
use crate::config::{Config, Runtime};
use crate::health::HealthReport;
use crate::publish::redis::{PublishError, PublisherOptions, RedisPublisher};
use crate::publish::{InProcessStore, WeightSnapshot, WriteOutcome};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::Message;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
mod writers;

use writers::GroupWriters;

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

/// The Redis sink of a config.
pub fn redis_sink(rt: &Runtime) -> anyhow::Result<WeightSink> {
    Ok(WeightSink::Redis(Box::new(
        RedisPublisher::new(&rt.redis.url, PublisherOptions::default())
            .map_err(|e| anyhow::anyhow!(e))?,
    )))
}

type HealthConsumer = StreamConsumer<kafka::QuietContext>;

fn health_consumer(rt: &Runtime) -> anyhow::Result<HealthConsumer> {
    let k = &rt.kafka;
    let consumer: HealthConsumer = kafka::client_config(k)
        // Required by librdkafka; no membership (plain assignment).
        .set("group.id", format!("{}-health-readers", k.group_id))
        .set("enable.auto.commit", "false")
        // Reports are few and a drain is in one: a broker that holds an
        // empty fetch for the default 500 ms would add that to every drain.
        .set("fetch.wait.max.ms", "10")
        .create_with_context(kafka::QuietContext::named("health"))?;
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

/// The health-topic reader, retried with capped backoff (1 s doubling to
/// 30 s) while the broker or the topic is unavailable: a broker that boots
/// after Hermes delays the writers, it does not stop the process. `None`
/// once asked to stop.
async fn connect_health(
    rt: &Runtime,
    metrics: &Metrics,
    stop: &CancellationToken,
) -> Option<HealthConsumer> {
    use super::metrics::Dependency;
    let target = format!("{} ({})", rt.kafka.brokers, rt.kafka.health_topic);
    let mut backoff = crate::backoff::Backoff::LONG;
    loop {
        match tokio::task::block_in_place(|| health_consumer(rt)) {
            Ok(c) => {
                metrics
                    .readiness
                    .set(Dependency::HealthTopic, &target, None);
                return Some(c);
            }
            Err(e) => {
                let problem = Some(e.to_string());
                metrics
                    .readiness
                    .set(Dependency::HealthTopic, &target, problem);
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(backoff.next_delay()) => {}
        }
    }
}

/// The writers' round: planning when due, heartbeats, and the look for
/// channels split over partitions (judged over
/// `alerts.partition_split_horizon_ms`) run at least this often.
const ROUND_MS: i64 = 500;

/// The group writers' loop: health reports in, snapshots out. A report
/// with a state change is planned and published at once; everything else
/// every 500 ms round.
pub struct GroupLoopParts {
    pub cfg_rx: tokio::sync::watch::Receiver<Arc<Config>>,
    /// Frozen at start.
    pub runtime: Arc<Runtime>,
    pub ownership: Arc<Ownership>,
    pub sink: WeightSink,
    pub metrics: Arc<Metrics>,
    pub stop: CancellationToken,
    /// The operators' desired overrides (freezes are carried out here).
    pub overrides: tokio::sync::watch::Receiver<Arc<Overrides>>,
    /// Where the writers' OVERRIDE alerts go.
    pub producer: Arc<OutputProducer>,
    /// This process's health reports, straight from its request loop; its
    /// copies on the health topic (`instance`) are skipped.
    pub local_reports: tokio::sync::mpsc::Receiver<HealthReport>,
    pub instance: String,
    /// Alerts are Confluent-framed with this id (registered at start).
    pub alert_schema_id: Option<u32>,
}

impl GroupLoopParts {
    /// The group writers beside the request loops built from `parts`: the
    /// same config, ownership, producer, overrides and stop signal.
    pub fn beside(
        parts: &super::requests::LoopParts,
        sink: WeightSink,
        local_reports: tokio::sync::mpsc::Receiver<HealthReport>,
    ) -> GroupLoopParts {
        GroupLoopParts {
            cfg_rx: parts.cfg_rx.clone(),
            runtime: parts.runtime.clone(),
            ownership: parts.ownership.clone(),
            sink,
            metrics: parts.metrics.clone(),
            stop: parts.stop.clone(),
            overrides: parts.overrides.clone(),
            producer: parts.producer.clone(),
            local_reports,
            instance: parts.instance.clone(),
            alert_schema_id: parts.alert_schema_id,
        }
    }
}

pub async fn run(parts: GroupLoopParts) -> anyhow::Result<()> {
    let GroupLoopParts {
        mut cfg_rx,
        runtime,
        ownership,
        sink,
        metrics,
        stop,
        mut overrides,
        producer,
        alert_schema_id,
        mut local_reports,
        instance,
    } = parts;
    let cfg = cfg_rx.borrow_and_update().clone();
    let Some(consumer) = connect_health(&runtime, &metrics, &stop).await else {
        return Ok(());
    };
    let mut writers = GroupWriters::new(cfg, runtime, sink, metrics);
    let mut round = tokio::time::interval(Duration::from_millis(ROUND_MS as u64));
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            m = consumer.recv() => {
                let applied = peer_report(m, &instance).is_some_and(|r| writers.on_report(r));
                if !applied {
                    continue;
                }
            }
            Some(r) = local_reports.recv() => {
                if !writers.on_report(r) {
                    continue;
                }
            }
            Ok(()) = overrides.changed() => {}
            _ = round.tick() => {}
        }
        if cfg_rx.has_changed().unwrap_or(false) {
            writers.reconfigure(cfg_rx.borrow_and_update().clone());
        }
        writers.sync_ownership(&ownership);
        // Every pass: a group taken over is frozen before its first write.
        let desired = overrides.borrow_and_update().clone();
        let mut alerts = writers.reconcile_freezes(&desired);
        alerts.extend(writers.split_alerts());
        for alert in alerts {
            produce_alert(&producer, &writers.runtime, &alert, alert_schema_id)?;
            writers.metrics.alert_produced(&alert);
        }
        writers.on_tick().await;
    }
    Ok(())
}

/// A health report another instance published, from what the health
/// consumer returned; errors and unreadable records are logged and
/// skipped. This instance's own reports come from its request loops
/// directly (in order), so the topic's copies are skipped too.
fn peer_report(
    m: Result<rdkafka::message::BorrowedMessage<'_>, rdkafka::error::KafkaError>,
    instance: &str,
) -> Option<HealthReport> {
    let m = m
        .inspect_err(|e| tracing::warn!(error = %e, "health consumer error"))
        .ok()?;
    match HealthReport::from_json(m.payload()?) {
        Ok(r) if r.instance == instance => None,
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(partition = m.partition(), offset = m.offset(), error = %e, "unreadable health report skipped");
            None
        }
    }
}

/// An alert of the writers, with the request loop's policy for alerts: one
/// Kafka will not take stops the loop.
fn produce_alert(
    producer: &OutputProducer,
    rt: &Runtime,
    alert: &AlertEvent,
    schema_id: Option<u32>,
) -> anyhow::Result<()> {
    let bytes = alert
        .to_record(schema_id)
        .map_err(|e| anyhow::anyhow!("alert encoding: {e}"))?;
    let rec = rdkafka::producer::BaseRecord::to(&rt.kafka.alert_topic)
        .key(alert.route_group.as_bytes())
        .payload(&bytes[..]);
    if !kafka::send(producer, rec) {
        anyhow::bail!("alert produce failed");
    }
    Ok(())
}
