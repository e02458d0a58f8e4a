//! The composition every closed loop runs: engines → health → scheduler.

use crate::alert::AlertEvent;
use crate::config::Config;
use crate::engine::{ApplyError, Engine};
use crate::event::RequestEvent;
use std::sync::Arc;

/// The engine and the scheduler together, for a process that owns every
/// channel: the simulator and replay. Re-plans every group after
/// each evaluation tick the watermark crosses.
pub struct Pipeline {
    pub engine: Engine,
    pub scheduler: crate::schedule::Scheduler,
    /// Every alert raised so far, in order.
    pub alerts: Vec<AlertEvent>,
    next_plan_ms: Option<i64>,
    replans: u64,
}

impl Pipeline {
    pub fn new(cfg: Arc<Config>) -> Pipeline {
        let mut scheduler = crate::schedule::Scheduler::new(cfg.clone());
        // Initial plans (trust-tier shares) exist before any event.
        for gi in 0..cfg.groups.len() {
            scheduler.plan_group(gi, 0, &[], false);
        }
        Pipeline {
            engine: Engine::new(cfg),
            scheduler,
            alerts: Vec::new(),
            next_plan_ms: None,
            replans: 0,
        }
    }

    /// Puts a route group in (or out of) manual mode (SPEC §5): its plan
    /// freezes until switched off, and the switch is recorded as an alert.
    /// Returns false for an unknown group.
    pub fn set_manual(&mut self, group: &str, on: bool, now_ms: i64) -> bool {
        if !self.scheduler.set_manual(group, on) {
            return false;
        }
        self.engine
            .record_group_override(group, on, now_ms, &mut self.alerts);
        true
    }

    /// Number of re-planning rounds so far (callers compare it to notice one).
    pub fn replans(&self) -> u64 {
        self.replans
    }

    /// Applies one event, re-planning if it moved the watermark past a tick.
    pub fn apply(&mut self, ev: &RequestEvent<'_>) -> Result<(), ApplyError> {
        let r = self.engine.apply(ev, &mut self.alerts);
        self.replan_if_due();
        r
    }

    /// Advances event time without an event (idle periods, simulated time).
    pub fn advance_to(&mut self, now_ms: i64) {
        self.engine.advance_to(now_ms, &mut self.alerts);
        self.replan_if_due();
    }

    fn replan_if_due(&mut self) {
        let Some(w) = self.engine.watermark_ms() else {
            return;
        };
        let interval = self.engine.config().engine.evaluation_interval_ms;
        let due = *self
            .next_plan_ms
            .get_or_insert((w.div_euclid(interval) + 1) * interval);
        if w < due {
            return;
        }
        let tick = w.div_euclid(interval) * interval;
        self.next_plan_ms = Some(tick + interval);
        let health = self.engine.health_all();
        let warm = self.engine.is_warm();
        for gi in 0..self.engine.config().groups.len() {
            self.scheduler.plan_group(gi, tick, &health, warm);
        }
        self.replans += 1;
    }
}
