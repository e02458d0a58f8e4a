//! What the service knows about itself, for `/metrics` and `/status`.
//!
//! The loops update these in place; a scrape only reads. The exposition is
//! rendered by the `prometheus-client` crate (Prometheus text format 0.0.4)
//! from an `Exporter` that reads this state at scrape time: `promtool
//! check metrics` finds nothing in it (`tests/metrics_lint.rs`).

use crate::health::TOP_SIGNALS;
use crate::short_str::ShortStr;
use crate::signals::{SignalKind, SIGNAL_COUNT};
use crate::state::StateKind;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// One channel as its partition owner last evaluated it. Fixed size, no
/// heap block of its own: the request thread writes it over the last one
/// in place ([`Metrics::set_channel`]) on every evaluation of every
/// channel. It used to go into a map keyed by id strings, with a few
/// strings and vectors a channel: a key allocated and compared down a
/// B-tree and the old value's blocks freed, each time (docs/performance.md,
/// "What the design choices bought").
#[derive(Debug, Clone)]
pub struct ChannelGauges {
    pub group: ShortStr,
    pub state: &'static str,
    pub score: Option<f64>,
    /// The score's largest contributions (signal, contribution), largest
    /// first: why the channel is where it is.
    pub signals: [Option<(SignalKind, f64)>; TOP_SIGNALS],
    pub health_weight: f64,
    /// An operator pin holds the channel's weight (`hermes ctl pin`).
    pub pinned: bool,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub error_rate: Option<f64>,
    /// Hard failures and bad answers over judged outcomes.
    pub failure_rate: Option<f64>,
    /// Every signal the engine measured at its last tick, in its own unit
    /// (the name says it: `_ms`, `_rate`, ratios), in [`SignalKind`] order:
    /// the dashboard's P99 vs baseline (`relative_p99`) and bad-answer
    /// rates. NaN for a signal with too few samples (not exported: it does
    /// not vote).
    pub signal_values: [f64; SIGNAL_COUNT],
}

impl Default for ChannelGauges {
    fn default() -> ChannelGauges {
        ChannelGauges {
            group: ShortStr::new(""),
            state: "",
            score: None,
            signals: [None; TOP_SIGNALS],
            health_weight: 0.0,
            pinned: false,
            p50_ms: None,
            p99_ms: None,
            error_rate: None,
            failure_rate: None,
            signal_values: [f64::NAN; SIGNAL_COUNT],
        }
    }
}

impl ChannelGauges {
    /// The contributions, largest first.
    pub fn contributions(&self) -> impl Iterator<Item = (SignalKind, f64)> + '_ {
        self.signals.iter().flatten().copied()
    }

    /// The signals measured (with enough samples), in [`SignalKind`] order.
    pub fn measured(&self) -> impl Iterator<Item = (SignalKind, f64)> + '_ {
        SignalKind::ALL
            .iter()
            .zip(self.signal_values)
            .filter(|(_, v)| v.is_finite())
            .map(|(k, v)| (*k, v))
    }
}

/// A channel's place in [`Metrics`]: its partition's row at the channel's
/// index in that partition's engine.
struct ChannelRow {
    id: ShortStr,
    gauges: ChannelGauges,
    /// When it was written (the registry's count of writes): of two
    /// partitions that both evaluated a channel, the later one is shown.
    written: u64,
}

/// Every channel row, per request partition, at the channel's index: a
/// pointer a configured channel per partition (indexes span the whole
/// config, and each partition evaluates only its share), a row for each
/// channel the partition evaluated.
#[derive(Default)]
struct ChannelRows {
    by_partition: BTreeMap<i32, Vec<Option<Box<ChannelRow>>>>,
    writes: u64,
}

/// One group as its writer last published it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct GroupGauges {
    pub epoch: u64,
    pub version: u64,
    /// Wall time of the last write or heartbeat refresh.
    pub heartbeat_ms: i64,
    pub manual: bool,
    pub projected_spend_per_hour: f64,
    pub budget_per_hour: Option<f64>,
    /// (class, channel) → weight.
    pub weights: BTreeMap<(String, String), f64>,
    pub shed: BTreeMap<String, f64>,
    pub waiting_for: Vec<String>,
}

/// A channel and the request partitions its events reach.
pub type SplitChannel = (String, Vec<i32>);

/// A histogram of durations, exported in seconds.
pub struct Histogram(prometheus_client::metrics::histogram::Histogram);

impl Histogram {
    /// Records one duration (negative: a clock step between instances; 0).
    pub fn observe_ms(&self, ms: i64) {
        self.0.observe(ms.max(0) as f64 / 1000.0);
    }
}

/// Buckets of `hermes_decision_publish_seconds`.
const DECISION_BUCKETS_S: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

impl Default for Histogram {
    fn default() -> Self {
        Histogram(prometheus_client::metrics::histogram::Histogram::new(
            DECISION_BUCKETS_S,
        ))
    }
}

