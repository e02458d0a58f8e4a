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
    /// The group is in a correlated failure (docs/decisions.md#safety-rails panic mode): every
    /// unpinned channel is planned as healthy, as static routing would.
    pub correlated: bool,
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

/// Fill `class` onto the channels in `order`, each limited by `room[j]`
/// (and optionally its trust cap). Returns the demand left over.
fn fill(
    rps: &mut [Vec<f64>; 4],
    room: &mut [f64],
    class: TrafficClass,
    mut left: f64,
    order: &[usize],
    trust_cap: Option<(&[f64], f64)>,
) -> f64 {
    let k = class.index();
    for &j in order {
        if left <= EPS {
            break;
        }
        let mut take = left.min(room[j]);
        if let Some((trust, demand)) = trust_cap {
            take = take.min((trust[j] * demand - rps[k][j]).max(0.0));
        }
        if take > EPS {
            rps[k][j] += take;
            room[j] -= take;
            left -= take;
        }
    }
    left
}

/// Plans one group. Pure: same input, same plan, whatever the channel order.
pub fn plan(
    input: &GroupInput,
    classes: &ClassPolicies,
    cfg: &ScheduleConfig,
    previous: Option<&Plan>,
    manual: bool,
) -> Plan {
    // Panic mode: health does not route, only pins, capacity and price do.
    let calm: Vec<ChannelInput>;
    let channels = if input.correlated {
        calm = input.channels.iter().map(as_if_healthy).collect();
        &calm
    } else {
        &input.channels
    };
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
    };

    let target = if manual {
        match previous {
            Some(p) => {
                return Plan {
                    manual: true,
                    computed_at_ms: input.now_ms,
                    // Entering manual mode is news for gateways and
                    // operators (the snapshot's `manual`): a new version,
                    // so it is published and announced, not only seen at
                    // the next heartbeat. The routing itself stays.
                    version: if p.manual { p.version } else { p.version + 1 },
                    ..p.clone()
                };
            }
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

    build_plan(input, &ctx, fractions, previous, manual)
}

/// Each channel's trust-tier share: its initial weight over the group's.
fn trust_shares(ch: &[&ChannelInput]) -> Vec<f64> {
    let n = ch.len();
    let total: f64 = ch.iter().map(|c| c.initial_weight.max(0.0)).sum();
    ch.iter()
        .map(|c| {
            if total > 0.0 {
                c.initial_weight.max(0.0) / total
            } else {
                1.0 / n.max(1) as f64
            }
        })
        .collect()
}

/// What each channel can take (rps, within the headroom), and whether its
/// quota is what bounds it: a quota forecast to run out within the horizon
/// caps the channel at the rate its remainder sustains.
fn capacities(ch: &[&ChannelInput], horizon_ms: i64, headroom: f64) -> (Vec<f64>, Vec<bool>) {
    let horizon_s = horizon_ms as f64 / 1000.0;
    let mut quota_bound = vec![false; ch.len()];
    let cap = ch
        .iter()
        .enumerate()
        .map(|(j, c)| {
            let mut cap = (c.capacity_rps * headroom).max(0.0);
            if let (Some(left_ms), Some(remaining)) = (c.quota_exhausted_in_ms, c.quota_remaining) {
                if left_ms < horizon_ms {
                    let sustainable = remaining.max(0) as f64 / horizon_s;
                    if sustainable < cap {
                        cap = sustainable;
                        quota_bound[j] = true;
                    }
                }
            }
            cap
        })
        .collect();
    (cap, quota_bound)
}

/// Channel indices, cheapest first (ties by id).
fn cheapest_first(ch: &[&ChannelInput]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..ch.len()).collect();
    order.sort_by(|a, b| {
        ch[*a]
            .price_per_1k_tokens
            .total_cmp(&ch[*b].price_per_1k_tokens)
            .then(ch[*a].id.cmp(&ch[*b].id))
    });
    order
}

/// A channel as panic mode plans it: healthy unless an operator pinned it.
fn as_if_healthy(c: &ChannelInput) -> ChannelInput {
    if c.pinned {
        return c.clone();
    }
    ChannelInput {
        state: StateKind::Healthy,
        health_weight: 1.0,
        score: None,
        ..c.clone()
    }
}

fn normalize_rows(f: &mut Fractions) {
    for row in f.iter_mut() {
        for x in row.iter_mut() {
            if *x < EPS {
                *x = 0.0;
            }
        }
    }
}

/// Before anything is known: the trust-tier shares, for every class, over
/// channels that are not drained.
fn initial_fractions(ctx: &Ctx<'_>) -> (Fractions, Vec<ShareReason>) {
    let n = ctx.ch.len();
    let usable: Vec<f64> = (0..n)
        .map(|j| {
            if ctx.ch[j].health_weight > 0.0 {
                ctx.trust[j] * ctx.ch[j].health_weight.min(1.0)
            } else {
                0.0
            }
        })
        .collect();
    let total: f64 = usable.iter().sum();
    let row: Vec<f64> = usable
        .iter()
        .map(|u| if total > 0.0 { u / total } else { 0.0 })
        .collect();
    let reasons = (0..n)
        .map(|j| match ctx.ch[j].state {
            _ if ctx.ch[j].pinned => ShareReason::Pinned,
            StateKind::Drained => ShareReason::Drained,
            _ => ShareReason::InitialShare,
        })
        .collect();
    ([row.clone(), row.clone(), row.clone(), row], reasons)
}

