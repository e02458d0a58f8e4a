//! One measurement pass: every signal of the table read from a channel's
//! windows at one event time, each from the first view with enough samples.

use super::{
    wilson_high, wilson_low, worst_outcome, Horizon, Horizons, LatencySummary, LatencyView,
    Measurement, Method, Pop, Probation, SignalDef, SignalKind, SignalPolicies, Signals, SIGNALS,
    SIGNAL_COUNT,
};
use crate::window::{Baseline, Counters, Digest, OutcomeWindow, SliceRing};

/// Measures every signal at `now_ms`; the median latency too when `median`
/// (see [`LatencySummary::p50_ms`]).
#[allow(clippy::too_many_arguments)]
pub fn measure(
    ring: &mut SliceRing,
    outcomes: &OutcomeWindow,
    baseline: &Baseline,
    cfg: &Horizons,
    policy: &SignalPolicies,
    now_ms: i64,
    not_before_ms: i64,
    horizon: Horizon,
    probation: Probation,
    median: bool,
) -> Signals {
    let short_ms = match horizon {
        Horizon::Recent => cfg.short_window_ms,
        Horizon::Whole => cfg.long_window_ms,
    };
    let [short, long] = ring.counters_of(
        now_ms,
        [
            (short_ms, not_before_ms),
            (cfg.long_window_ms, not_before_ms),
        ],
    );
    let mut out = Signals {
        short_real: short.real,
        short_probe: short.probe,
        evidence_real: long.real.requests,
        evidence_probe: long.probe.requests,
        ..Signals::default()
    };
    let mut pass = Pass {
        ring,
        // Candidate views in preference order.
        views: [
            (short_ms, Pop::Real, short.real),
            (cfg.long_window_ms, Pop::Real, long.real),
            (short_ms, Pop::Probe, short.probe),
            (cfg.long_window_ms, Pop::Probe, long.probe),
        ],
        now_ms,
        not_before_ms,
        horizon,
        cfg,
        policy,
        // In probation a signal votes on the probation's evidence: refusing
        // to vote there would let a sick channel pass on the signals that
        // did.
        probation: (horizon == Horizon::Whole).then_some(probation),
        median,
    };
    // The table, in order: a `Relative` signal reads an earlier one, when
    // that one was measured on real traffic (the baseline is learned there).
    let mut on_probes = [false; SIGNAL_COUNT];
    for def in &SIGNALS {
        let m = pass.one(def, outcomes, baseline, &mut out, &mut on_probes);
        out.values[def.kind as usize] = m;
    }
    out.unconditioned_rates(&short);
    out.quota_forecast(pass.ring, now_ms, cfg.long_window_ms);
    out
}

/// One measurement pass: the ring, the candidate views and what bounds
/// them.
pub(super) struct Pass<'a> {
    pub(super) ring: &'a mut SliceRing,
    pub(super) views: [(i64, Pop, Counters); 4],
    pub(super) now_ms: i64,
    pub(super) not_before_ms: i64,
    pub(super) horizon: Horizon,
    pub(super) cfg: &'a Horizons,
    pub(super) policy: &'a SignalPolicies,
    /// Set for a probation verdict ([`Horizon::Whole`]).
    pub(super) probation: Option<Probation>,
    /// Read the P99 view's median too.
    pub(super) median: bool,
}

