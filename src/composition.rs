//! The composition every closed loop runs: a partition's engine → health
//! reports → the group board → the scheduler → a weight snapshot.
//!
//! The service spreads it over processes: each request partition's owner
//! runs an [`Engine`] and sends [`health_reports`] to the `hermes.health`
//! topic; the owner of a group's writer partition feeds them to a
//! [`GroupPlanner`] and writes the plans it makes to Redis. [`Composition`]
//! runs the same types and functions in one process, with one partition and
//! the reports handed over by a function call, for the simulator and
//! replay: the drills exercise the readiness rule, the tick grid and the
//! immediate re-plan on a state change that production runs.

use crate::alert::{AlertEvent, AlertKind};
use crate::board::{GroupBoard, NotReady};
use crate::config::Config;
use crate::engine::{ApplyError, ChannelIdx, Engine};
use crate::event::RequestEvent;
use crate::health::{ChannelHealth, HealthReport, REPORT_FORMAT};
use crate::publish::WeightSnapshot;
use crate::schedule::{Plan, Scheduler};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// What a partition's engine reports after a step, if anything: after an
/// evaluation tick, or at once when a channel changed state between ticks
/// (the consecutive-failure fast path), so a drain reaches the writer
/// without waiting for the tick.
#[derive(Debug, Default)]
pub struct ReportGate {
    evaluations: u64,
}

impl ReportGate {
    /// Whether the engine evaluated since the last [`ReportGate::due`]:
    /// then the next step is due even without alerts.
    pub fn pending(&self, engine: &Engine) -> bool {
        engine.stats().evaluations != self.evaluations
    }

    /// Whether the step that raised `alerts` is to be reported, and whether
    /// it changed a channel's state.
    pub fn due(&mut self, engine: &Engine, alerts: &[AlertEvent]) -> Option<bool> {
        let changed = alerts.iter().any(|a| a.kind == AlertKind::Transition);
        if !self.pending(engine) && !changed {
            return None;
        }
        self.evaluations = engine.stats().evaluations;
        Some(changed)
    }
}

/// A partition engine's channel health, one report per route group: the
/// channels that have seen events (a partition knows nothing of the rest).
/// Nothing before the engine is warm: a writer must not plan from a minute
/// that has not been seen whole.
pub fn health_reports(
    engine: &Engine,
    instance: &str,
    partition: i32,
    changed_at_wall_ms: Option<i64>,
) -> Vec<HealthReport> {
    let Some(watermark) = engine.watermark_ms().filter(|_| engine.is_warm()) else {
        return Vec::new();
    };
    let healths = (0..engine.channel_count() as ChannelIdx)
        .filter(|idx| engine.has_events(*idx))
        .map(|idx| engine.health(idx))
        .collect();
    group_reports(healths, watermark, instance, partition, changed_at_wall_ms)
}

/// [`health_reports`] from healths already built (the service builds them
/// once per step for its gauges and state saves too).
pub fn group_reports(
    healths: Vec<ChannelHealth>,
    watermark_ms: i64,
    instance: &str,
    partition: i32,
    changed_at_wall_ms: Option<i64>,
) -> Vec<HealthReport> {
    let mut by_group: BTreeMap<String, Vec<ChannelHealth>> = BTreeMap::new();
    for h in healths {
        by_group.entry(h.group.clone()).or_default().push(h);
    }
    by_group
        .into_iter()
        .map(|(group, channels)| HealthReport {
            format: REPORT_FORMAT,
            group,
            instance: instance.to_string(),
            partition,
            watermark_ms,
            channels,
            changed_at_wall_ms,
        })
        .collect()
}

/// A plan ready to publish.
#[derive(Debug)]
pub struct Planned<'a> {
    pub plan: &'a Plan,
    /// Whether this call planned (a tick or a state change was due).
    pub replanned: bool,
    /// The wall time the earliest state change behind this plan was
    /// handled by its partition, if it was planned for one.
    pub change_at_wall_ms: Option<i64>,
}

/// What a group writer decides, without its I/O: the newest health of every
/// channel ([`GroupBoard`]), whether the group may be published, when to
/// plan (each evaluation tick of the group's watermark, and at once on a
/// reported state change), and the plan ([`Scheduler`]).
pub struct GroupPlanner {
    cfg: Arc<Config>,
    board: GroupBoard,
    scheduler: Scheduler,
    /// Groups planned from reports since this planner took them (a plan
    /// before that is the scheduler's trust-share default: never published).
    planned: BTreeSet<String>,
}

