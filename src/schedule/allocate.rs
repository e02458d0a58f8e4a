//! Steps 4-6 of a plan: what degraded channels may carry, filling the
//! healthy ones, the budget, overflow to the least bad channel, smoothing,
//! and the plan itself.

use super::*;

/// Step 3: degraded channels carry their allowance (health weight ×
/// nominal load), lowest-priority tolerant classes first. Returns the
/// healthy channels' room and every channel's reason so far.
pub(super) fn degraded_allowances(
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
