//! Scenario files: channels, traffic, faults (TOML). Documented with an
//! example in docs/scenarios.md; `scenarios/*.toml` are the drills.

use crate::config::Tier;
use crate::event::TrafficClass;
use serde::Deserialize;

/// A whole drill.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub duration_s: f64,
    /// RNG seed; `--seed` overrides it.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Simulation step; arrivals and completions are resolved to it.
    #[serde(default = "default_step_ms")]
    pub step_ms: i64,
    /// Event time at t = 0 (ms since the epoch).
    #[serde(default = "default_start_ms")]
    pub start_ms: i64,
    /// Spend ceiling per hour for the group (also written into the config).
    pub budget_per_hour: Option<f64>,
    #[serde(default)]
    pub gateway: GatewayModel,
    pub channels: Vec<SimChannel>,
    pub traffic: Vec<ClassTraffic>,
    /// Hermes config overrides (any keys of hermes.toml except `groups`),
    /// merged over the defaults; `--config FILE` replaces them.
    #[serde(default)]
    pub config: toml::Table,
}

fn default_quota_period_s() -> f64 {
    86_400.0
}
fn default_true() -> bool {
    true
}

fn default_seed() -> u64 {
    1
}
fn default_step_ms() -> i64 {
    100
}
fn default_start_ms() -> i64 {
    1_764_000_000_000
}

/// How the simulated gateways behave.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayModel {
    /// Retries per request after a retryable failure (incident 001: "retry
    /// immediately, up to 3 times" caused the storm).
    pub max_retries: u32,
    /// Delay before a retry.
    pub retry_delay_ms: i64,
    /// Each channel gets a probe this often (0: no probes).
    pub probe_interval_s: f64,
    /// Group name used for every channel.
    pub group: String,
    /// Gateways report the requests they do not send (`dispatch` SHED or
    /// NO_CHANNEL), so Hermes measures demand instead of inferring it.
    /// `false` models gateways older than that field.
    pub report_unsent: bool,
}

impl Default for GatewayModel {
    fn default() -> Self {
        GatewayModel {
            max_retries: 0,
            retry_delay_ms: 200,
            probe_interval_s: 10.0,
            group: "chat".into(),
            report_unsent: true,
        }
    }
}

/// A channel's behavior: a normal profile and a fault timeline.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimChannel {
    pub id: String,
    pub tier: Tier,
    #[serde(default)]
    pub price_per_1k_tokens: f64,
    /// Above this many attempts per second latency and errors rise.
    pub capacity_rps: f64,
    /// Capacity Hermes is told about (defaults to the real one).
    pub declared_capacity_rps: Option<f64>,
    /// Attempts the upstream allows per `quota_period_s` (probes included);
    /// past it every attempt gets 429 until the period ends (incident 002's
    /// free tier). Written into the Hermes config as the channel's `quota`.
    pub quota: Option<u64>,
    #[serde(default = "default_quota_period_s")]
    pub quota_period_s: f64,
    /// Whether the gateways report the upstream's remaining quota on each
    /// event (`quota_remaining`); without it Hermes counts against `quota`.
    #[serde(default = "default_true")]
    pub report_quota: bool,
    #[serde(default)]
    pub normal: Profile,
    #[serde(default)]
    pub faults: Vec<Fault>,
}

/// Behavior parameters. In a fault, unset fields keep the normal values.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub latency_p50_ms: Option<f64>,
    pub latency_p99_ms: Option<f64>,
    /// Time to first token as a share of latency.
    pub ttfb_share: Option<f64>,
    pub output_tokens_median: Option<f64>,
    pub truncation_rate: Option<f64>,
    pub garbled_rate: Option<f64>,
    pub schema_invalid_rate: Option<f64>,
    /// Share of HTTP 200 answers that are empty (0–9 output tokens).
    pub empty_rate: Option<f64>,
    /// Probabilities per attempt of each error class.
    pub server_error_rate: Option<f64>,
    pub read_timeout_rate: Option<f64>,
    pub connection_reset_rate: Option<f64>,
    pub rate_limited_rate: Option<f64>,
    /// Above this load (attempts/s) the upstream answers 429 to the excess.
    pub rate_limit_rps: Option<f64>,
}

