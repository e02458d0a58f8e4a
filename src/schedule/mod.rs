//! Cost-aware graded scheduling per route group (docs/decisions.md#scheduling).
//!
//! Input: every channel of one group with its health (state, health weight
//! factor, score, pin), price, capacity and quota forecast; the group's demand
//! per traffic class; an optional spend budget. Output: a [`Plan`]: per class,
//! weights over channels that sum to 1 plus a shed share, the projected spend,
//! and each channel's planned load and the reason for it.
//!
//! # How a plan is built
//! Channels are sorted by id first, so input order never matters.
//! 1. **Caps.** Each channel's hard cap is `capacity × headroom`, lowered to
//!    the sustainable rate when its quota is forecast to run out within the
//!    horizon. Its soft *trust cap* is its tier share (`initial_weight`,
//!    normalized over the group) of each class's demand: trust spreads risk
//!    (incident 004: free 30 / paid 70), and is exceeded only to avoid shedding.
//! 2. **Nominal plan.** The fill below with every channel treated as healthy:
//!    what each channel would carry at full weight.
//! 3. **Degraded channels.** AT_RISK and RECOVERING channels may carry
//!    `health weight × nominal load` (AT_RISK: 30 %, RECOVERING: the current
//!    step); OBSERVING channels the half-open share of the group's traffic
//!    (incident 002: "5 % of real traffic"), at most their nominal load, so the
//!    probation gathers evidence in about a minute. That allowance goes to the
//!    lowest-priority *tolerant* classes first (`accepts_at_risk`); interactive
//!    traffic leaves an AT_RISK channel first. DRAINED channels get nothing.
//! 4. **Healthy fill.** Classes in priority order take healthy capacity,
//!    cheapest channel first: first within trust caps, then beyond them up
//!    to the hard cap. What still does not fit goes, for tolerant classes,
//!    to AT_RISK capacity; the rest is shed and reported. No channel is ever
//!    planned above its hard cap (the backup is never overloaded).
//! 5. **Budget.** If projected spend exceeds the budget, the lowest-priority
//!    classes move off the most expensive channels to cheaper headroom, or
//!    are shed, until it fits.
//! 6. **Smoothing.** Each class moves from the previous plan toward the new
//!    one by at most `max_weight_step` per tick (a convex step in
//!    demand-fraction space, so capacity feasibility is preserved), except
//!    when a channel the class used became ineligible (a drain): that class
//!    jumps immediately.
//!
//! Before anything is known (engine not warm, or no demand seen yet) the
//! weights are the trust-tier shares.

use crate::config::{ClassPolicies, ScheduleConfig};
use crate::event::TrafficClass;
use crate::state::StateKind;
use std::borrow::Cow;

mod allocate;
mod scheduler;
mod shares;
#[cfg(test)]
mod tests;

use allocate::*;
pub use scheduler::Scheduler;
use shares::*;

/// One channel as the scheduler sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelInput {
    pub id: String,
    pub state: StateKind,
    /// Health weight factor from the state machine (pins included), [0, 1].
    pub health_weight: f64,
    pub pinned: bool,
    pub score: Option<f64>,
    /// The score's largest contributions (carried to the snapshot for
    /// people; no decision reads them).
    pub signals: Vec<(String, f64)>,
    pub price_per_1k_tokens: f64,
    pub capacity_rps: f64,
    /// Tier share while nothing is known; also the trust cap.
    pub initial_weight: f64,
    pub quota_remaining: Option<i64>,
    pub quota_exhausted_in_ms: Option<i64>,
    /// Mean tokens per request on this channel, if observed.
    pub tokens_per_request: Option<f64>,
    /// Share of hard failures and bad answers, if measured.
    pub failure_rate: Option<f64>,
    /// Consecutive hard failures up to its last attempt (0: it answered).
    pub failure_streak: u32,
    /// The channel's half-open share (`states.half_open_share`): what a
    /// probation, and a channel failing nearly everything in panic mode,
    /// is planned at.
    pub half_open_share: f64,
}