/// Steps 2–5 of the module doc. Returns fractions of each class's demand.
fn healthy_plan(
    ctx: &Ctx<'_>,
    quota_bound: &[bool],
    budget: Option<f64>,
) -> (Fractions, Vec<ShareReason>) {
    let n = ctx.ch.len();
    let nominal = nominal_load(ctx);
    let mut rps: Rps = [vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; n]];
    let mut left = ctx.demand;
    let (mut room, mut reasons) = degraded_allowances(ctx, &nominal, &mut rps, &mut left);
    healthy_fill(ctx, &mut rps, &mut room, &mut left);
    // What healthy and AT_RISK capacity could not take goes to the least-bad
    // unhealthy channels rather than being shed (docs/decisions.md#safety-rails: health never
    // sheds what static routing would have served), highest priority first.
    overflow_to_least_bad(ctx, &mut rps, &mut left);
    if let Some(budget) = budget {
        keep_to_budget(ctx, budget, &mut rps, &mut room, &mut reasons);
    }
    cap_reasons(ctx, quota_bound, &rps, &mut reasons);
    let fractions = [0, 1, 2, 3].map(|k| (0..n).map(|j| rps[k][j] / ctx.demand[k]).collect());
    (fractions, reasons)
}

/// Requests per second per class (schema order) and channel.
type Rps = [Vec<f64>; 4];

/// Step 2, nominal: every channel healthy, trust caps then capacity,
/// cheapest first. Each channel's total load.
fn nominal_load(ctx: &Ctx<'_>) -> Vec<f64> {
    let n = ctx.ch.len();
    let mut nominal_rps: Rps = [vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; n]];
    let mut room = ctx.cap.clone();
    for class in ctx.prio {
        let d = ctx.demand[class.index()];
        let left = fill(
            &mut nominal_rps,
            &mut room,
            class,
            d,
            &ctx.order_cost,
            Some((&ctx.trust, d)),
        );
        fill(
            &mut nominal_rps,
            &mut room,
            class,
            left,
            &ctx.order_cost,
            None,
        );
    }
    (0..n)
        .map(|j| (0..4).map(|k| nominal_rps[k][j]).sum())
        .collect()
}

/// Step 3: degraded channels carry their allowance (health weight ×
/// nominal load), lowest-priority tolerant classes first. Returns the
/// healthy channels' room and every channel's reason so far.
fn degraded_allowances(
    ctx: &Ctx<'_>,
    nominal: &[f64],
    rps: &mut Rps,
    left: &mut [f64; 4],
) -> (Vec<f64>, Vec<ShareReason>) {
    let n = ctx.ch.len();
    let mut room = vec![0.0; n];
    let mut reasons = vec![ShareReason::Healthy; n];
    for j in 0..n {
        let c = ctx.ch[j];
        let healthy = c.state == StateKind::Healthy && !c.pinned;
        room[j] = if healthy { ctx.cap[j] } else { 0.0 };
        reasons[j] = match c.state {
            _ if c.pinned => ShareReason::Pinned,
            StateKind::Healthy => ShareReason::Healthy,
            StateKind::AtRisk => ShareReason::AtRisk,
            StateKind::Drained => ShareReason::Drained,
            StateKind::Observing => ShareReason::Observing,
            StateKind::Recovering => ShareReason::Recovering,
        };
    }
    let mut low_first = ctx.prio;
    low_first.reverse();
    for j in 0..n {
        let c = ctx.ch[j];
        if (c.state == StateKind::Healthy && !c.pinned) || c.health_weight <= 0.0 {
            continue;
        }
        // Probation channels need traffic to prove themselves: if no
        // tolerant class has demand, any class may carry the small share.
        let base = if c.state == StateKind::Observing && !c.pinned {
            // Half-open: a share of the group's real traffic (incident 002: "5 %
            // of real traffic"), enough to judge it, never above its nominal.
            (c.health_weight * ctx.demand.iter().sum::<f64>())
                .min(nominal[j].max(ctx.cap[j] * 0.01))
        } else {
            c.health_weight.min(1.0) * nominal[j].max(ctx.cap[j] * 0.01)
        };
        let mut allowance = base.min(ctx.cap[j]);
        let tolerant_first = low_first.iter().filter(|k| ctx.tolerant(**k));
        let others = low_first
            .iter()
            .filter(|k| !ctx.tolerant(**k) && (c.pinned || ctx.is_probation(j)));
        for class in tolerant_first.chain(others) {
            if !ctx.score_ok(*class, j) && !ctx.is_probation(j) && !c.pinned {
                continue;
            }
            let k = class.index();
            let take = left[k].min(allowance);
            if take > EPS {
                rps[k][j] += take;
                left[k] -= take;
                allowance -= take;
            }
        }
    }
    (room, reasons)
}

/// Step 4: healthy capacity in priority order (trust caps, then room), then
/// tolerant classes' overflow onto AT_RISK capacity (not pinned).
fn healthy_fill(ctx: &Ctx<'_>, rps: &mut Rps, room: &mut [f64], left: &mut [f64; 4]) {
    for class in ctx.prio {
        let k = class.index();
        let eligible: Vec<usize> = ctx
            .order_cost
            .iter()
            .copied()
            .filter(|j| room[*j] > 0.0 && ctx.score_ok(class, *j))
            .collect();
        let d = ctx.demand[k];
        left[k] = fill(rps, room, class, left[k], &eligible, Some((&ctx.trust, d)));
        left[k] = fill(rps, room, class, left[k], &eligible, None);
    }
    for class in ctx.prio {
        let k = class.index();
        if left[k] <= EPS || !ctx.tolerant(class) {
            continue;
        }
        for &j in &ctx.order_cost {
            let c = ctx.ch[j];
            if c.state != StateKind::AtRisk || c.pinned || !ctx.score_ok(class, j) {
                continue;
            }
            let used: f64 = (0..4).map(|kk| rps[kk][j]).sum();
            let take = left[k].min((ctx.cap[j] - used).max(0.0));
            if take > EPS {
                rps[k][j] += take;
                left[k] -= take;
            }
        }
    }
}