#[derive(Default)]
pub struct Metrics {
    /// Record that changed a channel's state handled → the snapshot
    /// carrying it acknowledged by Redis (Hermes' own share of a drain's
    /// path to the gateways).
    pub decision_publish: Histogram,
    pub events_consumed: AtomicU64,
    pub events_applied: AtomicU64,
    pub events_replayed: AtomicU64,
    pub duplicates: AtomicU64,
    pub too_late: AtomicU64,
    pub alerts_produced: AtomicU64,
    pub health_reports: AtomicU64,
    pub health_reports_undelivered: AtomicU64,
    /// Alerts, dead letters and health reports acknowledged by Kafka.
    pub outputs_delivered: AtomicU64,
    /// Alerts and dead letters Kafka did not take (the request loop stops).
    pub outputs_undelivered: AtomicU64,
    pub snapshots_written: AtomicU64,
    pub snapshot_heartbeats: AtomicU64,
    pub snapshot_failures: AtomicU64,
    pub snapshots_refused_stale: AtomicU64,
    pub commits: AtomicU64,
    pub config_reloads: AtomicU64,
    pub config_reload_rejected: AtomicU64,
    dead_letters: Mutex<BTreeMap<&'static str, u64>>,
    channels: Mutex<ChannelRows>,
    /// (group, channel) → published weight changes.
    weight_changes: Mutex<BTreeMap<(String, String), u64>>,
    groups: Mutex<BTreeMap<String, GroupGauges>>,
    /// Per group written here: its channels split over request partitions.
    splits: Mutex<BTreeMap<String, Vec<SplitChannel>>>,
    /// Request partition → lag in records.
    lag: Mutex<BTreeMap<i32, i64>>,
    /// Request partitions this instance holds.
    /// Owned request partitions, per request loop.
    owned: Mutex<BTreeMap<usize, std::collections::BTreeSet<i32>>>,
    /// What `/readyz` answers.
    pub readiness: Readiness,
    /// The last alerts produced, one line each, newest last.
    recent_alerts: Mutex<std::collections::VecDeque<String>>,
    /// (group, channel or "", kind, severity) → alerts produced: what the
    /// alert rules page on (bounded: channels come from the config).
    alerts_by_kind: Mutex<BTreeMap<AlertSeries, u64>>,
}

/// (group, channel or "", kind, severity): one `hermes_alerts_total` series.
type AlertSeries = (String, String, &'static str, &'static str);

/// How many alert lines [`Metrics::recent_alerts`] keeps.
const RECENT_ALERTS: usize = 8;

/// A dependency `/readyz` reports on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Dependency {
    /// The request consumer's brokers (librdkafka's statistics: a broker up).
    Kafka,
    /// The health topic the group writers read.
    HealthTopic,
    /// Redis, for snapshots and saved state.
    Redis,
    /// The Schema Registry (a partition waits at a record it cannot decode
    /// without it).
    SchemaRegistry,
    /// Hermes' four topics exist.
    Topics,
}

impl Dependency {
    pub fn as_str(self) -> &'static str {
        match self {
            Dependency::Kafka => "kafka",
            Dependency::HealthTopic => "health_topic",
            Dependency::Redis => "redis",
            Dependency::SchemaRegistry => "schema_registry",
            Dependency::Topics => "topics",
        }
    }
}

/// Each dependency's last known problem, and the request loop's progress.
/// A dependency never seen failing counts as fine: readiness says what is
/// known to be wrong, with the reason.
#[derive(Default)]
pub struct Readiness {
    problems: Mutex<BTreeMap<Dependency, String>>,
    /// Every dependency checked at least once (`hermes_up` lists these).
    seen: Mutex<std::collections::BTreeSet<Dependency>>,
    /// The request loop received an assignment (possibly empty).
    assigned: std::sync::atomic::AtomicBool,
    /// Owned partitions still replaying or catching up, per request loop.
    catching_up: Mutex<BTreeMap<usize, u32>>,
    /// A dependency each request loop checks for itself (its consumer's
    /// brokers): the problem each loop last saw.
    per_lane: Mutex<BTreeMap<(Dependency, usize), String>>,
}

impl Readiness {
    /// Records a dependency's state: `Some(problem)` or fine. Logs once
    /// per change (a dependency that stays down is not a log line per
    /// retry). `target` names the address tried.
    pub fn set(&self, dep: Dependency, target: &str, problem: Option<String>) {
        lock(&self.seen).insert(dep);
        let mut problems = lock(&self.problems);
        match problem {
            Some(p) => {
                if problems.get(&dep) != Some(&p) {
                    tracing::warn!(dependency = dep.as_str(), %target, problem = %p, "dependency unavailable; retrying");
                    problems.insert(dep, p);
                }
            }
            None => {
                if problems.remove(&dep).is_some() {
                    tracing::info!(dependency = dep.as_str(), %target, "dependency available again");
                }
            }
        }
    }