/// One group's scheduling input.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupInput {
    pub group: String,
    pub now_ms: i64,
    pub channels: Vec<ChannelInput>,
    /// Requests per second per class (schema order of `TrafficClass`).
    pub demand_rps: [f64; 4],
    /// Spend ceiling per hour, if any.
    pub budget_per_hour: Option<f64>,
    /// Quota forecasts shorter than this plan the channel down.
    pub horizon_ms: i64,
    /// False until the engine has seen a window of data.
    pub warm: bool,
    /// The group is in a correlated failure (docs/decisions.md#safety-rails panic mode) since
    /// this event time: every unpinned channel is planned as healthy, as
    /// static routing would, except one failing nearly everything
    /// (`schedule.overflow_max_failure_rate`), which gets only its half-open
    /// share: the probe that sees the common cause end.
    pub panic_since_ms: Option<i64>,
    /// Measured spend over projected spend (1 when unknown): the budget is
    /// planned at `budget × (1 − schedule.budget_margin) / spend_calibration`,
    /// so a projection that runs low (token counts, retries, probes) does
    /// not let the group overspend.
    pub spend_calibration: f64,
}

/// Why a channel got the share it got (the first limit that bound).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ShareReason {
    /// Nothing known yet: the tier's initial share.
    InitialShare,
    /// Full share, no limit bound.
    Healthy,
    /// Trust cap reached (tier share of demand).
    TrustCap,
    /// Capacity × headroom reached.
    CapacityCap,
    /// AT_RISK: only tolerant classes, at the reduced weight.
    AtRisk,
    Drained,
    /// OBSERVING: the half-open share only.
    Observing,
    /// RECOVERING: the current recovery step.
    Recovering,
    /// Operator pin.
    Pinned,
    /// Panic mode (docs/decisions.md#safety-rails): planned like static
    /// routing whatever its health, because the group fails as a whole
    /// and draining cannot help.
    Panic,
    /// Panic mode, but the channel fails nearly everything it gets
    /// (`schedule.overflow_max_failure_rate`): only its half-open share,
    /// to see the common cause end.
    FailingInPanic,
    /// Planned down before its quota runs out.
    QuotaCap,
    /// Moved off to keep spend within budget.
    BudgetCap,
}

impl ShareReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ShareReason::InitialShare => "initial_share",
            ShareReason::Healthy => "healthy",
            ShareReason::TrustCap => "trust_cap",
            ShareReason::CapacityCap => "capacity_cap",
            ShareReason::AtRisk => "at_risk",
            ShareReason::Drained => "drained",
            ShareReason::Observing => "observing",
            ShareReason::Recovering => "recovering",
            ShareReason::Pinned => "pinned",
            ShareReason::Panic => "panic",
            ShareReason::FailingInPanic => "failing_in_panic",
            ShareReason::QuotaCap => "quota_cap",
            ShareReason::BudgetCap => "budget_cap",
        }
    }
}

/// One class's routing.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassPlan {
    pub class: TrafficClass,
    /// (channel id, weight), channels sorted by id; weights sum to 1 unless
    /// the class is fully shed (then all are 0).
    pub weights: Vec<(String, f64)>,
    /// Share of this class's demand to shed or queue, [0, 1].
    pub shed: f64,
    pub demand_rps: f64,
}

/// One channel's planned load.
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelPlan {
    pub id: String,
    pub state: StateKind,
    pub score: Option<f64>,
    /// The score's largest contributions (for people; see `ChannelHealth`).
    pub signals: Vec<(String, f64)>,
    pub planned_rps: f64,
    /// Capacity × headroom (after any quota cap).
    pub cap_rps: f64,
    pub reason: ShareReason,
}

/// A group's complete routing decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub group: String,
    /// Increases whenever the weights change.
    pub version: u64,
    pub computed_at_ms: i64,
    pub classes: Vec<ClassPlan>,
    pub channels: Vec<ChannelPlan>,
    pub projected_spend_per_hour: f64,
    pub budget_per_hour: Option<f64>,
    /// True while the group is in manual mode (weights frozen by an operator).
    pub manual: bool,
    /// The group is in panic mode (a correlated failure) since this event
    /// time: health does not route (docs/decisions.md#safety-rails).
    pub panic_since_ms: Option<i64>,
}

impl Plan {
    pub fn class(&self, class: TrafficClass) -> &ClassPlan {
        &self.classes[class.index()]
    }
    /// Weight of one channel for one class (0 if absent).
    pub fn weight(&self, class: TrafficClass, channel: &str) -> f64 {
        self.class(class)
            .weights
            .iter()
            .find(|(id, _)| id == channel)
            .map_or(0.0, |(_, w)| *w)
    }
    /// What gateways and operators read of a plan is the same: the routing,
    /// every channel's state, and the group's mode. A plan that differs in
    /// any of them is a new version, so a state moves with the weight it
    /// explains (a drain of a channel whose weight the scheduler had
    /// already taken is still news).
    pub fn same_published(&self, other: &Plan) -> bool {
        self.same_routing(other)
            && self.manual == other.manual
            && self.panic_since_ms.is_some() == other.panic_since_ms.is_some()
            && self.channels.len() == other.channels.len()
            && self
                .channels
                .iter()
                .zip(&other.channels)
                .all(|(a, b)| a.id == b.id && a.state == b.state)
    }

