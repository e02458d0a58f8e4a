//! The scheduler of a set of route groups: one plan per group per pass,
//! manual mode, the correlated-failure judgement and the spend meter.

use super::{plan, ChannelInput, GroupInput, Plan};

/// Plans every group of a config tick after tick, remembering the previous
/// plan (smoothing, versions) and which groups are in manual mode.
pub struct Scheduler {
    cfg: std::sync::Arc<crate::config::Config>,
    plans: Vec<Option<Plan>>,
    manual: Vec<bool>,
    /// Demand estimate per group and class (rps), see `plan_group`.
    demand: Vec<[f64; 4]>,
    /// Per group: the correlated-failure rule (`safety`) judged from the
    /// health the writer sees, so a group whose channels sit on different
    /// partitions (no one engine sees them all) is still planned like
    /// static routing while it fails as a whole.
    safety: Vec<crate::safety::GroupSafety>,
    /// Per group: planned against measured spend.
    spend: Vec<SpendMeter>,
    /// Per group: in panic mode since (event time), as this writer saw it.
    panic_since: Vec<Option<i64>>,
}

/// Planned against measured spend of one group (`GroupInput::spend_calibration`).
///
/// The measured side is each channel's cost over the demand window; the
/// planned side is the projection of the plans in force over about the same
/// span (an exponential average with the window as its time constant). Their
/// ratio is smoothed over five windows, so one burst does not swing it.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct SpendMeter {
    planned: Option<f64>,
    ratio: Option<f64>,
    at_ms: Option<i64>,
}

impl SpendMeter {
    /// Folds in the plan that was in force up to `now_ms` and the spend
    /// measured over the last `window_ms`; returns the calibration.
    pub(super) fn update(
        &mut self,
        now_ms: i64,
        in_force: Option<f64>,
        measured: f64,
        window_ms: i64,
    ) -> f64 {
        let dt = self.at_ms.map_or(window_ms, |t| (now_ms - t).max(0));
        self.at_ms = Some(now_ms);
        let Some(p) = in_force else {
            return self.ratio.unwrap_or(1.0);
        };
        let a = (dt as f64 / window_ms as f64).clamp(0.0, 1.0);
        let planned = self.planned.map_or(p, |x| x + a * (p - x));
        self.planned = Some(planned);
        if planned > 1e-6 && measured > 1e-6 {
            let r = (measured / planned).clamp(0.5, 2.0);
            let ar = a / 5.0;
            self.ratio = Some(self.ratio.map_or(r, |x| x + ar * (r - x)));
        }
        self.ratio.unwrap_or(1.0)
    }
}

/// Per tick, a held demand estimate decays by this factor toward what is
/// observed (5 s ticks: halves in about three minutes).
const HELD_DEMAND_DECAY: f64 = 0.98;

impl Scheduler {
    pub fn new(cfg: std::sync::Arc<crate::config::Config>) -> Scheduler {
        let n = cfg.groups.len();
        Scheduler {
            cfg,
            plans: vec![None; n],
            manual: vec![false; n],
            demand: vec![[0.0; 4]; n],
            safety: vec![crate::safety::GroupSafety::default(); n],
            spend: vec![SpendMeter::default(); n],
            panic_since: vec![None; n],
        }
    }

    /// Puts a group in (or out of) manual mode: its weights freeze. Returns
    /// false for an unknown group.
    pub fn set_manual(&mut self, group: &str, on: bool) -> bool {
        match self.cfg.groups.iter().position(|g| g.id == group) {
            Some(i) => {
                self.manual[i] = on;
                true
            }
            None => false,
        }
    }

    /// Whether a group is in manual mode (false for an unknown group).
    pub fn is_manual(&self, group: &str) -> bool {
        self.cfg
            .groups
            .iter()
            .position(|g| g.id == group)
            .is_some_and(|i| self.manual[i])
    }

    /// The current plan of a group, if one was made.
    pub fn plan(&self, group: &str) -> Option<&Plan> {
        let i = self.cfg.groups.iter().position(|g| g.id == group)?;
        self.plans[i].as_ref()
    }

