//! Health score (docs/decisions.md#score-and-states): 0 is healthy, 1 is as bad as it gets.
//!
//! Each voting signal maps linearly from 0 at its `normal` bound to 1 at its
//! `degraded` bound (clamped; the bounds may run downward, as for output
//! tokens), is multiplied by its weight, and the products are summed and
//! clamped to [0, 1]. The breakdown keeps every contribution so operators see
//! *why* a channel was judged as it was.

use crate::signals::{Measurement, SignalKind, Signals, SIGNAL_COUNT};
use crate::signals::{SignalPolicies, SignalPolicy};

/// A score and how it came about.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Score {
    /// In [0, 1].
    pub value: f64,
    /// Per `SignalKind`: its weighted contribution, `None` if it did not vote.
    pub contributions: [Option<f64>; SIGNAL_COUNT],
}

impl Score {
    /// Number of signals that voted.
    pub fn voters(&self) -> usize {
        self.contributions.iter().filter(|c| c.is_some()).count()
    }

    /// The voting signals with non-zero contributions, largest first.
    pub fn breakdown(&self) -> Vec<(SignalKind, f64)> {
        let mut v: Vec<(SignalKind, f64)> = SignalKind::ALL
            .iter()
            .filter_map(|k| self.contributions[*k as usize].map(|c| (*k, c)))
            .filter(|(_, c)| *c > 0.0)
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }

    /// `breakdown()` as "name=0.123, ..." for logs and alert reasons.
    pub fn explain(&self) -> String {
        let parts: Vec<String> = self
            .breakdown()
            .iter()
            .map(|(k, c)| format!("{}={c:.3}", k.name()))
            .collect();
        if parts.is_empty() {
            "no signal over its normal bound".into()
        } else {
            parts.join(", ")
        }
    }
}

/// Where `x` sits between the bounds, clamped to [0, 1].
pub fn severity(x: f64, p: &SignalPolicy) -> f64 {
    if !x.is_finite() {
        return if x.is_nan() { 0.0 } else { 1.0 };
    }
    let span = p.degraded - p.normal;
    if span == 0.0 {
        return 0.0;
    }
    ((x - p.normal) / span).clamp(0.0, 1.0)
}

/// Scores measured signals with a channel's policy.
pub fn score(signals: &Signals, policy: &SignalPolicies) -> Score {
    let mut out = Score::default();
    let mut total = 0.0;
    for kind in SignalKind::ALL {
        if let Some(m) = signals.get(kind) {
            let p = kind.policy(policy);
            let c = p.weight * severity(scored_value(kind, &m, policy), p);
            out.contributions[kind as usize] = Some(c);
            total += c;
        }
    }
    out.value = total.clamp(0.0, 1.0);
    out
}

/// The value a signal is scored at: a rate at its Wilson lower bound, so
/// its evidence counts in proportion to its samples (docs/decisions.md#safety-rails). The failure
/// rate (`bad_outcome_rate`) carries the weight of a drain on its own and
/// is read at `bad_outcome_confidence_z`: one unlucky minute of a 2 %
/// channel (14 bad of 200, 7 %, seen once a day or so) must not drain it,
/// while 10 % over the same 200 attempts still reads 8 %. The other rates
/// are read at `rate_confidence_z`. Both widen under
/// `confidence_full_samples`. Quantiles are read as measured.
fn scored_value(kind: SignalKind, m: &Measurement, policy: &SignalPolicies) -> f64 {
    let z = if kind == SignalKind::BadOutcomeRate {
        policy.bad_outcome_confidence_z
    } else if kind.is_rate() {
        policy.rate_confidence_z
    } else {
        return m.value;
    };
    crate::signals::wilson_low(m.value, m.samples, policy.z_at(z, m.samples))
}

/// The score the signals are still consistent with at `z` standard
/// deviations: each rate signal at its Wilson lower bound (see
/// [`crate::signals::wilson_low`]), the others as measured. A channel on
/// probation relapses only when even this optimistic reading is bad, so a
/// few unlucky failures among a few dozen attempts do not send a recovered
/// channel back (docs/decisions.md#safety-rails: probation evidence fits the traffic). Each
/// failure counts once (see `bounded`).
pub fn optimistic(signals: &Signals, policy: &SignalPolicies, z: f64) -> f64 {
    bounded(signals, policy, &|k, m| {
        if k.is_rate() {
            crate::signals::wilson_low(m.value, m.samples, policy.z_at(z, m.samples))
        } else {
            m.value
        }
    })
}

