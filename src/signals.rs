//! Per-channel signals (SPEC §4), measured from the windows at one event time.
//!
//! Each signal picks the first view that has enough samples, in this order:
//! real traffic over the short window, real over the long window, then probe
//! traffic (short, long). A channel at low volume is thus judged on five
//! minutes rather than not at all, and a drained channel that only sees probes
//! is judged on them. A signal with fewer than its `min_samples` everywhere
//! does not vote. `not_before_ms` clips every view, so a channel that was just
//! let back in is judged only on what happened since.

use crate::config::{EngineConfig, SignalPolicies, SignalPolicy};
use crate::window::{Baseline, Counters, Digest, OutcomeWindow, SliceRing};

/// Every scored signal, in the order of `SignalPolicies::entries`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SignalKind {
    P99Latency,
    RelativeP99,
    LongP99Latency,
    TtfbP99,
    SlowRatio,
    ErrorRate,
    LongErrorRate,
    RecentFailureRate,
    BadOutcomeRate,
    RateLimitedRate,
    RetryRate,
    TruncationRate,
    SchemaInvalidRate,
    GarbledRate,
    OutputTokensMedian,
    OutputTokensRelative,
    ShortOutputShare,
}

pub const SIGNAL_COUNT: usize = 17;

impl SignalKind {
    pub const ALL: [SignalKind; SIGNAL_COUNT] = [
        SignalKind::P99Latency,
        SignalKind::RelativeP99,
        SignalKind::LongP99Latency,
        SignalKind::TtfbP99,
        SignalKind::SlowRatio,
        SignalKind::ErrorRate,
        SignalKind::LongErrorRate,
        SignalKind::RecentFailureRate,
        SignalKind::BadOutcomeRate,
        SignalKind::RateLimitedRate,
        SignalKind::RetryRate,
        SignalKind::TruncationRate,
        SignalKind::SchemaInvalidRate,
        SignalKind::GarbledRate,
        SignalKind::OutputTokensMedian,
        SignalKind::OutputTokensRelative,
        SignalKind::ShortOutputShare,
    ];

    /// The config key (and metric / breakdown label).
    pub fn name(self) -> &'static str {
        match self {
            SignalKind::P99Latency => "p99_latency_ms",
            SignalKind::RelativeP99 => "relative_p99",
            SignalKind::LongP99Latency => "long_p99_latency_ms",
            SignalKind::TtfbP99 => "ttfb_p99_ms",
            SignalKind::SlowRatio => "slow_ratio",
            SignalKind::ErrorRate => "error_rate",
            SignalKind::LongErrorRate => "long_error_rate",
            SignalKind::RecentFailureRate => "recent_failure_rate",
            SignalKind::BadOutcomeRate => "bad_outcome_rate",
            SignalKind::RateLimitedRate => "rate_limited_rate",
            SignalKind::RetryRate => "retry_rate",
            SignalKind::TruncationRate => "truncation_rate",
            SignalKind::SchemaInvalidRate => "schema_invalid_rate",
            SignalKind::GarbledRate => "garbled_rate",
            SignalKind::OutputTokensMedian => "output_tokens_median",
            SignalKind::OutputTokensRelative => "output_tokens_relative",
            SignalKind::ShortOutputShare => "short_output_share",
        }
    }

    /// Whether the signal is a share of attempts (a binomial proportion, for
    /// which [`wilson_low`] gives a confidence bound); the others are
    /// quantiles and ratios of quantiles.
    pub fn is_rate(self) -> bool {
        matches!(
            self,
            SignalKind::SlowRatio
                | SignalKind::ErrorRate
                | SignalKind::LongErrorRate
                | SignalKind::RecentFailureRate
                | SignalKind::BadOutcomeRate
                | SignalKind::RateLimitedRate
                | SignalKind::RetryRate
                | SignalKind::TruncationRate
                | SignalKind::SchemaInvalidRate
                | SignalKind::GarbledRate
                | SignalKind::ShortOutputShare
        )
    }

    pub fn policy(self, p: &SignalPolicies) -> &SignalPolicy {
        p.entries()[self as usize].1
    }
}

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

