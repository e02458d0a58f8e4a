//! The request-topic loop: one engine per owned partition.
//!
//! Runs on its own OS thread around a `BaseConsumer`, so rebalance callbacks
//! run between two records of the same loop and need no locking against it.
//!
//! Per record: decode (fetching an unknown writer schema from the registry
//! once), drop duplicates by event id, apply to the partition's engine; a
//! bad record goes to the dead-letter topic with its reason and never stalls
//! the partition. Offsets are stored after the record was handled and
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

use super::groups::Ownership;
use super::kafka::{self, OutputProducer};
use super::metrics::{ChannelGauges, Metrics};
use super::registry::Registry;
use super::state_store::{SavedState, StateStore, StateWrite};
use crate::alert::AlertEvent;
use crate::codec::{Decoder, NoRegistry, SchemaLookup, WireFormat};
use crate::composition::{health_reports, ReportGate};
use crate::config::Config;
use crate::dedup::Dedup;
use crate::engine::{ApplyError, ChannelIdx, Engine};
use crate::state::StateMachine;
use anyhow::{anyhow, Context as _};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Message};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BROKER_TIMEOUT: Duration = Duration::from_secs(10);

/// A partition the group gave us, as the rebalance callback prepared it.
#[derive(Debug, Clone)]
struct Assigned {
    partition: i32,
    /// We held it before this rebalance and resume where we were.
    kept: bool,
    /// Offsets below this were handled by a previous owner.
    resume_at: i64,
    /// High watermark at assignment: reporting starts once past it.
    high: i64,
    /// First offset this assignment reads.
    start: i64,
}

#[derive(Debug)]
enum RebalanceEvent {
    /// `incremental`: added to the current assignment (cooperative);
    /// otherwise the whole new assignment (eager).
    Assigned {
        list: Vec<Assigned>,
        incremental: bool,
    },
    /// `Some`: these partitions (cooperative); `None`: all (eager).
    Revoked(Option<Vec<i32>>),
}

#[derive(Default)]
struct Shared {
    /// Positions of the partitions held when they were last revoked.
    positions: HashMap<i32, i64>,
    /// Per partition: the high watermark of the last fetch response, from
    /// librdkafka's statistics, and when it was reported.
    high_watermarks: HashMap<i32, (i64, Instant)>,
    events: Vec<RebalanceEvent>,
}

/// Prepares offsets on assignment (replay start) and commits on revocation.
struct RequestContext {
    topic: String,
    replay_ms: i64,
    shared: Arc<Mutex<Shared>>,
    producer: Arc<OutputProducer>,
    metrics: Arc<Metrics>,
}

