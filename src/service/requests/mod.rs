//! The request-topic loop: one engine per owned partition.
//!
//! Runs on its own OS thread around a `BaseConsumer`, so rebalance callbacks
//! run between two records of the same loop and need no locking against it.
//!
//! Records are taken in batches of what is ready (up to `POLL_BATCH`), in
//! order. Per record: decode (fetching an unknown writer schema from the
//! registry once), drop duplicates (gateway, event id and time), apply to the partition's
//! engine; a bad record goes to the dead-letter topic with its reason and
//! never stalls the partition. Offsets are stored once a batch was handled and
//! committed every `service.commit_interval_ms` only after every output
//! produced so far (alerts, dead letters) was acknowledged: at least once.
//!
//! On assignment of a partition the loop rebuilds it before it speaks for its
//! channels: it restores each channel's saved state machine, seeks to
//! `now - longest window` (offsets-for-times) and replays. Replayed records
//! below the committed offset were handled by the previous owner: they only
//! rebuild windows (no dead letters, no alerts again). The partition reports
//! health only once it is caught up with the high watermark seen at
//! assignment and its engine is warm. On revocation it commits and goes
//! quiet at once.
//!
//! The rooms: [`super::partition`] holds an owned partition (engine, dedup,
//! replay position) and returns what it produced as values;
//! [`super::rebalance`] decides where assigned partitions start and applies
//! assignments and revocations; this loop owns polling and decoding
//! (`records`), the `Emitter` (`emitter`: the one place outputs leave, with
//! one failure policy), and between batches (`housekeeping`) committing,
//! idle advance, config reloads and the operator command inbox.

use super::kafka::{self, OutputProducer};
use super::lock;
use super::metrics::Metrics;
use super::overrides::Overrides;
use super::ownership::Ownership;
use super::partition::{Outputs, Partition, Position};
use super::rebalance::{self, Assigned, LostPartitions, RequestContext, Shared};
use super::registry::Registry;
use super::state_store::{SavedState, StateStore};
use crate::codec::{Decoder, WireFormat};
use crate::config::{Config, Runtime};
use crate::health::HealthReport;
use anyhow::Context as _;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
mod emitter;
mod records;
use emitter::*;
mod housekeeping;
mod leaving;
pub use leaving::Leaving;

/// Records the loop takes from librdkafka's queue at once, when that many
/// are ready: enough to hint memory a few records ahead of applying them.
const POLL_BATCH: usize = 64;

/// Route groups whose saved states one pipelined read fetches at a
/// rebuild (about a megabyte of replies at ten channels a group).
const LOAD_CHUNK: usize = 500;

/// The request loop: the consumer and everything the loop mutates.
pub struct RequestLoop {
    consumer: BaseConsumer<RequestContext>,
    state: LoopState,
}

/// What the request loop needs from the service around it.
#[derive(Clone)]
pub struct LoopParts {
    /// The policy, reloaded live.
    pub cfg_rx: tokio::sync::watch::Receiver<Arc<Config>>,
    /// Frozen at start.
    pub runtime: Arc<Runtime>,
    pub ownership: Arc<Ownership>,
    /// Durable state machines; `None` (the demo without Redis): a takeover
    /// re-derives state from the replayed window.
    pub store: Option<StateStore>,
    pub producer: Arc<OutputProducer>,
    pub rt: tokio::runtime::Handle,
    pub metrics: Arc<Metrics>,
    pub instance: String,
    pub stop: tokio_util::sync::CancellationToken,
    /// The operators' desired overrides (pins are carried out here).
    pub overrides: tokio::sync::watch::Receiver<Arc<Overrides>>,
    /// Alerts are Confluent-framed with this id (registered at start).
    pub alert_schema_id: Option<u32>,
    /// This process's group writers: every health report is handed to them
    /// here as well as produced to the health topic (see `Emitter`).
    pub local_reports: tokio::sync::mpsc::Sender<HealthReport>,
    /// Which of the instance's request loops this is (0-based; one per
    /// `service.request_threads`, each a member of the consumer group).
    pub lane: usize,
    /// DECODE_ERROR_SPIKE over every record the instance reads, shared by
    /// its request loops.
    pub dead_letters: Arc<Mutex<crate::alert::DeadLetterRule>>,
    /// Partitions a request loop lost without a rebalance, for whichever
    /// loop gets them back (see [`LostPartitions`]).
    pub lost: Arc<Mutex<LostPartitions>>,
    /// Writer schemas fetched by any of the instance's request loops.
    pub schemas: super::registry::FetchedSchemas,
    /// The instance's request loops on their way out (see [`Leaving`]).
    pub leaving: Arc<Leaving>,
}