fn wilson(p: f64, n: u32, z: f64) -> (f64, f64) {
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

/// One measured value and the samples behind it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measurement {
    pub value: f64,
    pub samples: u32,
}

/// Latency quantiles for the status view and alert rules.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatencySummary {
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub samples: u32,
}

/// Everything measured about a channel at one evaluation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Signals {
    /// Per `SignalKind`: the measurement, or `None` when it lacked samples.
    pub values: [Option<Measurement>; SIGNAL_COUNT],
    /// Real traffic over the short window (status, alert rules).
    pub latency: Option<LatencySummary>,
    pub short_real: Counters,
    pub short_probe: Counters,
    /// Real attempts in the long view since `not_before_ms`, and probes:
    /// the evidence behind a probation decision.
    pub evidence_real: u32,
    pub evidence_probe: u32,
    /// Error rate of real traffic over the short window (unweighted by
    /// min_samples: for severity rules and the status view).
    pub error_rate: Option<f64>,
    /// Share of 429s over the short window, any population.
    pub rate_limited_rate: Option<f64>,
    /// Remaining quota and forecast time to exhaustion at the current burn.
    pub quota_remaining: Option<i64>,
    pub quota_exhausted_in_ms: Option<i64>,
}

impl Signals {
    pub fn get(&self, kind: SignalKind) -> Option<Measurement> {
        self.values[kind as usize]
    }
}

fn ratio(num: f64, den: u32) -> f64 {
    if den == 0 {
        0.0
    } else {
        num / den as f64
    }
}

/// A view of the ring: (window, population).
#[derive(Clone, Copy, PartialEq)]
enum Pop {
    Real,
    Probe,
}

/// Which views a measurement prefers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Horizon {
    /// The short window first, the long one when it lacks samples: quick to
    /// react (healthy, at-risk and recovering channels).
    Recent,
    /// Everything since `not_before_ms` within the long window: a probation
    /// verdict rests on all its evidence, so a periodic fault cannot hide in
    /// a lucky minute.
    Whole,
}

