//! Per-channel signals (docs/decisions.md#signals), measured from the windows at one event time.
//!
//! Each signal picks the first view that has enough samples, in this order:
//! real traffic over the short window, real over the long window, then probe
//! traffic (short, long). A channel at low volume is thus judged on five
//! minutes rather than not at all, and a drained channel that only sees probes
//! is judged on them. A signal with fewer than its `min_samples` everywhere
//! does not vote. `not_before_ms` clips every view, so a channel that was just
//! let back in is judged only on what happened since.
//!
//! The rooms: this file holds the signal table and what a measurement
//! returns; `measure` is one pass over a channel's windows, `policy` each
//! signal's bounds, `failure_rate` the failure rate at its confidence
//! bounds (per kind of bad answer, and since AT_RISK).

use crate::window::{Baseline, Counters, Digest, SliceRing};
mod policy;
pub use policy::*;
mod measure;
pub use measure::*;
mod failure_rate;
pub use failure_rate::*;

/// How a signal is measured (see [`measure`]).
#[derive(Clone, Copy)]
pub enum Method {
    /// A share of a view's counters: `of` gives (share, denominator) given
    /// `client_error_weight`; the first view whose denominator has
    /// `min_samples`. `real_only` skips the probe views.
    Rate {
        real_only: bool,
        of: fn(&Counters, f64) -> (f64, u32),
    },
    /// Hard failures among the last `engine.outcome_window` outcomes.
    RecentOutcomes,
    /// Hard failures and bad answers, over the real view (short or long)
    /// with `min_samples` judged outcomes whose bound reads worst, else the
    /// first probe view that has them; each kind of bad answer also over the
    /// answers that can show it (see [`bad_outcomes`]).
    BadOutcomes,
    /// Quantile `q` of a digest, over the first view whose counters show
    /// `min_samples` by `count`. `probe_fallback`: with too little real
    /// traffic, the same quantile of probe latency (a drained channel).
    Quantile {
        digest: Digest,
        q: f64,
        count: fn(&Counters) -> u32,
        probe_fallback: bool,
    },
    /// An earlier signal of the table over its learned baseline.
    Relative {
        of: SignalKind,
        baseline: fn(&Baseline, u32) -> Option<f64>,
    },
}

/// One scored signal: its kind, config key, how it is measured and its
/// default policy. [`SIGNALS`] holds them in [`SignalKind`] order.
#[derive(Clone, Copy)]
pub struct SignalDef {
    pub kind: SignalKind,
    /// The config key under `signals` (and the metric / breakdown label).
    pub name: &'static str,
    pub method: Method,
    pub default: SignalPolicy,
}