    /// [`Readiness::set`] for a dependency every request loop checks on
    /// its own: it is down while any loop sees it down (one loop's
    /// consumer reconnected says nothing of another's), with the first
    /// problem, named by its loop but for the first.
    pub fn set_lane(&self, lane: usize, dep: Dependency, target: &str, problem: Option<String>) {
        let combined = {
            let mut lanes = lock(&self.per_lane);
            match problem {
                Some(p) => lanes.insert((dep, lane), p),
                None => lanes.remove(&(dep, lane)),
            };
            let mut down = lanes.iter().filter(|((d, _), _)| *d == dep);
            down.next().map(|((_, l), p)| match l {
                0 => p.clone(),
                l => format!("request loop {l}: {p}"),
            })
        };
        self.set(dep, target, combined);
    }

    pub fn set_assigned(&self) {
        self.assigned.store(true, Ordering::Relaxed);
    }

    /// Request loop `lane`'s partitions still replaying or catching up.
    pub fn set_catching_up(&self, lane: usize, partitions: u32) {
        lock(&self.catching_up).insert(lane, partitions);
    }

    /// Every dependency checked so far, and whether it was up at its last
    /// check.
    pub fn up(&self) -> Vec<(Dependency, bool)> {
        let problems = lock(&self.problems);
        lock(&self.seen)
            .iter()
            .map(|d| (*d, !problems.contains_key(d)))
            .collect()
    }

    pub fn catching_up(&self) -> u32 {
        lock(&self.catching_up).values().sum()
    }

    /// `Ok` when ready; otherwise every reason it is not.
    pub fn check(&self) -> Result<(), Vec<String>> {
        let mut reasons: Vec<String> = lock(&self.problems)
            .iter()
            .map(|(d, p)| format!("{}: {p}", d.as_str()))
            .collect();
        if !self.assigned.load(Ordering::Relaxed) {
            reasons.push("no partition assignment received yet".into());
        }
        let n = self.catching_up();
        if n > 0 {
            reasons.push(format!("{n} partition(s) still replaying or catching up"));
        }
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(reasons)
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Metrics {
    pub fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an alert Kafka acknowledged and keeps its line for people.
    pub fn alert_produced(&self, a: &crate::alert::AlertEvent) {
        Metrics::inc(&self.alerts_produced);
        *lock(&self.alerts_by_kind)
            .entry((
                a.route_group.clone(),
                a.channel_id.clone().unwrap_or_default(),
                a.kind.as_str(),
                a.severity.as_str(),
            ))
            .or_default() += 1;
        let mut recent = lock(&self.recent_alerts);
        if recent.len() == RECENT_ALERTS {
            recent.pop_front();
        }
        recent.push_back(format!(
            "{} {:<8} {:<3} {}",
            crate::wall_clock::utc(a.event_time_ms),
            a.kind.as_str(),
            a.severity.as_str(),
            a.message
        ));
    }

    /// The last alerts produced, oldest first.
    pub fn recent_alerts(&self) -> Vec<String> {
        lock(&self.recent_alerts).iter().cloned().collect()
    }

    pub fn dead_letter(&self, kind: &'static str) {
        *lock(&self.dead_letters).entry(kind).or_default() += 1;
    }

    pub fn dead_letters_total(&self) -> u64 {
        lock(&self.dead_letters).values().sum()
    }

    /// Channel `id`'s gauges, from the engine of `partition` where the
    /// channel has index `idx`: written over its last ones in place.
    pub fn set_channel(&self, partition: i32, idx: u32, id: &str, g: ChannelGauges) {
        let mut rows = lock(&self.channels);
        rows.writes += 1;
        let written = rows.writes;
        let part = rows.by_partition.entry(partition).or_default();
        let idx = idx as usize;
        if part.len() <= idx {
            part.resize_with(idx + 1, || None);
        }
        match &mut part[idx] {
            // The same channel (a rebuilt engine may number them anew).
            Some(row) if row.id == *id => {
                row.gauges = g;
                row.written = written;
            }
            slot => {
                *slot = Some(Box::new(ChannelRow {
                    id: ShortStr::new(id),
                    gauges: g,
                    written,
                }))
            }
        }
    }

    /// Every channel's gauges by id, as the partition that evaluated it
    /// last left them.
    pub fn channels(&self) -> BTreeMap<String, ChannelGauges> {
        let rows = lock(&self.channels);
        let mut latest: BTreeMap<&str, &ChannelRow> = BTreeMap::new();
        for row in rows.by_partition.values().flatten().flatten() {
            let row: &ChannelRow = row;
            let e = latest.entry(row.id.as_str()).or_insert(row);
            if row.written > e.written {
                *e = row;
            }
        }
        latest
            .into_iter()
            .map(|(id, row)| (id.to_string(), row.gauges.clone()))
            .collect()
    }

    /// Every channel's state as its owner last evaluated it.
    pub fn channel_states(&self) -> BTreeMap<String, String> {
        self.channels()
            .into_iter()
            .map(|(id, g)| (id, g.state.to_string()))
            .collect()
    }

    pub fn forget_partition(&self, partition: i32) {
        lock(&self.channels).by_partition.remove(&partition);
        lock(&self.lag).remove(&partition);
    }

    /// Request loop `lane`'s partitions.
    pub fn set_owned(&self, lane: usize, owned: std::collections::BTreeSet<i32>) {
        lock(&self.owned).insert(lane, owned);
    }

    pub fn set_lag(&self, partition: i32, lag: i64) {
        lock(&self.lag).insert(partition, lag);
    }

    pub fn set_group(&self, group: &str, g: GroupGauges) {
        let mut groups = lock(&self.groups);
        if let Some(old) = groups.get(group) {
            let mut changes = lock(&self.weight_changes);
            for (k, w) in &g.weights {
                if old.weights.get(k).is_some_and(|o| (o - w).abs() > 1e-9) {
                    *changes.entry((group.to_string(), k.1.clone())).or_default() += 1;
                }
            }
        }
        groups.insert(group.to_string(), g);
    }

    pub fn set_group_waiting(&self, group: &str, waiting: Vec<String>) {
        lock(&self.groups)
            .entry(group.to_string())
            .or_default()
            .waiting_for = waiting;
    }

    pub fn forget_group(&self, group: &str) {
        lock(&self.groups).remove(group);
        lock(&self.splits).remove(group);
    }

    /// The group's channels whose events reach more than one partition.
    pub fn set_splits(&self, group: &str, splits: Vec<SplitChannel>) {
        lock(&self.splits).insert(group.to_string(), splits);
    }

    /// The exposition, rendered by `prometheus-client` in the Prometheus
    /// text format 0.0.4 (what `promtool check metrics` reads).
    pub fn render_prometheus(self: &std::sync::Arc<Self>) -> String {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(Exporter(self.clone())));
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry);
        out
    }

