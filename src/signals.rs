//! Per-channel signals (SPEC §4), measured from the windows at one event time.
//!
//! Each signal picks the first view that has enough samples, in this order:
//! real traffic over the short window, real over the long window, then probe
//! traffic (short, long). A channel at low volume is thus judged on five
//! minutes rather than not at all, and a drained channel that only sees probes
//! is judged on them. A signal with fewer than its `min_samples` everywhere
//! does not vote. `not_before_ms` clips every view, so a channel that was just
//! let back in is judged only on what happened since.

use crate::window::{Baseline, Counters, Digest, OutcomeWindow, SliceRing};
use serde::{Deserialize, Serialize};

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

/// One signal's contribution: it maps linearly from 0 at `normal` to 1 at
/// `degraded` (either direction: for output tokens lower is worse), is
/// clamped, and is multiplied by `weight`. A signal with fewer than
/// `min_samples` samples does not vote.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalPolicy {
    pub weight: f64,
    pub normal: f64,
    pub degraded: f64,
    pub min_samples: u32,
}

const fn sig(weight: f64, normal: f64, degraded: f64, min_samples: u32) -> SignalPolicy {
    SignalPolicy {
        weight,
        normal,
        degraded,
        min_samples,
    }
}

/// Every scored signal. The five with SPEC §5 seed weights (P99, error rate,
/// retry rate, truncation, output-token median) sum to 1.0 on their own; the
/// others add detection paths the seeds asked for. The score is clamped to 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SignalPolicies {
    /// P99 total latency, ms. SPEC §5: 0.25 over [2 s, 6 s] (seed 000).
    pub p99_latency_ms: SignalPolicy,
    /// P99 ÷ baseline P99. SPEC §4 / seed 004: ≥ 2.5 is sub-health even under
    /// the absolute bound, so at 2.5 this alone reaches the AT_RISK score.
    pub relative_p99: SignalPolicy,
    /// P99 latency of long-input requests, ms (failures only on long requests).
    pub long_p99_latency_ms: SignalPolicy,
    /// P99 time to first token, ms.
    pub ttfb_p99_ms: SignalPolicy,
    /// Share of requests slower than `engine.slow_request_ms`.
    pub slow_ratio: SignalPolicy,
    /// Share of failed attempts (client 4xx weighted by
    /// `client_error_weight`). SPEC §5: 0.20 over [1 %, 5 %].
    pub error_rate: SignalPolicy,
    /// Error rate among long-input requests (seed 003: 98 % → 70 % success on
    /// long requests only, invisible in the channel-wide rate). Weighted so
    /// that alone, at its degraded bound, it reaches AT_RISK.
    pub long_error_rate: SignalPolicy,
    /// Hard failures among the last `engine.outcome_window` outcomes, however
    /// far apart in time (seed 002's sparse failures). With the error rate it
    /// lets sustained hard failures drain a channel without help from
    /// latency: the SPEC's error weight (0.20) alone never could.
    pub recent_failure_rate: SignalPolicy,
    /// SPEC §5a, "a bad answer is a failed request": hard failures plus bad
    /// answers (truncated, garbled, schema-invalid, short or empty with HTTP
    /// 200) over hard failures plus successes. Alone at its degraded bound it
    /// drains (0.70 ≥ `drain_enter`), so any one kind of bad answer at 9–10 %
    /// of answers takes a channel out with normal status and latency, while
    /// 2–3 % (seed 000's healthy truncation floor) scores nothing.
    pub bad_outcome_rate: SignalPolicy,
    /// Share of 429 responses.
    pub rate_limited_rate: SignalPolicy,
    /// Share of attempts that are retries (attempt > 0). SPEC §5: 0.20 over
    /// [2 %, 10 %] (seed 000).
    pub retry_rate: SignalPolicy,
    /// Share of truncated outputs. SPEC §5: 0.20 over [5 %, 40 %].
    pub truncation_rate: SignalPolicy,
    /// Share of structured outputs that failed their schema (seed 002: > 1 %
    /// missing fields is sub-health).
    pub schema_invalid_rate: SignalPolicy,
    /// Share of outputs containing U+FFFD (seed 003: garbled text).
    pub garbled_rate: SignalPolicy,
    /// Median output tokens (lower is worse). SPEC §5: 0.15 over [500, 150].
    pub output_tokens_median: SignalPolicy,
    /// Median output tokens ÷ its baseline (lower is worse): the
    /// workload-independent twin of the absolute bound.
    pub output_tokens_relative: SignalPolicy,
    /// Share of outputs under `engine.short_output_tokens`.
    pub short_output_share: SignalPolicy,
    /// How much a client 4xx counts toward `error_rate` (SPEC §4: lightly).
    pub client_error_weight: f64,
    /// `bad_outcome_rate` is scored at its Wilson lower bound this many
    /// standard deviations (one-sided) under the measured share: measured
    /// over a minute of a free channel's traffic (~200 attempts) a 2 % line
    /// reads 7 % about once a day, and alone at the degraded bound that
    /// signal drains. 1.0 still reads 10 % over 200 attempts as 8 %.
    pub bad_outcome_confidence_z: f64,
}