/// Declares every signal once: the [`SignalKind`] variant (with its doc),
/// its entry in [`SIGNALS`], and its config key in [`SignalPolicies`].
macro_rules! signal_table {
    ($( $(#[$doc:meta])* $kind:ident = $name:literal, $method:expr, $default:expr; )*) => {
        /// Every scored signal, in table order.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum SignalKind {
            $( $(#[$doc])* $kind, )*
        }

        /// Number of scored signals.
        pub const SIGNAL_COUNT: usize = [$(SignalKind::$kind),*].len();

        /// The signal table: the one place a signal is declared.
        pub const SIGNALS: [SignalDef; SIGNAL_COUNT] = [
            $( SignalDef {
                kind: SignalKind::$kind,
                name: $name,
                method: $method,
                default: $default,
            }, )*
        ];

        /// Config keys of `signals`: every signal, then the two settings.
        const POLICY_KEYS: &[&str] = &[$($name,)* "client_error_weight", "bad_outcome_confidence_z", "rate_confidence_z", "confidence_full_samples"];
    };
}

const fn rate(real_only: bool, of: fn(&Counters, f64) -> (f64, u32)) -> Method {
    Method::Rate { real_only, of }
}

const fn quantile(digest: Digest, q: f64, count: fn(&Counters) -> u32) -> Method {
    Method::Quantile {
        digest,
        q,
        count,
        probe_fallback: false,
    }
}

signal_table! {
    /// P99 total latency, ms. docs/decisions.md#score-and-states: 0.25 over [2 s, 6 s] (incident 000).
    P99Latency = "p99_latency_ms",
        Method::Quantile { digest: Digest::Latency, q: 0.99, count: |c| c.requests, probe_fallback: true },
        sig(0.25, 2_000.0, 6_000.0, 50);
    /// P99 ÷ baseline P99. docs/decisions.md#signals / incident 004: ≥ 2.5 is sub-health even under
    /// the absolute bound, so at 2.5 this alone reaches the AT_RISK score.
    RelativeP99 = "relative_p99",
        Method::Relative { of: SignalKind::P99Latency, baseline: |b, n| b.p99_ms(n) },
        sig(0.45, 1.5, 2.5, 50);
    /// P99 latency of long-input requests, ms (failures only on long requests).
    LongP99Latency = "long_p99_latency_ms",
        quantile(Digest::LatencyLong, 0.99, |c| c.long_requests),
        sig(0.10, 4_000.0, 12_000.0, 20);
    /// P99 time to first token, ms.
    TtfbP99 = "ttfb_p99_ms",
        quantile(Digest::Ttfb, 0.99, |c| c.requests),
        sig(0.10, 1_500.0, 5_000.0, 50);
    /// Share of requests slower than `engine.slow_request_ms`.
    SlowRatio = "slow_ratio",
        rate(false, |c, _| (ratio(c.slow as f64, c.requests), c.requests)),
        sig(0.10, 0.05, 0.25, 20);
    /// Share of failed attempts (client 4xx weighted by
    /// `client_error_weight`). docs/decisions.md#score-and-states: 0.20 over [1 %, 5 %].
    ErrorRate = "error_rate",
        rate(false, |c, cew| {
            (ratio(c.errors as f64 + cew * c.client_errors as f64, c.requests), c.requests)
        }),
        sig(0.20, 0.01, 0.05, 20);
    /// Error rate among long-input requests (incident 003: 98 % → 70 % success on
    /// long requests only, invisible in the channel-wide rate). Weighted so
    /// that alone, at its degraded bound, it reaches AT_RISK.
    LongErrorRate = "long_error_rate",
        rate(true, |c, _| (ratio(c.long_errors as f64, c.long_requests), c.long_requests)),
        sig(0.45, 0.05, 0.25, 20);
    /// Hard failures among the last `engine.outcome_window` outcomes, however
    /// far apart in time (incident 002's sparse failures). With the error rate it
    /// lets sustained hard failures drain a channel without help from
    /// latency: the error rate's own weight (0.20) alone never could.
    RecentFailureRate = "recent_failure_rate",
        Method::RecentOutcomes,
        sig(0.45, 0.03, 0.15, 20);
    /// docs/decisions.md#safety-rails, "a bad answer is a failed request": hard failures plus bad
    /// answers (truncated, garbled, schema-invalid, short or empty with HTTP
    /// 200) over hard failures plus successes. Alone at its degraded bound it
    /// drains (0.70 ≥ `drain_enter`), so any one kind of bad answer at 9–10 %
    /// of answers takes a channel out with normal status and latency, while
    /// 2–3 % (incident 000's healthy truncation floor) scores nothing.
    /// Each kind is also judged over the answers that can show it (see
    /// [`bad_outcomes`]): schema-invalid answers at 12 % of structured
    /// requests that are a third of the traffic are 4 % of all answers.
    BadOutcomeRate = "bad_outcome_rate",
        Method::BadOutcomes,
        sig(0.70, 0.03, 0.08, 50);
    /// Share of 429 responses.
    RateLimitedRate = "rate_limited_rate",
        rate(false, |c, _| (ratio(c.rate_limited as f64, c.requests), c.requests)),
        sig(0.30, 0.02, 0.10, 20);
    /// Share of attempts that are retries (attempt > 0). docs/decisions.md#score-and-states: 0.20 over
    /// [2 %, 10 %] (incident 000).
    RetryRate = "retry_rate",
        rate(true, |c, _| (ratio(c.retries as f64, c.requests), c.requests)),
        sig(0.20, 0.02, 0.10, 20);
    /// Share of truncated outputs. docs/decisions.md#score-and-states: 0.20 over [5 %, 40 %].
    TruncationRate = "truncation_rate",
        rate(false, |c, _| (ratio(c.truncated as f64, c.successes), c.successes)),
        sig(0.20, 0.05, 0.40, 20);
    /// Share of structured outputs that failed their schema (incident 002: > 1 %
    /// missing fields is sub-health).
    SchemaInvalidRate = "schema_invalid_rate",
        rate(false, |c, _| (ratio(c.schema_invalid as f64, c.structured), c.structured)),
        sig(0.15, 0.01, 0.10, 10);
    /// Share of outputs containing U+FFFD (incident 003: garbled text).
    GarbledRate = "garbled_rate",
        rate(false, |c, _| (ratio(c.garbled as f64, c.successes), c.successes)),
        sig(0.15, 0.01, 0.10, 20);
    /// Median output tokens (lower is worse). docs/decisions.md#score-and-states: 0.15 over [500, 150].
    OutputTokensMedian = "output_tokens_median",
        quantile(Digest::OutputTokens, 0.5, |c| c.successes),
        sig(0.15, 500.0, 150.0, 20);
    /// Median output tokens ÷ its baseline (lower is worse): the
    /// workload-independent twin of the absolute bound.
    OutputTokensRelative = "output_tokens_relative",
        Method::Relative { of: SignalKind::OutputTokensMedian, baseline: |b, n| b.output_median(n) },
        sig(0.15, 0.8, 0.4, 20);
    /// Share of outputs under `engine.short_output_tokens`.
    ShortOutputShare = "short_output_share",
        rate(true, |c, _| (ratio(c.short_outputs as f64, c.successes), c.successes)),
        sig(0.10, 0.10, 0.50, 20);
}

impl SignalKind {
    pub const ALL: [SignalKind; SIGNAL_COUNT] = {
        let mut all = [SignalKind::P99Latency; SIGNAL_COUNT];
        let mut i = 0;
        while i < SIGNAL_COUNT {
            all[i] = SIGNALS[i].kind;
            i += 1;
        }
        all
    };

    pub fn def(self) -> &'static SignalDef {
        &SIGNALS[self as usize]
    }

    /// The config key (and metric / breakdown label).
    pub fn name(self) -> &'static str {
        self.def().name
    }

    /// Whether the signal is a share of attempts (a binomial proportion, for
    /// which [`wilson_low`] gives a confidence bound); the others are
    /// quantiles and ratios of quantiles.
    pub fn is_rate(self) -> bool {
        matches!(
            self.def().method,
            Method::Rate { .. } | Method::RecentOutcomes | Method::BadOutcomes
        )
    }

    /// A failure rate whose failures `BadOutcomeRate` counts too: hard
    /// failures (errors, the last outcomes) and each kind of bad answer.
    pub fn within_bad_outcome(self) -> bool {
        matches!(
            self,
            SignalKind::ErrorRate
                | SignalKind::RecentFailureRate
                | SignalKind::TruncationRate
                | SignalKind::SchemaInvalidRate
                | SignalKind::GarbledRate
                | SignalKind::ShortOutputShare
        )
    }

    /// A tail quantile (a P99, or its ratio to the baseline): what a few
    /// slow attempts move while the typical one is fine.
    pub fn is_tail(self) -> bool {
        match self.def().method {
            Method::Quantile { q, .. } => q >= 0.9,
            Method::Relative { of, .. } => of.is_tail(),
            _ => false,
        }
    }

    pub fn policy(self, p: &SignalPolicies) -> &SignalPolicy {
        p.get(self)
    }
}

/// One measured value and the samples behind it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measurement {
    pub value: f64,
    pub samples: u32,
    /// A tail quantile measured for a probation verdict
    /// ([`Horizon::Whole`]): the same quantile at its upper confidence rank
    /// (see [`Probation::confidence_z`]). `None`: no bound was read.
    pub high: Option<f64>,
}