impl Pass<'_> {
    /// Measures one signal of the table. `out` holds the signals before it
    /// (a `Relative` one reads its base there); `on_probes` marks those
    /// measured on probe traffic.
    pub(super) fn one(
        &mut self,
        def: &SignalDef,
        outcomes: &OutcomeWindow,
        baseline: &Baseline,
        out: &mut Signals,
        on_probes: &mut [bool; SIGNAL_COUNT],
    ) -> Option<Measurement> {
        let k = def.kind;
        let min = self.min(k);
        match def.method {
            Method::Rate { real_only, of } => self.rate(min, real_only, of),
            Method::BadOutcomes => self.bad_outcomes(min),
            Method::RecentOutcomes => (outcomes.len() >= min)
                .then(|| outcomes.failure_rate())
                .flatten()
                .map(|value| Measurement::of(value, outcomes.len())),
            Method::Quantile {
                digest,
                q,
                count,
                probe_fallback,
            } => {
                let mut found = self.quantile(digest, q, count, min);
                if found.is_none() && probe_fallback {
                    // A drained channel: judged on probes.
                    on_probes[k as usize] = true;
                    found = self.quantile(Digest::LatencyProbe, q, count, min);
                }
                found.map(|(m, mut d, view)| {
                    if k == SignalKind::P99Latency {
                        out.latency = Some(LatencySummary::of(m, &mut d, view, self.median));
                    }
                    m
                })
            }
            Method::Relative { of, baseline: base } => out.values[of as usize]
                .filter(|m| !on_probes[of as usize] && m.samples >= min)
                .and_then(|m| {
                    base(baseline, self.cfg.baseline_min_windows)
                        .filter(|b| *b > 0.0)
                        .map(|b| Measurement {
                            value: m.value / b,
                            samples: m.samples,
                            high: m.high.map(|h| h / b),
                        })
                }),
        }
    }

    /// [`bad_outcomes`] over the real-traffic view whose evidence reads
    /// worst at its lower bound, among those with `min` judged outcomes: a
    /// channel at AT_RISK weight shows a fault on a minute of few attempts
    /// and, a few minutes on, on five of many more. With no such real view,
    /// the first probe view that has them (a drained channel).
    pub(super) fn bad_outcomes(&self, min: u32) -> Option<Measurement> {
        let policy = self.policy;
        let z = policy.bad_outcome_confidence_z;
        let low = move |p, n| wilson_low(p, n, policy.z_at(z, n));
        let high = |p, n| wilson_high(p, n, self.probation.map_or(0.0, |pr| pr.confidence_z));
        // A probation's pass reads the failure rate at its upper bound
        // (`score::pessimistic`): the candidate that bound reads worst.
        let bound: &dyn Fn(f64, u32) -> f64 = if self.probation.is_some() {
            &high
        } else {
            &low
        };
        let judged = |c: &Counters| c.hard_failures + c.successes >= min;
        let kind_min = self.probation.map_or(min, |pr| pr.floor_samples.min(min));
        let real = self
            .views
            .iter()
            .filter(|v| v.1 == Pop::Real && judged(&v.2))
            .map(|v| worst_outcome(&v.2, kind_min, bound))
            .max_by(|a, b| bound(a.0, a.1).total_cmp(&bound(b.0, b.1)));
        real.or_else(|| {
            self.views
                .iter()
                .find(|v| v.1 == Pop::Probe && judged(&v.2))
                .map(|v| worst_outcome(&v.2, kind_min, bound))
        })
        .map(|(value, samples)| Measurement::of(value, samples))
    }

    /// The samples signal `k` needs to vote in this pass.
    pub(super) fn min(&self, k: SignalKind) -> u32 {
        let cap = self.probation.map_or(u32::MAX, |p| p.min_samples);
        k.policy(self.policy).min_samples.min(cap)
    }

    /// A counter share over the first view whose denominator has `min`.
    pub(super) fn rate(
        &self,
        min: u32,
        real_only: bool,
        of: fn(&Counters, f64) -> (f64, u32),
    ) -> Option<Measurement> {
        let cew = self.policy.client_error_weight;
        self.views
            .iter()
            .filter(|v| !real_only || v.1 == Pop::Real)
            .map(|v| of(&v.2, cew))
            .find(|(_, n)| *n >= min)
            .map(|(value, samples)| Measurement::of(value, samples))
    }

    /// Quantile `q` of `which` over the first view (real views, or probe
    /// views for probe latency) whose counters show `min` by `count` and
    /// whose digest holds that many: the measurement, the digest behind
    /// it and its view. A tail quantile of the recent horizon keeps
    /// `quantile_min_tail` samples beyond it, so a tail is never one or
    /// two requests.
    pub(super) fn quantile(
        &mut self,
        which: Digest,
        q: f64,
        count: fn(&Counters) -> u32,
        min: u32,
    ) -> Option<(Measurement, crate::digest::ViewDigest, LatencyView)> {
        let pop_ok = |p: Pop| match which {
            Digest::LatencyProbe => p == Pop::Probe,
            _ => p == Pop::Real,
        };
        for (window_ms, pop, c) in self.views {
            if !pop_ok(pop) || count(&c) < min {
                continue;
            }
            let Some(mut d) = self
                .ring
                .digest(which, self.now_ms, window_ms, self.not_before_ms)
            else {
                continue;
            };
            if (d.count() as u32) < min {
                continue;
            }
            let q = if q > 0.5 && self.horizon == Horizon::Recent {
                q.min(1.0 - self.cfg.quantile_min_tail as f64 / d.count())
            } else {
                q
            };
            let samples = d.count() as u32;
            let high = self.probation.map(|p| {
                let n = d.count().max(1.0);
                let spread = p.confidence_z * (q * (1.0 - q) / n).sqrt();
                d.estimate_quantile((q + spread).min(1.0))
            });
            let value = d.estimate_quantile(q);
            let m = Measurement {
                value,
                samples,
                high: high.map(|h| h.max(value)),
            };
            let view = LatencyView {
                digest: which,
                window_ms,
                not_before_ms: self.not_before_ms,
            };
            return Some((m, d, view));
        }
        None
    }
}
