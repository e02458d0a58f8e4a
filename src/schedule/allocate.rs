//! Steps 4-6 of a plan: what degraded channels may carry, filling the
//! healthy ones, the budget, overflow to the least bad channel, smoothing,
//! and the plan itself.

use super::{
    fill, ChannelInput, ChannelPlan, ClassPlan, Ctx, Fractions, GroupInput, Plan, Rps, ShareReason,
    EPS, PHANTOM_RPS,
};
use crate::event::TrafficClass;
use crate::state::StateKind;

/// Step 3: degraded channels carry their allowance. A channel on
/// probation carries each class's fair part of its share, so no class lands
/// wholly on a channel that is still proving itself (docs/decisions.md#safety-rails:
/// every class keeps a way out): OBSERVING the half-open share of each
/// class's demand (at least `schedule.half_open_min_rps` in all, within
/// its nominal load), RECOVERING its current step of each class's nominal
/// load. AT_RISK and pinned channels carry `health weight × nominal load`,
/// lowest-priority tolerant classes first (interactive traffic leaves an
/// AT_RISK channel first). Returns the healthy channels' room and every
/// channel's reason so far.
pub(super) fn degraded_allowances(
    ctx: &Ctx<'_>,
    nominal: &Rps,
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
    for j in 0..n {
        let c = ctx.ch[j];
        if (c.state == StateKind::Healthy && !c.pinned) || c.health_weight <= 0.0 {
            continue;
        }
        if ctx.is_probation(j) && !c.pinned {
            probation_allowance(ctx, j, nominal, rps, left);
        } else {
            let nominal_j: f64 = (0..4).map(|k| nominal[k][j]).sum();
            let allowance = c.health_weight.min(1.0) * nominal_j.max(ctx.cap[j] * 0.01);
            tolerant_allowance(ctx, j, allowance.min(ctx.cap[j]), rps, left);
        }
    }
    (room, reasons)
}

/// A probation channel's fair part of each class (see
/// [`degraded_allowances`]).
fn probation_allowance(ctx: &Ctx<'_>, j: usize, nominal: &Rps, rps: &mut Rps, left: &mut [f64; 4]) {
    let c = ctx.ch[j];
    let demand: f64 = ctx.demand.iter().sum();
    let nominal_j: f64 = (0..4).map(|k| nominal[k][j]).sum();
    let normal = nominal_j.max(ctx.cap[j] * 0.01);
    // Each class's part of the channel's load: its part of the channel's
    // nominal load, or of the group's demand when the channel has none.
    let part = |k: usize| {
        if nominal_j > EPS {
            nominal[k][j] / nominal_j
        } else {
            ctx.demand[k] / demand
        }
    };
    if c.state == StateKind::Observing {
        // Half-open: a share of the group's real traffic (incident 002: "5 %
        // of real traffic"), at least the floor a probation needs to see
        // its evidence in minutes, never above its nominal load. Each class
        // gives the same share of its demand.
        // In panic mode a channel failing nearly everything is probed at
        // its half-open share of its own nominal load: enough to see the
        // common cause end, little to fail meanwhile.
        let half_open = c.health_weight * if ctx.panic { nominal_j } else { demand };
        let total = half_open
            .max(ctx.half_open_min_rps)
            .min(normal)
            .min(ctx.cap[j]);
        for k in 0..4 {
            take(rps, left, k, j, total * ctx.demand[k] / demand);
        }
    } else {
        // RECOVERING: its current step of each class's nominal load.
        let total = (c.health_weight.min(1.0) * normal).min(ctx.cap[j]);
        for k in 0..4 {
            take(rps, left, k, j, total * part(k));
        }
    }
}

/// Puts up to `want` of class `k`'s unplanned demand on channel `j`.
fn take(rps: &mut Rps, left: &mut [f64; 4], k: usize, j: usize, want: f64) {
    let t = left[k].min(want);
    if t > EPS {
        rps[k][j] += t;
        left[k] -= t;
    }
}

/// An AT_RISK or pinned channel's allowance, lowest-priority tolerant
/// classes first; a pinned channel takes the others' too.
fn tolerant_allowance(
    ctx: &Ctx<'_>,
    j: usize,
    mut allowance: f64,
    rps: &mut Rps,
    left: &mut [f64; 4],
) {
    let c = ctx.ch[j];
    let mut low_first = ctx.prio;
    low_first.reverse();
    let tolerant_first = low_first.iter().filter(|k| ctx.tolerant(**k));
    let others = low_first.iter().filter(|k| !ctx.tolerant(**k) && c.pinned);
    for class in tolerant_first.chain(others) {
        if !ctx.score_ok(*class, j) && !c.pinned {
            continue;
        }
        let k = class.index();
        let t = left[k].min(allowance);
        if t > EPS {
            rps[k][j] += t;
            left[k] -= t;
            allowance -= t;
        }
    }
}