/// Step 5, budget: lowest-priority classes off the most expensive channels,
/// onto strictly cheaper healthy room where there is some, else shed.
fn keep_to_budget(
    ctx: &Ctx<'_>,
    budget: f64,
    rps: &mut Rps,
    room: &mut [f64],
    reasons: &mut [ShareReason],
) {
    let n = ctx.ch.len();
    let spend = |rps: &Rps| -> f64 {
        (0..n)
            .map(|j| {
                let load: f64 = (0..4).map(|k| rps[k][j]).sum();
                spend_per_hour(ctx.ch[j], load)
            })
            .sum()
    };
    let mut by_price_desc = ctx.order_cost.clone();
    by_price_desc.reverse();
    let mut low_first = ctx.prio;
    low_first.reverse();
    'classes: for class in low_first {
        let k = class.index();
        for &j in &by_price_desc {
            let over = spend(rps) - budget;
            if over <= 1e-9 {
                break 'classes;
            }
            if rps[k][j] <= EPS || ctx.ch[j].price_per_1k_tokens <= 0.0 {
                continue;
            }
            let per_rps = spend_per_hour(ctx.ch[j], 1.0);
            let cut = rps[k][j].min(over / per_rps);
            rps[k][j] -= cut;
            reasons[j] = ShareReason::BudgetCap;
            let mut moving = cut;
            for &i in &ctx.order_cost {
                if moving <= EPS || ctx.ch[i].price_per_1k_tokens >= ctx.ch[j].price_per_1k_tokens {
                    break;
                }
                if room[i] <= EPS || !ctx.score_ok(class, i) {
                    continue;
                }
                let take = moving.min(room[i]);
                rps[k][i] += take;
                room[i] -= take;
                moving -= take;
            }
        }
    }
}

/// A healthy channel's reason when a cap bound its share: quota, capacity,
/// then trust.
fn cap_reasons(ctx: &Ctx<'_>, quota_bound: &[bool], rps: &Rps, reasons: &mut [ShareReason]) {
    for j in 0..ctx.ch.len() {
        let load: f64 = (0..4).map(|k| rps[k][j]).sum();
        if reasons[j] == ShareReason::Healthy {
            if quota_bound[j] && load >= ctx.cap[j] - 1e-9 {
                reasons[j] = ShareReason::QuotaCap;
            } else if load >= ctx.cap[j] - 1e-9 && ctx.cap[j] > 0.0 {
                reasons[j] = ShareReason::CapacityCap;
            } else if (0..4)
                .any(|k| rps[k][j] >= ctx.trust[j] * ctx.demand[k] - 1e-9 && rps[k][j] > EPS)
            {
                reasons[j] = ShareReason::TrustCap;
            }
        }
    }
}

/// Demand left after the healthy fill goes to unpinned unhealthy channels,
/// lowest score first (cheapest on ties), within their capacity, unless a
/// channel fails about everything (`overflow_max_failure_rate`).
/// Shedding is then for capacity and budget only.
fn overflow_to_least_bad(ctx: &Ctx<'_>, rps: &mut [Vec<f64>; 4], left: &mut [f64; 4]) {
    let n = ctx.ch.len();
    let mut sick: Vec<usize> = (0..n)
        .filter(|&j| {
            let c = ctx.ch[j];
            c.state != StateKind::Healthy
                && !c.pinned
                && c.failure_rate
                    .is_none_or(|f| f < ctx.overflow_max_failure_rate)
        })
        .collect();
    sick.sort_by(|a, b| {
        let score = |j: usize| ctx.ch[j].score.unwrap_or(0.0);
        score(*a)
            .total_cmp(&score(*b))
            .then(
                ctx.ch[*a]
                    .price_per_1k_tokens
                    .total_cmp(&ctx.ch[*b].price_per_1k_tokens),
            )
            .then(ctx.ch[*a].id.cmp(&ctx.ch[*b].id))
    });
    for class in ctx.prio {
        let k = class.index();
        for &j in &sick {
            if left[k] <= EPS {
                break;
            }
            let used: f64 = (0..4).map(|kk| rps[kk][j]).sum();
            let take = left[k].min((ctx.cap[j] - used).max(0.0));
            if take > EPS {
                rps[k][j] += take;
                left[k] -= take;
            }
        }
    }
}

fn spend_per_hour(c: &ChannelInput, rps: f64) -> f64 {
    let tokens = c.tokens_per_request.unwrap_or(1000.0);
    rps * 3600.0 * tokens / 1000.0 * c.price_per_1k_tokens
}

/// Whether `class` may use channel `j` at all in this health picture.
fn eligible(ctx: &Ctx<'_>, class: TrafficClass, j: usize) -> bool {
    let c = ctx.ch[j];
    if c.health_weight <= 0.0 {
        return false;
    }
    if c.pinned || ctx.is_probation(j) {
        return true;
    }
    match c.state {
        StateKind::Healthy => ctx.score_ok(class, j),
        StateKind::AtRisk => ctx.tolerant(class) && ctx.score_ok(class, j),
        _ => false,
    }
}

