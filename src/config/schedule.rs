//! Scheduling (`[schedule]`, `[traffic_classes]`) and group safety
//! (`[safety]`): how a group's weights are planned.

use super::Issues;
use crate::event::TrafficClass;
use serde::{Deserialize, Serialize};

/// Group-level safety (docs/decisions.md#safety-rails; the mechanism is in `safety`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SafetyConfig {
    /// Panic mode on or off (on: docs/decisions.md#safety-rails asks for it).
    pub enabled: bool,
    /// Share of a group's capacity that must be bad at once for a correlated
    /// failure. 0.5, like Envoy's default panic threshold (50 %).
    pub panic_threshold: f64,
    /// At least this many channels bad at once: one channel is a channel
    /// fault whatever share of the capacity it carries.
    pub panic_min_channels: u32,
    /// Consecutive evaluations without the condition before panic ends.
    pub panic_exit_evaluations: u32,
    /// A drain this recent counts as the same event: a network blip fast-path
    /// drains each channel within seconds of the others, before a tick sees
    /// them together.
    pub correlation_window_ms: i64,
}

impl Default for SafetyConfig {
    fn default() -> Self {
        SafetyConfig {
            enabled: true,
            panic_threshold: 0.5,
            panic_min_channels: 2,
            panic_exit_evaluations: 3,
            correlation_window_ms: 60_000,
        }
    }
}

pub(super) fn validate_safety(s: &SafetyConfig, v: &mut Issues) {
    if !(s.panic_threshold > 0.0 && s.panic_threshold <= 1.0) {
        v.push("safety.panic_threshold", "must be within (0, 1]");
    }
    if s.panic_min_channels < 2 {
        v.push(
            "safety.panic_min_channels",
            "must be at least 2 (one channel is a channel fault)",
        );
    }
    if s.panic_exit_evaluations == 0 {
        v.push("safety.panic_exit_evaluations", "must be at least 1");
    }
    v.positive_ms(
        "safety.correlation_window_ms".into(),
        s.correlation_window_ms,
    );
}

/// Scheduler knobs (docs/decisions.md#scheduling).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScheduleConfig {
    /// Never plan more than capacity × headroom on a channel (incident 002: the
    /// backup that collapsed under doubled traffic).
    pub capacity_headroom: f64,
    /// Largest change of one channel's weight per evaluation tick, except
    /// drains (immediate). Incident 002: at most 15 % per round.
    pub max_weight_step: f64,
    /// Demand is estimated over this much event time.
    pub demand_window_ms: i64,
    /// Weights below this are dropped to zero (and the rest renormalized).
    pub min_weight: f64,
    /// docs/decisions.md#safety-rails, "health never sheds what static routing would have served":
    /// demand that healthy capacity cannot take goes to the least-bad
    /// unhealthy channels (lowest score first, within capacity) rather than
    /// being shed, unless a channel's measured failure rate (hard failures
    /// and bad answers, the `bad_outcome_rate` signal) is at or above this:
    /// a request sent there is about as lost as a shed one. The score is no
    /// guide here: it saturates at 1 for a channel that still serves 90 %.
    pub overflow_max_failure_rate: f64,
    /// A group's budget is planned at `budget × (1 − budget_margin)`, after
    /// scaling the projection by what the group was measured to spend
    /// against what was planned (see `schedule::Scheduler`): the budget must
    /// hold in every hour, so the plan keeps a little room for noise and
    /// for the lag between a plan and the spend it causes.
    pub budget_margin: f64,
    /// A group's writer first publishes once every channel reported, or
    /// this long after the group's first report (channels without traffic
    /// then count as unknown): no regression to default weights after a
    /// restart or a takeover.
    pub group_warmup_ms: i64,
    /// A channel on probation (OBSERVING) gets `states.half_open_share` of
    /// its group's traffic, but never less than this many requests per
    /// second (within its normal share): recovery must fit the traffic
    /// (docs/decisions.md#safety-rails). 5 % of a quiet group's 0.7 rps is
    /// one attempt every 30 s, and a probation would wait half an hour
    /// for the 20 attempts it needs; at 0.2 rps it has them in 100 s.
    pub half_open_min_rps: f64,
    /// docs/decisions.md#safety-rails, "every class keeps a way out": while
    /// a class has demand and a healthy channel has room, at least this
    /// share of the class is planned on healthy channels, so a retry has
    /// somewhere to go (gateways that avoid the channel that just failed
    /// need only a weight above 0; those that pick again at random need a
    /// share).
    pub retry_path_share: f64,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig {
            capacity_headroom: 0.8,
            max_weight_step: 0.15,
            demand_window_ms: 60_000,
            min_weight: 0.001,
            overflow_max_failure_rate: 0.9,
            budget_margin: 0.03,
            group_warmup_ms: 60_000,
            half_open_min_rps: 0.2,
            retry_path_share: 0.1,
        }
    }
}