struct LoopState {
    cfg: Arc<Config>,
    runtime: Arc<Runtime>,
    ownership: Arc<Ownership>,
    cfg_rx: tokio::sync::watch::Receiver<Arc<Config>>,
    shared: Arc<Mutex<Shared>>,
    partitions: BTreeMap<i32, Partition>,
    registry: Option<Registry>,
    store: Option<StateStore>,
    rt: tokio::runtime::Handle,
    metrics: Arc<Metrics>,
    instance: String,
    stop: tokio_util::sync::CancellationToken,
    /// Which request loop of the instance this is.
    lane: usize,
    /// How many the instance runs, and their way out together.
    lanes: usize,
    leaving: Arc<Leaving>,
    /// DECODE_ERROR_SPIKE over every record this instance reads.
    dead_letters: Arc<Mutex<crate::alert::DeadLetterRule>>,
    lost: Arc<Mutex<LostPartitions>>,
    emitter: Emitter,
    overrides: tokio::sync::watch::Receiver<Arc<Overrides>>,
    /// The last consumer error logged, and when.
    last_consumer_error: Option<(String, Instant)>,
    /// Per partition, the offset to store once the batch is handled: the
    /// last live record's plus one.
    to_store: BTreeMap<i32, i64>,
    /// The state store's generation this loop last saved everything for
    /// (see `state_store`).
    saved_generation: u64,
}

impl RequestLoop {
    /// `lanes` request loops on the same parts, one per lane (each its own
    /// consumer-group member).
    pub fn per_lane(lanes: usize, parts: LoopParts) -> anyhow::Result<Vec<RequestLoop>> {
        (0..lanes)
            .map(|lane| {
                RequestLoop::new(
                    LoopParts {
                        lane,
                        ..parts.clone()
                    },
                    lanes,
                )
            })
            .collect()
    }

    /// Request loop `parts.lane` of the instance's `lanes`.
    pub fn new(parts: LoopParts, lanes: usize) -> anyhow::Result<RequestLoop> {
        let cfg = parts.cfg_rx.borrow().clone();
        let k = &parts.runtime.kafka;
        let shared = Arc::new(Mutex::new(Shared::default()));
        let ctx = RequestContext {
            lane: parts.lane,
            brokers: k.brokers.clone(),
            topic: k.request_topic.clone(),
            replay_ms: cfg.engine.long_window_ms.max(cfg.engine.short_window_ms)
                + cfg.engine.allowed_lateness_ms,
            shared: shared.clone(),
            lost: parts.lost.clone(),
            producer: parts.producer.clone(),
            metrics: parts.metrics.clone(),
            quiet: kafka::QuietLog::default(),
        };
        let consumer = request_consumer(k, &parts.instance, parts.lane, ctx)?;
        let registry = if k.schema_registry_url.is_empty() {
            None
        } else {
            Some(Registry::new(k)?.sharing(parts.schemas.clone()))
        };
        let emitter = Emitter {
            runtime: parts.runtime.clone(),
            producer: parts.producer,
            metrics: parts.metrics.clone(),
            store: parts.store.clone(),
            alert_schema_id: parts.alert_schema_id,
            local_reports: parts.local_reports,
        };
        Ok(RequestLoop {
            consumer,
            state: LoopState {
                cfg,
                runtime: parts.runtime.clone(),
                ownership: parts.ownership,
                cfg_rx: parts.cfg_rx,
                shared,
                partitions: BTreeMap::new(),
                registry,
                store: parts.store,
                rt: parts.rt,
                metrics: parts.metrics,
                instance: parts.instance,
                stop: parts.stop,
                lane: parts.lane,
                lanes,
                leaving: parts.leaving,
                dead_letters: parts.dead_letters,
                lost: parts.lost,
                emitter,
                overrides: parts.overrides,
                last_consumer_error: None,
                to_store: BTreeMap::new(),
                saved_generation: 0,
            },
        })
    }