/// Step 6: move toward the target by at most `step` on any (class, channel)
/// fraction. One step size for every class keeps the result a convex mix of
/// two capacity-feasible plans, hence feasible. A drain (a class's channel
/// became ineligible) jumps straight to the target, and so does a mix that
/// would overload a channel under today's demand.
fn smooth(
    ctx: &Ctx<'_>,
    prev: &Plan,
    target: &(Fractions, Vec<ShareReason>),
    step: f64,
) -> (Fractions, Vec<ShareReason>) {
    let n = ctx.ch.len();
    let prev_f: [Vec<f64>; 4] = [0, 1, 2, 3].map(|k| {
        let p = &prev.classes[k];
        p.weights.iter().map(|(_, w)| w * (1.0 - p.shed)).collect()
    });
    let drained = TrafficClass::ALL
        .iter()
        .any(|c| (0..n).any(|j| prev_f[c.index()][j] > EPS && !eligible(ctx, *c, j)));
    if drained {
        return target.clone();
    }
    let max_move = (0..4)
        .flat_map(|k| (0..n).map(move |j| (k, j)))
        .map(|(k, j)| (target.0[k][j] - prev_f[k][j]).abs())
        .fold(0.0, f64::max);
    if max_move <= step {
        return target.clone();
    }
    let a = step / max_move;
    let mixed: Fractions = [0, 1, 2, 3].map(|k| {
        (0..n)
            .map(|j| prev_f[k][j] + a * (target.0[k][j] - prev_f[k][j]))
            .collect()
    });
    let overloads = (0..n).any(|j| {
        let load: f64 = (0..4).map(|k| mixed[k][j] * ctx.demand[k]).sum();
        load > ctx.cap[j] + 1e-9
    });
    if overloads {
        return target.clone();
    }
    (mixed, target.1.clone())
}

fn build_plan(
    input: &GroupInput,
    ctx: &Ctx<'_>,
    (fractions, reasons): (Fractions, Vec<ShareReason>),
    previous: Option<&Plan>,
    manual: bool,
) -> Plan {
    let n = ctx.ch.len();
    let real_demand = input
        .demand_rps
        .map(|d| if d.is_finite() { d.max(0.0) } else { 0.0 });
    let mut classes = Vec::with_capacity(4);
    let mut planned = vec![0.0; n];
    for &class in TrafficClass::ALL {
        let k = class.index();
        let served: f64 = fractions[k].iter().sum();
        let shed = (1.0 - served).clamp(0.0, 1.0);
        let weights: Vec<(String, f64)> = (0..n)
            .map(|j| {
                let w = if served > EPS {
                    fractions[k][j] / served
                } else {
                    0.0
                };
                (ctx.ch[j].id.clone(), w)
            })
            .collect();
        for j in 0..n {
            planned[j] += fractions[k][j] * real_demand[k];
        }
        classes.push(ClassPlan {
            class,
            weights,
            shed: if shed < 1e-9 { 0.0 } else { shed },
            demand_rps: real_demand[k],
        });
    }
    let channels: Vec<ChannelPlan> = (0..n)
        .map(|j| ChannelPlan {
            id: ctx.ch[j].id.clone(),
            state: ctx.ch[j].state,
            score: ctx.ch[j].score,
            signals: ctx.ch[j].signals.clone(),
            planned_rps: planned[j],
            cap_rps: ctx.cap[j],
            reason: reasons[j],
        })
        .collect();
    let projected = (0..n).map(|j| spend_per_hour(ctx.ch[j], planned[j])).sum();
    let mut plan = Plan {
        group: input.group.clone(),
        version: 1,
        computed_at_ms: input.now_ms,
        classes,
        channels,
        projected_spend_per_hour: projected,
        budget_per_hour: input.budget_per_hour,
        manual,
    };
    if let Some(prev) = previous {
        // Leaving manual mode is news too, even with the same routing.
        plan.version = if plan.same_routing(prev) && prev.manual == plan.manual {
            prev.version
        } else {
            prev.version + 1
        };
    }
    plan
}

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
}

/// Planned against measured spend of one group (`GroupInput::spend_calibration`).
///
/// The measured side is each channel's cost over the demand window; the
/// planned side is the projection of the plans in force over about the same
/// span (an exponential average with the window as its time constant). Their
/// ratio is smoothed over five windows, so one burst does not swing it.
#[derive(Debug, Clone, Copy, Default)]
struct SpendMeter {
    planned: Option<f64>,
    ratio: Option<f64>,
    at_ms: Option<i64>,
}