/// docs/decisions.md#safety-rails, "every class keeps a way out": a class
/// with demand that healthy channels carry less than
/// `schedule.retry_path_share` of, while one of them has room, moves that
/// much off the unhealthy channels it sits on (each in proportion) onto the
/// cheapest healthy room. A retry then has somewhere to go.
pub(super) fn keep_retry_paths(ctx: &Ctx<'_>, rps: &mut Rps, room: &mut [f64]) {
    let n = ctx.ch.len();
    let healthy = |class: TrafficClass, j: usize| {
        let c = ctx.ch[j];
        c.state == StateKind::Healthy
            && !c.pinned
            && c.health_weight > 0.0
            && ctx.score_ok(class, j)
    };
    for class in ctx.prio {
        let k = class.index();
        if ctx.demand[k] <= PHANTOM_RPS * 2.0 {
            continue;
        }
        let on_healthy: f64 = (0..n)
            .filter(|&j| healthy(class, j))
            .map(|j| rps[k][j])
            .sum();
        let movable: f64 = (0..n)
            .filter(|&j| !healthy(class, j) && !ctx.ch[j].pinned)
            .map(|j| rps[k][j])
            .sum();
        let free: f64 = (0..n).filter(|&j| healthy(class, j)).map(|j| room[j]).sum();
        let need = (ctx.retry_path_share * ctx.demand[k] - on_healthy)
            .min(movable)
            .min(free);
        if need <= EPS {
            continue;
        }
        let keep = 1.0 - need / movable;
        for j in (0..n).filter(|&j| !healthy(class, j) && !ctx.ch[j].pinned) {
            rps[k][j] *= keep;
        }
        let mut moving = need;
        for &j in &ctx.order_cost {
            if moving <= EPS {
                break;
            }
            if !healthy(class, j) {
                continue;
            }
            let t = moving.min(room[j]);
            rps[k][j] += t;
            room[j] -= t;
            moving -= t;
        }
    }
}

/// Step 4: healthy capacity in priority order (trust caps, then room), then
/// tolerant classes' overflow onto AT_RISK capacity (not pinned).
pub(super) fn healthy_fill(ctx: &Ctx<'_>, rps: &mut Rps, room: &mut [f64], left: &mut [f64; 4]) {
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
pub(super) fn keep_to_budget(
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
pub(super) fn cap_reasons(
    ctx: &Ctx<'_>,
    quota_bound: &[bool],
    rps: &Rps,
    reasons: &mut [ShareReason],
) {
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
pub(super) fn overflow_to_least_bad(ctx: &Ctx<'_>, rps: &mut [Vec<f64>; 4], left: &mut [f64; 4]) {
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

pub(super) fn spend_per_hour(c: &ChannelInput, rps: f64) -> f64 {
    let tokens = c.tokens_per_request.unwrap_or(1000.0);
    rps * 3600.0 * tokens / 1000.0 * c.price_per_1k_tokens
}

/// Whether `class` may use channel `j` at all in this health picture.
pub(super) fn eligible(ctx: &Ctx<'_>, class: TrafficClass, j: usize) -> bool {
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
pub(super) fn smooth(
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

pub(super) fn build_plan(
    input: &GroupInput,
    ctx: &Ctx<'_>,
    shown: &[&ChannelInput],
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
            state: shown[j].state,
            score: shown[j].score,
            signals: shown[j].signals.clone(),
            planned_rps: planned[j],
            cap_rps: ctx.cap[j],
            reason: match reasons[j] {
                _ if input.panic_since_ms.is_none() || shown[j].pinned => reasons[j],
                _ if ctx.ch[j].state == StateKind::Observing => ShareReason::FailingInPanic,
                _ => ShareReason::Panic,
            },
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
        panic_since_ms: input.panic_since_ms,
    };
    if let Some(prev) = previous {
        // Leaving manual mode is news too, even with the same routing.
        plan.version = if plan.same_published(prev) {
            prev.version
        } else {
            prev.version + 1
        };
    }
    plan
}