/// Resolved behavior at one instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Behavior {
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub ttfb_share: f64,
    pub output_tokens_median: f64,
    pub truncation_rate: f64,
    pub garbled_rate: f64,
    pub schema_invalid_rate: f64,
    pub empty_rate: f64,
    pub server_error_rate: f64,
    pub read_timeout_rate: f64,
    pub connection_reset_rate: f64,
    pub rate_limited_rate: f64,
    pub rate_limit_rps: f64,
}

impl Behavior {
    /// Healthy defaults: a typical paid LLM endpoint.
    pub fn base() -> Behavior {
        Behavior {
            latency_p50_ms: 1200.0,
            latency_p99_ms: 1800.0,
            ttfb_share: 0.25,
            output_tokens_median: 540.0,
            truncation_rate: 0.01,
            garbled_rate: 0.0,
            schema_invalid_rate: 0.0,
            empty_rate: 0.0,
            server_error_rate: 0.002,
            read_timeout_rate: 0.0,
            connection_reset_rate: 0.0,
            rate_limited_rate: 0.0,
            rate_limit_rps: f64::INFINITY,
        }
    }

    pub fn with(mut self, p: &Profile) -> Behavior {
        macro_rules! take {
            ($($f:ident),*) => { $( if let Some(v) = p.$f { self.$f = v; } )* };
        }
        take!(
            latency_p50_ms,
            latency_p99_ms,
            ttfb_share,
            output_tokens_median,
            truncation_rate,
            garbled_rate,
            schema_invalid_rate,
            empty_rate,
            server_error_rate,
            read_timeout_rate,
            connection_reset_rate,
            rate_limited_rate,
            rate_limit_rps
        );
        self
    }

    /// Linear mix: `a` at 0, `b` at 1.
    pub fn lerp(a: &Behavior, b: &Behavior, x: f64) -> Behavior {
        let l = |p: f64, q: f64| {
            if p.is_infinite() || q.is_infinite() {
                if x >= 1.0 {
                    q
                } else {
                    p
                }
            } else {
                p + (q - p) * x
            }
        };
        Behavior {
            latency_p50_ms: l(a.latency_p50_ms, b.latency_p50_ms),
            latency_p99_ms: l(a.latency_p99_ms, b.latency_p99_ms),
            ttfb_share: l(a.ttfb_share, b.ttfb_share),
            output_tokens_median: l(a.output_tokens_median, b.output_tokens_median),
            truncation_rate: l(a.truncation_rate, b.truncation_rate),
            garbled_rate: l(a.garbled_rate, b.garbled_rate),
            schema_invalid_rate: l(a.schema_invalid_rate, b.schema_invalid_rate),
            empty_rate: l(a.empty_rate, b.empty_rate),
            server_error_rate: l(a.server_error_rate, b.server_error_rate),
            read_timeout_rate: l(a.read_timeout_rate, b.read_timeout_rate),
            connection_reset_rate: l(a.connection_reset_rate, b.connection_reset_rate),
            rate_limited_rate: l(a.rate_limited_rate, b.rate_limited_rate),
            rate_limit_rps: l(a.rate_limit_rps, b.rate_limit_rps),
        }
    }
}

/// A periodic latency pulse (incident 004: 40 s fine, then 1–2 s slow).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pulse {
    pub period_s: f64,
    /// Pulse length; with `max_duration_s` it varies uniformly per pulse.
    pub duration_s: f64,
    pub max_duration_s: Option<f64>,
    pub latency_ms: f64,
}

/// One fault window on a channel.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    pub start_s: f64,
    pub end_s: f64,
    /// The fault grows linearly from the normal profile over this long.
    #[serde(default)]
    pub ramp_s: f64,
    /// Only long-input requests are affected (incident 003).
    #[serde(default)]
    pub only_long: bool,
    /// Every attempt is refused (connect error, fast).
    #[serde(default)]
    pub refuse_all: bool,
    pub pulse: Option<Pulse>,
    #[serde(flatten)]
    pub profile: Profile,
}

/// Demand of one traffic class.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassTraffic {
    pub class: ClassName,
    /// Mean requests per second.
    pub rps: f64,
    /// Diurnal swing: rps × (1 + amplitude × sin(2π t / 24 h)).
    #[serde(default)]
    pub diurnal_amplitude: f64,
    /// Share of requests with long input.
    #[serde(default = "default_long_share")]
    pub long_share: f64,
    /// Share of requests asking for structured (schema) output.
    #[serde(default)]
    pub structured_share: f64,
    #[serde(default)]
    pub bursts: Vec<Burst>,
}