impl Default for SignalPolicies {
    fn default() -> Self {
        SignalPolicies {
            p99_latency_ms: sig(0.25, 2_000.0, 6_000.0, 50),
            relative_p99: sig(0.45, 1.5, 2.5, 50),
            long_p99_latency_ms: sig(0.10, 4_000.0, 12_000.0, 20),
            ttfb_p99_ms: sig(0.10, 1_500.0, 5_000.0, 50),
            slow_ratio: sig(0.10, 0.05, 0.25, 20),
            error_rate: sig(0.20, 0.01, 0.05, 20),
            long_error_rate: sig(0.45, 0.05, 0.25, 20),
            recent_failure_rate: sig(0.45, 0.03, 0.15, 20),
            bad_outcome_rate: sig(0.70, 0.03, 0.09, 50),
            rate_limited_rate: sig(0.30, 0.02, 0.10, 20),
            retry_rate: sig(0.20, 0.02, 0.10, 20),
            truncation_rate: sig(0.20, 0.05, 0.40, 20),
            schema_invalid_rate: sig(0.15, 0.01, 0.10, 10),
            garbled_rate: sig(0.15, 0.01, 0.10, 20),
            output_tokens_median: sig(0.15, 500.0, 150.0, 20),
            output_tokens_relative: sig(0.15, 0.8, 0.4, 20),
            short_output_share: sig(0.10, 0.10, 0.50, 20),
            client_error_weight: 0.1,
            bad_outcome_confidence_z: 1.0,
        }
    }
}

impl SignalPolicies {
    /// Every signal policy with its config key, in a fixed order (the order of
    /// `signals::SignalKind`).
    pub fn entries(&self) -> [(&'static str, &SignalPolicy); SIGNAL_COUNT] {
        [
            ("p99_latency_ms", &self.p99_latency_ms),
            ("relative_p99", &self.relative_p99),
            ("long_p99_latency_ms", &self.long_p99_latency_ms),
            ("ttfb_p99_ms", &self.ttfb_p99_ms),
            ("slow_ratio", &self.slow_ratio),
            ("error_rate", &self.error_rate),
            ("long_error_rate", &self.long_error_rate),
            ("recent_failure_rate", &self.recent_failure_rate),
            ("bad_outcome_rate", &self.bad_outcome_rate),
            ("rate_limited_rate", &self.rate_limited_rate),
            ("retry_rate", &self.retry_rate),
            ("truncation_rate", &self.truncation_rate),
            ("schema_invalid_rate", &self.schema_invalid_rate),
            ("garbled_rate", &self.garbled_rate),
            ("output_tokens_median", &self.output_tokens_median),
            ("output_tokens_relative", &self.output_tokens_relative),
            ("short_output_share", &self.short_output_share),
        ]
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

/// The windows signals are measured over (from `EngineConfig::horizons`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Horizons {
    pub short_window_ms: i64,
    pub long_window_ms: i64,
    /// Samples a tail quantile keeps beyond it (see `EngineConfig`).
    pub quantile_min_tail: u32,
    pub baseline_min_windows: u32,
}

/// Measures every signal at `now_ms`.
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
    use crate::config::EngineConfig;
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
            SliceRing::new(cfg.ring_shape()),
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
            &cfg.horizons(),
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
            &cfg.horizons(),
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
            &cfg.horizons(),
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
            &cfg.horizons(),
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
