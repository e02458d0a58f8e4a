//! Bringing a route group's channel health together for its one writer.
//!
//! Channels of one group can live on different Kafka partitions, so on
//! different Hermes instances. Every partition owner reports the health of
//! the channels its events carry on a low-volume topic keyed by group
//! (`hermes.health`); every instance reads it and keeps the newest report of
//! every channel ([`GroupBoard`]); the owner of the group's writer partition
//! ([`writer_partition`]) re-plans the group once per evaluation tick and is
//! its only Redis writer.
//!
//! Pure: reports in, per-group health and readiness out. The topic I/O is in
//! `service::groups`.

use crate::config::Config;
use crate::health::{ChannelHealth, HealthReport};
use crate::state::StateKind;
use std::collections::BTreeMap;

/// The request partition whose owner writes `group`'s snapshot: a fixed
/// hash (FNV-1a), so every instance computes the same answer. The writer
/// role moves exactly when that partition moves, through the one consumer
/// group the service already has.
pub fn writer_partition(group: &str, request_partitions: u32) -> i32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in group.as_bytes() {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    (h % request_partitions.max(1)) as i32
}

#[derive(Debug, Clone)]
struct Entry {
    watermark_ms: i64,
    health: ChannelHealth,
}

#[derive(Debug, Clone, Default)]
struct GroupView {
    /// Wall time of the first report since this writer took the group.
    first_report_ms: Option<i64>,
    channels: BTreeMap<String, Entry>,
    /// Highest event time any report carried.
    watermark_ms: Option<i64>,
    /// Channel states in the snapshot stored before this writer took over.
    previous_states: BTreeMap<String, String>,
    next_plan_ms: Option<i64>,
    /// A reported state change not planned for yet (see `take_state_change`).
    state_changed_at_ms: Option<i64>,
    /// Per channel, the request partitions that reported demand for it, and
    /// when last (wall ms): more than one is a split channel.
    carriers: BTreeMap<String, BTreeMap<i32, i64>>,
}

/// Why a group is not published yet.
#[derive(Debug, Clone, PartialEq)]
pub enum NotReady {
    NoReports,
    /// Waiting for these channels (until the warm-up ends, or indefinitely
    /// for ones that were not healthy in the stored snapshot).
    Waiting(Vec<String>),
}

/// The newest health of every channel, per group.
pub struct GroupBoard {
    groups: BTreeMap<String, GroupView>,
}

impl GroupBoard {
    pub fn new() -> GroupBoard {
        GroupBoard {
            groups: BTreeMap::new(),
        }
    }

    /// Takes a report; per channel, the one with the newest event time wins
    /// (a partition that moved reports from its new owner with a later
    /// watermark). Returns false for a group not in `cfg`.
    pub fn on_report(&mut self, cfg: &Config, r: HealthReport, wall_ms: i64) -> bool {
        let Some(g) = cfg.groups.iter().find(|g| g.id == r.group) else {
            return false;
        };
        let view = self.groups.entry(r.group.clone()).or_default();
        view.first_report_ms.get_or_insert(wall_ms);
        view.watermark_ms = Some(
            view.watermark_ms
                .map_or(r.watermark_ms, |w| w.max(r.watermark_ms)),
        );
        for h in r.channels {
            if h.group != g.id || !g.channels.iter().any(|c| c.id == h.id) {
                continue;
            }
            if h.demand_rps.iter().sum::<f64>() > 0.0 {
                view.carriers
                    .entry(h.id.clone())
                    .or_default()
                    .insert(r.partition, wall_ms);
            }
            let prev_state = view.channels.get(&h.id).map(|e| e.health.state);
            let newer = view
                .channels
                .get(&h.id)
                .is_none_or(|e| e.watermark_ms <= r.watermark_ms);
            if newer && prev_state.is_some_and(|s| s != h.state) {
                // The earliest change not yet planned for.
                let at = r.changed_at_wall_ms.unwrap_or(wall_ms);
                view.state_changed_at_ms = Some(view.state_changed_at_ms.map_or(at, |t| t.min(at)));
            }
            if newer {
                view.channels.insert(
                    h.id.clone(),
                    Entry {
                        watermark_ms: r.watermark_ms,
                        health: h,
                    },
                );
            }
        }
        true
    }