impl SpendMeter {
    /// Folds in the plan that was in force up to `now_ms` and the spend
    /// measured over the last `window_ms`; returns the calibration.
    fn update(&mut self, now_ms: i64, in_force: Option<f64>, measured: f64, window_ms: i64) -> f64 {
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
            correlated,
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
    fn judge_correlation(
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
    fn uncensored_demand(&self, gi: usize, mut demand: [f64; 4], unsent: [f64; 4]) -> [f64; 4] {
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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ClassPolicies;
    use proptest::prelude::*;
    use TrafficClass::*;

    fn ch(id: &str, price: f64, cap: f64, initial: f64) -> ChannelInput {
        ChannelInput {
            id: id.into(),
            state: StateKind::Healthy,
            health_weight: 1.0,
            pinned: false,
            score: Some(0.05),
            signals: Vec::new(),
            price_per_1k_tokens: price,
            capacity_rps: cap,
            initial_weight: initial,
            quota_remaining: None,
            quota_exhausted_in_ms: None,
            tokens_per_request: Some(1000.0),
            failure_rate: Some(0.0),
        }
    }

    fn group(channels: Vec<ChannelInput>, demand: [f64; 4]) -> GroupInput {
        GroupInput {
            group: "chat".into(),
            now_ms: 1_000,
            channels,
            demand_rps: demand,
            budget_per_hour: None,
            horizon_ms: 3_600_000,
            warm: true,
            correlated: false,
            spend_calibration: 1.0,
        }
    }

    fn run(g: &GroupInput) -> Plan {
        plan(
            g,
            &ClassPolicies::default(),
            &ScheduleConfig::default(),
            None,
            false,
        )
    }

    fn set_state(g: &mut GroupInput, id: &str, state: StateKind, weight: f64, score: f64) {
        let c = g.channels.iter_mut().find(|c| c.id == id).unwrap();
        c.state = state;
        c.health_weight = weight;
        c.score = Some(score);
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    /// free (cap 100 → 80 planned), paid (cap 100 → 80): 30/70 trust.
    fn two() -> GroupInput {
        group(
            vec![ch("free", 0.0, 100.0, 0.3), ch("paid", 1.0, 100.0, 0.7)],
            [10.0, 10.0, 20.0, 5.0],
        )
    }

    #[test]
    fn all_healthy_follows_trust_shares() {
        let p = run(&two());
        for &c in TrafficClass::ALL {
            assert!(
                close(p.weight(c, "free"), 0.3),
                "{c}: {}",
                p.weight(c, "free")
            );
            assert!(close(p.weight(c, "paid"), 0.7));
            assert_eq!(p.class(c).shed, 0.0);
        }
        assert_eq!(p.channels[0].reason, ShareReason::TrustCap);
    }

    #[test]
    fn nothing_known_gives_initial_shares() {
        let mut g = two();
        g.warm = false;
        let p = run(&g);
        assert!(close(p.weight(Interactive, "free"), 0.3));
        assert_eq!(p.channels[1].reason, ShareReason::InitialShare);
    }

    #[test]
    fn free_at_risk_batch_stays_interactive_moves() {
        let mut g = two();
        set_state(&mut g, "free", StateKind::AtRisk, 0.3, 0.5);
        let p = run(&g);
        assert_eq!(p.weight(Interactive, "free"), 0.0);
        assert_eq!(p.weight(Core, "free"), 0.0);
        assert!(p.weight(Batch, "free") > 0.0 || p.weight(Experimental, "free") > 0.0);
        // Free carried 0.3 × 45 = 13.5 rps nominally; now 30 % of that.
        assert!(
            close(p.channels[0].planned_rps, 0.3 * 13.5),
            "{}",
            p.channels[0].planned_rps
        );
        // Experimental (lowest priority, 5 rps) takes that 4.05 rps first.
        assert!(close(p.weight(Experimental, "free"), 4.05 / 5.0));
        assert_eq!(p.weight(Batch, "free"), 0.0);
        assert_eq!(p.channels[0].reason, ShareReason::AtRisk);
    }

    #[test]
    fn free_drained_with_ample_paid_capacity() {
        let mut g = two();
        set_state(&mut g, "free", StateKind::Drained, 0.0, 0.9);
        let p = run(&g);
        for &c in TrafficClass::ALL {
            assert_eq!(p.weight(c, "free"), 0.0);
            assert!(close(p.weight(c, "paid"), 1.0));
            assert_eq!(p.class(c).shed, 0.0);
        }
        assert_eq!(p.channels[0].reason, ShareReason::Drained);
    }

    #[test]
    fn free_drained_paid_absorbs_only_what_fits_highest_priority_first() {
        // 100 rps: free carries 90 (trust 0.9), paid 10 with capacity
        // 57.5 × 0.8 = 46, i.e. room for 36 more: 40 % of free's traffic.
        let mut g = group(
            vec![ch("free", 0.0, 200.0, 0.9), ch("paid", 1.0, 57.5, 0.1)],
            [20.0, 30.0, 40.0, 10.0],
        );
        let healthy = run(&g);
        assert!(close(healthy.channels[0].planned_rps, 90.0));
        assert!(close(healthy.channels[1].planned_rps, 10.0));
        set_state(&mut g, "free", StateKind::Drained, 0.0, 0.9);
        // Down hard: nothing would be served there, so the rest is shed.
        g.channels[0].failure_rate = Some(1.0);
        let p = run(&g);
        let paid = &p.channels[1];
        assert!(
            paid.planned_rps <= paid.cap_rps + 1e-9,
            "never over capacity × headroom"
        );
        assert!(close(paid.planned_rps, 46.0));
        // Highest priority first: interactive whole, core 26 of 30, the rest shed.
        assert_eq!(p.class(Interactive).shed, 0.0);
        assert!(close(p.class(Core).shed, 4.0 / 30.0));
        assert!(close(p.class(Batch).shed, 1.0));
        assert!(close(p.class(Experimental).shed, 1.0));
        assert_eq!(paid.reason, ShareReason::CapacityCap);
    }

    #[test]
    fn a_drained_channel_that_still_serves_takes_the_overflow_instead_of_a_shed() {
        // docs/decisions.md#safety-rails: health never sheds what static routing would have
        // served. Free fails 20 % and is drained; paid can take 46 of 100.
        let mut g = group(
            vec![ch("free", 0.0, 200.0, 0.9), ch("paid", 1.0, 57.5, 0.1)],
            [20.0, 30.0, 40.0, 10.0],
        );
        set_state(&mut g, "free", StateKind::Drained, 0.0, 0.9);
        g.channels[0].failure_rate = Some(0.2);
        let p = run(&g);
        for c in &p.classes {
            assert_eq!(c.shed, 0.0, "{:?} shed", c.class);
        }
        // Interactive stays off the sick channel; the overflow is what the
        // lowest priorities could not fit on paid.
        assert_eq!(p.weight(Interactive, "free"), 0.0);
        assert!(close(p.channels[1].planned_rps, 46.0));
        assert!(close(p.channels[0].planned_rps, 54.0));
        // Past the limit it fails about everything: shed after all.
        g.channels[0].failure_rate = Some(0.95);
        assert!(run(&g).class(Batch).shed > 0.99);
    }

    #[test]
    fn a_correlated_failure_is_planned_like_static_routing() {
        let mut g = group(
            vec![ch("free", 0.0, 60.0, 0.3), ch("paid", 1.0, 60.0, 0.7)],
            [10.0, 10.0, 10.0, 0.0],
        );
        let calm = run(&g);
        set_state(&mut g, "free", StateKind::Drained, 0.0, 0.9);
        set_state(&mut g, "paid", StateKind::AtRisk, 0.3, 0.6);
        g.correlated = true;
        let p = run(&g);
        assert!(p.same_routing(&calm), "{p:?}");
        // A pin still holds.
        g.channels[0].pinned = true;
        assert_eq!(run(&g).weight(Core, "free"), 0.0);
    }

    #[test]
    fn the_writer_sees_a_correlated_failure_no_single_engine_saw() {
        // Two partitions each report one channel, neither flags the group;
        // both channels were drained seconds ago. The writer's own rule
        // plans the group like static routing.
        let cfg = std::sync::Arc::new(crate::config::Config::single_group(
            "chat",
            &[
                ("free-a", crate::config::Tier::Free, 0.0, 50.0),
                ("paid-a", crate::config::Tier::Paid, 1.0, 50.0),
            ],
        ));
        let report =
            |id: &str, state: StateKind, incident: Option<i64>| crate::health::ChannelHealth {
                score: Some(0.2),
                demand_rps: [1.0, 2.0, 2.0, 0.0],
                failure_rate: Some(1.0),
                incident_since_ms: incident,
                ..crate::health::ChannelHealth::fixture(id, state)
            };
        let now = 1_000_000;
        let mut s = Scheduler::new(cfg.clone());
        let calm = vec![
            report("free-a", StateKind::Healthy, None),
            report("paid-a", StateKind::Healthy, None),
        ];
        let before = s.plan_group(0, now - 5_000, &calm, true).0.clone();
        let down = vec![
            report("free-a", StateKind::Drained, Some(now - 3_000)),
            report("paid-a", StateKind::Drained, Some(now - 2_000)),
        ];
        let (p, _) = s.plan_group(0, now, &down, true);
        assert!(p.same_routing(&before), "{p:?}");
        // One channel drained alone is its own fault: it is drained.
        let mut t = Scheduler::new(cfg);
        t.plan_group(0, now - 5_000, &calm, true);
        let one = vec![
            report("free-a", StateKind::Drained, Some(now - 3_000)),
            report("paid-a", StateKind::Healthy, None),
        ];
        let (p, _) = t.plan_group(0, now, &one, true);
        assert_eq!(p.weight(TrafficClass::Core, "free-a"), 0.0);
    }

    /// Demand of a shed class: measured from unsent reports when gateways
    /// send them; scaled up by the shed share only when they do not.
    #[test]
    fn shed_demand_is_measured_when_gateways_report_it() {
        let cfg = std::sync::Arc::new(crate::config::Config::single_group(
            "chat",
            &[("paid-a", crate::config::Tier::Paid, 1.0, 10.0)],
        ));
        let now = 1_000_000;
        // 20 rps of core demand on a channel with room for 8: half is shed.
        let report = |served: f64, unsent: f64| crate::health::ChannelHealth {
            demand_rps: [0.0, served + unsent, 0.0, 0.0],
            unsent_rps: [0.0, unsent, 0.0, 0.0],
            ..crate::health::ChannelHealth::fixture("paid-a", StateKind::Healthy)
        };
        let core = |p: &Plan| p.class(Core).clone();
        let mut s = Scheduler::new(cfg.clone());
        let first = core(s.plan_group(0, now, &[report(20.0, 0.0)], true).0);
        assert!(first.shed > 0.5, "{first:?}");
        // Reporting gateways: 8 served + 12 unsent is 20, nothing inflated.
        let p = core(s.plan_group(0, now + 5_000, &[report(8.0, 12.0)], true).0);
        assert!(close(p.demand_rps, 20.0), "{p:?}");
        // Older gateways: only the 8 served are seen; scaled back up.
        let mut old = Scheduler::new(cfg);
        old.plan_group(0, now, &[report(20.0, 0.0)], true);
        let p = core(old.plan_group(0, now + 5_000, &[report(8.0, 0.0)], true).0);
        assert!(p.demand_rps > 8.0 * 1.5, "{p:?}");
    }

    #[test]
    fn spend_calibration_follows_what_was_measured() {
        let mut m = SpendMeter::default();
        assert_eq!(m.update(0, None, 0.0, 60_000), 1.0, "nothing known yet");
        // Plans project 100/h while 120/h is measured, for ten minutes.
        let mut r = 1.0;
        for i in 1..=120 {
            r = m.update(i * 5_000, Some(100.0), 120.0, 60_000);
        }
        assert!((r - 1.2).abs() < 0.02, "{r}");
        // The calibration lowers the budget the plan works with.
        let mut g = two();
        g.budget_per_hour = Some(60_000.0);
        let plain = run(&g).projected_spend_per_hour;
        g.spend_calibration = r;
        let calibrated = run(&g).projected_spend_per_hour;
        assert!(
            calibrated * r <= 60_000.0 * (1.0 - 0.03) + 1e-6,
            "{calibrated}"
        );
        assert!(calibrated < plain);
    }

    #[test]
    fn at_risk_capacity_takes_tolerant_overflow_before_shedding() {
        let mut g = group(
            vec![ch("free", 0.0, 200.0, 0.9), ch("paid", 1.0, 50.0, 0.1)],
            [20.0, 30.0, 40.0, 20.0],
        );
        set_state(&mut g, "free", StateKind::AtRisk, 0.3, 0.5);
        let p = run(&g);
        // Interactive and core fit on paid (40) except 10 core rps, which
        // go to the least-bad channel rather than being shed (docs/decisions.md#safety-rails).
        assert_eq!(p.weight(Interactive, "free"), 0.0);
        assert_eq!(p.class(Core).shed, 0.0);
        assert!(close(p.weight(Core, "free"), 10.0 / 30.0));
        // Batch and experimental stay on the degraded free channel, unshed.
        assert_eq!(p.class(Batch).shed, 0.0);
        assert_eq!(p.class(Experimental).shed, 0.0);
        assert!(p.channels[0].planned_rps <= p.channels[0].cap_rps + 1e-9);
    }

    #[test]
    fn budget_binding_moves_low_priority_off_paid() {
        let mut g = two();
        // Paid at trust share: 0.7 × 45 = 31.5 rps × 3600 × 1 = 113 400/h.
        g.budget_per_hour = Some(60_000.0);
        let p = run(&g);
        assert!(
            p.projected_spend_per_hour <= 60_000.0 + 1e-6,
            "{}",
            p.projected_spend_per_hour
        );
        // Experimental and batch moved to free (beyond its trust cap).
        assert!(close(p.weight(Experimental, "free"), 1.0));
        assert!(p.weight(Batch, "free") > 0.3);
        // Interactive untouched.
        assert!(close(p.weight(Interactive, "free"), 0.3));
        assert_eq!(p.channels[1].reason, ShareReason::BudgetCap);
    }

    #[test]
    fn budget_sheds_when_nothing_cheaper_has_room() {
        let mut g = group(vec![ch("paid", 1.0, 100.0, 1.0)], [10.0, 10.0, 10.0, 10.0]);
        g.budget_per_hour = Some(3600.0 * 25.0);
        let p = run(&g);
        assert!(p.projected_spend_per_hour <= 3600.0 * 25.0 + 1e-6);
        assert!(close(p.class(Experimental).shed, 1.0));
        // The plan keeps `budget_margin` of the budget in reserve.
        let affordable = 25.0 * (1.0 - ScheduleConfig::default().budget_margin);
        assert!(close(p.class(Batch).shed, 1.0 - (affordable - 20.0) / 10.0));
        assert_eq!(p.class(Core).shed, 0.0);
    }

    #[test]
    fn quota_running_out_is_planned_down() {
        let mut g = two();
        let free = &mut g.channels[0];
        free.quota_remaining = Some(3_600 * 5); // 5 rps sustainable over the hour
        free.quota_exhausted_in_ms = Some(1_200_000);
        let p = run(&g);
        assert!(
            close(p.channels[0].planned_rps, 5.0),
            "{}",
            p.channels[0].planned_rps
        );
        assert_eq!(p.channels[0].reason, ShareReason::QuotaCap);
        assert!(p.class(Interactive).shed == 0.0);
    }

    #[test]
    fn pins_are_obeyed() {
        let mut g = two();
        let free = &mut g.channels[0];
        free.pinned = true;
        free.health_weight = 0.0;
        let p = run(&g);
        assert_eq!(p.weight(Interactive, "free"), 0.0);
        assert_eq!(p.channels[0].reason, ShareReason::Pinned);
    }

    #[test]
    fn recovering_share_goes_to_lowest_priority_first() {
        let mut g = two();
        set_state(&mut g, "free", StateKind::Recovering, 0.2, 0.1);
        let p = run(&g);
        // 0.2 × 13.5 = 2.7 rps, all experimental (5 rps demand).
        assert!(close(p.channels[0].planned_rps, 2.7));
        assert!(close(p.weight(Experimental, "free"), 2.7 / 5.0));
        assert_eq!(p.weight(Interactive, "free"), 0.0);
    }

    #[test]
    fn smoothing_limits_steps_except_drains() {
        let g = two();
        let cfg = ScheduleConfig::default();
        let classes = ClassPolicies::default();
        let p0 = plan(&g, &classes, &cfg, None, false);
        // Budget forces experimental fully onto free: a big move, smoothed.
        let mut g1 = g.clone();
        g1.budget_per_hour = Some(60_000.0);
        let p1 = plan(&g1, &classes, &cfg, Some(&p0), false);
        let d = p1.weight(Experimental, "free") - p0.weight(Experimental, "free");
        assert!(close(d, cfg.max_weight_step), "{d}");
        assert_eq!(p1.version, p0.version + 1);
        // A drain is immediate.
        let mut g2 = g.clone();
        set_state(&mut g2, "free", StateKind::Drained, 0.0, 0.9);
        let p2 = plan(&g2, &classes, &cfg, Some(&p0), false);
        assert_eq!(p2.weight(Interactive, "free"), 0.0);
        // Same inputs again: same version.
        let p3 = plan(&g2, &classes, &cfg, Some(&p2), false);
        assert_eq!(p3.version, p2.version);
    }

    #[test]
    fn manual_mode_freezes_the_plan() {
        let g = two();
        let p0 = run(&g);
        let mut g1 = g.clone();
        set_state(&mut g1, "free", StateKind::Drained, 0.0, 0.9);
        let p1 = plan(
            &g1,
            &ClassPolicies::default(),
            &ScheduleConfig::default(),
            Some(&p0),
            true,
        );
        assert!(p1.manual);
        assert!(p1.same_routing(&p0));
        assert_eq!(p1.version, p0.version + 1, "the switch itself is published");
        let p2 = plan(
            &g1,
            &ClassPolicies::default(),
            &ScheduleConfig::default(),
            Some(&p1),
            true,
        );
        assert_eq!(p2.version, p1.version, "frozen: nothing new after that");
        let p3 = plan(
            &g,
            &ClassPolicies::default(),
            &ScheduleConfig::default(),
            Some(&p2),
            false,
        );
        assert!(!p3.manual);
        assert!(p3.version > p2.version, "leaving manual mode is published");
    }

    #[test]
    fn shuffled_inputs_give_the_same_plan() {
        let mut g = group(
            vec![
                ch("c", 0.5, 30.0, 0.7),
                ch("a", 0.0, 20.0, 0.3),
                ch("b", 2.0, 50.0, 0.7),
            ],
            [5.0, 10.0, 30.0, 3.0],
        );
        set_state(&mut g, "a", StateKind::AtRisk, 0.3, 0.5);
        let p = run(&g);
        g.channels.reverse();
        assert_eq!(run(&g), p);
        g.channels.swap(0, 1);
        assert_eq!(run(&g), p);
    }

    fn arb_group() -> impl Strategy<Value = GroupInput> {
        let chan = (
            0.0f64..3.0,
            1.0f64..200.0,
            0.05f64..1.0,
            0usize..5,
            0.0f64..1.0,
        );
        (
            proptest::collection::vec(chan, 1..8),
            proptest::array::uniform4(0.0f64..150.0),
            proptest::option::of(0.0f64..500_000.0),
        )
            .prop_map(|(chans, demand, budget)| {
                let states = [
                    StateKind::Healthy,
                    StateKind::AtRisk,
                    StateKind::Drained,
                    StateKind::Observing,
                    StateKind::Recovering,
                ];
                let channels = chans
                    .into_iter()
                    .enumerate()
                    .map(|(i, (price, cap, init, st, w))| {
                        let state = states[st];
                        let health_weight = match state {
                            StateKind::Healthy => 1.0,
                            StateKind::AtRisk => 0.3,
                            StateKind::Drained => 0.0,
                            StateKind::Observing => 0.05,
                            StateKind::Recovering => w,
                        };
                        ChannelInput {
                            state,
                            health_weight,
                            score: Some(if state == StateKind::Healthy {
                                0.1
                            } else {
                                0.5
                            }),
                            ..ch(&format!("ch{i}"), price, cap, init)
                        }
                    })
                    .collect();
                let mut g = group(channels, demand);
                g.budget_per_hour = budget;
                g
            })
    }

    proptest! {
        #[test]
        fn plans_are_well_formed(g in arb_group()) {
            let cfg = ScheduleConfig::default();
            let p = run(&g);
            for c in &p.classes {
                let sum: f64 = c.weights.iter().map(|(_, w)| *w).sum();
                prop_assert!(c.weights.iter().all(|(_, w)| *w >= 0.0));
                prop_assert!((0.0..=1.0).contains(&c.shed));
                prop_assert!(close(sum, 1.0) || (sum == 0.0 && close(c.shed, 1.0)), "sum {} shed {}", sum, c.shed);
            }
            let sorted = { let mut v = g.channels.clone(); v.sort_by(|a, b| a.id.cmp(&b.id)); v };
            for (c, input) in p.channels.iter().zip(&sorted) {
                prop_assert!(c.planned_rps <= input.capacity_rps * cfg.capacity_headroom + 1e-6,
                    "{} planned {} cap {}", c.id, c.planned_rps, input.capacity_rps);
            }
            // A drained channel only carries what healthy capacity could not
            // (docs/decisions.md#safety-rails overflow): while it carries anything, every healthy
            // channel is full. (Without a budget, which may move load later.)
            let overflow = p.channels.iter().zip(&sorted)
                .any(|(c, i)| i.state == StateKind::Drained && c.planned_rps > 1e-9);
            if overflow && g.budget_per_hour.is_none() {
                for (c, input) in p.channels.iter().zip(&sorted) {
                    if input.state == StateKind::Healthy {
                        prop_assert!(c.planned_rps >= c.cap_rps - 1e-6,
                            "{} has room ({} of {}) while a drained channel carries load", c.id, c.planned_rps, c.cap_rps);
                    }
                }
            }
            let mut shuffled = g.clone();
            shuffled.channels.reverse();
            prop_assert_eq!(run(&shuffled), p);
        }

        #[test]
        fn smoothing_never_overloads(g in arb_group(), h in arb_group()) {
            // Previous plan from one health picture, next from another over the
            // same channels: the smoothed plan still respects capacity.
            let mut h = h;
            h.channels = g.channels.iter().zip(h.channels.iter().cycle()).map(|(a, b)| ChannelInput {
                state: b.state, health_weight: b.health_weight, score: b.score, ..a.clone()
            }).collect();
            h.demand_rps = g.demand_rps;
            let cfg = ScheduleConfig::default();
            let classes = ClassPolicies::default();
            let p0 = plan(&g, &classes, &cfg, None, false);
            let p1 = plan(&h, &classes, &cfg, Some(&p0), false);
            for c in &p1.channels {
                let cap = h.channels.iter().find(|x| x.id == c.id).unwrap().capacity_rps * cfg.capacity_headroom;
                prop_assert!(c.planned_rps <= cap + 1e-6, "{} {} {}", c.id, c.planned_rps, cap);
            }
        }
    }
}