    /// Re-plans group `gi` from its channels' health. A channel missing from
    /// `health` has no evidence either way and is planned as healthy with an
    /// unknown score (before warm-up that means its trust-tier share).
    /// Returns the plan and whether its routing changed.
    pub fn plan_group(
        &mut self,
        gi: usize,
        now_ms: i64,
        health: &[crate::health::ChannelHealth],
        warm: bool,
    ) -> (&Plan, bool) {
        let correlated = self.judge_correlation(gi, now_ms, health, warm);
        let panic_since_ms = match (correlated, self.panic_since[gi]) {
            (false, _) => None,
            (true, since) => Some(since.unwrap_or(now_ms)),
        };
        self.panic_since[gi] = panic_since_ms;
        let g = &self.cfg.groups[gi];
        let prev = self.plans[gi].as_ref();
        let mut demand = [0.0; 4];
        let mut unsent = [0.0; 4];
        let mut measured_spend = 0.0;
        let mut channels = Vec::with_capacity(g.channels.len());
        for c in &g.channels {
            let h = health.iter().find(|h| h.id == c.id);
            if let Some(h) = h {
                for k in 0..4 {
                    demand[k] += h.demand_rps[k];
                    unsent[k] += h.unsent_rps[k];
                }
                measured_spend += h.spend_per_hour;
            }
            channels.push(ChannelInput::of(c, h));
        }
        self.demand[gi] = self.uncensored_demand(gi, demand, unsent);
        let spend_calibration = if warm {
            self.spend[gi].update(
                now_ms,
                prev.map(|p| p.projected_spend_per_hour),
                measured_spend,
                self.cfg.schedule.demand_window_ms,
            )
        } else {
            1.0
        };
        let input = GroupInput {
            group: g.id.clone(),
            now_ms,
            channels,
            demand_rps: self.demand[gi],
            budget_per_hour: g.budget_per_hour,
            horizon_ms: self.cfg.engine.quota_horizon_ms,
            warm,
            panic_since_ms,
            spend_calibration,
        };
        let next = plan(
            &input,
            &self.cfg.classes,
            &self.cfg.schedule,
            prev,
            self.manual[gi],
        );
        let changed = prev.is_none_or(|p| p.version != next.version);
        self.plans[gi] = Some(next);
        (self.plans[gi].as_ref().expect("just set"), changed)
    }

    /// Whether group `gi` fails as a whole (docs/decisions.md#safety-rails): its own panic rule
    /// over the channels' health (updated once warm), or a partition engine
    /// that already judged it so.
    pub(super) fn judge_correlation(
        &mut self,
        gi: usize,
        now_ms: i64,
        health: &[crate::health::ChannelHealth],
        warm: bool,
    ) -> bool {
        let g = &self.cfg.groups[gi];
        let window_ms = self.cfg.safety.correlation_window_ms;
        let peers: Vec<crate::safety::PeerHealth> = g
            .channels
            .iter()
            .filter_map(|c| {
                let h = health.iter().find(|h| h.id == c.id)?;
                Some(crate::safety::PeerHealth {
                    capacity_rps: c.capacity_rps,
                    load_rps: h.demand_rps.iter().sum(),
                    bad: crate::safety::is_bad(
                        h.score,
                        c.policy.states.at_risk_enter,
                        h.incident_since_ms,
                        now_ms,
                        window_ms,
                    ),
                    pinned: h.pinned,
                })
            })
            .collect();
        if warm {
            let headroom = self.cfg.schedule.capacity_headroom;
            self.safety[gi].update(now_ms, &peers, &self.cfg.safety, headroom);
        }
        self.safety[gi].in_panic() || health.iter().any(|h| h.group == g.id && h.correlated)
    }

    /// Gateways report the requests they shed (`dispatch`), and those count
    /// in `demand_rps`. Gateways that do not (older ones) leave a shed
    /// class's demand censored: for a class shed with no unsent report at
    /// all, scale the served demand back up by the shed share, and never
    /// let the estimate fall faster than a slow decay. A low estimate would
    /// plan a backup above its capacity (incident 002).
    pub(super) fn uncensored_demand(
        &self,
        gi: usize,
        mut demand: [f64; 4],
        unsent: [f64; 4],
    ) -> [f64; 4] {
        if let Some(p) = self.plans[gi].as_ref() {
            for (k, d) in demand.iter_mut().enumerate() {
                let shed = p.classes[k].shed;
                if shed > 1e-9 && unsent[k] <= 0.0 {
                    let corrected = *d / (1.0 - shed).max(0.5);
                    *d = corrected.max(self.demand[gi][k] * HELD_DEMAND_DECAY);
                }
            }
        }
        demand
    }
}