/// Measures every signal at `now_ms`.
#[allow(clippy::too_many_arguments)]
pub fn measure(
    ring: &mut SliceRing,
    outcomes: &OutcomeWindow,
    baseline: &Baseline,
    cfg: &EngineConfig,
    policy: &SignalPolicies,
    now_ms: i64,
    not_before_ms: i64,
    horizon: Horizon,
    probation_min_samples: u32,
) -> Signals {
    let short_ms = match horizon {
        Horizon::Recent => cfg.short_window_ms,
        Horizon::Whole => cfg.long_window_ms,
    };
    let short = ring.counters(now_ms, short_ms, not_before_ms);
    let long = ring.counters(now_ms, cfg.long_window_ms, not_before_ms);
    // Candidate views in preference order.
    let views = [
        (short_ms, Pop::Real, short.real),
        (cfg.long_window_ms, Pop::Real, long.real),
        (short_ms, Pop::Probe, short.probe),
        (cfg.long_window_ms, Pop::Probe, long.probe),
    ];
    let mut out = Signals {
        short_real: short.real,
        short_probe: short.probe,
        evidence_real: long.real.requests,
        evidence_probe: long.probe.requests,
        ..Signals::default()
    };
    // In probation a signal votes on the probation's evidence: refusing to
    // vote there would let a sick channel pass on the signals that did.
    let probation_cap = match horizon {
        Horizon::Recent => u32::MAX,
        Horizon::Whole => probation_min_samples,
    };
    let min = |k: SignalKind| k.policy(policy).min_samples.min(probation_cap);

    // Counter-based rates: the first view with enough denominator samples.
    let counter_signal = |k: SignalKind,
                          real_only: bool,
                          f: &dyn Fn(&Counters) -> (f64, u32)|
     -> Option<Measurement> {
        views
            .iter()
            .filter(|v| !real_only || v.1 == Pop::Real)
            .map(|v| f(&v.2))
            .find(|(_, n)| *n >= min(k))
            .map(|(value, samples)| Measurement { value, samples })
    };
    let cew = policy.client_error_weight;
    let set = |out: &mut Signals, k: SignalKind, m: Option<Measurement>| {
        out.values[k as usize] = m;
    };
    set(
        &mut out,
        SignalKind::ErrorRate,
        counter_signal(SignalKind::ErrorRate, false, &|c| {
            (
                ratio(c.errors as f64 + cew * c.client_errors as f64, c.requests),
                c.requests,
            )
        }),
    );
    set(
        &mut out,
        SignalKind::LongErrorRate,
        counter_signal(SignalKind::LongErrorRate, true, &|c| {
            (
                ratio(c.long_errors as f64, c.long_requests),
                c.long_requests,
            )
        }),
    );
    // SPEC §5a: a bad answer is a failed request. Hard failures and bad
    // answers over the outcomes that say something about the channel.
    set(
        &mut out,
        SignalKind::BadOutcomeRate,
        counter_signal(SignalKind::BadOutcomeRate, false, &|c| {
            let judged = c.hard_failures + c.successes;
            (
                ratio((c.hard_failures + c.bad_answers) as f64, judged),
                judged,
            )
        }),
    );
    set(
        &mut out,
        SignalKind::RateLimitedRate,
        counter_signal(SignalKind::RateLimitedRate, false, &|c| {
            (ratio(c.rate_limited as f64, c.requests), c.requests)
        }),
    );
    set(
        &mut out,
        SignalKind::RetryRate,
        counter_signal(SignalKind::RetryRate, true, &|c| {
            (ratio(c.retries as f64, c.requests), c.requests)
        }),
    );
    set(
        &mut out,
        SignalKind::SlowRatio,
        counter_signal(SignalKind::SlowRatio, false, &|c| {
            (ratio(c.slow as f64, c.requests), c.requests)
        }),
    );
    set(
        &mut out,
        SignalKind::TruncationRate,
        counter_signal(SignalKind::TruncationRate, false, &|c| {
            (ratio(c.truncated as f64, c.successes), c.successes)
        }),
    );
    set(
        &mut out,
        SignalKind::SchemaInvalidRate,
        counter_signal(SignalKind::SchemaInvalidRate, false, &|c| {
            (ratio(c.schema_invalid as f64, c.structured), c.structured)
        }),
    );
    set(
        &mut out,
        SignalKind::GarbledRate,
        counter_signal(SignalKind::GarbledRate, false, &|c| {
            (ratio(c.garbled as f64, c.successes), c.successes)
        }),
    );
    set(
        &mut out,
        SignalKind::ShortOutputShare,
        counter_signal(SignalKind::ShortOutputShare, true, &|c| {
            (ratio(c.short_outputs as f64, c.successes), c.successes)
        }),
    );
    let recent = SignalKind::RecentFailureRate;
    if outcomes.len() >= min(recent) {
        out.values[recent as usize] = outcomes.failure_rate().map(|value| Measurement {
            value,
            samples: outcomes.len(),
        });
    }

    // Digest-based signals: pick the view by counters, then merge once.
    let mut quantile =
        |which: Digest, k: SignalKind, q: f64, count_of: &dyn Fn(&Counters) -> u32| {
            let pop_ok = |p: Pop| match which {
                Digest::LatencyProbe => p == Pop::Probe,
                _ => p == Pop::Real,
            };
            for (window_ms, pop, c) in views {
                if !pop_ok(pop) || count_of(&c) < min(k) {
                    continue;
                }
                if let Some(d) = ring.digest(which, now_ms, window_ms, not_before_ms) {
                    if d.count() as u32 >= min(k) {
                        let q = if q > 0.5 && horizon == Horizon::Recent {
                            q.min(1.0 - cfg.quantile_min_tail as f64 / d.count())
                        } else {
                            q
                        };
                        return d.estimate_quantile(q).map(|value| {
                            (
                                Measurement {
                                    value,
                                    samples: d.count() as u32,
                                },
                                d,
                            )
                        });
                    }
                }
            }
            None
        };

    let real_p99 = quantile(Digest::Latency, SignalKind::P99Latency, 0.99, &|c| {
        c.requests
    });
    let baseline_points = cfg.baseline_min_windows;
    match &real_p99 {
        Some((m, d)) => {
            out.values[SignalKind::P99Latency as usize] = Some(*m);
            if let Some(base) = baseline.p99_ms(baseline_points).filter(|b| *b > 0.0) {
                if m.samples >= min(SignalKind::RelativeP99) {
                    out.values[SignalKind::RelativeP99 as usize] = Some(Measurement {
                        value: m.value / base,
                        samples: m.samples,
                    });
                }
            }
            out.latency = Some(LatencySummary {
                p50_ms: d.estimate_quantile(0.5).unwrap_or(0.0),
                p95_ms: d.estimate_quantile(0.95).unwrap_or(0.0),
                p99_ms: m.value,
                max_ms: d.max().unwrap_or(0.0),
                samples: m.samples,
            });
        }
        None => {
            // A drained channel: judge latency on probes.
            if let Some((m, d)) =
                quantile(Digest::LatencyProbe, SignalKind::P99Latency, 0.99, &|c| {
                    c.requests
                })
            {
                out.values[SignalKind::P99Latency as usize] = Some(m);
                out.latency = Some(LatencySummary {
                    p50_ms: d.estimate_quantile(0.5).unwrap_or(0.0),
                    p95_ms: d.estimate_quantile(0.95).unwrap_or(0.0),
                    p99_ms: m.value,
                    max_ms: d.max().unwrap_or(0.0),
                    samples: m.samples,
                });
            }
        }
    }
    out.values[SignalKind::LongP99Latency as usize] = quantile(
        Digest::LatencyLong,
        SignalKind::LongP99Latency,
        0.99,
        &|c| c.long_requests,
    )
    .map(|x| x.0);
    out.values[SignalKind::TtfbP99 as usize] =
        quantile(Digest::Ttfb, SignalKind::TtfbP99, 0.99, &|c| c.requests).map(|x| x.0);
    if let Some((m, _)) = quantile(
        Digest::OutputTokens,
        SignalKind::OutputTokensMedian,
        0.5,
        &|c| c.successes,
    ) {
        out.values[SignalKind::OutputTokensMedian as usize] = Some(m);
        if let Some(base) = baseline.output_median(baseline_points).filter(|b| *b > 0.0) {
            if m.samples >= min(SignalKind::OutputTokensRelative) {
                out.values[SignalKind::OutputTokensRelative as usize] = Some(Measurement {
                    value: m.value / base,
                    samples: m.samples,
                });
            }
        }
    }

    // Unconditioned rates for alert rules and the status view.
    let all = {
        let mut c = short.real;
        c.requests += short.probe.requests;
        c.rate_limited += short.probe.rate_limited;
        c
    };
    out.error_rate =
        (short.real.requests > 0).then(|| ratio(short.real.errors as f64, short.real.requests));
    out.rate_limited_rate =
        (all.requests > 0).then(|| ratio(all.rate_limited as f64, all.requests));

    if let Some(((t0, q0), (t1, q1))) = ring.quota_reports(now_ms, cfg.long_window_ms) {
        out.quota_remaining = Some(q1);
        if t1 > t0 && q0 > q1 {
            let burn_per_ms = (q0 - q1) as f64 / (t1 - t0) as f64;
            out.quota_exhausted_in_ms = Some((q1.max(0) as f64 / burn_per_ms) as i64);
        } else if q1 <= 0 {
            out.quota_exhausted_in_ms = Some(0);
        }
    }
    out
}