    /// Runs until `stop` is set or an output cannot be delivered (then the
    /// uncommitted records are handled again by whoever takes over).
    pub fn run(self) -> anyhow::Result<()> {
        let RequestLoop {
            consumer,
            mut state,
        } = self;
        state.run(&consumer)
    }
}

type RequestConsumer = BaseConsumer<RequestContext>;

/// The lane's member of the request topic's consumer group, subscribed.
fn request_consumer(
    k: &crate::config::KafkaConfig,
    instance: &str,
    lane: usize,
    ctx: RequestContext,
) -> anyhow::Result<RequestConsumer> {
    let mut config = kafka::client_config(k);
    if let Some(member) = k.static_member(lane)? {
        config.set("group.instance.id", member);
    }
    let consumer: RequestConsumer = config
        .set("group.id", &k.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", k.session_timeout_ms.to_string())
        .set("heartbeat.interval.ms", k.heartbeat_interval_ms.to_string())
        // Incremental rebalances: partitions that stay keep their
        // engines, only moved ones are revoked and rebuilt.
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("client.id", lane_client_id(instance, lane))
        .set("statistics.interval.ms", "1000")
        // The loop drains its fetch queue slower than librdkafka fills
        // it whenever it is behind; the default 1 s backoff then left
        // it idle 0.5-0.7 s of every second (benches/end_to_end.rs:
        // 115 k records/s with it, 470 k without).
        .set("fetch.queue.backoff.ms", "10")
        // A topic created after start (kafka.create_topics, or an
        // operator) is noticed within seconds, not the default 5 min.
        .set("topic.metadata.refresh.interval.ms", "5000")
        .create_with_context(ctx)
        .context("creating the request consumer")?;
    consumer
        .subscribe(&[k.request_topic.as_str()])
        .context("subscribing to the request topic")?;
    Ok(consumer)
}

/// The consumer's `client.id`: the instance, and the loop when there are
/// several (broker logs and group listings tell them apart).
fn lane_client_id(instance: &str, lane: usize) -> String {
    if lane == 0 {
        instance.to_string()
    } else {
        format!("{instance}-r{lane}")
    }
}

impl LoopState {
    fn run(&mut self, consumer: &RequestConsumer) -> anyhow::Result<()> {
        match self.serve(consumer) {
            Ok(()) => leaving::leave(self, consumer),
            Err(e) => {
                self.leaving.failed();
                Err(e)
            }
        }
    }

    /// Polls, handles and commits until `stop` is set.
    fn serve(&mut self, consumer: &RequestConsumer) -> anyhow::Result<()> {
        // Every line this loop logs names it (`requests{lane=1}`).
        let _span = tracing::info_span!("requests", lane = self.lane).entered();
        let decoder = Decoder::new(WireFormat::Auto);
        let mut next_commit = Instant::now();
        let mut next_housekeeping = Instant::now();
        let mut batch = Vec::with_capacity(POLL_BATCH);
        while !self.stop.is_cancelled() {
            let polled = consumer.poll(Duration::from_millis(100));
            self.handle_rebalances(consumer);
            match polled {
                Some(Ok(m)) => {
                    batch.push(m);
                    records::poll_batch(self, consumer, &decoder, &mut batch)?;
                }
                Some(Err(e)) => self.consumer_error(e),
                None => {}
            }
            let housekeeping = Instant::now() >= next_housekeeping;
            if housekeeping || self.overrides.has_changed().unwrap_or(false) {
                // Also every round: a partition assigned, or a channel's
                // first event, since the set last changed.
                housekeeping::reconcile_overrides(self)?;
            }
            if housekeeping {
                next_housekeeping = Instant::now() + Duration::from_millis(500);
                housekeeping::housekeeping(self, consumer)?;
            }
            if Instant::now() >= next_commit {
                next_commit = Instant::now()
                    + Duration::from_millis(self.runtime.service.commit_interval_ms as u64);
                housekeeping::commit(self, consumer)?;
            }
        }
        Ok(())
    }

    /// A consumer error is logged when it differs from the last one, or a
    /// minute after it: a broker that stays down is not a line per poll
    /// (librdkafka retries on its own; readiness reports it).
    fn consumer_error(&mut self, e: rdkafka::error::KafkaError) {
        let text = e.to_string();
        let repeat = self
            .last_consumer_error
            .as_ref()
            .is_some_and(|(t, at)| *t == text && at.elapsed() < Duration::from_secs(60));
        if !repeat {
            tracing::warn!(error = %text, brokers = %self.runtime.kafka.brokers, "consumer error");
            self.last_consumer_error = Some((text, Instant::now()));
        }
    }

    /// Saved state machines of every group (retried briefly; without them a
    /// takeover re-derives state from the replayed window alone).
    fn load_saved_states(&self) -> BTreeMap<String, SavedState> {
        let mut out = BTreeMap::new();
        let Some(store) = &self.store else {
            return out;
        };
        // Pipelined in chunks, each retried on its own: a failure costs
        // the states of one chunk's groups, not of every group.
        let groups: Vec<&str> = self.cfg.groups.iter().map(|g| g.id.as_str()).collect();
        let started = Instant::now();
        for chunk in groups.chunks(LOAD_CHUNK) {
            let mut attempt = 0;
            let mut backoff = crate::backoff::Backoff::SHORT;
            loop {
                attempt += 1;
                let r = self.rt.block_on(async {
                    tokio::time::timeout(Duration::from_secs(5), store.load(chunk)).await
                });
                match r {
                    Ok(Ok(states)) => {
                        out.extend(states);
                        break;
                    }
                    Ok(Err(e)) if attempt < 3 => {
                        let wait = backoff.next_delay();
                        tracing::warn!(groups = chunk.len(), first = chunk[0], error = %e, retry_in = ?wait, "loading saved state; retrying");
                        std::thread::sleep(wait);
                    }
                    Err(_) if attempt < 3 => {}
                    other => {
                        tracing::error!(groups = chunk.len(), first = chunk[0], result = ?other.map(|r| r.map(|_| ())), "saved state unavailable; state is rebuilt from the replay alone");
                        break;
                    }
                }
            }
        }
        tracing::info!(
            groups = groups.len(),
            states = out.len(),
            took_ms = started.elapsed().as_millis() as u64,
            "saved states loaded"
        );
        out
    }

    /// New partitions, restored from the saved state machines.
    fn build(&self, fresh: &[Assigned]) -> Vec<Partition> {
        let saved = self.load_saved_states();
        let e = &self.cfg.engine;
        let now = crate::wall_clock::now_ms();
        let replay_floor_ms = now - e.long_window_ms.max(e.short_window_ms) - e.allowed_lateness_ms;
        let latest_ok_ms = now.saturating_add(e.clock_skew_ms());
        fresh
            .iter()
            .map(|a| {
                let pos = Position {
                    resume_at: a.resume_at,
                    caught_up_at: a.high,
                    start: a.start,
                    replay_floor_ms,
                };
                let dedup_ms = self.runtime.service.dedup_horizon_ms;
                Partition::rebuild(
                    a.partition,
                    self.cfg.clone(),
                    pos,
                    &saved,
                    latest_ok_ms,
                    dedup_ms,
                )
            })
            .collect()
    }

    fn handle_rebalances(&mut self, consumer: &RequestConsumer) {
        let events = std::mem::take(&mut lock(&self.shared).events);
        if events.is_empty() {
            return;
        }
        self.metrics.readiness.set_assigned();
        for ev in events {
            let mut partitions = std::mem::take(&mut self.partitions);
            let lost = self.lost.clone();
            rebalance::apply(&mut partitions, ev, &self.metrics, &lost, |fresh| {
                self.build(fresh)
            });
            self.partitions = partitions;
        }
        let owned: std::collections::BTreeSet<i32> = self
            .partitions
            .iter()
            .filter(|(_, p)| p.active)
            .map(|(p, _)| *p)
            .collect();
        self.metrics.set_owned(self.lane, owned.clone());
        self.ownership.set_owned(self.lane, owned);
        housekeeping::refresh_partition_count(self, consumer);
    }
}

/// The idle advance over `partitions`, with the outputs handed to `emit`.
/// An output `emit` refuses stops the advance and is returned: what an idle
/// step produced (a cool-down's alert) is never dropped on the floor.
fn advance_idle(
    partitions: &mut BTreeMap<i32, Partition>,
    known: &HashMap<i32, (i64, Instant)>,
    idle: Duration,
    to: i64,
    instance: &str,
    mut emit: impl FnMut(Outputs) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    for (p, part) in partitions.iter_mut() {
        let due = part.active
            && part.caught_up()
            && part.last_record.elapsed() >= idle
            && part.last_idle_check.elapsed() >= idle;
        if !due {
            continue;
        }
        part.last_idle_check = Instant::now();
        match known.get(p) {
            // Reported since the last record came, and nothing past it.
            Some((high, at)) if *at > part.last_record && *high <= part.next_offset() => {
                part.advance_to(to);
                emit(part.outputs(instance, crate::wall_clock::now_ms))?;
            }
            Some((high, _)) => {
                tracing::debug!(
                    partition = p,
                    high,
                    next = part.next_offset(),
                    "not idle yet: event time waits"
                );
            }
            None => {
                tracing::debug!(partition = p, "no fetch report yet: event time waits");
            }
        }
    }
    Ok(())
}

/// The request topic's partition count from the broker's metadata: `Err`
/// (with why) when the fetch fails or the topic has no partitions yet.
fn partition_count<C: rdkafka::consumer::ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
) -> Result<u32, String> {
    let md = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(2))
        .map_err(|e| format!("metadata unavailable: {e}"))?;
    let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
        return Err("the topic is not in the metadata".into());
    };
    match t.error() {
        Some(e) => Err(format!("{e:?}")),
        None if t.partitions().is_empty() => Err("no partitions in the metadata".into()),
        None => Ok(t.partitions().len() as u32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::tests::sample_event;
    use crate::config::Tier;

    fn partition() -> Partition {
        let cfg = Arc::new(Config::single_group(
            "chat",
            &[
                ("free-a", Tier::Free, 0.0, 50.0),
                ("paid-a", Tier::Paid, 1.0, 100.0),
            ],
        ));
        let pos = Position {
            resume_at: 0,
            caught_up_at: Some(0),
            start: 0,
            replay_floor_ms: 0,
        };
        Partition::rebuild(0, cfg, pos, &BTreeMap::new(), i64::MAX, 60_000)
    }

    /// A partition whose free channel was drained by five failures, then
    /// read nothing for a while: the idle advance past its cool-down has
    /// an alert to emit.
    fn drained_and_idle(t0: i64) -> (BTreeMap<i32, Partition>, HashMap<i32, (i64, Instant)>) {
        let mut p = partition();
        let ids: Vec<String> = (0..5).map(|i| format!("e{i}")).collect();
        for (offset, id) in ids.iter().enumerate() {
            let mut e = sample_event();
            e.channel_id = "free-a";
            e.event_id = id;
            e.event_time_ms = t0 + offset as i64 * 10;
            e.error_class = crate::event::ErrorClass::ServerError;
            e.http_status = 503;
            p.apply(&e, offset as i64, e.event_time_ms).unwrap();
            p.handled(offset as i64, Instant::now());
        }
        let _ = p.outputs("test", || t0);
        p.last_record = Instant::now() - Duration::from_secs(10);
        p.last_idle_check = p.last_record;
        let known = HashMap::from([(0, (p.next_offset(), Instant::now()))]);
        (BTreeMap::from([(0, p)]), known)
    }

    #[test]
    fn an_idle_step_whose_alert_cannot_leave_stops_the_loop() {
        let t0 = 1_764_000_000_000;
        let (mut parts, known) = drained_and_idle(t0);
        let mut alerts = Vec::new();
        let idle = Duration::from_secs(1);
        let to = t0 + 10 * 60_000;
        advance_idle(&mut parts, &known, idle, to, "test", |out| {
            alerts.extend(out.alerts);
            Ok(())
        })
        .unwrap();
        assert!(
            !alerts.is_empty(),
            "the cool-down should have produced an alert"
        );

        let (mut parts, known) = drained_and_idle(t0);
        let mut offered = 0;
        let refused = advance_idle(&mut parts, &known, idle, to, "test", |out| {
            offered += out.alerts.len();
            anyhow::bail!("alert produce failed")
        });
        assert!(offered > 0);
        assert!(
            refused.is_err(),
            "an alert the producer refused must stop the loop, not vanish"
        );
    }

    #[test]
    fn the_partition_count_is_an_error_until_the_topic_exists() {
        let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
        let consumer: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("allow.auto.create.topics", "false")
            .create()
            .unwrap();
        let missing = partition_count(&consumer, "requests");
        assert!(missing.is_err(), "{missing:?}");
        cluster.create_topic("requests", 3, 1).unwrap();
        assert_eq!(partition_count(&consumer, "requests"), Ok(3));
    }
}