/// The score the signals are still consistent with at `z` standard
/// deviations, read the other way: the failure rate (`bad_outcome_rate`,
/// hard failures and bad answers together) at its Wilson upper bound, the
/// rest as measured. A probation passes only when even this reading is
/// good, so the evidence a pass needs grows with what the channel shows: a
/// clean channel passes on about 60 attempts, one still failing 10 % does
/// not pass on a lucky handful (docs/decisions.md#safety-rails: a confidence bound on the failure
/// rate, not a fixed count). Only the one comprehensive rate is bounded,
/// and the rates whose failures it counts are left out (see `bounded`).
/// A tail quantile measured for a probation is read at its upper rank
/// ([`crate::signals::Probation`]): a pulse that slowed a handful of the
/// probation's attempts is not averaged away by the point P99.
pub fn pessimistic(signals: &Signals, policy: &SignalPolicies, z: f64) -> f64 {
    bounded(signals, policy, &|k, m| {
        if k == SignalKind::BadOutcomeRate {
            crate::signals::wilson_high(m.value, m.samples, z)
        } else {
            m.high.unwrap_or(m.value)
        }
    })
}

/// Whether a reading is that of an intermittent fault (docs/decisions.md#signals, incident 004's
/// latency pulses): the tail quantiles carry the score (most of it, and
/// without them it would pass a probation, under `observe_pass_score`),
/// while the typical
/// attempt, the median latency of the same view, is no slower than the
/// healthy channel's P99 (its learned baseline, else the P99 signal's
/// `normal` bound). A channel slow throughout (incident 001's 4 s median) is
/// not intermittent, nor is one failing a share of its requests. Such a
/// probation looks clean until an attempt falls inside the fault, so its
/// relapses hold later probations (`StatePolicy::intermittent_hold_factor`).
/// `median` reads that median (`signals::read_latency_median`); it is called
/// only when the tail carries the score.
pub fn intermittent(
    sc: &Score,
    median: impl FnOnce() -> Option<f64>,
    baseline: &crate::window::Baseline,
    policy: &crate::config::HealthPolicy,
    baseline_min_windows: u32,
) -> bool {
    let (mut tail, mut rest) = (0.0, 0.0);
    for kind in SignalKind::ALL {
        if let Some(c) = sc.contributions[kind as usize] {
            *if kind.is_tail() { &mut tail } else { &mut rest } += c;
        }
    }
    if rest >= policy.states.observe_pass_score || tail < rest {
        return false;
    }
    let Some(p50_ms) = median() else {
        return false;
    };
    let healthy_p99 = baseline
        .p99_ms(baseline_min_windows)
        .unwrap_or(policy.signals.get(SignalKind::P99Latency).normal);
    p50_ms <= healthy_p99
}