fn default_long_share() -> f64 {
    0.2
}

/// A multiplicative demand burst.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Burst {
    pub start_s: f64,
    pub end_s: f64,
    pub factor: f64,
}

/// Class names as written in scenario files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClassName {
    Interactive,
    Core,
    Batch,
    Experimental,
}

impl ClassName {
    pub fn class(self) -> TrafficClass {
        match self {
            ClassName::Interactive => TrafficClass::Interactive,
            ClassName::Core => TrafficClass::Core,
            ClassName::Batch => TrafficClass::Batch,
            ClassName::Experimental => TrafficClass::Experimental,
        }
    }
}

/// True for finite numbers above zero (false for NaN).
fn positive(x: f64) -> bool {
    x.is_finite() && x > 0.0
}

impl Scenario {
    pub fn from_toml(text: &str) -> Result<Scenario, String> {
        let s: Scenario = toml::from_str(text).map_err(|e| e.to_string())?;
        s.validate()?;
        Ok(s)
    }

    fn validate(&self) -> Result<(), String> {
        if !positive(self.duration_s) {
            return Err("duration_s must be positive".into());
        }
        if self.step_ms <= 0 || self.step_ms > 1000 {
            return Err("step_ms must be within 1..=1000".into());
        }
        if self.channels.is_empty() {
            return Err("channels: at least one channel is needed".into());
        }
        for (i, c) in self.channels.iter().enumerate() {
            if !positive(c.capacity_rps) {
                return Err(format!(
                    "channels[{i}] ({}).capacity_rps must be positive",
                    c.id
                ));
            }
            for (j, f) in c.faults.iter().enumerate() {
                if !positive(f.end_s - f.start_s) || f.ramp_s < 0.0 {
                    return Err(format!(
                        "channels[{i}] ({}).faults[{j}]: need end_s > start_s and ramp_s >= 0",
                        c.id
                    ));
                }
                if let Some(p) = f.pulse {
                    if !(positive(p.period_s)
                        && positive(p.duration_s)
                        && p.duration_s < p.period_s)
                    {
                        return Err(format!(
                            "channels[{i}] ({}).faults[{j}].pulse: need 0 < duration_s < period_s",
                            c.id
                        ));
                    }
                }
            }
        }
        if self.traffic.is_empty() {
            return Err("traffic: at least one class is needed".into());
        }
        for (i, t) in self.traffic.iter().enumerate() {
            let valid = t.rps.is_finite()
                && t.rps >= 0.0
                && (0.0..=1.0).contains(&t.long_share)
                && t.diurnal_amplitude.abs() <= 1.0;
            if !valid {
                return Err(format!(
                    "traffic[{i}]: rps >= 0, long_share in [0,1], |diurnal_amplitude| <= 1"
                ));
            }
        }
        Ok(())
    }

    /// The Hermes config text for this scenario's channels: `config` (or the
    /// `--config` file's non-group keys) plus one group of the channels.
    pub fn hermes_config_text(&self, overrides: Option<&toml::Table>) -> Result<String, String> {
        let mut root = overrides.cloned().unwrap_or_else(|| self.config.clone());
        root.remove("groups");
        let mut group = toml::Table::new();
        group.insert("id".into(), self.gateway.group.clone().into());
        if let Some(b) = self.budget_per_hour {
            group.insert("budget_per_hour".into(), b.into());
        }
        let channels: Vec<toml::Value> = self
            .channels
            .iter()
            .map(|c| {
                let mut t = toml::Table::new();
                t.insert("id".into(), c.id.clone().into());
                t.insert("tier".into(), c.tier.as_str().into());
                t.insert("price_per_1k_tokens".into(), c.price_per_1k_tokens.into());
                t.insert(
                    "capacity_rps".into(),
                    c.declared_capacity_rps.unwrap_or(c.capacity_rps).into(),
                );
                if let Some(q) = c.quota {
                    t.insert("quota".into(), (q.min(i64::MAX as u64) as i64).into());
                    t.insert(
                        "quota_period_ms".into(),
                        ((c.quota_period_s * 1000.0) as i64).into(),
                    );
                }
                toml::Value::Table(t)
            })
            .collect();
        group.insert("channels".into(), toml::Value::Array(channels));
        root.insert(
            "groups".into(),
            toml::Value::Array(vec![toml::Value::Table(group)]),
        );
        toml::to_string(&root).map_err(|e| e.to_string())
    }
}