    /// This instance's part of the fleet, with the columns `hermes status`
    /// shows: the channels its partitions evaluate and the groups it writes.
    pub fn status_view(
        &self,
        overrides: &super::overrides::Overrides,
    ) -> super::status::StatusView {
        use super::status::{ChannelRow, GroupRow, StatusView};
        let now = crate::wall_clock::now_ms();
        let groups = lock(&self.groups).clone();
        let channels = self.channels();
        let mut view = StatusView {
            source: format!(
                "hermes instance {} (its own channels; `hermes status` shows the fleet)",
                std::process::id()
            ),
            generated_ms: now,
            ..Default::default()
        };
        for (id, g) in &groups {
            view.groups.push(GroupRow {
                group: id.clone(),
                epoch: Some(g.epoch),
                version: Some(g.version),
                age_ms: (g.heartbeat_ms > 0).then(|| (now - g.heartbeat_ms).max(0)),
                manual: g.manual,
                shed: g.shed.clone(),
                projected_spend_per_hour: Some(g.projected_spend_per_hour),
                note: (!g.waiting_for.is_empty())
                    .then(|| format!("warming up: waiting for {}", g.waiting_for.join(", "))),
            });
        }
        for (id, c) in &channels {
            let weights = groups
                .get(c.group.as_str())
                .map(|g| {
                    g.weights
                        .iter()
                        .filter(|((_, ch), _)| ch == id)
                        .map(|((class, _), w)| (class.clone(), *w))
                        .collect()
                })
                .unwrap_or_default();
            view.channels.push(ChannelRow {
                channel: id.clone(),
                group: c.group.as_str().to_string(),
                state: c.state.to_string(),
                score: c.score,
                signals: c
                    .contributions()
                    .map(|(k, v)| (k.name().to_string(), v))
                    .collect(),
                weights,
                pin: c.pinned.then(|| "pinned".to_string()),
            });
        }
        view.with_overrides(overrides)
    }
}

/// Reads [`Metrics`] at scrape time for `prometheus-client`.
#[derive(Debug)]
struct Exporter(std::sync::Arc<Metrics>);

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// Every state a channel can be in: `hermes_channel_state` is one-hot
/// over these.
const STATES: [StateKind; 5] = [
    StateKind::Healthy,
    StateKind::AtRisk,
    StateKind::Drained,
    StateKind::Observing,
    StateKind::Recovering,
];

type Labels<'a> = Vec<(&'static str, &'a str)>;