    /// Channels of `group` whose events reached more than one request
    /// partition, each reporting demand within `horizon_ms` of `wall_ms`,
    /// with those partitions (ascending). Forgets older carriers.
    pub fn split_channels(
        &mut self,
        group: &str,
        wall_ms: i64,
        horizon_ms: i64,
    ) -> Vec<(String, Vec<i32>)> {
        let Some(view) = self.groups.get_mut(group) else {
            return Vec::new();
        };
        let mut split = Vec::new();
        view.carriers.retain(|channel, parts| {
            parts.retain(|_, at| wall_ms - *at <= horizon_ms);
            if parts.len() > 1 {
                split.push((channel.clone(), parts.keys().copied().collect()));
            }
            !parts.is_empty()
        });
        split
    }

    /// Remembers the channel states of the snapshot stored before this writer
    /// took the group: a channel that was not healthy there keeps the group
    /// unpublished until it reports (no regression to "healthy by default").
    pub fn set_previous_states(&mut self, group: &str, states: BTreeMap<String, String>) {
        self.groups
            .entry(group.to_string())
            .or_default()
            .previous_states = states;
    }

    pub fn groups(&self) -> impl Iterator<Item = &str> {
        self.groups.keys().map(|s| s.as_str())
    }

    /// Whether the group may be published: every channel reported, or the
    /// warm-up has passed and every silent channel was healthy (or unknown)
    /// in the previously stored snapshot.
    pub fn ready(&self, cfg: &Config, group: &str, wall_ms: i64) -> Result<(), NotReady> {
        let (Some(view), Some(g)) = (
            self.groups.get(group),
            cfg.groups.iter().find(|g| g.id == group),
        ) else {
            return Err(NotReady::NoReports);
        };
        let Some(first) = view.first_report_ms else {
            return Err(NotReady::NoReports);
        };
        let warmed = wall_ms - first >= cfg.schedule.group_warmup_ms;
        let healthy = StateKind::Healthy.as_str();
        let waiting: Vec<String> = g
            .channels
            .iter()
            .filter(|c| !view.channels.contains_key(&c.id))
            .filter(|c| {
                !warmed
                    || view
                        .previous_states
                        .get(&c.id)
                        .is_some_and(|s| s != healthy)
            })
            .map(|c| c.id.clone())
            .collect();
        if waiting.is_empty() {
            Ok(())
        } else {
            Err(NotReady::Waiting(waiting))
        }
    }

    /// The newest health of the group's reported channels.
    pub fn health(&self, group: &str) -> Vec<ChannelHealth> {
        self.groups
            .get(group)
            .map(|v| v.channels.values().map(|e| e.health.clone()).collect())
            .unwrap_or_default()
    }

    /// The highest event time any report of the group carried.
    pub fn watermark_ms(&self, group: &str) -> Option<i64> {
        self.groups.get(group)?.watermark_ms
    }

    /// If a channel of the group changed state since the last call: the
    /// wall time the earliest such change was handled (its reporter's
    /// clock), and the group's watermark to plan at. The writer re-plans
    /// then without waiting for the next tick, so a drain reaches gateways
    /// at once.
    pub fn state_change_pending(&self, group: &str) -> bool {
        self.groups
            .get(group)
            .is_some_and(|v| v.state_changed_at_ms.is_some())
    }

    pub fn take_state_change(&mut self, group: &str) -> Option<(i64, i64)> {
        let view = self.groups.get_mut(group)?;
        let at = view.state_changed_at_ms.take()?;
        Some((at, view.watermark_ms?))
    }

    /// If the group's watermark crossed its next evaluation tick, the tick
    /// to plan at (once per tick, as the single-process pipeline does).
    pub fn plan_due(&mut self, cfg: &Config, group: &str) -> Option<i64> {
        let interval = cfg.engine.evaluation_interval_ms;
        let view = self.groups.get_mut(group)?;
        let w = view.watermark_ms?;
        let due = *view
            .next_plan_ms
            .get_or_insert(w.div_euclid(interval) * interval);
        if w < due {
            return None;
        }
        let tick = w.div_euclid(interval) * interval;
        view.next_plan_ms = Some(tick + interval);
        Some(tick)
    }
}