impl GroupPlanner {
    pub fn new(cfg: Arc<Config>) -> GroupPlanner {
        GroupPlanner {
            scheduler: Scheduler::new(cfg.clone()),
            board: GroupBoard::new(),
            planned: BTreeSet::new(),
            cfg,
        }
    }

    /// A new policy: plans restart from the current health (smoothing memory
    /// is per config).
    pub fn reconfigure(&mut self, cfg: Arc<Config>) {
        self.scheduler = Scheduler::new(cfg.clone());
        self.planned.clear();
        self.cfg = cfg;
    }

    /// Takes a report; false for a group not in the config.
    pub fn on_report(&mut self, report: HealthReport, wall_ms: i64) -> bool {
        self.board.on_report(&self.cfg, report, wall_ms)
    }

    /// Whether a reported state change waits to be planned.
    /// Channels of `group` split over request partitions
    /// (`alerts.partition_split_horizon_ms`), with their partitions.
    pub fn split_channels(&mut self, group: &str, wall_ms: i64) -> Vec<(String, Vec<i32>)> {
        let horizon = self.cfg.alerts.partition_split_horizon_ms;
        self.board.split_channels(group, wall_ms, horizon)
    }

    pub fn state_change_pending(&self, group: &str) -> bool {
        self.board.state_change_pending(group)
    }

    /// This writer takes `group`; `previous_states` are the channel states of
    /// the snapshot stored before (see [`GroupBoard::ready`]).
    pub fn take_over(&mut self, group: &str, previous_states: BTreeMap<String, String>) {
        self.board.set_previous_states(group, previous_states);
        self.planned.remove(group);
    }

    /// This writer no longer writes `group`.
    pub fn release(&mut self, group: &str) {
        self.planned.remove(group);
    }

    /// Puts a group in (or out of) manual mode; false for an unknown group.
    pub fn set_manual(&mut self, group: &str, on: bool) -> bool {
        self.scheduler.set_manual(group, on)
    }

    /// Whether the group is in manual mode.
    pub fn is_manual(&self, group: &str) -> bool {
        self.scheduler.is_manual(group)
    }

    /// The group's event time: the highest watermark its reports carried.
    pub fn watermark_ms(&self, group: &str) -> Option<i64> {
        self.board.watermark_ms(group)
    }

    /// The group's current plan, once planned from reports.
    pub fn plan_of(&self, group: &str) -> Option<&Plan> {
        self.scheduler
            .plan(group)
            .filter(|_| self.planned.contains(group))
    }

    /// Plans the group if a tick or a state change is due, and returns its
    /// current plan (`None` until it was first planned from reports), or why
    /// it may not be published yet.
    pub fn plan(&mut self, group: &str, wall_ms: i64) -> Result<Option<Planned<'_>>, NotReady> {
        let Some(gi) = self.cfg.groups.iter().position(|g| g.id == group) else {
            return Err(NotReady::NoReports);
        };
        self.board.ready(&self.cfg, group, wall_ms)?;
        let change = self.board.take_state_change(group);
        let at = match (self.board.plan_due(&self.cfg, group), change) {
            (Some(tick), _) => Some(tick),
            (None, Some((_, watermark))) => Some(watermark),
            (None, None) => None,
        };
        if let Some(at) = at {
            self.scheduler
                .plan_group(gi, at, &self.board.health(group), true);
            self.planned.insert(group.to_string());
        }
        Ok(self.plan_of(group).map(|plan| Planned {
            plan,
            replanned: at.is_some(),
            change_at_wall_ms: change.map(|(at, _)| at),
        }))
    }
}

/// The whole composition in one process, for the simulator and replay: one
/// request partition (every channel), reports handed straight to the
/// planner, every new plan published as the next snapshot version. The
/// "wall clock" of readiness and warm-up is event time here.
pub struct Composition {
    pub engine: Engine,
    planner: GroupPlanner,
    gate: ReportGate,
    /// Every alert raised so far, in order.
    pub alerts: Vec<AlertEvent>,
    /// The latest snapshot of each group, as a gateway would read it.
    snapshots: BTreeMap<String, (u64, WeightSnapshot)>,
    published: u64,
    plans: u64,
}

