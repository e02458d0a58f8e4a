//! Steps 1-3 of a plan: caps, trust shares, where each class would go with
//! every channel healthy, and the fractions a degraded group starts from.

use super::{
    cap_reasons, degraded_allowances, healthy_fill, keep_retry_paths, keep_to_budget,
    overflow_to_least_bad, ChannelInput, Ctx, Fractions, Rps, ShareReason, EPS,
};
use crate::event::TrafficClass;
use crate::state::StateKind;

/// Fill `class` onto the channels in `order`, each limited by `room[j]`
/// (and optionally its trust cap). Returns the demand left over.
pub(super) fn fill(
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

/// Each channel's trust-tier share: its initial weight over the group's.
pub(super) fn trust_shares(ch: &[&ChannelInput]) -> Vec<f64> {
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
pub(super) fn capacities(
    ch: &[&ChannelInput],
    horizon_ms: i64,
    headroom: f64,
) -> (Vec<f64>, Vec<bool>) {
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
pub(super) fn cheapest_first(ch: &[&ChannelInput]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..ch.len()).collect();
    order.sort_by(|a, b| {
        ch[*a]
            .price_per_1k_tokens
            .total_cmp(&ch[*b].price_per_1k_tokens)
            .then(ch[*a].id.cmp(&ch[*b].id))
    });
    order
}

/// Whether panic mode sees `c` as failing nearly everything it gets: at
/// least `max_failure_rate` of it (`schedule.overflow_max_failure_rate`),
/// and its last attempt failed too. The rate is read over windows that
/// remember the failures for a minute; the first answer after the common
/// cause ends clears the streak, and the channel is planned again at once.
pub(super) fn failing_in_panic(c: &ChannelInput, max_failure_rate: f64) -> bool {
    !c.pinned && c.failure_streak > 0 && c.failure_rate.is_some_and(|f| f >= max_failure_rate)
}

/// A channel as panic mode plans it (docs/decisions.md#safety-rails):
/// healthy, unless an operator pinned it or it is `failing` (nearly
/// everything, while another channel still serves); then it is on
/// probation at its half-open share, the probe that sees the common cause
/// end.
pub(super) fn in_panic(c: &ChannelInput, failing: bool) -> ChannelInput {
    if c.pinned {
        return c.clone();
    }
    if failing {
        return ChannelInput {
            state: StateKind::Observing,
            health_weight: c.half_open_share,
            ..c.clone()
        };
    }
    ChannelInput {
        state: StateKind::Healthy,
        health_weight: 1.0,
        score: None,
        ..c.clone()
    }
}

pub(super) fn normalize_rows(f: &mut Fractions) {
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
pub(super) fn initial_fractions(ctx: &Ctx<'_>) -> (Fractions, Vec<ShareReason>) {
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
pub(super) fn healthy_plan(
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
    keep_retry_paths(ctx, &mut rps, &mut room);
    if let Some(budget) = budget {
        keep_to_budget(ctx, budget, &mut rps, &mut room, &mut reasons);
    }
    cap_reasons(ctx, quota_bound, &rps, &mut reasons);
    let fractions = [0, 1, 2, 3].map(|k| (0..n).map(|j| rps[k][j] / ctx.demand[k]).collect());
    (fractions, reasons)
}

/// Step 2, nominal: every channel healthy, trust caps then capacity,
/// cheapest first. Each class's load on each channel.
pub(super) fn nominal_load(ctx: &Ctx<'_>) -> Rps {
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
    nominal_rps
}