impl ClientContext for RequestContext {
    /// Consumer lag per partition from librdkafka's statistics (no broker
    /// round trip on the loop).
    fn stats(&self, stats: rdkafka::Statistics) {
        if let Some(t) = stats.topics.get(&self.topic) {
            let now = Instant::now();
            let mut shared = lock(&self.shared);
            for (p, part) in &t.partitions {
                if *p >= 0 && part.consumer_lag >= 0 {
                    self.metrics.set_lag(*p, part.consumer_lag);
                }
                if *p >= 0 && part.hi_offset >= 0 {
                    shared.high_watermarks.insert(*p, (part.hi_offset, now));
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RequestContext {
    fn plan_assignment(
        &self,
        c: &BaseConsumer<RequestContext>,
        tpl: &mut TopicPartitionList,
    ) -> Vec<Assigned> {
        let positions = std::mem::take(&mut lock(&self.shared).positions);
        let partitions: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
        let mut fresh = TopicPartitionList::new();
        for p in &partitions {
            if !positions.contains_key(p) {
                fresh.add_partition(&self.topic, *p);
            }
        }
        let committed: HashMap<i32, i64> = if fresh.count() > 0 {
            match c.committed_offsets(fresh.clone(), BROKER_TIMEOUT) {
                Ok(t) => t
                    .elements()
                    .iter()
                    .filter_map(|e| match e.offset() {
                        Offset::Offset(o) => Some((e.partition(), o)),
                        _ => None,
                    })
                    .collect(),
                Err(e) => {
                    tracing::warn!(error = %e, "committed offsets unavailable; replaying the window only");
                    HashMap::new()
                }
            }
        } else {
            HashMap::new()
        };
        let since = crate::wall_clock::now_ms() - self.replay_ms;
        let mut by_time = TopicPartitionList::new();
        for e in fresh.elements() {
            let _ = by_time.add_partition_offset(&self.topic, e.partition(), Offset::Offset(since));
        }
        let replay_from: HashMap<i32, Offset> = if by_time.count() > 0 {
            match c.offsets_for_times(by_time, BROKER_TIMEOUT) {
                Ok(t) => t
                    .elements()
                    .iter()
                    .map(|e| (e.partition(), e.offset()))
                    .collect(),
                Err(e) => {
                    tracing::warn!(error = %e, "offsets-for-times failed; replaying from the committed offsets");
                    HashMap::new()
                }
            }
        } else {
            HashMap::new()
        };
        let mut out = Vec::new();
        for p in partitions {
            let high = c
                .fetch_watermarks(&self.topic, p, BROKER_TIMEOUT)
                .map(|(_, h)| h)
                .unwrap_or(0);
            let (start, kept, resume_at, start_num) = if let Some(&pos) = positions.get(&p) {
                (Offset::Offset(pos), true, pos, pos)
            } else {
                let committed = committed.get(&p).copied();
                // Replay the window (by time) when the broker can say where it
                // starts; without that, from the committed offset, or for a
                // group that never committed, from the beginning (records
                // older than every window are then skipped cheaply, and bad
                // ones still reach the dead-letter topic: nothing is lost).
                let start = match (replay_from.get(&p), committed) {
                    (Some(Offset::Offset(o)), Some(c)) => Offset::Offset((*o).min(c)),
                    (Some(Offset::Offset(o)), None) => Offset::Offset(*o),
                    (_, Some(c)) => Offset::Offset(c),
                    (_, None) => Offset::Beginning,
                };
                let start_num = match start {
                    Offset::Offset(o) => o,
                    Offset::End => high,
                    _ => 0,
                };
                // A brand-new group: what we replay is new to everyone.
                (start, false, committed.unwrap_or(start_num), start_num)
            };
            let _ = tpl.set_partition_offset(&self.topic, p, start);
            tracing::info!(
                partition = p,
                ?start,
                resume_at,
                high,
                kept,
                "partition assigned"
            );
            out.push(Assigned {
                partition: p,
                kept,
                resume_at,
                high,
                start: start_num,
            });
        }
        out
    }
}

impl ConsumerContext for RequestContext {
    fn rebalance(
        &self,
        c: &BaseConsumer<RequestContext>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let incremental = matches!(c.rebalance_protocol(), RebalanceProtocol::Cooperative);
                let list = self.plan_assignment(c, tpl);
                let r = if incremental {
                    c.incremental_assign(tpl)
                } else {
                    c.assign(tpl)
                };
                if let Err(e) = r {
                    tracing::error!(error = %e, "assign failed");
                }
                lock(&self.shared)
                    .events
                    .push(RebalanceEvent::Assigned { list, incremental });
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let incremental = matches!(c.rebalance_protocol(), RebalanceProtocol::Cooperative);
                let mut positions = HashMap::new();
                if let Ok(pos) = c.position() {
                    for e in pos.elements() {
                        if let Offset::Offset(o) = e.offset() {
                            positions.insert(e.partition(), o);
                        }
                    }
                }
                if !c.assignment_lost() {
                    // Outputs first, then the offsets that cover them.
                    if self.producer.flush(BROKER_TIMEOUT).is_ok() {
                        if let Err(e) = c.commit_consumer_state(CommitMode::Sync) {
                            tracing::debug!(error = %e, "commit on revocation");
                        }
                    }
                }
                let revoked: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                tracing::info!(?revoked, "partitions revoked");
                let r = if incremental {
                    c.incremental_unassign(tpl)
                } else {
                    c.unassign()
                };
                if let Err(e) = r {
                    tracing::error!(error = %e, "unassign failed");
                }
                let mut sh = lock(&self.shared);
                if incremental {
                    sh.events.push(RebalanceEvent::Revoked(Some(revoked)));
                } else {
                    sh.positions = positions;
                    sh.events.push(RebalanceEvent::Revoked(None));
                }
            }
            other => tracing::error!(error = ?other, "rebalance error"),
        }
    }
}

struct Partition {
    engine: Engine,
    dedup: Dedup,
    alerts: Vec<AlertEvent>,
    resume_at: i64,
    caught_up_at: i64,
    next_offset: i64,
    /// Replayed events older than this are outside every window (a broker
    /// that answers offsets-for-times too early costs time, not results).
    replay_floor_ms: i64,
    last_record: Instant,
    /// When `advance_idle` last asked the broker whether this partition is
    /// really idle (at most once per `idle_advance_ms`).
    last_idle_check: Instant,
    /// When the engine's steps are reported (`composition::ReportGate`).
    gate: ReportGate,
    saved: ahash::AHashMap<String, StateMachine>,
    active: bool,
}

impl Partition {
    fn replaying(&self) -> bool {
        self.next_offset < self.resume_at
    }
    fn caught_up(&self) -> bool {
        self.next_offset >= self.caught_up_at
    }
}

/// The request loop: the consumer and everything the loop mutates.
pub struct RequestLoop {
    consumer: BaseConsumer<RequestContext>,
    state: LoopState,
}

struct LoopState {
    cfg: Arc<Config>,
    ownership: Arc<Ownership>,
    cfg_rx: tokio::sync::watch::Receiver<Arc<Config>>,
    producer: Arc<OutputProducer>,
    shared: Arc<Mutex<Shared>>,
    partitions: BTreeMap<i32, Partition>,
    registry: Option<Registry>,
    /// Durable state machines; `None` (the demo without Redis): a takeover
    /// re-derives state from the replayed window.
    store: Option<StateStore>,
    rt: tokio::runtime::Handle,
    metrics: Arc<Metrics>,
    instance: String,
    stop: Arc<AtomicBool>,
    /// DECODE_ERROR_SPIKE over every record this instance reads.
    dead_letters: crate::alert::DeadLetterRule,
}

impl RequestLoop {
    pub fn new(
        cfg_rx: tokio::sync::watch::Receiver<Arc<Config>>,
        ownership: Arc<Ownership>,
        store: Option<StateStore>,
        rt: tokio::runtime::Handle,
        metrics: Arc<Metrics>,
        instance: String,
        stop: Arc<AtomicBool>,
    ) -> anyhow::Result<RequestLoop> {
        let cfg = cfg_rx.borrow().clone();
        let k = &cfg.kafka;
        let producer =
            kafka::output_producer(k, metrics.clone()).context("creating the producer")?;
        let producer = Arc::new(producer);
        let shared = Arc::new(Mutex::new(Shared::default()));
        let ctx = RequestContext {
            topic: k.request_topic.clone(),
            replay_ms: cfg.engine.long_window_ms.max(cfg.engine.short_window_ms)
                + cfg.engine.allowed_lateness_ms,
            shared: shared.clone(),
            producer: producer.clone(),
            metrics: metrics.clone(),
        };
        let consumer: BaseConsumer<RequestContext> = kafka::client_config(k)
            .set("group.id", &k.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", k.session_timeout_ms.to_string())
            .set(
                "heartbeat.interval.ms",
                (k.session_timeout_ms / 3).max(100).to_string(),
            )
            // Incremental rebalances: partitions that stay keep their
            // engines, only moved ones are revoked and rebuilt.
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("client.id", &instance)
            .set("statistics.interval.ms", "1000")
            .create_with_context(ctx)
            .context("creating the request consumer")?;
        consumer
            .subscribe(&[k.request_topic.as_str()])
            .context("subscribing to the request topic")?;
        let registry =
            (!k.schema_registry_url.is_empty()).then(|| Registry::new(&k.schema_registry_url));
        let dead_letters = crate::alert::DeadLetterRule::new(cfg.alerts.clone());
        Ok(RequestLoop {
            consumer,
            state: LoopState {
                cfg,
                ownership,
                cfg_rx,
                producer,
                shared,
                partitions: BTreeMap::new(),
                registry,
                store,
                rt,
                metrics,
                instance,
                stop,
                dead_letters,
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

impl LoopState {
    fn run(&mut self, consumer: &RequestConsumer) -> anyhow::Result<()> {
        let decoder = Decoder::new(WireFormat::Auto);
        let mut next_commit = Instant::now();
        let mut next_housekeeping = Instant::now();
        while !self.stop.load(Ordering::Relaxed) {
            let polled = consumer.poll(Duration::from_millis(100));
            self.handle_rebalances(consumer);
            // Nothing fetched and queued: every partition is caught up.
            let drained = polled.is_none();
            match polled {
                Some(Ok(m)) => {
                    self.handle_record(consumer, &decoder, &m)?;
                }
                Some(Err(e)) => tracing::warn!(error = %e, "consumer error"),
                None => {}
            }
            if Instant::now() >= next_housekeeping {
                next_housekeeping = Instant::now() + Duration::from_millis(500);
                self.reload_config();
                if drained {
                    self.advance_idle();
                }
            }
            if Instant::now() >= next_commit {
                next_commit = Instant::now()
                    + Duration::from_millis(self.cfg.service.commit_interval_ms as u64);
                self.commit(consumer)?;
            }
        }
        self.commit(consumer)?;
        Ok(())
    }

    /// Commits the stored offsets once every output produced so far is
    /// acknowledged. A slow broker only delays the commit (the stored
    /// offsets wait for the next round); an output that failed for good
    /// (after librdkafka's own retries) stops the loop without committing
    /// past it.
    fn commit(&mut self, consumer: &RequestConsumer) -> anyhow::Result<()> {
        if let Err(e) = self.producer.flush(Duration::from_secs(2)) {
            tracing::debug!(error = %e, "outputs still in flight; commit waits for the next round");
            return Ok(());
        }
        let failed = self.metrics.outputs_undelivered.load(Ordering::Relaxed);
        if failed > 0 {
            anyhow::bail!(
                "{failed} output record(s) were not delivered; exiting without committing past them"
            );
        }
        if self.partitions.values().any(|p| p.active) {
            match consumer.commit_consumer_state(CommitMode::Async) {
                Ok(()) => Metrics::inc(&self.metrics.commits),
                // Nothing stored since the last commit.
                Err(rdkafka::error::KafkaError::ConsumerCommit(
                    rdkafka::error::RDKafkaErrorCode::NoOffset,
                )) => {}
                Err(e) => tracing::warn!(error = %e, "offset commit failed; retrying next round"),
            }
        }
        Ok(())
    }

    fn reload_config(&mut self) {
        if !self.cfg_rx.has_changed().unwrap_or(false) {
            return;
        }
        let cfg = self.cfg_rx.borrow_and_update().clone();
        for (p, part) in self.partitions.iter_mut() {
            if let Err(e) = part.engine.reconfigure(cfg.clone()) {
                tracing::error!(partition = p, error = %e, "config reload not applied");
                return;
            }
        }
        self.cfg = cfg;
    }

    /// Saved state machines of every group (retried briefly; without them a
    /// takeover re-derives state from the replayed window alone).
    fn load_saved_states(&self) -> BTreeMap<String, SavedState> {
        let mut out = BTreeMap::new();
        let Some(store) = &self.store else {
            return out;
        };
        for g in &self.cfg.groups {
            let mut attempt = 0;
            loop {
                attempt += 1;
                let r = self.rt.block_on(async {
                    tokio::time::timeout(Duration::from_secs(5), store.load(&g.id)).await
                });
                match r {
                    Ok(Ok(states)) => {
                        out.extend(states);
                        break;
                    }
                    Ok(Err(e)) if attempt < 3 => {
                        tracing::warn!(group = %g.id, error = %e, "loading saved state; retrying");
                        std::thread::sleep(Duration::from_millis(500));
                    }
                    Err(_) if attempt < 3 => {}
                    other => {
                        tracing::error!(group = %g.id, result = ?other.map(|r| r.map(|_| ())), "saved state unavailable; state is rebuilt from the replay alone");
                        break;
                    }
                }
            }
        }
        out
    }

    fn handle_rebalances(&mut self, consumer: &RequestConsumer) {
        let events = std::mem::take(&mut lock(&self.shared).events);
        if events.is_empty() {
            return;
        }
        self.apply_rebalances(events);
        let owned: std::collections::BTreeSet<i32> = self
            .partitions
            .iter()
            .filter(|(_, p)| p.active)
            .map(|(p, _)| *p)
            .collect();
        self.metrics.set_owned(owned.clone());
        self.ownership.set_owned(owned);
        let topic = &self.cfg.kafka.request_topic;
        if let Ok(md) = consumer.fetch_metadata(Some(topic), BROKER_TIMEOUT) {
            if let Some(t) = md.topics().iter().find(|t| t.name() == topic) {
                self.ownership
                    .request_partitions
                    .store(t.partitions().len() as u32, Ordering::Relaxed);
            }
        }
    }

    fn apply_rebalances(&mut self, events: Vec<RebalanceEvent>) {
        for ev in events {
            match ev {
                RebalanceEvent::Revoked(None) => {
                    for part in self.partitions.values_mut() {
                        part.active = false;
                    }
                }
                RebalanceEvent::Revoked(Some(ps)) => {
                    for p in ps {
                        self.partitions.remove(&p);
                        self.metrics.forget_partition(p);
                    }
                }
                RebalanceEvent::Assigned { list, incremental } => {
                    let keep: Vec<i32> = list
                        .iter()
                        .filter(|a| a.kept)
                        .map(|a| a.partition)
                        .collect();
                    let gone: Vec<i32> = self
                        .partitions
                        .keys()
                        .filter(|p| !incremental && !keep.contains(p))
                        .copied()
                        .collect();
                    for p in gone {
                        self.partitions.remove(&p);
                        self.metrics.forget_partition(p);
                    }
                    let fresh: Vec<&Assigned> = list
                        .iter()
                        .filter(|a| !a.kept || !self.partitions.contains_key(&a.partition))
                        .collect();
                    let saved = if fresh.is_empty() {
                        BTreeMap::new()
                    } else {
                        self.load_saved_states()
                    };
                    let replay_floor_ms = crate::wall_clock::now_ms()
                        - self
                            .cfg
                            .engine
                            .long_window_ms
                            .max(self.cfg.engine.short_window_ms)
                        - self.cfg.engine.allowed_lateness_ms;
                    for a in fresh {
                        let mut engine = Engine::for_partition(self.cfg.clone());
                        let mut restored = ahash::AHashMap::new();
                        let latest_ok = crate::wall_clock::now_ms()
                            .saturating_add(self.cfg.engine.clock_skew_ms());
                        for (channel, s) in &saved {
                            // A state saved by a build that let a bad clock
                            // move event time would freeze the channel until
                            // then: it counts as saved now.
                            if s.saved_at_ms > latest_ok {
                                tracing::warn!(
                                    channel = %channel,
                                    saved_at_ms = s.saved_at_ms,
                                    "saved state is stamped in the future; restoring it as of now"
                                );
                            }
                            let saved_at = s.saved_at_ms.min(latest_ok);
                            if engine.restore(channel, s.machine.clone(), saved_at) {
                                restored.insert(channel.clone(), s.machine.clone());
                            }
                        }
                        tracing::info!(
                            partition = a.partition,
                            restored = restored.len(),
                            "partition rebuilding"
                        );
                        self.partitions.insert(
                            a.partition,
                            Partition {
                                engine,
                                dedup: Dedup::new(self.cfg.service.dedup_horizon_ms),
                                alerts: Vec::new(),
                                resume_at: a.resume_at,
                                caught_up_at: a.high,
                                next_offset: a.start,
                                replay_floor_ms,
                                last_record: Instant::now(),
                                last_idle_check: Instant::now(),
                                gate: ReportGate::default(),
                                saved: restored,
                                active: true,
                            },
                        );
                    }
                    for p in keep {
                        if let Some(part) = self.partitions.get_mut(&p) {
                            part.active = true;
                        }
                    }
                }
            }
        }
    }

    fn dead_letter(
        &self,
        m: &rdkafka::message::BorrowedMessage<'_>,
        kind: &'static str,
        reason: &str,
    ) -> anyhow::Result<()> {
        let payload = m.payload().unwrap_or(&[]);
        let mut rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&self.cfg.kafka.dead_letter_topic)
            .payload(payload)
            .headers(kafka::dead_letter_headers(
                kind,
                reason,
                m.partition(),
                m.offset(),
            ));
        if let Some(k) = m.key() {
            rec = rec.key(k);
        }
        if !kafka::send(&self.producer, rec) {
            anyhow::bail!(
                "dead-letter produce failed at partition {} offset {}; not committing past it",
                m.partition(),
                m.offset()
            );
        }
        self.metrics.dead_letter(kind);
        Ok(())
    }

    fn handle_record(
        &mut self,
        consumer: &RequestConsumer,
        decoder: &Decoder,
        m: &rdkafka::message::BorrowedMessage<'_>,
    ) -> anyhow::Result<()> {
        Metrics::inc(&self.metrics.events_consumed);
        let p = m.partition();
        let Some(part) = self.partitions.get(&p) else {
            return Ok(());
        };
        if !part.active || m.offset() < part.next_offset {
            return Ok(());
        }
        let replaying = m.offset() < part.resume_at;
        let payload = m.payload().unwrap_or(&[]);
        // An unknown writer schema is fetched once, before decoding.
        let mut registry_error = None;
        if let (Some(reg), [0, a, b, c, d, ..]) = (self.registry.as_mut(), payload) {
            let id = u32::from_be_bytes([*a, *b, *c, *d]);
            if reg.cache.writer_schema(id).is_none() {
                for attempt in 1..=3 {
                    match reg.fetch(id) {
                        Ok(_) => {
                            registry_error = None;
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(schema_id = id, attempt, error = %e, "schema registry");
                            registry_error = Some(e);
                            std::thread::sleep(Duration::from_millis(500));
                        }
                    }
                }
            }
        }
        let lookup: &dyn SchemaLookup = match &self.registry {
            Some(r) => &r.cache,
            None => &NoRegistry,
        };
        // One wall-clock read per record: the clock check and the
        // dead-letter share both use it.
        let wall = crate::wall_clock::now_ms();
        let outcome: Result<(), (&'static str, String)> = match decoder.decode(payload, lookup) {
            Ok(ev) => {
                let part = self.partitions.get_mut(&p).expect("checked above");
                if replaying && ev.event_time_ms < part.replay_floor_ms {
                    Ok(())
                } else if crate::clock::is_ahead(
                    ev.event_time_ms,
                    wall,
                    self.cfg.engine.clock_skew_ms(),
                ) {
                    // Before dedup: a far-future time would expire every
                    // remembered id. The engine refuses it the same way.
                    let e = part.engine.apply_live(&ev, wall, &mut part.alerts);
                    Err(e.map_or_else(
                        |e| (e.kind(), e.to_string()),
                        |()| ("future_timestamp", "stamped ahead of the wall clock".into()),
                    ))
                } else if !part.dedup.first_seen(ev.event_id, ev.event_time_ms) {
                    Metrics::inc(&self.metrics.duplicates);
                    Ok(())
                } else {
                    match part.engine.apply_live(&ev, wall, &mut part.alerts) {
                        Ok(()) => {
                            Metrics::inc(if replaying {
                                &self.metrics.events_replayed
                            } else {
                                &self.metrics.events_applied
                            });
                            Ok(())
                        }
                        Err(ApplyError::TooLate { .. }) => {
                            Metrics::inc(&self.metrics.too_late);
                            Ok(())
                        }
                        Err(e) => Err((e.kind(), e.to_string())),
                    }
                }
            }
            Err(e) => match (&e, registry_error) {
                (crate::codec::CodecError::UnknownSchemaId { .. }, Some(re)) => {
                    Err(("schema_registry_unreachable", format!("{e} ({re})")))
                }
                _ => Err((e.kind(), e.to_string())),
            },
        };
        if let Err((kind, reason)) = &outcome {
            if !replaying {
                self.dead_letter(m, kind, reason)?;
            }
        }
        if !replaying {
            let dead = outcome.as_ref().err().map(|(kind, _)| *kind);
            if let Some(spike) = self.dead_letters.record(wall, dead) {
                tracing::warn!(
                    reason = spike.reason,
                    share = spike.share,
                    records = spike.records,
                    "a share of the input is dead-lettered (DECODE_ERROR_SPIKE)"
                );
                if let Some(part) = self.partitions.get_mut(&p) {
                    part.alerts.push(spike.alert);
                }
            }
        }
        if !replaying {
            consumer
                .store_offset_from_message(m)
                .context("storing the offset")?;
        }
        let part = self.partitions.get_mut(&p).expect("checked above");
        part.next_offset = m.offset() + 1;
        part.last_record = Instant::now();
        self.after_engine_step(p)
    }

    /// Idle partitions move event time with the wall clock (minus the allowed
    /// lateness), so cool-downs and silence alarms still run.
    /// Event time moves on for partitions that are really idle: nothing came
    /// for `idle_advance_ms` *and* librdkafka's latest fetch report, made
    /// after the last record, shows nothing past what was read. A poll that
    /// returns nothing only says the fetch is slow (a loaded broker):
    /// advancing then would make the backlog, stamped earlier, arrive too
    /// late and be dropped. No report (a broker that does not answer) is no
    /// proof of idleness either: the partition waits. The report comes from
    /// the statistics callback (`statistics.interval.ms`), so the check asks
    /// the broker nothing.
    fn advance_idle(&mut self) {
        let idle = Duration::from_millis(self.cfg.service.idle_advance_ms as u64);
        let to = crate::wall_clock::now_ms() - self.cfg.engine.allowed_lateness_ms;
        let candidates: Vec<i32> = self
            .partitions
            .iter()
            .filter(|(_, part)| {
                part.active
                    && part.caught_up()
                    && part.last_record.elapsed() >= idle
                    && part.last_idle_check.elapsed() >= idle
            })
            .map(|(p, _)| *p)
            .collect();
        let known = lock(&self.shared).high_watermarks.clone();
        let mut ps = Vec::new();
        for p in candidates {
            let Some(part) = self.partitions.get_mut(&p) else {
                continue;
            };
            part.last_idle_check = Instant::now();
            match known.get(&p) {
                // Reported since the last record came, and nothing past it.
                Some((high, at)) if *at > part.last_record && *high <= part.next_offset => {
                    ps.push(p)
                }
                Some((high, _)) => {
                    tracing::debug!(
                        partition = p,
                        high,
                        next = part.next_offset,
                        "not idle yet: event time waits"
                    );
                }
                None => {
                    tracing::debug!(partition = p, "no fetch report yet: event time waits");
                }
            }
        }
        for p in ps {
            if let Some(part) = self.partitions.get_mut(&p) {
                if part.engine.watermark_ms().is_none() {
                    continue;
                }
                part.engine.advance_to(to, &mut part.alerts);
            }
            let _ = self.after_engine_step(p);
        }
    }

    /// After the engine moved: alerts out, and after an evaluation tick the
    /// state is saved, gauges updated and health reported.
    fn after_engine_step(&mut self, p: i32) -> anyhow::Result<()> {
        let Some(part) = self.partitions.get_mut(&p) else {
            return Ok(());
        };
        let replaying = part.replaying();
        // Reported after a tick, and at once after a state change between
        // ticks (the fast path): a drain must reach gateways in well under a
        // second.
        let due = part.gate.due(&part.engine, &part.alerts);
        for a in part.alerts.drain(..) {
            if replaying {
                continue; // the previous owner produced these
            }
            let key = a
                .channel_id
                .clone()
                .unwrap_or_else(|| a.route_group.clone());
            let bytes = a.to_avro().map_err(|e| anyhow!("alert encoding: {e}"))?;
            let rec = BaseRecord::to(&self.cfg.kafka.alert_topic)
                .key(key.as_bytes())
                .payload(&bytes[..]);
            if !kafka::send(&self.producer, rec) {
                anyhow::bail!("alert produce failed; not committing past it");
            }
            Metrics::inc(&self.metrics.alerts_produced);
        }
        let Some(changed) = due else {
            return Ok(());
        };
        let changed_at_wall_ms = changed.then(crate::wall_clock::now_ms);
        let Some(watermark) = part.engine.watermark_ms() else {
            return Ok(());
        };
        for idx in 0..part.engine.channel_count() as ChannelIdx {
            if !part.engine.has_events(idx) {
                continue;
            }
            let h = part.engine.health(idx);
            let machine = part.engine.machine(idx);
            if part.saved.get(&h.id) != Some(machine) {
                part.saved.insert(h.id.clone(), machine.clone());
                if let Some(store) = &self.store {
                    store.save(StateWrite {
                        group: h.group.clone(),
                        channel: h.id.clone(),
                        state: SavedState {
                            saved_at_ms: watermark,
                            machine: machine.clone(),
                        },
                    });
                }
            }
            let lat = part.engine.signals(idx).latency;
            self.metrics.set_channel(
                &h.id,
                ChannelGauges {
                    group: h.group.clone(),
                    state: h.state.as_str().to_string(),
                    score: h.score,
                    health_weight: h.weight,
                    p50_ms: lat.map(|l| l.p50_ms),
                    p99_ms: h.p99_ms,
                    error_rate: h.error_rate,
                    partition: p,
                },
            );
        }
        if !part.caught_up() {
            return Ok(());
        }
        for report in health_reports(&part.engine, &self.instance, p, changed_at_wall_ms) {
            let bytes = report.to_json();
            let rec = BaseRecord::to(&self.cfg.kafka.health_topic)
                .key(report.group.as_bytes())
                .payload(&bytes[..]);
            if kafka::send(&self.producer, rec) {
                Metrics::inc(&self.metrics.health_reports);
            }
        }
        Ok(())
    }
}
