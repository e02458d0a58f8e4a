//! Health score (SPEC §5): 0 is healthy, 1 is as bad as it gets.
//!
//! Each voting signal maps linearly from 0 at its `normal` bound to 1 at its
//! `degraded` bound (clamped; the bounds may run downward, as for output
//! tokens), is multiplied by its weight, and the products are summed and
//! clamped to [0, 1]. The breakdown keeps every contribution so operators see
//! *why* a channel was judged as it was.

use crate::config::{SignalPolicies, SignalPolicy};
use crate::signals::{SignalKind, Signals, SIGNAL_COUNT};

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
            let c = p.weight * severity(m.value, p);
            out.contributions[kind as usize] = Some(c);
            total += c;
        }
    }
    out.value = total.clamp(0.0, 1.0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signals::Measurement;
    use proptest::prelude::*;

    fn with(kind: SignalKind, value: f64) -> Signals {
        let mut s = Signals::default();
        s.values[kind as usize] = Some(Measurement {
            value,
            samples: 1000,
        });
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
    fn seed_weights_and_breakdown() {
        let p = SignalPolicies::default();
        // SPEC §5: P99 weight 0.25 over [2 s, 6 s]; at 4 s it contributes 0.125.
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
                s.values[i] = v.map(|value| Measurement { value, samples: 100 });
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
