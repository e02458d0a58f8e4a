//! The Prometheus exposition: an `Exporter` that reads the service's state
//! at scrape time and encodes it with `prometheus-client` (instance
//! counters and gauges, channel rows, group weights, split channels).

use super::{ChannelGauges, GroupGauges, Metrics};
use crate::service::lock;
use crate::state::StateKind;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Reads [`Metrics`] at scrape time for `prometheus-client`.
#[derive(Debug)]
pub(super) struct Exporter(pub(super) std::sync::Arc<Metrics>);

pub(super) type Labels<'a> = Vec<(&'static str, &'a str)>;

/// The channel gauges with only group and channel labels: name, help, and
/// how to read the value (absent: too few samples).
pub(super) type Read = fn(&ChannelGauges) -> Option<f64>;

pub(super) const CHANNEL_GAUGES: [(&str, &str, Read); 5] = [
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
pub(super) fn per_label<'a>(
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
pub(super) fn gauges<'a>(
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
pub(super) fn counters<'a>(
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

pub(super) fn one(v: f64) -> [(Labels<'static>, f64); 1] {
    [(Vec::new(), v)]
}

impl prometheus_client::collector::Collector for Exporter {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        for (name, help, c) in self.counters() {
            counters(
                &mut enc,
                name,
                help,
                [(Vec::new(), c.load(Ordering::Relaxed))],
            )?;
        }
        self.encode_instance(&mut enc)?;
        self.encode_outputs(&mut enc)?;
        self.encode_channels(&mut enc)?;
        self.encode_groups(&mut enc)
    }
}

impl Exporter {
    /// Every plain counter: name (without `_total`), help, value.
    pub(super) fn counters(&self) -> [(&'static str, &'static str, &AtomicU64); 17] {
        let m = &*self.0;
        [
            ("hermes_outputs_delivered", "Output records (alerts, dead letters, health reports) acknowledged by Kafka.", &m.outputs_delivered),
            ("hermes_outputs_undelivered", "Alerts and dead letters Kafka did not take; the instance stops without committing past them.", &m.outputs_undelivered),
            ("hermes_health_reports_undelivered", "Health reports not delivered (best effort: the next one replaces them).", &m.health_reports_undelivered),
            ("hermes_events_consumed", "Records read from the request topic.", &m.events_consumed),
            ("hermes_events_applied", "Events applied to the engine.", &m.events_applied),
            ("hermes_events_replayed", "Events re-applied to rebuild windows after an assignment.", &m.events_replayed),
            ("hermes_events_duplicate", "Events ignored as duplicates (same gateway, event id and event time).", &m.duplicates),
            ("hermes_events_too_late", "Events older than the allowed lateness.", &m.too_late),
            ("hermes_alerts_produced", "Alert events produced.", &m.alerts_produced),
            ("hermes_health_reports", "Health reports produced to the health topic.", &m.health_reports),
            ("hermes_snapshots_written", "New snapshot versions written to Redis.", &m.snapshots_written),
            ("hermes_snapshot_heartbeats", "Snapshot heartbeat refreshes.", &m.snapshot_heartbeats),
            ("hermes_snapshot_failures", "Snapshot writes that failed after retries.", &m.snapshot_failures),
            ("hermes_snapshots_refused_stale", "Snapshot writes refused because a newer writer owns the group.", &m.snapshots_refused_stale),
            ("hermes_offset_commits", "Offset commits.", &m.commits),
            ("hermes_config_reloads", "Config reloads applied.", &m.config_reloads),
            ("hermes_config_reloads_rejected", "Config reloads refused (invalid file, or a restart-only change).", &m.config_reload_rejected),
        ]
    }

    /// Build, dependencies, warm-up and decision latency.
    pub(super) fn encode_instance(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let m = &*self.0;
        gauges(
            enc,
            "hermes_build_info",
            "Always 1; the labels name the build.",
            None,
            [(vec![("version", env!("CARGO_PKG_VERSION"))], 1.0)],
        )?;
        let up = m.readiness.up();
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
            one(f64::from(m.readiness.catching_up())),
        )?;
        let h = enc.encode_descriptor(
            "hermes_decision_publish",
            "From handling the record that changed a channel's state to Redis acknowledging the snapshot that carries it.",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?;
        m.decision_publish.0.encode(h)
    }

    /// What this instance produced (alerts, dead letters) and the request
    /// partitions it holds, with their lag.
    pub(super) fn encode_outputs(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let m = &*self.0;
        let by_kind = lock(&m.alerts_by_kind).clone();
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
        let dead = lock(&m.dead_letters).clone();
        counters(
            enc,
            "hermes_dead_letters",
            "Records sent to the dead-letter topic, by reason kind.",
            dead.iter().map(|(k, n)| (vec![("kind", *k)], *n)),
        )?;
        let owned: Vec<String> = lock(&m.owned)
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
        let members: Vec<(String, super::GroupMember)> = lock(&m.members)
            .iter()
            .map(|(lane, g)| (lane.to_string(), *g))
            .collect();
        counters(
            enc,
            "hermes_consumer_rebalances",
            "Rebalances (assignments and revocations) each request loop's consumer took part in; a count that keeps rising is a group that does not settle.",
            members
                .iter()
                .map(|(lane, g)| (vec![("lane", lane.as_str())], g.rebalances)),
        )?;
        gauges(
            enc,
            "hermes_consumer_group_steady",
            "1 while the request loop's consumer is a member of the group with its assignment, 0 while it joins or rebalances.",
            None,
            members.iter().map(|(lane, g)| {
                (
                    vec![("lane", lane.as_str())],
                    if g.steady { 1.0 } else { 0.0 },
                )
            }),
        )?;
        let lag: Vec<(String, i64)> = lock(&m.lag)
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
    pub(super) fn encode_channels(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let m = &*self.0;
        let channels = m.channels();
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
            StateKind::ALL
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
    pub(super) fn encode_groups(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let m = &*self.0;
        self.encode_splits(enc)?;
        let groups = lock(&m.groups).clone();
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
            "hermes_group_panic",
            "1 while the group is in panic mode: most of its capacity fails at once and the \
             healthy channels have no room for it, so health does not route (a correlated \
             failure, docs/decisions.md#safety-rails).",
            None,
            per_group(&|g| Some(f64::from(u8::from(g.panic_since_ms.is_some())))),
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
    pub(super) fn encode_splits(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let m = &*self.0;
        let splits = lock(&m.splits).clone();
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
    pub(super) fn encode_weights(
        &self,
        enc: &mut DescriptorEncoder,
        groups: &BTreeMap<String, GroupGauges>,
    ) -> std::fmt::Result {
        let m = &*self.0;
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
        let changes = lock(&m.weight_changes).clone();
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