impl Composition {
    pub fn new(cfg: Arc<Config>) -> Composition {
        Composition {
            engine: Engine::for_partition(cfg.clone()),
            planner: GroupPlanner::new(cfg),
            gate: ReportGate::default(),
            alerts: Vec::new(),
            snapshots: BTreeMap::new(),
            published: 0,
            plans: 0,
        }
    }

    /// Applies one event, then reports and plans as the service would.
    pub fn apply(&mut self, ev: &RequestEvent<'_>) -> Result<(), ApplyError> {
        let from = self.alerts.len();
        let r = self.engine.apply(ev, &mut self.alerts);
        self.after_step(from);
        r
    }

    /// Advances event time without an event (idle periods, simulated time).
    pub fn advance_to(&mut self, now_ms: i64) {
        let from = self.alerts.len();
        self.engine.advance_to(now_ms, &mut self.alerts);
        self.after_step(from);
    }

    /// Puts a route group in (or out of) manual mode (docs/decisions.md#score-and-states): its plan
    /// freezes until switched off, and the switch is recorded as an alert.
    /// Returns false for an unknown group.
    pub fn set_manual(&mut self, group: &str, on: bool, now_ms: i64) -> bool {
        if !self.planner.set_manual(group, on) {
            return false;
        }
        self.engine
            .record_group_override(group, on, now_ms, &mut self.alerts);
        true
    }

    /// The group's latest published snapshot.
    pub fn snapshot(&self, group: &str) -> Option<&WeightSnapshot> {
        self.snapshots.get(group).map(|(_, s)| s)
    }

    /// The group's current plan, once planned from reports.
    pub fn plan(&self, group: &str) -> Option<&Plan> {
        self.planner.plan_of(group)
    }

    /// Snapshot versions published so far (callers compare it to notice one).
    pub fn published(&self) -> u64 {
        self.published
    }

    /// Planning rounds so far, whether or not they changed the plan.
    pub fn plans(&self) -> u64 {
        self.plans
    }