    /// The classes with demand that no HEALTHY channel carries while one
    /// has room (docs/decisions.md#safety-rails: every class keeps a way
    /// out): a retry of theirs has nowhere healthy to go.
    pub fn classes_without_retry_path(&self) -> Vec<TrafficClass> {
        let healthy: Vec<usize> = (0..self.channels.len())
            .filter(|&j| {
                let c = &self.channels[j];
                c.state == StateKind::Healthy && c.reason != ShareReason::Pinned
            })
            .collect();
        let room = healthy
            .iter()
            .any(|&j| self.channels[j].planned_rps < self.channels[j].cap_rps - 1e-6);
        if !room {
            return Vec::new();
        }
        self.classes
            .iter()
            .filter(|c| c.demand_rps > 1e-6 && c.shed < 1.0 - 1e-9)
            .filter(|c| {
                healthy
                    .iter()
                    .all(|&j| c.weights.get(j).is_none_or(|(_, w)| *w <= 1e-9))
            })
            .map(|c| c.class)
            .collect()
    }

    /// Same weights and shed shares (within 1e-9).
    pub fn same_routing(&self, other: &Plan) -> bool {
        self.classes.len() == other.classes.len()
            && self.classes.iter().zip(&other.classes).all(|(a, b)| {
                (a.shed - b.shed).abs() < 1e-9
                    && a.weights.len() == b.weights.len()
                    && a.weights
                        .iter()
                        .zip(&b.weights)
                        .all(|(x, y)| x.0 == y.0 && (x.1 - y.1).abs() < 1e-9)
            })
    }
}

const EPS: f64 = 1e-12;
/// Demand assumed for a class with none observed, so it still gets weights.
const PHANTOM_RPS: f64 = 1e-6;

/// Per-class fractions of demand on each channel (rows: class, cols: channel).
type Fractions = [Vec<f64>; 4];

struct Ctx<'a> {
    ch: Vec<&'a ChannelInput>,
    cap: Vec<f64>,
    trust: Vec<f64>,
    demand: [f64; 4],
    order_cost: Vec<usize>,
    classes: &'a ClassPolicies,
    prio: [TrafficClass; 4],
    overflow_max_failure_rate: f64,
    half_open_min_rps: f64,
    retry_path_share: f64,
    /// Panic mode: an OBSERVING channel here is one failing nearly
    /// everything (see `shares::in_panic`).
    panic: bool,
}

impl Ctx<'_> {
    fn tolerant(&self, class: TrafficClass) -> bool {
        self.classes.get(class).accepts_at_risk
    }
    fn score_ok(&self, class: TrafficClass, j: usize) -> bool {
        self.ch[j]
            .score
            .is_none_or(|s| s <= self.classes.get(class).max_score + EPS)
    }
    fn is_probation(&self, j: usize) -> bool {
        matches!(
            self.ch[j].state,
            StateKind::Observing | StateKind::Recovering
        )
    }
}

/// Plans one group. Pure: same input, same plan, whatever the channel order.
pub fn plan(
    input: &GroupInput,
    classes: &ClassPolicies,
    cfg: &ScheduleConfig,
    previous: Option<&Plan>,
    manual: bool,
) -> Plan {
    let channels = as_planned(input, cfg);
    let mut ch: Vec<&ChannelInput> = channels.iter().collect();
    ch.sort_by(|a, b| a.id.cmp(&b.id));
    let n = ch.len();
    let (cap, quota_bound) = capacities(&ch, input.horizon_ms, cfg.capacity_headroom);
    let demand = input
        .demand_rps
        .map(|d| if d.is_finite() { d.max(0.0) } else { 0.0 });
    let known = input.warm && demand.iter().sum::<f64>() > EPS;
    let ctx = Ctx {
        trust: trust_shares(&ch),
        order_cost: cheapest_first(&ch),
        ch,
        cap,
        demand: demand.map(|d| d.max(PHANTOM_RPS)),
        classes,
        prio: classes.in_priority_order(),
        overflow_max_failure_rate: cfg.overflow_max_failure_rate,
        half_open_min_rps: cfg.half_open_min_rps,
        retry_path_share: cfg.retry_path_share,
        panic: input.panic_since_ms.is_some(),
    };

    // As the channels are, for the plan's statuses (panic mode plans them
    // otherwise, and says so in their reasons).
    let mut shown: Vec<&ChannelInput> = input.channels.iter().collect();
    shown.sort_by(|a, b| a.id.cmp(&b.id));
    let target = if manual {
        match previous {
            Some(p) => return frozen(p, input, &shown),
            None => initial_fractions(&ctx),
        }
    } else if !known {
        initial_fractions(&ctx)
    } else {
        let budget = input
            .budget_per_hour
            .map(|b| b * (1.0 - cfg.budget_margin) / input.spend_calibration.clamp(0.5, 2.0));
        let mut target = healthy_plan(&ctx, &quota_bound, budget);
        // A plan where nothing is eligible for a class leaves it fully shed.
        normalize_rows(&mut target.0);
        target
    };

    // Smoothing against the previous plan.
    let fractions = match previous.filter(|p| {
        !manual
            && p.channels.len() == n
            && p.channels.iter().zip(&ctx.ch).all(|(a, b)| a.id == b.id)
    }) {
        Some(prev) if known => smooth(&ctx, prev, &target, cfg.max_weight_step),
        _ => target,
    };

    build_plan(input, &ctx, &shown, fractions, previous, manual)
}