/// The channel gauges with only group and channel labels: name, help, and
/// how to read the value (absent: too few samples).
type Read = fn(&ChannelGauges) -> Option<f64>;
const CHANNEL_GAUGES: [(&str, &str, Read); 5] = [
        (
            "hermes_channel_score",
            "Health score, 0 healthy .. 1 failing (the state machine's input).",
            |g| g.score,
        ),
        (
            "hermes_channel_health_weight",
            "Weight factor the state (or a pin) implies, 0 .. 1, before the scheduler's shares.",
            |g| Some(g.health_weight),
        ),
        (
            "hermes_channel_pinned",
            "1 while an operator pin holds the channel's weight.",
            |g| Some(f64::from(u8::from(g.pinned))),
        ),
        (
            "hermes_channel_error_ratio",
            "Hard-failure rate over the short window.",
            |g| g.error_rate,
        ),
        (
            "hermes_channel_bad_outcome_ratio",
            "Hard failures and bad answers (truncated, garbled, schema-invalid, short) over judged outcomes.",
            |g| g.failure_rate,
        ),
];

/// The rows of a channel gauge with a third label beside group and
/// channel: `values` gives each channel's (label value, value) pairs.
fn per_label<'a>(
    channels: &'a BTreeMap<String, ChannelGauges>,
    label: &'static str,
    values: impl Fn(&'a ChannelGauges) -> Vec<(&'a str, f64)>,
) -> Vec<(Labels<'a>, f64)> {
    let mut rows = Vec::new();
    for (id, g) in channels {
        for (x, v) in values(g) {
            let labels = vec![
                ("group", g.group.as_str()),
                ("channel", id.as_str()),
                (label, x),
            ];
            rows.push((labels, v));
        }
    }
    rows
}