/// A bounded reading (`optimistic` for a relapse, `pessimistic` for a
/// probation's pass and AT_RISK's exit): each signal at `value_of`. When
/// the comprehensive failure rate (`bad_outcome_rate`) voted, the rates whose failures it counts too (`error_rate`,
/// `recent_failure_rate`, the bad-answer kinds) are left out: the same few
/// failures read several times add up to a verdict none of them supports.
/// Incident 003's line fails 2 % on a good day; 6 failures in 61 attempts after
/// its fault ended sent it back twice over, through `error_rate` and
/// `bad_outcome_rate`. The other way, one error among 51 attempts of a
/// probation read at 2 % by `error_rate` and again inside the failure
/// rate's upper bound held `slow-ramp-truncation` seed 303 in probation
/// for 195 s.
fn bounded(
    signals: &Signals,
    policy: &SignalPolicies,
    value_of: &dyn Fn(SignalKind, &crate::signals::Measurement) -> f64,
) -> f64 {
    let comprehensive = signals.get(SignalKind::BadOutcomeRate).is_some();
    let mut total = 0.0;
    for kind in SignalKind::ALL {
        if comprehensive && kind.within_bad_outcome() {
            continue;
        }
        if let Some(m) = signals.get(kind) {
            let p = kind.policy(policy);
            total += p.weight * severity(value_of(kind, &m), p);
        }
    }
    total.clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn with(kind: SignalKind, value: f64) -> Signals {
        let mut s = Signals::default();
        s.values[kind as usize] = Some(Measurement::of(value, 1000));
        s
    }

    #[test]
    fn linear_between_bounds_both_directions() {
        let up = SignalPolicy {
            weight: 1.0,
            normal: 2000.0,
            degraded: 6000.0,
            min_samples: 1,
        };
        assert_eq!(severity(1000.0, &up), 0.0);
        assert_eq!(severity(4000.0, &up), 0.5);
        assert_eq!(severity(9000.0, &up), 1.0);
        let down = SignalPolicy {
            weight: 1.0,
            normal: 500.0,
            degraded: 150.0,
            min_samples: 1,
        };
        assert_eq!(severity(600.0, &down), 0.0);
        assert_eq!(severity(325.0, &down), 0.5);
        assert_eq!(severity(128.0, &down), 1.0);
    }

    #[test]
    fn the_optimistic_score_forgives_small_samples_not_large_ones() {
        let p = SignalPolicies::default();
        let at = |value: f64, samples: u32| {
            let mut s = Signals::default();
            s.values[SignalKind::BadOutcomeRate as usize] = Some(Measurement::of(value, samples));
            s
        };
        // 4 bad of 80 (5 %): the point estimate counts it, the bounds do not
        // (the score itself reads the failure rate at z = 1).
        let point = SignalPolicies {
            bad_outcome_confidence_z: 0.0,
            rate_confidence_z: 0.0,
            ..SignalPolicies::default()
        };
        assert!(score(&at(0.05, 80), &point).value > 0.2);
        assert!(score(&at(0.05, 80), &p).value < 0.01);
        assert_eq!(optimistic(&at(0.05, 80), &p, 1.645), 0.0);
        // 10 % over 200 attempts (a minute of a free channel) still reads
        // as AT_RISK on its own.
        assert!(score(&at(0.10, 200), &p).value >= 0.45);
        // 12 % over 2 000 attempts is bad whichever way it is read.
        assert!(optimistic(&at(0.12, 2000), &p, 1.645) >= 0.65);
        // z = 0 is the point estimate.
        let s = at(0.07, 300);
        assert!((optimistic(&s, &point, 0.0) - score(&s, &point).value).abs() < 1e-9);
    }

    #[test]
    fn the_relapse_reading_counts_the_same_failures_once() {
        let p = SignalPolicies::default();
        // Incident 003's line after its fault: 6 failed of 61, all errors, so
        // the error rate and the failure rate both read 9.8 %.
        let mut s = Signals::default();
        s.values[SignalKind::ErrorRate as usize] = Some(Measurement::of(6.0 / 61.0, 61));
        s.values[SignalKind::RecentFailureRate as usize] = Some(Measurement::of(0.06, 100));
        assert!(
            optimistic(&s, &p, 1.0) > 0.0,
            "alone, the error rate counts"
        );
        s.values[SignalKind::BadOutcomeRate as usize] = Some(Measurement::of(6.0 / 61.0, 61));
        let once = optimistic(&s, &p, 1.0);
        s.values[SignalKind::ErrorRate as usize] = None;
        s.values[SignalKind::RecentFailureRate as usize] = None;
        assert_eq!(once, optimistic(&s, &p, 1.0));
        assert!(once < 0.45, "{once}: one rate's lower bound is no relapse");
    }

    #[test]
    fn the_pass_reading_counts_the_same_failures_once() {
        let p = SignalPolicies::default();
        // `slow-ramp-truncation` seed 303, 60 s into a probation after its
        // fault ended: 2 bad of 51 attempts, one of them an error. The
        // failure rate's upper bound is the doubt about those failures;
        // the error rate's point value read the same error again and held
        // the probation (0.54 + 0.12 against a 0.4 pass line).
        let mut s = Signals::default();
        s.values[SignalKind::ErrorRate as usize] = Some(Measurement::of(1.0 / 51.0, 51));
        s.values[SignalKind::RecentFailureRate as usize] = Some(Measurement::of(0.02, 51));
        assert!(
            pessimistic(&s, &p, 1.645) > 0.0,
            "alone, the error rate counts"
        );
        s.values[SignalKind::BadOutcomeRate as usize] = Some(Measurement::of(2.0 / 51.0, 51));
        let once = pessimistic(&s, &p, 1.645);
        s.values[SignalKind::ErrorRate as usize] = None;
        s.values[SignalKind::RecentFailureRate as usize] = None;
        assert_eq!(once, pessimistic(&s, &p, 1.645));
    }

    #[test]
    fn an_intermittent_reading_is_a_bad_tail_over_a_typical_attempt_at_full_speed() {
        let policy = crate::config::HealthPolicy::default();
        let mut baseline = crate::window::Baseline::new(60);
        for _ in 0..10 {
            baseline.learn(180.0, 500.0);
        }
        let reading = |p50: f64, p99: f64, bad_rate: f64| {
            let mut s = Signals::default();
            s.values[SignalKind::P99Latency as usize] = Some(Measurement::of(p99, 200));
            s.values[SignalKind::RelativeP99 as usize] = Some(Measurement::of(p99 / 180.0, 200));
            s.values[SignalKind::BadOutcomeRate as usize] = Some(Measurement::of(bad_rate, 2000));
            s.latency = Some(crate::signals::LatencySummary {
                p50_ms: Some(p50),
                p99_ms: p99,
                ..Default::default()
            });
            let sc = score(&s, &policy.signals);
            (sc, s)
        };
        let median = |s: &Signals| s.latency.and_then(|l| l.p50_ms);
        let judge = |(sc, s): (Score, Signals)| {
            assert!(sc.value >= policy.states.relapse_score, "{sc:?}");
            intermittent(&sc, || median(&s), &baseline, &policy, 5)
        };
        // Incident 004: 120 ms typical, a pulse makes the tail 2.2 s.
        assert!(judge(reading(120.0, 2_200.0, 0.0)));
        // Incident 001: slow throughout (a 4 s median): sustained.
        assert!(!judge(reading(4_000.0, 9_000.0, 0.0)));
        // Failing a share of its requests: not the tail's doing, even with
        // a little help from it.
        assert!(!judge(reading(120.0, 150.0, 0.2)));
        assert!(!judge(reading(120.0, 300.0, 0.069)));
        // Without a learned baseline, the P99 bound stands in for it.
        let empty = crate::window::Baseline::new(60);
        let (sc, s) = reading(1_900.0, 7_000.0, 0.0);
        assert!(intermittent(&sc, || median(&s), &empty, &policy, 5));
        let (sc, s) = reading(2_100.0, 7_000.0, 0.0);
        assert!(!intermittent(&sc, || median(&s), &empty, &policy, 5));
        // No median, no verdict; and none is read when the tail does not
        // carry the score.
        assert!(!intermittent(&sc, || None, &empty, &policy, 5));
        let (sc, _) = reading(120.0, 150.0, 0.2);
        assert!(!intermittent(
            &sc,
            || unreachable!("not read"),
            &baseline,
            &policy,
            5
        ));
    }

    #[test]
    fn seed_weights_and_breakdown() {
        let p = SignalPolicies::default();
        // docs/decisions.md#score-and-states: P99 weight 0.25 over [2 s, 6 s]; at 4 s it contributes 0.125.
        let s = score(&with(SignalKind::P99Latency, 4000.0), &p);
        assert!((s.value - 0.125).abs() < 1e-12);
        assert_eq!(s.voters(), 1);
        assert_eq!(s.breakdown(), vec![(SignalKind::P99Latency, 0.125)]);
        assert_eq!(s.explain(), "p99_latency_ms=0.125");
        // Relative latency at 2.5x alone is sub-health (AT_RISK at 0.45).
        let s = score(&with(SignalKind::RelativeP99, 2.5), &p);
        assert!((s.value - 0.45).abs() < 1e-12);
    }

    #[test]
    fn silence_scores_zero_with_no_voters() {
        let s = score(&Signals::default(), &SignalPolicies::default());
        assert_eq!(s.value, 0.0);
        assert_eq!(s.voters(), 0);
    }

    proptest! {
        #[test]
        fn score_always_in_unit_interval(values in proptest::collection::vec(proptest::option::of(-1e9f64..1e9), SIGNAL_COUNT)) {
            let mut s = Signals::default();
            for (i, v) in values.iter().enumerate() {
                s.values[i] = v.map(|value| Measurement::of(value, 100));
            }
            let sc = score(&s, &SignalPolicies::default());
            prop_assert!((0.0..=1.0).contains(&sc.value));
            for c in sc.contributions.iter().flatten() {
                prop_assert!(*c >= 0.0);
            }
        }

        #[test]
        fn score_is_monotone_in_each_signal(kind in 0usize..SIGNAL_COUNT, a in 0.0f64..10_000.0, b in 0.0f64..10_000.0) {
            let p = SignalPolicies::default();
            let k = SignalKind::ALL[kind];
            let pol = k.policy(&p);
            let (lo, hi) = if a < b { (a, b) } else { (b, a) };
            // "worse" is higher for rising bounds, lower for falling ones
            let (better, worse) = if pol.degraded > pol.normal { (lo, hi) } else { (hi, lo) };
            let sb = score(&with(k, better), &p).value;
            let sw = score(&with(k, worse), &p).value;
            prop_assert!(sw >= sb);
        }
    }
}