impl Measurement {
    /// A point measurement with no confidence bound.
    pub const fn of(value: f64, samples: u32) -> Measurement {
        Measurement {
            value,
            samples,
            high: None,
        }
    }
}

/// How a probation verdict reads its evidence (from `StatePolicy`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Probation {
    /// Samples enough for any signal to vote in probation (a signal whose
    /// own `min_samples` is higher votes on this many).
    pub min_samples: u32,
    /// Standard deviations of the confidence bounds a probation is judged
    /// at. A tail quantile is read at rank `q + z·sqrt(q(1−q)/n)` too: a
    /// fault that hits 2–5 % of requests in short pulses (incident 004) leaves
    /// only a handful of slow attempts among a probation's few hundred, and
    /// the point P99 of an unlucky handful reads clean.
    pub confidence_z: f64,
    /// A kind of bad answer counts in a pass's failure rate once this many
    /// answers could show it (`StatePolicy::probation_floor_samples`): at
    /// a half-open share structured answers are few, and a kind left out
    /// would let a probation pass while a third of the traffic still fails.
    pub floor_samples: u32,
}

/// Latency quantiles for the status view and alert rules.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatencySummary {
    /// The median of the view behind the P99, when this evaluation read it
    /// (`measure`'s `median`); [`read_latency_median`] reads it when it did not.
    pub p50_ms: Option<f64>,
    pub p99_ms: f64,
    pub samples: u32,
    /// The view behind the P99.
    pub view: LatencyView,
}