/// The channels as a plan sees them. Panic mode: health does not route,
/// only pins, capacity and price do; a channel failing nearly everything
/// gets only a probe's share.
fn as_planned<'a>(input: &'a GroupInput, cfg: &ScheduleConfig) -> Cow<'a, [ChannelInput]> {
    if input.panic_since_ms.is_none() {
        return Cow::Borrowed(&input.channels);
    }
    // Only while another channel serves nearly everything it gets (it
    // fails at most `1 − overflow_max_failure_rate`) is there anything
    // better to send to. Otherwise, when every channel fails at once
    // (and the windows have not all caught up), they are all planned
    // like static routing, and are back the moment the common cause
    // ends.
    let max = cfg.overflow_max_failure_rate;
    let some_serve = input
        .channels
        .iter()
        .any(|c| !c.pinned && c.failure_rate.is_none_or(|f| f <= 1.0 - max));
    Cow::Owned(
        input
            .channels
            .iter()
            .map(|c| in_panic(c, some_serve && failing_in_panic(c, max)))
            .collect(),
    )
}

/// Manual mode's plan: the routing of `previous` stays; the statuses are
/// the channels' (`shown`, in id order) as they are now.
fn frozen(previous: &Plan, input: &GroupInput, shown: &[&ChannelInput]) -> Plan {
    let mut frozen = Plan {
        manual: true,
        computed_at_ms: input.now_ms,
        panic_since_ms: input.panic_since_ms,
        ..previous.clone()
    };
    if frozen.channels.len() == shown.len() {
        for (c, s) in frozen.channels.iter_mut().zip(shown) {
            c.state = s.state;
            c.score = s.score;
            c.signals = s.signals.clone();
        }
    }
    // Entering manual mode is news for gateways and operators (the
    // snapshot's `manual`), as is a state: a new version, so it is
    // published and announced, not only seen at the next heartbeat. The
    // routing itself stays.
    if !frozen.same_published(previous) {
        frozen.version = previous.version + 1;
    }
    frozen
}

/// Requests per second per class (schema order) and channel.
type Rps = [Vec<f64>; 4];

impl ChannelInput {
    /// A configured channel as its health shows it; with no health yet,
    /// healthy at full weight with an unknown score.
    fn of(
        c: &crate::config::ChannelConfig,
        h: Option<&crate::health::ChannelHealth>,
    ) -> ChannelInput {
        ChannelInput {
            id: c.id.clone(),
            state: h.map_or(StateKind::Healthy, |h| h.state),
            health_weight: h.map_or(1.0, |h| h.weight),
            pinned: h.is_some_and(|h| h.pinned),
            score: h.and_then(|h| h.score),
            signals: h.map(|h| h.signals.clone()).unwrap_or_default(),
            price_per_1k_tokens: c.price_per_1k_tokens,
            capacity_rps: c.capacity_rps,
            initial_weight: c.initial_weight,
            quota_remaining: h.and_then(|h| h.quota_remaining),
            quota_exhausted_in_ms: h.and_then(|h| h.quota_exhausted_in_ms),
            tokens_per_request: h.and_then(|h| h.tokens_per_request),
            failure_rate: h.and_then(|h| h.failure_rate),
            failure_streak: h.map_or(0, |h| h.failure_streak),
            half_open_share: c.policy.states.half_open_share,
        }
    }
}