/// How a traffic class is scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassPolicy {
    /// 0 is served first.
    pub priority: u8,
    /// May this class stay on an AT_RISK channel (incident 000: batch may).
    pub accepts_at_risk: bool,
    /// Highest channel score this class tolerates.
    pub max_score: f64,
    /// Whether the class may be shed when capacity is short (else it is
    /// queued on the least-bad channel and reported).
    pub sheddable: bool,
}

/// Per-class policies, keyed by class name in TOML.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClassPolicies {
    pub interactive: ClassPolicy,
    pub core: ClassPolicy,
    pub batch: ClassPolicy,
    pub experimental: ClassPolicy,
}

impl Default for ClassPolicies {
    fn default() -> Self {
        ClassPolicies {
            interactive: ClassPolicy {
                priority: 0,
                accepts_at_risk: false,
                max_score: 0.45,
                sheddable: true,
            },
            core: ClassPolicy {
                priority: 1,
                accepts_at_risk: false,
                max_score: 0.45,
                sheddable: true,
            },
            batch: ClassPolicy {
                priority: 2,
                accepts_at_risk: true,
                max_score: 0.65,
                sheddable: true,
            },
            experimental: ClassPolicy {
                priority: 3,
                accepts_at_risk: true,
                max_score: 0.65,
                sheddable: true,
            },
        }
    }
}

impl ClassPolicies {
    pub fn get(&self, class: TrafficClass) -> &ClassPolicy {
        match class {
            TrafficClass::Interactive => &self.interactive,
            TrafficClass::Core => &self.core,
            TrafficClass::Batch => &self.batch,
            TrafficClass::Experimental => &self.experimental,
        }
    }
    /// Classes in serving order (priority, then schema order).
    pub fn in_priority_order(&self) -> [TrafficClass; 4] {
        let mut all = [
            TrafficClass::Interactive,
            TrafficClass::Core,
            TrafficClass::Batch,
            TrafficClass::Experimental,
        ];
        all.sort_by_key(|c| (self.get(*c).priority, c.index()));
        all
    }
}

pub(super) fn validate_schedule(s: &ScheduleConfig, v: &mut Issues) {
    if !(s.capacity_headroom > 0.0 && s.capacity_headroom <= 1.0) {
        v.push(
            "schedule.capacity_headroom",
            format!("must be within (0, 1], got {}", s.capacity_headroom),
        );
    }
    if !(s.max_weight_step > 0.0 && s.max_weight_step <= 1.0) {
        v.push("schedule.max_weight_step", "must be within (0, 1]");
    }
    v.positive_ms("schedule.demand_window_ms".into(), s.demand_window_ms);
    v.positive_ms("schedule.group_warmup_ms".into(), s.group_warmup_ms);
    if !(s.half_open_min_rps >= 0.0 && s.half_open_min_rps.is_finite()) {
        v.push("schedule.half_open_min_rps", "must be a finite number >= 0");
    }
    if !(0.0..=1.0).contains(&s.retry_path_share) {
        v.push("schedule.retry_path_share", "must be within [0, 1]");
    }
    if !(0.0..0.5).contains(&s.min_weight) {
        v.push("schedule.min_weight", "must be within [0, 0.5)");
    }
    if !(s.overflow_max_failure_rate > 0.0 && s.overflow_max_failure_rate <= 1.0) {
        v.push(
            "schedule.overflow_max_failure_rate",
            "must be within (0, 1]",
        );
    }
    if !(0.0..0.5).contains(&s.budget_margin) {
        v.push("schedule.budget_margin", "must be within [0, 0.5)");
    }
}