/// The short-window P99 and output median a healthy channel teaches its
/// baseline (NaN where the window lacks enough samples).
pub fn baseline_point(signals: &Signals, policy: &SignalPolicies) -> (f64, f64) {
    let p99 = signals
        .latency
        .filter(|l| l.samples >= policy.p99_latency_ms.min_samples)
        .map_or(f64::NAN, |l| l.p99_ms);
    let out = signals
        .get(SignalKind::OutputTokensMedian)
        .map_or(f64::NAN, |m| m.value);
    (p99, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::tests::sample_event;
    use crate::event::ErrorClass;

    fn setup() -> (
        SliceRing,
        OutcomeWindow,
        Baseline,
        EngineConfig,
        SignalPolicies,
    ) {
        let cfg = EngineConfig::default();
        (
            SliceRing::new(&cfg),
            OutcomeWindow::new(cfg.outcome_window),
            Baseline::new(cfg.baseline_windows),
            cfg,
            SignalPolicies::default(),
        )
    }

    #[test]
    fn a_signal_under_its_minimum_sample_size_does_not_vote() {
        let (mut ring, outcomes, baseline, cfg, policy) = setup();
        let t0 = 1_000_000_000;
        // 10 requests, all failing: error rate 100 % but min_samples is 20.
        for i in 0..10 {
            let mut e = sample_event();
            e.event_time_ms = t0 + i * 100;
            e.error_class = ErrorClass::ServerError;
            ring.record(&e);
        }
        let s = measure(
            &mut ring,
            &outcomes,
            &baseline,
            &cfg,
            &policy,
            t0 + 1000,
            i64::MIN / 2,
            Horizon::Recent,
            0,
        );
        assert_eq!(s.get(SignalKind::ErrorRate), None);
        assert_eq!(s.get(SignalKind::P99Latency), None);
        assert_eq!(s.error_rate, Some(1.0), "the status view still sees it");
    }

    #[test]
    fn sparse_channels_fall_back_to_the_long_window() {
        let (mut ring, outcomes, baseline, cfg, policy) = setup();
        let t0 = 1_000_000_000;
        // 30 requests spread over 4 minutes: < 20 in the last minute.
        for i in 0..30 {
            let mut e = sample_event();
            e.event_time_ms = t0 + i * 8000;
            e.error_class = if i % 3 == 0 {
                ErrorClass::ServerError
            } else {
                ErrorClass::None
            };
            ring.record(&e);
        }
        let now = t0 + 29 * 8000;
        let s = measure(
            &mut ring,
            &outcomes,
            &baseline,
            &cfg,
            &policy,
            now,
            i64::MIN / 2,
            Horizon::Recent,
            0,
        );
        let m = s.get(SignalKind::ErrorRate).unwrap();
        assert_eq!(m.samples, 30);
        assert!((m.value - 10.0 / 30.0).abs() < 1e-9);
    }

    #[test]
    fn relative_latency_against_baseline() {
        let (mut ring, outcomes, mut baseline, cfg, policy) = setup();
        for _ in 0..10 {
            baseline.learn(400.0, 500.0);
        }
        let t0 = 1_000_000_000;
        for i in 0..200 {
            let mut e = sample_event();
            e.event_time_ms = t0 + i * 100;
            e.latency_ms = 1_000 + (i % 10) as i32 * 10;
            ring.record(&e);
        }
        let s = measure(
            &mut ring,
            &outcomes,
            &baseline,
            &cfg,
            &policy,
            t0 + 20_000,
            i64::MIN / 2,
            Horizon::Recent,
            0,
        );
        let rel = s.get(SignalKind::RelativeP99).unwrap().value;
        assert!((rel - 1090.0 / 400.0).abs() < 0.1, "{rel}");
        let out_rel = s.get(SignalKind::OutputTokensRelative).unwrap().value;
        assert!((out_rel - 540.0 / 500.0).abs() < 0.01, "{out_rel}");
    }

    #[test]
    fn quota_forecast_from_burn_rate() {
        let (mut ring, outcomes, baseline, cfg, policy) = setup();
        let t0 = 1_000_000_000;
        for i in 0..=100 {
            let mut e = sample_event();
            e.event_time_ms = t0 + i * 1000;
            e.quota_remaining = Some(10_000 - i * 10); // 10 per second
            ring.record(&e);
        }
        let s = measure(
            &mut ring,
            &outcomes,
            &baseline,
            &cfg,
            &policy,
            t0 + 100_000,
            i64::MIN / 2,
            Horizon::Recent,
            0,
        );
        assert_eq!(s.quota_remaining, Some(9_000));
        assert_eq!(s.quota_exhausted_in_ms, Some(900_000));
    }
}