    fn after_step(&mut self, from: usize) {
        let Some(changed) = self.gate.due(&self.engine, &self.alerts[from..]) else {
            return;
        };
        let Some(now) = self.engine.watermark_ms() else {
            return;
        };
        let reports = health_reports(&self.engine, "in-process", 0, changed.then_some(now));
        let mut groups = Vec::with_capacity(reports.len());
        for r in reports {
            groups.push(r.group.clone());
            self.planner.on_report(r, now);
        }
        for group in groups {
            let Ok(Some(p)) = self.planner.plan(&group, now) else {
                continue;
            };
            if !p.replanned {
                continue;
            }
            self.plans += 1;
            let plan_version = p.plan.version;
            let version = match self.snapshots.get(&group) {
                Some((v, _)) if *v == plan_version => continue,
                Some((_, s)) => s.version + 1,
                None => 1,
            };
            let mut snap = WeightSnapshot::from_plan(p.plan, 1, now);
            snap.version = version;
            self.snapshots.insert(group, (plan_version, snap));
            self.published += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::tests::sample_event;
    use crate::config::Tier;
    use crate::event::{ErrorClass, TrafficClass};

    const T0: i64 = 1_700_000_000_000;

    fn cfg() -> Arc<Config> {
        Arc::new(Config::single_group(
            "chat",
            &[
                ("free-a", Tier::Free, 0.0, 50.0),
                ("paid-a", Tier::Paid, 1.0, 100.0),
            ],
        ))
    }

    fn ev(channel: &str, t: i64) -> RequestEvent<'_> {
        let mut e = sample_event();
        e.channel_id = channel;
        e.route_group = "chat";
        e.event_time_ms = t;
        e
    }

    fn healthy(c: &mut Composition, from: i64, to: i64) -> i64 {
        let mut t = from;
        while t < to {
            c.apply(&ev("free-a", t)).unwrap();
            c.apply(&ev("paid-a", t)).unwrap();
            t += 100;
        }
        t
    }

    #[test]
    fn nothing_is_published_before_the_engine_is_warm_and_every_channel_reported() {
        let mut c = Composition::new(cfg());
        healthy(&mut c, T0, T0 + 59_000);
        assert_eq!(c.published(), 0, "a minute of event time first");
        assert!(c.snapshot("chat").is_none());
        healthy(&mut c, T0 + 59_000, T0 + 70_000);
        assert_eq!(c.published(), 1);
        let s = c.snapshot("chat").unwrap();
        assert_eq!(s.version, 1);
        assert!(s.channels.contains_key("free-a") && s.channels.contains_key("paid-a"));
    }

    #[test]
    fn a_silent_channel_holds_the_group_until_the_warm_up_ends() {
        let mut c = Composition::new(cfg());
        let mut t = T0;
        while t < T0 + 100_000 {
            c.apply(&ev("paid-a", t)).unwrap();
            t += 100;
        }
        // Warm at 60 s, first report then; free-a has said nothing: the
        // group waits `group_warmup_ms` (60 s) from its first report.
        assert_eq!(c.published(), 0);
        while t < T0 + 125_000 {
            c.apply(&ev("paid-a", t)).unwrap();
            t += 100;
        }
        assert_eq!(c.published(), 1);
    }

    #[test]
    fn a_drain_is_planned_at_once_not_at_the_next_tick() {
        let mut c = Composition::new(cfg());
        let t = healthy(&mut c, T0, T0 + 120_000) + 500;
        c.advance_to(t); // past the tick at 120 s
        let before = c.published();
        let plans = c.plans();
        // Between ticks: the fast path drains free-a on its Nth failure.
        let mut k = 0;
        while c.snapshot("chat").unwrap().channels["free-a"].state != "DRAINED" {
            let mut x = ev("free-a", t + k);
            x.error_class = ErrorClass::ConnectionReset;
            c.apply(&x).unwrap();
            k += 1;
            assert!(k < 10, "not drained after {k} failures");
        }
        let tick = c.engine.config().engine.evaluation_interval_ms;
        assert!(k < tick, "within the tick");
        assert_eq!(c.published(), before + 1);
        assert_eq!(c.plans(), plans + 1, "one re-plan, for the change");
        let s = c.snapshot("chat").unwrap();
        assert_eq!(
            s.classes[TrafficClass::Core.as_str()]
                .weights
                .get("free-a")
                .copied()
                .unwrap_or(0.0),
            0.0
        );
    }

    #[test]
    fn group_manual_mode_freezes_the_plan_and_is_recorded() {
        let mut c = Composition::new(cfg());
        let t = healthy(&mut c, T0, T0 + 120_000);
        let before = c.plan("chat").unwrap().clone();
        assert!(c.set_manual("chat", true, t));
        assert!(!c.set_manual("nope", true, t));
        let a = c.alerts.last().unwrap();
        assert_eq!(
            (a.kind, a.channel_id.as_deref()),
            (AlertKind::Override, None)
        );
        assert_eq!(a.reason, "manual_mode(on=true)");
        // The free channel goes down hard; the frozen plan does not follow.
        for i in 0..5 {
            let mut x = ev("free-a", t + i);
            x.error_class = ErrorClass::ConnectionReset;
            c.apply(&x).unwrap();
        }
        c.advance_to(t + 30_000);
        let frozen = c.plan("chat").unwrap();
        assert!(frozen.manual && frozen.same_routing(&before));
        c.set_manual("chat", false, t + 30_000);
        c.advance_to(t + 40_000);
        let live = c.plan("chat").unwrap();
        assert_eq!(
            live.weight(TrafficClass::Core, "free-a"),
            0.0,
            "drained once manual mode ends"
        );
    }

    #[test]
    fn the_planner_plans_once_per_tick_of_the_group_watermark() {
        let cfg = cfg();
        let mut engine = Engine::for_partition(cfg.clone());
        let mut planner = GroupPlanner::new(cfg);
        let mut out = Vec::new();
        let mut t = T0;
        while t < T0 + 61_000 {
            engine.apply(&ev("free-a", t), &mut out).unwrap();
            engine.apply(&ev("paid-a", t), &mut out).unwrap();
            t += 100;
        }
        for r in health_reports(&engine, "a", 0, None) {
            assert!(planner.on_report(r, 0));
        }
        assert!(planner.plan("chat", 0).unwrap().unwrap().replanned);
        // The same watermark again: no new round, the plan stands.
        for r in health_reports(&engine, "a", 0, None) {
            planner.on_report(r, 0);
        }
        assert!(!planner.plan("chat", 0).unwrap().unwrap().replanned);
        assert_eq!(
            planner.plan("other", 0).unwrap_err(),
            NotReady::NoReports,
            "a group not in the config"
        );
    }
}