impl Default for GroupBoard {
    fn default() -> Self {
        GroupBoard::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Tier;
    use crate::health::REPORT_FORMAT;

    fn cfg() -> Config {
        Config::single_group(
            "chat",
            &[
                ("paid", Tier::Paid, 0.01, 100.0),
                ("free", Tier::Free, 0.0, 50.0),
            ],
        )
    }

    fn health(id: &str, state: StateKind) -> ChannelHealth {
        ChannelHealth::fixture(id, state)
    }

    fn report(partition: i32, watermark_ms: i64, channels: Vec<ChannelHealth>) -> HealthReport {
        HealthReport {
            format: REPORT_FORMAT,
            group: "chat".into(),
            instance: "test".into(),
            partition,
            watermark_ms,
            channels,
            changed_at_wall_ms: None,
        }
    }

    #[test]
    fn a_state_change_is_flagged_for_an_immediate_plan() {
        let c = cfg();
        let mut b = GroupBoard::new();
        b.on_report(
            &c,
            report(0, 5_000, vec![health("free", StateKind::Healthy)]),
            100,
        );
        assert!(
            !b.state_change_pending("chat"),
            "a first report is no change"
        );
        b.on_report(
            &c,
            report(0, 6_000, vec![health("free", StateKind::Healthy)]),
            200,
        );
        assert_eq!(b.take_state_change("chat"), None);
        let mut drained = report(0, 7_300, vec![health("free", StateKind::Drained)]);
        drained.changed_at_wall_ms = Some(290);
        b.on_report(&c, drained, 300);
        assert!(b.state_change_pending("chat"));
        assert_eq!(b.take_state_change("chat"), Some((290, 7_300)));
        assert_eq!(b.take_state_change("chat"), None, "taken once");
    }

    #[test]
    fn writer_partitions_are_stable_and_spread() {
        // Fixed values: every instance and every release must agree.
        assert_eq!(writer_partition("chat", 3), writer_partition("chat", 3));
        assert_eq!(writer_partition("chat", 1), 0);
        let spread: std::collections::BTreeSet<i32> = (0..64)
            .map(|i| writer_partition(&format!("group-{i}"), 8))
            .collect();
        assert_eq!(spread.len(), 8, "64 groups reach every one of 8 partitions");
        assert!(spread.iter().all(|p| (0..8).contains(p)));
    }

    #[test]
    fn reports_round_trip_and_other_formats_are_refused() {
        let r = report(0, 5, vec![health("free", StateKind::Drained)]);
        assert_eq!(HealthReport::from_json(&r.to_json()).unwrap(), r);
        let mut other = r.clone();
        other.format = 2;
        assert!(HealthReport::from_json(&other.to_json()).is_err());
        assert!(HealthReport::from_json(b"\x00garbage").is_err());
    }

    #[test]
    fn the_newest_report_of_a_channel_wins() {
        let cfg = cfg();
        let mut b = GroupBoard::new();
        b.on_report(
            &cfg,
            report(0, 2_000, vec![health("free", StateKind::Drained)]),
            0,
        );
        b.on_report(
            &cfg,
            report(1, 1_000, vec![health("free", StateKind::Healthy)]),
            0,
        );
        assert_eq!(
            b.health("chat")[0].state,
            StateKind::Drained,
            "older report ignored"
        );
        b.on_report(
            &cfg,
            report(1, 3_000, vec![health("free", StateKind::Observing)]),
            0,
        );
        assert_eq!(b.health("chat")[0].state, StateKind::Observing);
    }

    #[test]
    fn a_group_waits_for_every_channel_until_the_warmup() {
        let cfg = cfg();
        let warmup = cfg.schedule.group_warmup_ms;
        let mut b = GroupBoard::new();
        assert_eq!(b.ready(&cfg, "chat", 0), Err(NotReady::NoReports));
        b.on_report(
            &cfg,
            report(0, 1, vec![health("paid", StateKind::Healthy)]),
            0,
        );
        assert_eq!(
            b.ready(&cfg, "chat", 1),
            Err(NotReady::Waiting(vec!["free".into()]))
        );
        assert_eq!(b.ready(&cfg, "chat", warmup), Ok(()));
        b.on_report(
            &cfg,
            report(1, 1, vec![health("free", StateKind::Healthy)]),
            2,
        );
        assert_eq!(b.ready(&cfg, "chat", 3), Ok(()));
    }

    #[test]
    fn a_channel_drained_in_the_stored_snapshot_blocks_publishing_until_it_reports() {
        let cfg = cfg();
        let mut b = GroupBoard::new();
        b.set_previous_states(
            "chat",
            [("free".to_string(), "DRAINED".to_string())]
                .into_iter()
                .collect(),
        );
        b.on_report(
            &cfg,
            report(0, 1, vec![health("paid", StateKind::Healthy)]),
            0,
        );
        assert!(b
            .ready(&cfg, "chat", 10 * cfg.schedule.group_warmup_ms)
            .is_err());
        b.on_report(
            &cfg,
            report(1, 2, vec![health("free", StateKind::Drained)]),
            0,
        );
        assert_eq!(b.ready(&cfg, "chat", 1), Ok(()));
    }

    #[test]
    fn plans_fall_once_per_evaluation_tick() {
        let cfg = cfg();
        let i = cfg.engine.evaluation_interval_ms;
        let mut b = GroupBoard::new();
        b.on_report(&cfg, report(0, 10 * i + 1, vec![]), 0);
        assert_eq!(b.plan_due(&cfg, "chat"), Some(10 * i));
        b.on_report(&cfg, report(1, 10 * i + 2, vec![]), 0);
        assert_eq!(
            b.plan_due(&cfg, "chat"),
            None,
            "same tick, second partition"
        );
        b.on_report(&cfg, report(1, 11 * i, vec![]), 0);
        assert_eq!(b.plan_due(&cfg, "chat"), Some(11 * i));
    }

    #[test]
    fn reports_for_unknown_groups_or_foreign_channels_are_ignored() {
        let cfg = cfg();
        let mut b = GroupBoard::new();
        let mut r = report(0, 1, vec![health("free", StateKind::Healthy)]);
        r.group = "other".into();
        assert!(!b.on_report(&cfg, r, 0));
        let mut h = health("nope", StateKind::Healthy);
        h.group = "chat".into();
        b.on_report(&cfg, report(0, 1, vec![h]), 0);
        assert!(b.health("chat").is_empty());
    }

    /// A channel with demand reported by two partitions within the horizon
    /// is split; one partition, or a second one gone quiet, is not.
    #[test]
    fn a_channel_carried_by_two_partitions_is_split_until_one_goes_quiet() {
        let c = cfg();
        let mut b = GroupBoard::new();
        let busy = |id: &str| {
            let mut h = health(id, StateKind::Healthy);
            h.demand_rps = [1.0, 0.0, 0.0, 0.0];
            h
        };
        // Reported without demand (seen once, long ago): not a carrier.
        let mut quiet = health("free", StateKind::Healthy);
        quiet.demand_rps = [0.0; 4];
        b.on_report(&c, report(2, 5_000, vec![quiet]), 1_000);
        b.on_report(
            &c,
            report(0, 5_000, vec![busy("free"), busy("paid")]),
            1_000,
        );
        assert!(b.split_channels("chat", 1_000, 60_000).is_empty());
        b.on_report(&c, report(1, 5_000, vec![busy("free")]), 2_000);
        assert_eq!(
            b.split_channels("chat", 2_000, 60_000),
            vec![("free".to_string(), vec![0, 1])]
        );
        // Partition 0 keeps reporting; partition 1 stops.
        b.on_report(
            &c,
            report(0, 9_000, vec![busy("free"), busy("paid")]),
            70_000,
        );
        assert!(b.split_channels("chat", 70_000, 60_000).is_empty());
        assert!(b.split_channels("other", 70_000, 60_000).is_empty());
    }
}