/// A view of one latency digest: which, how long, and since when.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencyView {
    pub digest: Digest,
    pub window_ms: i64,
    pub not_before_ms: i64,
}

impl Default for LatencyView {
    fn default() -> Self {
        LatencyView {
            digest: Digest::Latency,
            window_ms: 0,
            not_before_ms: i64::MIN / 2,
        }
    }
}

/// The median latency of the view behind `latency`'s P99 at `now_ms` (the
/// evaluation that measured it): the value `measure` would have read with
/// `median` set, read from the ring now. Merging every run of the view
/// for it at every evaluation took 7–8 % of the request path (docs/performance.md),
/// and only the median gauge and an intermittence verdict
/// use it.
pub fn read_latency_median(
    ring: &mut SliceRing,
    latency: &LatencySummary,
    now_ms: i64,
) -> Option<f64> {
    latency.p50_ms.or_else(|| {
        let v = latency.view;
        ring.digest(v.digest, now_ms, v.window_ms, v.not_before_ms)
            .map(|mut d| d.estimate_quantile(0.5))
    })
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

impl LatencySummary {
    /// The P99 latency measurement and the view behind it (its median
    /// read when `median`).
    fn of(
        p99: Measurement,
        d: &mut crate::digest::ViewDigest,
        view: LatencyView,
        median: bool,
    ) -> LatencySummary {
        LatencySummary {
            p50_ms: median.then(|| d.estimate_quantile(0.5)),
            p99_ms: p99.value,
            samples: p99.samples,
            view,
        }
    }
}

impl Signals {
    /// Error and 429 rates over the short window, unconditioned by
    /// `min_samples`, for alert rules and the status view.
    fn unconditioned_rates(&mut self, short: &crate::window::ViewCounters) {
        let all = {
            let mut c = short.real;
            c.requests += short.probe.requests;
            c.rate_limited += short.probe.rate_limited;
            c
        };
        self.error_rate =
            (short.real.requests > 0).then(|| ratio(short.real.errors as f64, short.real.requests));
        self.rate_limited_rate =
            (all.requests > 0).then(|| ratio(all.rate_limited as f64, all.requests));
    }

    /// Remaining quota and the time to exhaustion at the burn the reports
    /// of the long view show.
    fn quota_forecast(&mut self, ring: &mut SliceRing, now_ms: i64, long_window_ms: i64) {
        if let Some(((t0, q0), (t1, q1))) = ring.quota_reports(now_ms, long_window_ms) {
            self.quota_remaining = Some(q1);
            if t1 > t0 && q0 > q1 {
                let burn_per_ms = (q0 - q1) as f64 / (t1 - t0) as f64;
                self.quota_exhausted_in_ms = Some((q1.max(0) as f64 / burn_per_ms) as i64);
            } else if q1 <= 0 {
                self.quota_exhausted_in_ms = Some(0);
            }
        }
    }
}

/// The short-window P99 and output median a healthy channel teaches its
/// baseline (NaN where the window lacks enough samples).
pub fn baseline_point(signals: &Signals, policy: &SignalPolicies) -> (f64, f64) {
    let p99 = signals
        .latency
        .filter(|l| l.samples >= policy.get(SignalKind::P99Latency).min_samples)
        .map_or(f64::NAN, |l| l.p99_ms);
    let out = signals
        .get(SignalKind::OutputTokensMedian)
        .map_or(f64::NAN, |m| m.value);
    (p99, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::OutcomeWindow;

    /// `Horizon::Recent` does not read it.
    const NOT_ON_PROBATION: Probation = Probation {
        min_samples: 0,
        confidence_z: 0.0,
        floor_samples: 0,
    };

    #[test]
    fn the_table_is_in_kind_order_with_unique_config_keys() {
        let mut names = std::collections::BTreeSet::new();
        for (i, d) in SIGNALS.iter().enumerate() {
            assert_eq!(d.kind as usize, i, "{} out of order", d.name);
            assert_eq!(SignalKind::ALL[i], d.kind);
            assert!(names.insert(d.name), "{} declared twice", d.name);
            assert!(
                d.name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{}: config keys are snake_case",
                d.name
            );
            if let Method::Relative { of, .. } = d.method {
                assert!((of as usize) < i, "{} reads a later signal", d.name);
            }
        }
    }

    #[test]
    fn every_signal_is_a_config_key_with_its_default_and_nothing_else_is() {
        let defaults = SignalPolicies::default();
        let text = toml::to_string(&defaults).unwrap();
        for d in &SIGNALS {
            assert!(
                text.contains(&format!("[{}]", d.name)),
                "{} not in {text}",
                d.name
            );
            assert_eq!(defaults.get(d.kind), &d.default);
        }
        let back: SignalPolicies = toml::from_str(&text).unwrap();
        assert_eq!(back, defaults);
        // One signal set, the rest keep their defaults.
        let one: SignalPolicies = toml::from_str(
            "[error_rate]\nweight = 0.5\nnormal = 0.02\ndegraded = 0.2\nmin_samples = 7\n",
        )
        .unwrap();
        assert_eq!(one.get(SignalKind::ErrorRate).min_samples, 7);
        assert_eq!(one.get(SignalKind::P99Latency), &SIGNALS[0].default);
        let err = toml::from_str::<SignalPolicies>("[p99_latency]\nweight = 1.0\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `p99_latency`"), "{err}");
        assert!(
            err.contains("p99_latency_ms"),
            "the known keys are named: {err}"
        );
    }

    #[test]
    fn the_design_notes_name_every_signal() {
        let readme =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/decisions.md"))
                .unwrap();
        for d in &SIGNALS {
            assert!(
                readme.contains(&format!("`{}`", d.name)),
                "docs/decisions.md does not name {}",
                d.name
            );
        }
    }
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

    /// `measure` of the recent horizon, no probation, at `now`.
    fn recent(
        ring: &mut SliceRing,
        outcomes: &OutcomeWindow,
        baseline: &Baseline,
        cfg: &EngineConfig,
        policy: &SignalPolicies,
        now: i64,
        median: bool,
    ) -> Signals {
        measure(
            ring,
            outcomes,
            baseline,
            &cfg.horizons(),
            policy,
            now,
            i64::MIN / 2,
            Horizon::Recent,
            NOT_ON_PROBATION,
            median,
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
        let s = recent(
            &mut ring,
            &outcomes,
            &baseline,
            &cfg,
            &policy,
            t0 + 1000,
            true,
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
        let s = recent(&mut ring, &outcomes, &baseline, &cfg, &policy, now, true);
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
        let s = recent(
            &mut ring,
            &outcomes,
            &baseline,
            &cfg,
            &policy,
            t0 + 20_000,
            true,
        );
        let rel = s.get(SignalKind::RelativeP99).unwrap().value;
        assert!((rel - 1090.0 / 400.0).abs() < 0.1, "{rel}");
        let out_rel = s.get(SignalKind::OutputTokensRelative).unwrap().value;
        assert!((out_rel - 540.0 / 500.0).abs() < 0.01, "{out_rel}");
    }

    #[test]
    fn the_median_read_later_is_the_one_measure_reads() {
        // Real traffic in the short view; real traffic only before it
        // (the long view); only probes (a drained channel: the probe view).
        // Each read with the median and without it, then the median read
        // on its own.
        let t0 = 1_000_000_000;
        let cfg = EngineConfig::default();
        for (probes_after, view) in [
            (None, (Digest::Latency, cfg.short_window_ms)),
            (Some(30_000), (Digest::Latency, cfg.long_window_ms)),
            (Some(0), (Digest::LatencyProbe, cfg.short_window_ms)),
        ] {
            let (mut ring, outcomes, baseline, cfg, policy) = setup();
            for i in 0..900i64 {
                let mut e = sample_event();
                e.event_time_ms = t0 + i * 100;
                e.latency_ms = 200 + ((i * 7919) % 3_000) as i32;
                e.is_probe = probes_after.is_some_and(|p| i * 100 >= p);
                ring.record(&e);
            }
            let now = t0 + 90_000;
            let mut at =
                |median| recent(&mut ring, &outcomes, &baseline, &cfg, &policy, now, median);
            let with = at(true);
            let without = at(false);
            let l = with.latency.expect("a P99");
            let expected = l.p50_ms.expect("read with the median");
            assert!(expected > 200.0 && expected < 3_200.0, "{expected}");
            let lazy = without.latency.expect("the same P99");
            assert_eq!(lazy.p50_ms, None);
            assert_eq!((lazy.p99_ms, lazy.view), (l.p99_ms, l.view));
            assert_eq!((l.view.digest, l.view.window_ms), view);
            assert_eq!(read_latency_median(&mut ring, &lazy, now), Some(expected));
            // A median already read is not read again.
            assert_eq!(read_latency_median(&mut ring, &l, now), Some(expected));
        }
    }

    #[test]
    fn a_probation_reads_the_tail_at_its_upper_rank() {
        let (mut ring, outcomes, mut baseline, cfg, policy) = setup();
        for _ in 0..10 {
            baseline.learn(200.0, 500.0);
        }
        let t0 = 1_000_000_000;
        // A pulse caught one of 190 probation attempts (incident 004 at a 5 %
        // share): the point P99 is clean, the upper rank is not.
        for i in 0..190 {
            let mut e = sample_event();
            e.event_time_ms = t0 + i * 600;
            e.latency_ms = if i == 95 {
                2_200
            } else {
                120 + (i % 7) as i32 * 10
            };
            ring.record(&e);
        }
        let now = t0 + 190 * 600;
        let probation = Probation {
            min_samples: 200,
            confidence_z: 1.0,
            floor_samples: 20,
        };
        let at = |ring: &mut SliceRing, horizon| {
            measure(
                ring,
                &outcomes,
                &baseline,
                &cfg.horizons(),
                &policy,
                now,
                t0,
                horizon,
                probation,
                true,
            )
        };
        let s = at(&mut ring, Horizon::Whole);
        let p99 = s.get(SignalKind::P99Latency).unwrap();
        assert!(p99.value < 400.0, "point P99 {}", p99.value);
        assert!(p99.high.unwrap() > 1_500.0, "upper rank {:?}", p99.high);
        let rel = s.get(SignalKind::RelativeP99).unwrap();
        assert!(rel.high.unwrap() > 2.5 * rel.value, "{rel:?}");
        let scored = crate::score::pessimistic(&s, &policy, probation.confidence_z);
        assert!(scored >= 0.45, "the pass is refused: {scored}");
        assert!(crate::score::score(&s, &policy).value < 0.40);
        // Outside a probation no bound is read.
        let s = at(&mut ring, Horizon::Recent);
        assert_eq!(s.get(SignalKind::P99Latency).unwrap().high, None);
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
        let s = recent(
            &mut ring,
            &outcomes,
            &baseline,
            &cfg,
            &policy,
            t0 + 100_000,
            true,
        );
        assert_eq!(s.quota_remaining, Some(9_000));
        assert_eq!(s.quota_exhausted_in_ms, Some(900_000));
    }
}
