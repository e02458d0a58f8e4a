//! What the service knows about itself, for `/metrics` and `/status`.
//!
//! The loops update these in place; a scrape only reads. The exposition is
//! rendered by the `prometheus-client` crate (Prometheus text format 0.0.4)
//! from an `Exporter` that reads this state at scrape time: `promtool
//! check metrics` finds nothing in it (`tests/prometheus.rs`).
//!
//! The rooms: this file holds the state the loops update; `exposition`
//! encodes it at scrape time, `readiness` keeps what `/readyz` answers.

use super::lock;
use crate::health::TOP_SIGNALS;
use crate::short_str::ShortStr;
use crate::signals::{SignalKind, SIGNAL_COUNT};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
mod readiness;
pub use readiness::*;
mod exposition;
use exposition::Exporter;

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
    /// In panic mode since this event time (a correlated failure).
    pub panic_since_ms: Option<i64>,
    /// Channel → why the plan gave it its share.
    pub reasons: BTreeMap<String, String>,
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
    /// Per request loop: its consumer's group membership, from librdkafka's
    /// statistics.
    members: Mutex<BTreeMap<usize, GroupMember>>,
    /// What `/readyz` answers.
    pub readiness: Readiness,
    /// The last alerts produced, one line each, newest last.
    recent_alerts: Mutex<std::collections::VecDeque<String>>,
    /// (group, channel or "", kind, severity) → alerts produced: what the
    /// alert rules page on (bounded: channels come from the config).
    alerts_by_kind: Mutex<BTreeMap<AlertSeries, u64>>,
}

/// One request loop's consumer in the request topic's group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupMember {
    /// Assignments and revocations it took part in since it started.
    pub rebalances: u64,
    /// A member with its assignment, between rebalances (librdkafka's
    /// group state `up`, join state `steady`).
    pub steady: bool,
}

/// (group, channel or "", kind, severity): one `hermes_alerts_total` series.
type AlertSeries = (String, String, &'static str, &'static str);

/// How many alert lines [`Metrics::recent_alerts`] keeps.
const RECENT_ALERTS: usize = 8;

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

    /// Drops the rows of channels a reloaded config no longer has (the
    /// others move to their new index at their next evaluation).
    pub fn keep_channels(&self, configured: impl Fn(&str) -> bool) {
        for rows in lock(&self.channels).by_partition.values_mut() {
            for slot in rows.iter_mut() {
                if slot.as_ref().is_some_and(|r| !configured(r.id.as_str())) {
                    *slot = None;
                }
            }
        }
    }

    pub fn forget_partition(&self, partition: i32) {
        lock(&self.channels).by_partition.remove(&partition);
        lock(&self.lag).remove(&partition);
    }

    /// Request loop `lane`'s partitions.
    pub fn set_owned(&self, lane: usize, owned: std::collections::BTreeSet<i32>) {
        lock(&self.owned).insert(lane, owned);
    }

    /// Request loop `lane`'s consumer group membership, as librdkafka's
    /// last statistics report gave it.
    pub fn set_member(&self, lane: usize, member: GroupMember) {
        lock(&self.members).insert(lane, member);
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
                panic_since_ms: g.panic_since_ms,
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
                plan: groups
                    .get(c.group.as_str())
                    .and_then(|g| g.reasons.get(id.as_str()).cloned()),
                pin: c.pinned.then(|| "pinned".to_string()),
            });
        }
        view.with_overrides(overrides)
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
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
        m.set_member(
            0,
            GroupMember {
                rebalances: 4,
                steady: false,
            },
        );
        m.set_member(
            1,
            GroupMember {
                rebalances: 3,
                steady: true,
            },
        );
        let text = m.render_prometheus();
        let has =
            |line: &str| assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        has("hermes_channel_state{group=\"chat\",channel=\"free\",state=\"DRAINED\"} 1.0");
        has("hermes_channel_state{group=\"chat\",channel=\"free\",state=\"HEALTHY\"} 0.0");
        has("hermes_channel_weight_changes_total{group=\"chat\",channel=\"free\"} 1");
        has("hermes_dead_letters_total{kind=\"malformed\"} 1");
        has("hermes_consumer_rebalances_total{lane=\"0\"} 4");
        has("hermes_consumer_rebalances_total{lane=\"1\"} 3");
        has("hermes_consumer_group_steady{lane=\"0\"} 0.0");
        has("hermes_consumer_group_steady{lane=\"1\"} 1.0");
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
        m.set_channel(7, 5, "gone", g("HEALTHY", 0.0));
        m.keep_channels(|id| id != "gone");
        assert!(!m.channel_states().contains_key("gone"));
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
