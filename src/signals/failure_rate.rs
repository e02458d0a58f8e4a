//! The failure rate (hard failures and bad answers) at its confidence
//! bounds: each kind of bad answer over the answers that can show it, and
//! the readings since a channel went AT_RISK.

use super::{ratio, Horizons, Measurement, SignalKind, SignalPolicies};
use crate::window::{Counters, SliceRing};

/// The Wilson score interval's lower bound for a share `p` observed over
/// `n` trials, at `z` standard deviations (one-sided): the smallest true
/// rate the observation is still consistent with. Four failures in 80 look
/// like 5 %, but the channel may well be at its usual 2 %.
pub fn wilson_low(p: f64, n: u32, z: f64) -> f64 {
    wilson(p, n, z).0
}

/// The Wilson interval's upper bound: the largest true rate the
/// observation is still consistent with (none in 60 attempts still allows
/// 4 % at z = 1.645).
pub fn wilson_high(p: f64, n: u32, z: f64) -> f64 {
    wilson(p, n, z).1
}

pub(super) fn wilson(p: f64, n: u32, z: f64) -> (f64, f64) {
    if n == 0 || !p.is_finite() {
        return (0.0, 1.0);
    }
    let n = n as f64;
    let p = p.clamp(0.0, 1.0);
    let z2 = z * z;
    let centre = p + z2 / (2.0 * n);
    let spread = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    let d = 1.0 + z2 / n;
    (
        ((centre - spread) / d).max(0.0),
        ((centre + spread) / d).min(1.0),
    )
}

/// docs/decisions.md#safety-rails, "a bad answer is a failed request", measured over the
/// answers that can show it: the share (and its denominator) whose Wilson
/// lower bound at `z` is the highest among
/// - hard failures and every bad answer over hard failures and successes;
/// - each kind of bad answer over the answers that can show it: schema
///   failures over structured answers, truncated, garbled and short ones
///   over successes;
///
/// a kind only once its denominator has `min` samples, each bound at
/// `bad_outcome_confidence_z` (widened under `confidence_full_samples`).
/// Scored at its lower bound (`score`), the pick is the reading the evidence most firmly says
/// is bad: a kind that only structured requests can show is not diluted by
/// the answers that could never show it, and a kind seen on a handful of
/// answers does not outvote the whole.
pub fn bad_outcomes(c: &Counters, min: u32, policy: &SignalPolicies) -> (f64, u32) {
    let z = policy.bad_outcome_confidence_z;
    worst_outcome(c, min, &|p, n| wilson_low(p, n, policy.z_at(z, n)))
}

/// The candidate of [`bad_outcomes`] that `bound` reads worst: the lower
/// bound for a move down, the upper one for a probation's pass (a kind
/// seen on few answers cannot rule out a fault there).
pub(super) fn worst_outcome(
    c: &Counters,
    kind_min: u32,
    bound: &dyn Fn(f64, u32) -> f64,
) -> (f64, u32) {
    let judged = c.hard_failures + c.successes;
    let mut best = (
        ratio((c.hard_failures + c.bad_answers) as f64, judged),
        judged,
    );
    let mut worst = bound(best.0, best.1);
    for (bad, of) in [
        (c.schema_invalid, c.structured),
        (c.truncated, c.successes),
        (c.garbled, c.successes),
        (c.short_outputs, c.successes),
    ] {
        if of < kind_min {
            continue;
        }
        let share = ratio(bad as f64, of);
        let b = bound(share, of);
        if b > worst {
            best = (share, of);
            worst = b;
        }
    }
    best
}

/// The failure rate (`bad_outcome_rate`) of real traffic since `since_ms`
/// only: what a channel in AT_RISK is judged on when it would leave it,
/// down (`drain`) or up (`exit`). At its reduced weight such a channel sees
/// few attempts, so its short view often lacks the samples and the rate
/// falls back to the long view, which reaches back before the channel went
/// AT_RISK: a fault that began minutes ago is diluted there by the healthy
/// time before it, the channel reads as recovered, goes back to full weight
/// and is drained moments later (a re-trip, `bad-answers-empty` seed 101).
/// Here the short view and the long one are clipped at `since_ms`.
/// - `exit` reads the first with the signal's `min_samples`: the freshest
///   evidence enough to judge, so a fault that ended lets the channel go.
/// - `drain` reads, of those with `min_samples`, the one whose reading has
///   the highest lower bound (as [`bad_outcomes`] picks among kinds): at a
///   third of the traffic, a kind only structured requests can show has its
///   samples in the long view alone, and the short view's all-answers share
///   would hide it, so the drain would wait on a lucky minute
///   (`structured-bad-answers` seed 303: 310 s, 230 s this way).
///
/// With neither view at `min_samples`, both read the long view with what it
/// has, so thin evidence reads wide at its confidence bound (none: no exit).
pub fn bad_outcome_rate_since(
    ring: &SliceRing,
    cfg: &Horizons,
    policy: &SignalPolicies,
    now_ms: i64,
    since_ms: i64,
) -> SinceAtRisk {
    let min = SignalKind::BadOutcomeRate.policy(policy).min_samples;
    let [short, long] = ring
        .counters_of(
            now_ms,
            [
                (cfg.short_window_ms, since_ms),
                (cfg.long_window_ms, since_ms),
            ],
        )
        .map(|v| v.real);
    let readings = [
        bad_outcomes(&short, min, policy),
        bad_outcomes(&long, min, policy),
    ];
    let enough = || readings.iter().filter(|(_, n)| *n >= min);
    let z = policy.bad_outcome_confidence_z;
    let low = |(p, n): &(f64, u32)| wilson_low(*p, *n, policy.z_at(z, *n));
    let exit = enough().next().unwrap_or(&readings[1]);
    let drain = enough()
        .max_by(|a, b| low(a).total_cmp(&low(b)))
        .unwrap_or(&readings[1]);
    SinceAtRisk {
        drain: Measurement::of(drain.0, drain.1),
        exit: Measurement::of(exit.0, exit.1),
    }
}

/// [`bad_outcome_rate_since`]'s two readings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SinceAtRisk {
    /// What confirms a drain from AT_RISK (read at its lower bound).
    pub drain: Measurement,
    /// What lets the channel back to HEALTHY (read at its upper bound).
    pub exit: Measurement,
}

/// The failure rate (`bad_outcome_rate`) of the episode that put a channel
/// AT_RISK: real traffic since the short view that confirmed it
/// (`at_risk_since_ms − short_window_ms`), over at most the long view. At
/// its reduced weight an AT_RISK channel's sliding short view holds a few
/// dozen answers, too few for a 10 % fault to read past its degraded bound
/// at the confidence bound, and its long view reaches back into the healthy
/// time before the fault. The episode keeps every answer of the fault that
/// was judged, so its evidence only grows while the channel waits.
pub fn bad_outcome_rate_episode(
    ring: &SliceRing,
    cfg: &Horizons,
    policy: &SignalPolicies,
    now_ms: i64,
    at_risk_since_ms: i64,
) -> Measurement {
    let min = SignalKind::BadOutcomeRate.policy(policy).min_samples;
    let since = at_risk_since_ms - cfg.short_window_ms;
    let episode = ring.counters(now_ms, cfg.long_window_ms, since).real;
    let (value, samples) = bad_outcomes(&episode, min, policy);
    Measurement::of(value, samples)
}