/// One gauge family: name, help, unit, and a value per label set.
fn gauges<'a>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    rows: impl IntoIterator<Item = (Labels<'a>, f64)>,
) -> std::fmt::Result {
    let mut family = enc.encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?;
    for (labels, v) in rows {
        ConstGauge::new(v).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// One counter family (`_total` is appended).
fn counters<'a>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels<'a>, u64)>,
) -> std::fmt::Result {
    let mut family = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in rows {
        ConstCounter::new(v).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

fn one(v: f64) -> [(Labels<'static>, f64); 1] {
    [(Vec::new(), v)]
}

impl prometheus_client::collector::Collector for Exporter {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let m = &*self.0;
        for (name, help, c) in m.counters() {
            counters(
                &mut enc,
                name,
                help,
                [(Vec::new(), c.load(Ordering::Relaxed))],
            )?;
        }
        m.encode_instance(&mut enc)?;
        m.encode_channels(&mut enc)?;
        m.encode_groups(&mut enc)
    }
}

impl Metrics {
    /// Every plain counter: name (without `_total`), help, value.
    fn counters(&self) -> [(&'static str, &'static str, &AtomicU64); 17] {
        [
            ("hermes_outputs_delivered", "Output records (alerts, dead letters, health reports) acknowledged by Kafka.", &self.outputs_delivered),
            ("hermes_outputs_undelivered", "Alerts and dead letters Kafka did not take; the instance stops without committing past them.", &self.outputs_undelivered),
            ("hermes_health_reports_undelivered", "Health reports not delivered (best effort: the next one replaces them).", &self.health_reports_undelivered),
            ("hermes_events_consumed", "Records read from the request topic.", &self.events_consumed),
            ("hermes_events_applied", "Events applied to the engine.", &self.events_applied),
            ("hermes_events_replayed", "Events re-applied to rebuild windows after an assignment.", &self.events_replayed),
            ("hermes_events_duplicate", "Events ignored as duplicates (same gateway, event id and event time).", &self.duplicates),
            ("hermes_events_too_late", "Events older than the allowed lateness.", &self.too_late),
            ("hermes_alerts_produced", "Alert events produced.", &self.alerts_produced),
            ("hermes_health_reports", "Health reports produced to the health topic.", &self.health_reports),
            ("hermes_snapshots_written", "New snapshot versions written to Redis.", &self.snapshots_written),
            ("hermes_snapshot_heartbeats", "Snapshot heartbeat refreshes.", &self.snapshot_heartbeats),
            ("hermes_snapshot_failures", "Snapshot writes that failed after retries.", &self.snapshot_failures),
            ("hermes_snapshots_refused_stale", "Snapshot writes refused because a newer writer owns the group.", &self.snapshots_refused_stale),
            ("hermes_offset_commits", "Offset commits.", &self.commits),
            ("hermes_config_reloads", "Config reloads applied.", &self.config_reloads),
            ("hermes_config_reloads_rejected", "Config reloads refused (invalid file, or a restart-only change).", &self.config_reload_rejected),
        ]
    }

    /// Build, dependencies, warm-up, decision latency, dead letters,
    /// partitions held and consumer lag.
    fn encode_instance(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        gauges(
            enc,
            "hermes_build_info",
            "Always 1; the labels name the build.",
            None,
            [(vec![("version", env!("CARGO_PKG_VERSION"))], 1.0)],
        )?;
        let up = self.readiness.up();
        gauges(
            enc,
            "hermes_up",
            "1 when the dependency answered its last check, 0 when it did not.",
            None,
            up.iter()
                .map(|(d, ok)| (vec![("dependency", d.as_str())], f64::from(u8::from(*ok)))),
        )?;
        gauges(
            enc,
            "hermes_partitions_catching_up",
            "Owned request partitions still replaying their window or catching up (no health reports from them yet).",
            None,
            one(f64::from(self.readiness.catching_up())),
        )?;
        let h = enc.encode_descriptor(
            "hermes_decision_publish",
            "From handling the record that changed a channel's state to Redis acknowledging the snapshot that carries it.",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?;
        self.decision_publish.0.encode(h)?;
        let by_kind = lock(&self.alerts_by_kind).clone();
        counters(
            enc,
            "hermes_alerts",
            "Alert events produced, by group, channel (empty for group alerts), kind and severity.",
            by_kind.iter().map(|((g, c, k, s), n)| {
                (
                    vec![
                        ("group", g.as_str()),
                        ("channel", c.as_str()),
                        ("kind", *k),
                        ("severity", *s),
                    ],
                    *n,
                )
            }),
        )?;
        let dead = lock(&self.dead_letters).clone();
        counters(
            enc,
            "hermes_dead_letters",
            "Records sent to the dead-letter topic, by reason kind.",
            dead.iter().map(|(k, n)| (vec![("kind", *k)], *n)),
        )?;
        let owned: Vec<String> = lock(&self.owned)
            .values()
            .flatten()
            .map(|p| p.to_string())
            .collect();
        gauges(
            enc,
            "hermes_partition_assigned",
            "Request partitions this instance holds (1 per partition).",
            None,
            owned.iter().map(|p| (vec![("partition", p.as_str())], 1.0)),
        )?;
        let lag: Vec<(String, i64)> = lock(&self.lag)
            .iter()
            .map(|(p, l)| (p.to_string(), *l))
            .collect();
        gauges(
            enc,
            "hermes_consumer_lag_records",
            "Records between the last applied offset and the high watermark, per request partition.",
            None,
            lag.iter()
                .map(|(p, l)| (vec![("partition", p.as_str())], *l as f64)),
        )
    }

    /// Per channel this instance evaluates.
    fn encode_channels(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let channels = self.channels();
        let rows = |f: &dyn Fn(&ChannelGauges) -> Option<f64>| -> Vec<(Labels<'_>, f64)> {
            channels
                .iter()
                .filter_map(|(id, g)| {
                    f(g).map(|v| {
                        (
                            vec![("group", g.group.as_str()), ("channel", id.as_str())],
                            v,
                        )
                    })
                })
                .collect()
        };
        for (name, help, read) in CHANNEL_GAUGES {
            gauges(enc, name, help, None, rows(&read))?;
        }
        // Window quantiles of a t-digest, not a summary: promlint reserves
        // the `quantile` label for summaries, so the label is `percentile`.
        let latency = per_label(&channels, "percentile", |g| {
            [("50", g.p50_ms), ("99", g.p99_ms)]
                .into_iter()
                .filter_map(|(pct, v)| v.map(|v| (pct, v / 1000.0)))
                .collect()
        });
        let signals = per_label(&channels, "signal", |g| {
            g.measured().map(|(k, v)| (k.name(), v)).collect()
        });
        gauges(enc, "hermes_channel_signal", "Each measured signal in its own unit (the signal label names it: _ms, _rate, relative_ ratios); too few samples: absent.", None, signals)?;
        let contributions = per_label(&channels, "signal", |g| {
            g.contributions().map(|(k, c)| (k.name(), c)).collect()
        });
        gauges(
            enc,
            "hermes_channel_score_contribution",
            "The signals adding most to the score, and how much (they sum to at most the score).",
            None,
            contributions,
        )?;
        gauges(
            enc,
            "hermes_channel_latency",
            "Latency percentile over the short window (a t-digest estimate; the median is read every engine.latency_median_interval_ms, 1 min by default).",
            Some(Unit::Seconds),
            latency,
        )?;
        let states = per_label(&channels, "state", |g| {
            STATES
                .iter()
                .map(|s| (s.as_str(), f64::from(u8::from(g.state == s.as_str()))))
                .collect()
        });
        gauges(
            enc,
            "hermes_channel_state",
            "1 for the channel's current state, 0 for the others.",
            None,
            states,
        )
    }

    /// Per group this instance writes.
    fn encode_groups(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        self.encode_splits(enc)?;
        let groups = lock(&self.groups).clone();
        self.encode_weights(enc, &groups)?;
        let now = crate::wall_clock::now_ms();
        let per_group = |f: &dyn Fn(&GroupGauges) -> Option<f64>| -> Vec<(Labels<'_>, f64)> {
            groups
                .iter()
                .filter_map(|(id, g)| f(g).map(|v| (vec![("group", id.as_str())], v)))
                .collect()
        };
        gauges(
            enc,
            "hermes_group_snapshot_version",
            "Version of the last snapshot written.",
            None,
            per_group(&|g| Some(g.version as f64)),
        )?;
        gauges(
            enc,
            "hermes_group_writer_epoch",
            "Writer epoch of this instance for the group (a takeover takes a higher one).",
            None,
            per_group(&|g| Some(g.epoch as f64)),
        )?;
        gauges(
            enc,
            "hermes_group_snapshot_age",
            "Wall time since this writer last wrote or refreshed the group's snapshot.",
            Some(Unit::Seconds),
            per_group(&|g| {
                (g.heartbeat_ms > 0).then(|| (now - g.heartbeat_ms).max(0) as f64 / 1000.0)
            }),
        )?;
        gauges(
            enc,
            "hermes_group_manual",
            "1 while an operator froze the group's weights (manual mode).",
            None,
            per_group(&|g| Some(f64::from(u8::from(g.manual)))),
        )?;
        gauges(
            enc,
            "hermes_group_warming_up",
            "1 while the writer waits for channels to be evaluated before its first plan.",
            None,
            per_group(&|g| Some(f64::from(u8::from(!g.waiting_for.is_empty())))),
        )?;
        gauges(
            enc,
            "hermes_group_projected_spend_per_hour",
            "Spend per hour the published plan projects, in the config's cost unit.",
            None,
            per_group(&|g| Some(g.projected_spend_per_hour)),
        )?;
        gauges(
            enc,
            "hermes_group_budget_per_hour",
            "The group's configured budget per hour (absent: no budget).",
            None,
            per_group(&|g| g.budget_per_hour),
        )
    }

    /// Channels whose events reach more than one request partition.
    fn encode_splits(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let splits = lock(&self.splits).clone();
        let split_rows: Vec<(String, String, String, f64)> = splits
            .iter()
            .flat_map(|(g, chans)| {
                chans.iter().map(move |(c, parts)| {
                    let list = parts.iter().map(|p| p.to_string()).collect::<Vec<_>>();
                    (g.clone(), c.clone(), list.join(","), parts.len() as f64)
                })
            })
            .collect();
        gauges(
            enc,
            "hermes_channel_split_partitions",
            "Request partitions a channel's events reach when more than one (gateways with different partitioners); absent when one.",
            None,
            split_rows.iter().map(|(g, c, p, n)| {
                (
                    vec![
                        ("group", g.as_str()),
                        ("channel", c.as_str()),
                        ("partitions", p.as_str()),
                    ],
                    *n,
                )
            }),
        )
    }

    /// The published weights and shed shares, and how often they changed.
    fn encode_weights(
        &self,
        enc: &mut DescriptorEncoder,
        groups: &BTreeMap<String, GroupGauges>,
    ) -> std::fmt::Result {
        let mut weights = Vec::new();
        let mut shed = Vec::new();
        for (group, g) in groups {
            for ((class, channel), w) in &g.weights {
                weights.push((
                    vec![
                        ("group", group.as_str()),
                        ("class", class.as_str()),
                        ("channel", channel.as_str()),
                    ],
                    *w,
                ));
            }
            for (class, x) in &g.shed {
                shed.push((
                    vec![("group", group.as_str()), ("class", class.as_str())],
                    *x,
                ));
            }
        }
        gauges(
            enc,
            "hermes_channel_weight",
            "Published routing weight per class (what gateways read).",
            None,
            weights,
        )?;
        gauges(
            enc,
            "hermes_group_shed_ratio",
            "Published share of a class's requests to shed.",
            None,
            shed,
        )?;
        let changes = lock(&self.weight_changes).clone();
        counters(
            enc,
            "hermes_channel_weight_changes",
            "Published weight changes of a channel (any class).",
            changes
                .iter()
                .map(|((g, c), n)| (vec![("group", g.as_str()), ("channel", c.as_str())], *n)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dependency_each_request_loop_checks_is_down_while_any_loop_sees_it_down() {
        let r = Readiness::default();
        r.set_assigned();
        let down = || Some("no broker connection up".to_string());
        r.set_lane(0, Dependency::Kafka, "b:9092", down());
        r.set_lane(1, Dependency::Kafka, "b:9092", down());
        r.set_lane(0, Dependency::Kafka, "b:9092", None);
        let why = r.check().unwrap_err().join("; ");
        assert!(
            why.contains("kafka: request loop 1: no broker connection up"),
            "{why}"
        );
        r.set_lane(1, Dependency::Kafka, "b:9092", None);
        assert!(r.check().is_ok());
    }
    use std::sync::Arc;

    #[test]
    fn exposition_is_one_hot_per_state_and_counts_weight_changes() {
        let m = Arc::new(Metrics::default());
        m.set_channel(
            0,
            0,
            "free",
            ChannelGauges {
                group: ShortStr::new("chat"),
                state: "DRAINED",
                score: Some(0.9),
                p99_ms: Some(2_500.0),
                ..Default::default()
            },
        );
        let mut g = GroupGauges {
            epoch: 7,
            ..Default::default()
        };
        g.weights.insert(("CORE".into(), "free".into()), 0.3);
        m.set_group("chat", g.clone());
        g.weights.insert(("CORE".into(), "free".into()), 0.0);
        g.shed.insert("BATCH".into(), 0.25);
        m.set_group("chat", g);
        m.dead_letter("malformed");
        let text = m.render_prometheus();
        let has =
            |line: &str| assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        has("hermes_channel_state{group=\"chat\",channel=\"free\",state=\"DRAINED\"} 1.0");
        has("hermes_channel_state{group=\"chat\",channel=\"free\",state=\"HEALTHY\"} 0.0");
        has("hermes_channel_weight_changes_total{group=\"chat\",channel=\"free\"} 1");
        has("hermes_dead_letters_total{kind=\"malformed\"} 1");
        has("hermes_group_shed_ratio{group=\"chat\",class=\"BATCH\"} 0.25");
        has("hermes_group_writer_epoch{group=\"chat\"} 7.0");
        has(
            "hermes_channel_latency_seconds{group=\"chat\",channel=\"free\",percentile=\"99\"} 2.5",
        );
        assert!(text.contains("hermes_build_info{version="), "{text}");
        let five_states = text
            .lines()
            .filter(|l| l.starts_with("hermes_channel_state{"))
            .count();
        assert_eq!(five_states, 5, "{text}");
    }

    /// A channel's row is written over in place; one evaluated by two
    /// partitions (a hand-over) shows the later write, once; a partition
    /// let go takes its rows with it; an index that now holds another
    /// channel (a rebuilt engine) replaces the row.
    #[test]
    fn channel_rows_show_the_last_evaluation_of_each_channel_once() {
        let m = Metrics::default();
        let g = |state: &'static str, score: f64| ChannelGauges {
            group: ShortStr::new("chat"),
            state,
            score: Some(score),
            ..Default::default()
        };
        m.set_channel(3, 0, "free", g("HEALTHY", 0.1));
        m.set_channel(3, 1, "paid", g("HEALTHY", 0.0));
        m.set_channel(3, 0, "free", g("AT_RISK", 0.5));
        m.set_channel(7, 4, "free", g("DRAINED", 0.9));
        let states = m.channel_states();
        assert_eq!(states.len(), 2, "{states:?}");
        assert_eq!(states["free"], "DRAINED");
        m.set_channel(3, 0, "free", g("OBSERVING", 0.4));
        assert_eq!(m.channel_states()["free"], "OBSERVING");
        m.forget_partition(3);
        assert_eq!(m.channel_states()["free"], "DRAINED");
        assert!(!m.channel_states().contains_key("paid"));
        m.set_channel(7, 4, "other", g("HEALTHY", 0.0));
        let states = m.channel_states();
        assert_eq!(states.keys().collect::<Vec<_>>(), ["other"]);
    }

    /// Measured signals and the score's contributions are exported by
    /// name; a signal without enough samples (NaN) is left out.
    #[test]
    fn signal_values_and_contributions_are_exported_by_name() {
        let m = Arc::new(Metrics::default());
        let mut values = [f64::NAN; SIGNAL_COUNT];
        values[SignalKind::TruncationRate as usize] = 0.25;
        m.set_channel(
            0,
            0,
            "free",
            ChannelGauges {
                group: ShortStr::new("chat"),
                state: "AT_RISK",
                signals: [Some((SignalKind::TruncationRate, 0.3)), None, None],
                signal_values: values,
                ..Default::default()
            },
        );
        let text = m.render_prometheus();
        let has =
            |line: &str| assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        has("hermes_channel_signal{group=\"chat\",channel=\"free\",signal=\"truncation_rate\"} 0.25");
        has("hermes_channel_score_contribution{group=\"chat\",channel=\"free\",signal=\"truncation_rate\"} 0.3");
        let signal_lines = text
            .lines()
            .filter(|l| l.starts_with("hermes_channel_signal{"))
            .count();
        assert_eq!(signal_lines, 1, "{text}");
    }

    #[test]
    fn the_status_view_joins_a_channel_with_its_group_weights() {
        let m = Metrics::default();
        m.set_channel(
            0,
            0,
            "free",
            ChannelGauges {
                group: ShortStr::new("chat"),
                state: "DRAINED",
                signals: [Some((SignalKind::TruncationRate, 0.4)), None, None],
                ..Default::default()
            },
        );
        let mut g = GroupGauges::default();
        g.weights.insert(("CORE".into(), "free".into()), 0.0);
        g.weights.insert(("CORE".into(), "paid".into()), 1.0);
        m.set_group("chat", g);
        let view = m.status_view(&Default::default());
        assert_eq!(view.channels.len(), 1);
        assert_eq!(view.channels[0].weights["CORE"], 0.0);
        assert!(view.render().contains("truncation_rate 0.40"));
    }
}
