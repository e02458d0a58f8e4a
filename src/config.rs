//! Configuration: one TOML file, validated once, then handed to the engine as
//! an immutable [`Config`]. The engine never sees an unvalidated value.
//!
//! Health policies layer, most specific last:
//! built-in defaults → `[policy]` → built-in tier defaults → `[tiers.<tier>.policy]`
//! → `[[groups.channels]] policy`. Layers are partial TOML tables deep-merged
//! before one typed deserialization, so a channel can override a single bound
//! (`policy.signals.p99_latency_ms.normal = 900`) and every error names the
//! offending key with its full path.
//!
//! Every default cites where it came from: SPEC.md (the distilled product
//! spec) or the seed incident (`shared/seeds/00N`) whose team chose it.

use crate::event::TrafficClass;
use crate::signals::SignalPolicies;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A config problem, naming the key at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct ConfigIssue {
    pub key: String,
    pub reason: String,
}

/// All problems found in one config (validation does not stop at the first).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid config:\n{}", .issues.iter().map(|i| format!("  - {i}")).collect::<Vec<_>>().join("\n"))]
pub struct ConfigError {
    pub issues: Vec<ConfigIssue>,
}

impl ConfigError {
    fn one(key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            issues: vec![ConfigIssue {
                key: key.into(),
                reason: reason.into(),
            }],
        }
    }
}

/// Collects issues with a key prefix.
#[derive(Default)]
struct Issues(Vec<ConfigIssue>);

impl Issues {
    fn push(&mut self, key: impl Into<String>, reason: impl Into<String>) {
        self.0.push(ConfigIssue {
            key: key.into(),
            reason: reason.into(),
        });
    }
    fn positive_ms(&mut self, key: String, v: i64) {
        if v <= 0 {
            self.push(key, format!("must be a positive duration in ms, got {v}"));
        }
    }
    fn fraction(&mut self, key: String, v: f64) {
        if !(0.0..=1.0).contains(&v) || v.is_nan() {
            self.push(key, format!("must be within [0, 1], got {v}"));
        }
    }
    fn non_negative(&mut self, key: String, v: f64) {
        if !(v >= 0.0 && v.is_finite()) {
            self.push(key, format!("must be a finite number >= 0, got {v}"));
        }
    }
}

// ---------------------------------------------------------------------------
// The service's connections (`hermes run`)
// ---------------------------------------------------------------------------

/// Kafka connection and topics. `properties` pass through to librdkafka
/// verbatim (security.protocol, sasl.*, ssl.*, ...); their values are never
/// logged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// Bootstrap servers, `host:port[,host:port...]`. Empty: `hermes run`
    /// refuses to start (the embedded demo needs none).
    pub brokers: String,
    /// Consumer group of the request topic (channels are sharded by key).
    pub group_id: String,
    pub request_topic: String,
    pub alert_topic: String,
    pub dead_letter_topic: String,
    /// Low-volume topic keyed by route group: per-channel health from the
    /// partition owners to the one writer of each group (every instance
    /// reads all of it; see `service::groups`).
    pub health_topic: String,
    pub session_timeout_ms: i64,
    /// Schema Registry base URL (`http://host:port`) for Confluent-framed
    /// records; empty: plain datums only.
    pub schema_registry_url: String,
    /// Extra librdkafka properties for every client (security settings).
    pub properties: BTreeMap<String, String>,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            brokers: String::new(),
            group_id: "hermes".into(),
            request_topic: "hermes.requests".into(),
            alert_topic: "hermes.alerts".into(),
            dead_letter_topic: "hermes.dead-letters".into(),
            health_topic: "hermes.health".into(),
            session_timeout_ms: 10_000,
            schema_registry_url: String::new(),
            properties: BTreeMap::new(),
        }
    }
}

impl KafkaConfig {
    fn validate(&self, v: &mut Issues) {
        let topics = [
            ("kafka.request_topic", &self.request_topic),
            ("kafka.alert_topic", &self.alert_topic),
            ("kafka.dead_letter_topic", &self.dead_letter_topic),
            ("kafka.health_topic", &self.health_topic),
        ];
        let mut seen = ahash::AHashSet::new();
        for (k, t) in topics {
            if t.is_empty() {
                v.push(k, "must not be empty");
            } else if !seen.insert(t.as_str()) {
                v.push(k, format!("topic `{t}` is used for two purposes"));
            }
        }
        if self.group_id.is_empty() {
            v.push("kafka.group_id", "must not be empty");
        }
        v.positive_ms("kafka.session_timeout_ms".into(), self.session_timeout_ms);
        if !self.schema_registry_url.is_empty() && !self.schema_registry_url.starts_with("http://")
        {
            v.push(
                "kafka.schema_registry_url",
                "only http:// registries are supported (put TLS in a local proxy)",
            );
        }
        for k in self.properties.keys() {
            if matches!(
                k.as_str(),
                "bootstrap.servers"
                    | "group.id"
                    | "enable.auto.commit"
                    | "enable.auto.offset.store"
            ) {
                v.push(
                    format!("kafka.properties.{k}"),
                    "is managed by Hermes (use the dedicated key, or leave it out)",
                );
            }
        }
    }
}

/// Redis connection. AUTH goes in the URL (`redis://user:pass@host:port`);
/// the password is redacted in every log line.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    pub url: String,
}

/// Timers of the service shell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServiceConfig {
    /// How often an unchanged snapshot's `heartbeat_ms` is refreshed.
    pub heartbeat_ms: i64,
    /// A group is first published once every channel reported, or this long
    /// after its first report (channels without traffic then count as
    /// unknown).
    pub group_warmup_ms: i64,
    /// Duplicate event ids are ignored within this much event time.
    pub dedup_horizon_ms: i64,
    /// Offsets are committed this often (after outputs were delivered).
    pub commit_interval_ms: i64,
    /// The config file is checked for changes this often (0: never).
    pub reload_check_ms: i64,
    /// Prometheus `/metrics` and the `/status` view; empty: off.
    pub http_listen: String,
    /// A partition without events for this long (wall time) advances its
    /// event time to `wall clock - engine.allowed_lateness_ms`, so ticks,
    /// cool-downs and the silent-channel alarm still run.
    pub idle_advance_ms: i64,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            heartbeat_ms: 10_000,
            group_warmup_ms: 60_000,
            dedup_horizon_ms: 60_000,
            commit_interval_ms: 1_000,
            reload_check_ms: 5_000,
            http_listen: "127.0.0.1:9464".into(),
            idle_advance_ms: 5_000,
        }
    }
}

impl ServiceConfig {
    fn validate(&self, v: &mut Issues) {
        for (k, x) in [
            ("heartbeat_ms", self.heartbeat_ms),
            ("group_warmup_ms", self.group_warmup_ms),
            ("dedup_horizon_ms", self.dedup_horizon_ms),
            ("commit_interval_ms", self.commit_interval_ms),
            ("idle_advance_ms", self.idle_advance_ms),
        ] {
            v.positive_ms(format!("service.{k}"), x);
        }
        if self.reload_check_ms < 0 {
            v.push("service.reload_check_ms", "must be >= 0 (0 turns it off)");
        }
        if !self.http_listen.is_empty() && self.http_listen.parse::<std::net::SocketAddr>().is_err()
        {
            v.push(
                "service.http_listen",
                format!("`{}` is not an ip:port address", self.http_listen),
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Engine-wide settings
// ---------------------------------------------------------------------------

/// How windows are sliced and when channels are evaluated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// Width of one ring slice. SPEC §4: 5–10 s slices.
    pub slice_ms: i64,
    /// The short view (SPEC §4: 1 min). Must be a multiple of `slice_ms`.
    pub short_window_ms: i64,
    /// The long view (SPEC §4: 5 min); signals that lack samples in the short
    /// view fall back to it. Sets the ring length, hence memory per channel.
    pub long_window_ms: i64,
    /// How often every channel is scored and its state machine stepped (event
    /// time). Defaults to one slice.
    pub evaluation_interval_ms: i64,
    /// Events up to this much older than the partition watermark still land in
    /// their slice; older ones are counted (`too_late`) and dropped.
    pub allowed_lateness_ms: i64,
    /// An event stamped further ahead than this of its reference (the wall
    /// clock in the service; the watermark in replay and the simulator) is
    /// refused as `future_timestamp` and moves nothing (see `clock`). At most
    /// `allowed_lateness_ms`, so a gateway ahead by less than this never
    /// makes another gateway's events too late. Unset: equal to it.
    pub max_clock_skew_ms: Option<i64>,
    /// Without a wall clock (replay, the simulator), a jump of the watermark
    /// past the skew is taken when a second gateway's event, or this many
    /// events in a row, land beyond it: a real gap in the traffic.
    pub clock_jump_events: u32,
    /// Size of the count-based window of last outcomes. SPEC §4 / seed 002:
    /// "the last 100 requests" catches sparse failures a time window misses.
    pub outcome_window: u32,
    /// t-digest compression. 100 keeps P99 error around 2–3 % at a quarter of
    /// the memory of 200 (<0.5 %); per-channel memory is documented in `window`.
    pub tdigest_size: u32,
    /// Requests with at least this many input tokens are "long" (their own
    /// latency and error buckets: seed 003, failures only on long requests).
    pub long_input_tokens: u32,
    /// Outputs with fewer tokens count toward the short-output share.
    pub short_output_tokens: u32,
    /// A request slower than this counts toward the slow-request ratio.
    pub slow_request_ms: u32,
    /// How many completed short windows the baseline remembers (the median of
    /// their P99 and output-token median is the baseline). 30 × 1 min.
    pub baseline_windows: u32,
    /// The relative signals do not vote until this many baseline points exist.
    pub baseline_min_windows: u32,
    /// Tail quantiles (P99) are never decided by fewer than this many
    /// requests: over n samples the quantile read is min(0.99, 1 − tail/n).
    /// Three 10 s timeouts in a quiet minute (289 requests) were the P99 and
    /// drained a healthy channel in the 24 h drill. On probation the plain
    /// P99 is used: there a few outliers must count against letting it back.
    pub quantile_min_tail: u32,
    /// A channel with no events for this long while its partition advances is
    /// reported silent. Seed 004 wants gaps noticed within a minute.
    pub silent_after_ms: i64,
    /// Quota forecasts look this far ahead (also the scheduler's horizon).
    pub quota_horizon_ms: i64,
}

impl EngineConfig {
    /// The allowed clock skew: `max_clock_skew_ms`, or the allowed lateness.
    pub fn clock_skew_ms(&self) -> i64 {
        self.max_clock_skew_ms.unwrap_or(self.allowed_lateness_ms)
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            slice_ms: 5_000,
            short_window_ms: 60_000,
            long_window_ms: 300_000,
            evaluation_interval_ms: 5_000,
            allowed_lateness_ms: 10_000,
            max_clock_skew_ms: None,
            clock_jump_events: 20,
            outcome_window: 100,
            tdigest_size: 100,
            long_input_tokens: 4_000,
            short_output_tokens: 50,
            slow_request_ms: 5_000,
            baseline_windows: 30,
            baseline_min_windows: 5,
            quantile_min_tail: 5,
            silent_after_ms: 60_000,
            quota_horizon_ms: 3_600_000,
        }
    }
}

impl EngineConfig {
    /// Number of slices in the ring.
    pub fn ring_slices(&self) -> usize {
        (self.long_window_ms / self.slice_ms) as usize
    }
    /// The slice ring every channel keeps.
    pub fn ring_shape(&self) -> crate::window::RingShape {
        crate::window::RingShape {
            slice_ms: self.slice_ms,
            slices: self.ring_slices(),
            tdigest_size: self.tdigest_size,
            long_input_tokens: self.long_input_tokens,
            short_output_tokens: self.short_output_tokens,
            slow_request_ms: self.slow_request_ms,
        }
    }
    /// The views signals are measured over.
    pub fn horizons(&self) -> crate::signals::Horizons {
        crate::signals::Horizons {
            short_window_ms: self.short_window_ms,
            long_window_ms: self.long_window_ms,
            quantile_min_tail: self.quantile_min_tail,
            baseline_min_windows: self.baseline_min_windows,
        }
    }
    /// Number of slices in the short view.
    pub fn short_slices(&self) -> usize {
        (self.short_window_ms / self.slice_ms) as usize
    }

    fn validate(&self, v: &mut Issues) {
        for (k, x) in [
            ("slice_ms", self.slice_ms),
            ("short_window_ms", self.short_window_ms),
            ("long_window_ms", self.long_window_ms),
            ("evaluation_interval_ms", self.evaluation_interval_ms),
            ("silent_after_ms", self.silent_after_ms),
            ("quota_horizon_ms", self.quota_horizon_ms),
        ] {
            v.positive_ms(format!("engine.{k}"), x);
        }
        if self.allowed_lateness_ms < 0 {
            v.push("engine.allowed_lateness_ms", "must be >= 0");
        }
        if self
            .max_clock_skew_ms
            .is_some_and(|k| k < 0 || k > self.allowed_lateness_ms)
        {
            v.push(
                "engine.max_clock_skew_ms",
                "must be within [0, engine.allowed_lateness_ms] (a gateway ahead by less than \
                 the skew must not make the others' events too late)",
            );
        }
        if self.clock_jump_events == 0 {
            v.push("engine.clock_jump_events", "must be at least 1");
        }
        if self.slice_ms > 0 {
            if self.short_window_ms % self.slice_ms != 0 {
                v.push(
                    "engine.short_window_ms",
                    "must be a multiple of engine.slice_ms",
                );
            }
            if self.long_window_ms % self.slice_ms != 0 {
                v.push(
                    "engine.long_window_ms",
                    "must be a multiple of engine.slice_ms",
                );
            }
            if self.long_window_ms / self.slice_ms > 720 {
                v.push(
                    "engine.long_window_ms",
                    "is more than 720 slices: memory per channel grows with the ring",
                );
            }
            if self.allowed_lateness_ms + self.short_window_ms > self.long_window_ms {
                v.push(
                    "engine.allowed_lateness_ms",
                    "plus short_window_ms must fit in long_window_ms (late events need a slice to land in)",
                );
            }
        }
        if self.short_window_ms > self.long_window_ms {
            v.push(
                "engine.short_window_ms",
                "must not exceed engine.long_window_ms",
            );
        }
        if self.outcome_window == 0 || self.outcome_window > 10_000 {
            v.push("engine.outcome_window", "must be within 1..=10000");
        }
        if !(20..=1000).contains(&self.tdigest_size) {
            v.push("engine.tdigest_size", "must be within 20..=1000");
        }
        if self.baseline_windows == 0 {
            v.push("engine.baseline_windows", "must be at least 1");
        }
        if self.baseline_min_windows > self.baseline_windows {
            v.push(
                "engine.baseline_min_windows",
                "must not exceed engine.baseline_windows",
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Health policy: signal bounds and weights, state machine
// ---------------------------------------------------------------------------

/// One leg of the recovery schedule: while the recovery weight is below
/// `until`, raise it by `step` every `every_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecoveryStep {
    pub until: f64,
    pub step: f64,
    pub every_ms: i64,
}

/// The graded state machine's thresholds and timers (SPEC §5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StatePolicy {
    /// Score at or above which HEALTHY becomes AT_RISK. SPEC §5 / seed 000.
    pub at_risk_enter: f64,
    /// Score below which AT_RISK returns to HEALTHY (hysteresis: below entry).
    pub at_risk_exit: f64,
    /// Score at or above which a channel is drained once confirmed.
    pub drain_enter: f64,
    /// Health weight factor while AT_RISK. SPEC §5 / seed 000: weight × 0.3,
    /// keeping only low-risk batch traffic.
    pub at_risk_weight: f64,
    /// Consecutive evaluations at or above `at_risk_enter` before AT_RISK.
    /// Seed 004: free lines trip after 2, paid after 3.
    pub at_risk_confirmations: u32,
    /// Consecutive evaluations at or above `drain_enter` before DRAINED.
    /// SPEC §5 / seed 000: two consecutive windows.
    pub drain_confirmations: u32,
    /// Consecutive evaluations below `at_risk_exit` before AT_RISK → HEALTHY.
    /// A full short window (12 × 5 s): a channel at 30 % weight sees few
    /// requests, and a periodic fault (seed 004: a pulse every 40 s) must not
    /// slip out between two pulses and flap back in.
    pub healthy_confirmations: u32,
    /// Consecutive hard failures that drain immediately (fast path). SPEC §5:
    /// 3–5, lower for free channels.
    pub consecutive_failures: u32,
    /// Base cool-down in DRAINED before OBSERVING. SPEC §5: 90–120 s; seed
    /// 002 cut 300 s to 90 s because long cool-downs stalled recovery.
    pub cooldown_ms: i64,
    /// Each remembered incident multiplies the cool-down by this.
    pub cooldown_growth: f64,
    /// Cap on the grown cool-down.
    pub max_cooldown_ms: i64,
    /// The incident penalty halves over this much event time.
    pub penalty_half_life_ms: i64,
    /// Share of the channel's normal weight given to it while OBSERVING
    /// (seed 002: 5 % half-open traffic).
    pub half_open_share: f64,
    /// Consecutive passing evaluations in OBSERVING before RECOVERING.
    pub observe_passes: u32,
    /// While OBSERVING, a signal votes once it has this many samples even if
    /// its own `min_samples` is higher: there the risk is calling a sick
    /// channel healthy, not the reverse. An OBSERVING evaluation only counts
    /// as a pass when at least this many
    /// real attempts (probes too when `half_open_share` is 0) arrived since
    /// the channel was let back in, enough for the latency signals to vote:
    /// with a 5 % share few signals have enough samples to vote, and a score
    /// summed over too few voters reads healthier than the channel is. 200
    /// samples see a fault that hits 2.5 % of requests (seed 004's 1 s pulse
    /// every 40 s) with 99.4 % probability; 100 miss it one time in 13, and
    /// a long fault gets many probations, so luck would let it back in.
    pub probation_min_samples: u32,
    /// Recovery fits the traffic (SPEC §5a): a probation that has run this
    /// long may pass on fewer than `probation_min_samples` attempts (probes
    /// included), given `probation_floor_samples`. A sparse channel (0.2–1
    /// rps) would otherwise stay OBSERVING for hours.
    pub probation_max_wait_ms: i64,
    /// The least evidence any pass rests on.
    pub probation_floor_samples: u32,
    /// An OBSERVING evaluation passes below this score (SPEC §5: 0.4).
    pub observe_pass_score: f64,
    /// In OBSERVING or RECOVERING, an evaluation at or above this score is a
    /// failure and drains again.
    pub relapse_score: f64,
    /// On probation (OBSERVING, RECOVERING) a channel sees few attempts, so
    /// its rate signals are read with a Wilson confidence bound this many
    /// standard deviations wide (one-sided): a relapse is called only when
    /// even the lower bounds score at `relapse_score`, a pass only when even
    /// the upper bounds score under `observe_pass_score`. At 1.645 each call
    /// has 95 % confidence. A line that normally fails 2 % shows 5 % in 80
    /// attempts every few minutes (seed 003's line relapsed after its fault
    /// ended on that), and a line still failing 10 % shows 3 % in 30
    /// attempts often enough to pass. An OBSERVING pass also reads the tail
    /// latency signals at their upper rank (`signals::Probation`): a
    /// periodic pulse that slowed one of 190 attempts leaves the point P99
    /// clean. 0 judges on the point estimate.
    pub probation_confidence_z: f64,
    /// RECOVERING weight schedule (SPEC §5 / seed 002: +10 % every 120 s up
    /// to 40 %, then +20 %). The first step is also the starting weight.
    pub recovery_steps: Vec<RecoveryStep>,
    /// More weight changes than this within `oscillation_window_ms` raise an
    /// oscillation alarm (SPEC §5: more than 4 in 3 minutes).
    pub oscillation_max_changes: u32,
    pub oscillation_window_ms: i64,
    /// An incident penalty at or above this (incidents, each halving over
    /// `penalty_half_life_ms`) also raises the oscillation alarm: an
    /// upstream that fails again every few minutes after being let back
    /// (three incidents within a half-life) oscillates too slowly for the
    /// 3-minute rule.
    pub oscillation_penalty: f64,
}

impl Default for StatePolicy {
    fn default() -> Self {
        StatePolicy {
            at_risk_enter: 0.45,
            at_risk_exit: 0.35,
            drain_enter: 0.65,
            at_risk_weight: 0.3,
            at_risk_confirmations: 3,
            drain_confirmations: 2,
            healthy_confirmations: 12,
            consecutive_failures: 5,
            cooldown_ms: 120_000,
            cooldown_growth: 2.0,
            // SPEC §5a: back to full weight within 8 min of a fault ending.
            // A grown cool-down of 180 s, a probation of 15–150 s and the
            // 90 s schedule fit; seed 002 cut 300 s cool-downs to 90 s for
            // the same reason.
            max_cooldown_ms: 180_000,
            penalty_half_life_ms: 1_800_000,
            half_open_share: 0.05,
            observe_passes: 3,
            probation_min_samples: 200,
            probation_max_wait_ms: 120_000,
            probation_floor_samples: 20,
            observe_pass_score: 0.40,
            relapse_score: 0.45,
            probation_confidence_z: 1.0,
            // SPEC §5a: full weight within 8 min of a fault ending, with
            // the default config. The SPEC §5 seed schedule (+10 % / 120 s
            // to 40 %, then +20 %) takes 720 s from its first step, so
            // measured drills took 850–980 s; this one takes 90 s, in steps
            // of 30 s in which a channel at 25 % weight still sees enough
            // attempts for a relapse to be called.
            recovery_steps: vec![RecoveryStep {
                until: 1.0,
                step: 0.25,
                every_ms: 30_000,
            }],
            oscillation_max_changes: 4,
            oscillation_window_ms: 180_000,
            oscillation_penalty: 2.5,
        }
    }
}

/// A channel's complete health policy after all layers are merged.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthPolicy {
    pub signals: SignalPolicies,
    pub states: StatePolicy,
}

impl HealthPolicy {
    fn validate(&self, at: &str, v: &mut Issues) {
        validate_signals(&self.signals, at, v);
        self.states.validate(at, v);
    }
}

/// Every signal's bounds and weight, and the two signal settings.
fn validate_signals(signals: &SignalPolicies, at: &str, v: &mut Issues) {
    for (name, s) in signals.entries() {
        let key = format!("{at}.signals.{name}");
        v.non_negative(format!("{key}.weight"), s.weight);
        if !s.normal.is_finite() || !s.degraded.is_finite() {
            v.push(&key, "bounds must be finite numbers");
        } else if s.normal == s.degraded {
            v.push(
                &key,
                format!(
                    "normal and degraded bounds are equal ({}): the signal cannot map",
                    s.normal
                ),
            );
        }
        if s.min_samples == 0 {
            v.push(
                format!("{key}.min_samples"),
                "must be at least 1 (a signal needs data to vote)",
            );
        }
    }
    let z = signals.bad_outcome_confidence_z;
    if !(0.0..=5.0).contains(&z) {
        v.push(
            format!("{at}.signals.bad_outcome_confidence_z"),
            "must be within [0, 5]",
        );
    }
    let total: f64 = signals.entries().iter().map(|(_, s)| s.weight).sum();
    if total.is_nan() || total <= 0.0 {
        v.push(
            format!("{at}.signals"),
            "every signal weight is 0: the score could never move",
        );
    }
    v.fraction(
        format!("{at}.signals.client_error_weight"),
        signals.client_error_weight,
    );
}

impl StatePolicy {
    /// How a probation verdict reads its evidence.
    pub fn probation(&self) -> crate::signals::Probation {
        crate::signals::Probation {
            min_samples: self.probation_min_samples,
            confidence_z: self.probation_confidence_z,
        }
    }

    fn validate(&self, at: &str, v: &mut Issues) {
        let st = self;
        let sk = |k: &str| format!("{at}.states.{k}");
        for (k, x) in [
            ("at_risk_enter", st.at_risk_enter),
            ("at_risk_exit", st.at_risk_exit),
            ("drain_enter", st.drain_enter),
            ("at_risk_weight", st.at_risk_weight),
            ("half_open_share", st.half_open_share),
            ("observe_pass_score", st.observe_pass_score),
            ("relapse_score", st.relapse_score),
        ] {
            v.fraction(sk(k), x);
        }
        if st.at_risk_exit >= st.at_risk_enter {
            v.push(
                sk("at_risk_exit"),
                format!(
                    "must be below at_risk_enter ({}) so the state cannot flap at the boundary",
                    st.at_risk_enter
                ),
            );
        }
        if st.drain_enter <= st.at_risk_enter {
            v.push(
                sk("drain_enter"),
                format!("must be above at_risk_enter ({})", st.at_risk_enter),
            );
        }
        if st.observe_pass_score > st.relapse_score {
            v.push(
                sk("observe_pass_score"),
                "must not exceed relapse_score (a pass would also be a relapse)",
            );
        }
        for (k, x) in [
            ("at_risk_confirmations", st.at_risk_confirmations),
            ("drain_confirmations", st.drain_confirmations),
            ("healthy_confirmations", st.healthy_confirmations),
            ("consecutive_failures", st.consecutive_failures),
            ("observe_passes", st.observe_passes),
            ("probation_min_samples", st.probation_min_samples),
            ("probation_floor_samples", st.probation_floor_samples),
            ("oscillation_max_changes", st.oscillation_max_changes),
        ] {
            if x == 0 {
                v.push(sk(k), "must be at least 1");
            }
        }
        for (k, x) in [
            ("cooldown_ms", st.cooldown_ms),
            ("max_cooldown_ms", st.max_cooldown_ms),
            ("penalty_half_life_ms", st.penalty_half_life_ms),
            ("oscillation_window_ms", st.oscillation_window_ms),
            ("probation_max_wait_ms", st.probation_max_wait_ms),
        ] {
            v.positive_ms(sk(k), x);
        }
        if !(st.probation_confidence_z >= 0.0 && st.probation_confidence_z <= 5.0) {
            v.push(sk("probation_confidence_z"), "must be within [0, 5]");
        }
        if !(st.oscillation_penalty > 0.0 && st.oscillation_penalty.is_finite()) {
            v.push(sk("oscillation_penalty"), "must be a positive number");
        }
        if st.probation_floor_samples > st.probation_min_samples {
            v.push(
                sk("probation_floor_samples"),
                "must not exceed probation_min_samples",
            );
        }
        if st.max_cooldown_ms < st.cooldown_ms {
            v.push(sk("max_cooldown_ms"), "must be at least cooldown_ms");
        }
        if !(st.cooldown_growth >= 1.0 && st.cooldown_growth <= 10.0) {
            v.push(sk("cooldown_growth"), "must be within [1, 10]");
        }
        self.validate_recovery_steps(at, v);
    }

    /// The recovery schedule: steps in (0, 1], `until` rising to 1.0.
    fn validate_recovery_steps(&self, at: &str, v: &mut Issues) {
        let st = self;
        let sk = |k: &str| format!("{at}.states.{k}");
        if st.recovery_steps.is_empty() {
            v.push(sk("recovery_steps"), "needs at least one step");
        }
        let mut prev_until = 0.0;
        for (i, s) in st.recovery_steps.iter().enumerate() {
            let key = format!("{at}.states.recovery_steps[{i}]");
            if !(s.step > 0.0 && s.step <= 1.0) {
                v.push(format!("{key}.step"), "must be within (0, 1]");
            }
            if !(s.until > prev_until && s.until <= 1.0) {
                v.push(
                    format!("{key}.until"),
                    "must increase from step to step and be at most 1",
                );
            }
            v.positive_ms(format!("{key}.every_ms"), s.every_ms);
            prev_until = s.until;
        }
        if st
            .recovery_steps
            .last()
            .is_some_and(|s| (s.until - 1.0).abs() > 1e-9)
        {
            v.push(
                sk("recovery_steps"),
                "the last step must reach until = 1.0 (full weight)",
            );
        }
    }
}

/// Built-in free-tier overrides (partial policy). Seed 004 made trust tiers
/// explicit: free lines trip faster and on lower thresholds ("P99 500 ms twice
/// vs paid 800 ms three times", scaled to our LLM latency bounds); seed 002
/// lowered the free error threshold below the paid one and cut the cool-down
/// to 90 s.
const FREE_TIER_POLICY: &str = r#"
[signals.p99_latency_ms]
weight = 0.25
normal = 1500.0
degraded = 4500.0
min_samples = 50

[signals.error_rate]
weight = 0.20
normal = 0.005
degraded = 0.03
min_samples = 20

[states]
at_risk_confirmations = 2
consecutive_failures = 4
cooldown_ms = 90000
"#;

// ---------------------------------------------------------------------------
// Alerts, scheduling, traffic classes
// ---------------------------------------------------------------------------

/// Alert rules (SPEC §7).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlertConfig {
    /// The same (channel, kind) alert is raised at most once per window.
    /// Transitions are never deduplicated: every one is an action.
    pub dedup_window_ms: i64,
    /// SPEC §7: error rate above this *and* P99 above `p1_p99_ms` is P1.
    pub p1_error_rate: f64,
    /// SPEC §7: P99 above this alone is P2.
    pub p1_p99_ms: f64,
    /// SPEC §7: more consecutive probe failures than this is P1 "upstream
    /// unavailable".
    pub probe_failures_p1: u32,
    /// A 429 share above this raises a rate-limit spike alert.
    pub rate_limit_spike: f64,
    /// ... once at least this many attempts are behind the share.
    pub rate_limit_min_samples: u32,
    /// Quota forecast to run out within this raises a quota alert. Longer
    /// than `engine.quota_horizon_ms`, where the scheduler starts planning
    /// the channel down: planned down, the forecast settles near that
    /// horizon, and an alert set under it would never fire (seen in the
    /// quota-cliff drill with 30 min).
    pub quota_alert_ms: i64,
    /// DECODE_ERROR_SPIKE: raised (per dead-letter reason, deduplicated) when
    /// that reason's share of the records read over `dead_letter_window_ms`
    /// reaches this ...
    pub dead_letter_share: f64,
    /// ... once at least this many records were read in the window.
    pub dead_letter_min_records: u32,
    pub dead_letter_window_ms: i64,
}

impl Default for AlertConfig {
    fn default() -> Self {
        AlertConfig {
            dedup_window_ms: 300_000,
            p1_error_rate: 0.02,
            p1_p99_ms: 800.0,
            probe_failures_p1: 6,
            rate_limit_spike: 0.05,
            rate_limit_min_samples: 20,
            quota_alert_ms: 4_500_000,
            dead_letter_share: 0.01,
            dead_letter_min_records: 100,
            dead_letter_window_ms: 60_000,
        }
    }
}

/// Group-level safety (SPEC §5a; the mechanism is in `safety`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SafetyConfig {
    /// Panic mode on or off (on: SPEC §5a asks for it).
    pub enabled: bool,
    /// Share of a group's capacity that must be bad at once for a correlated
    /// failure. 0.5, like Envoy's default panic threshold (50 %).
    pub panic_threshold: f64,
    /// At least this many channels bad at once: one channel is a channel
    /// fault whatever share of the capacity it carries.
    pub panic_min_channels: u32,
    /// Consecutive evaluations without the condition before panic ends.
    pub panic_exit_evaluations: u32,
    /// A drain this recent counts as the same event: a network blip fast-path
    /// drains each channel within seconds of the others, before a tick sees
    /// them together.
    pub correlation_window_ms: i64,
}

impl Default for SafetyConfig {
    fn default() -> Self {
        SafetyConfig {
            enabled: true,
            panic_threshold: 0.5,
            panic_min_channels: 2,
            panic_exit_evaluations: 3,
            correlation_window_ms: 60_000,
        }
    }
}

fn validate_safety(s: &SafetyConfig, v: &mut Issues) {
    if !(s.panic_threshold > 0.0 && s.panic_threshold <= 1.0) {
        v.push("safety.panic_threshold", "must be within (0, 1]");
    }
    if s.panic_min_channels < 2 {
        v.push(
            "safety.panic_min_channels",
            "must be at least 2 (one channel is a channel fault)",
        );
    }
    if s.panic_exit_evaluations == 0 {
        v.push("safety.panic_exit_evaluations", "must be at least 1");
    }
    v.positive_ms(
        "safety.correlation_window_ms".into(),
        s.correlation_window_ms,
    );
}

/// Scheduler knobs (SPEC §6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScheduleConfig {
    /// Never plan more than capacity × headroom on a channel (seed 002: the
    /// backup that collapsed under doubled traffic).
    pub capacity_headroom: f64,
    /// Largest change of one channel's weight per evaluation tick, except
    /// drains (immediate). Seed 002: at most 15 % per round.
    pub max_weight_step: f64,
    /// Demand is estimated over this much event time.
    pub demand_window_ms: i64,
    /// Weights below this are dropped to zero (and the rest renormalized).
    pub min_weight: f64,
    /// SPEC §5a, "health never sheds what static routing would have served":
    /// demand that healthy capacity cannot take goes to the least-bad
    /// unhealthy channels (lowest score first, within capacity) rather than
    /// being shed, unless a channel's measured failure rate (hard failures
    /// and bad answers, the `bad_outcome_rate` signal) is at or above this:
    /// a request sent there is about as lost as a shed one. The score is no
    /// guide here: it saturates at 1 for a channel that still serves 90 %.
    pub overflow_max_failure_rate: f64,
    /// A group's budget is planned at `budget × (1 − budget_margin)`, after
    /// scaling the projection by what the group was measured to spend
    /// against what was planned (see `schedule::Scheduler`): the budget must
    /// hold in every hour, so the plan keeps a little room for noise and
    /// for the lag between a plan and the spend it causes.
    pub budget_margin: f64,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig {
            capacity_headroom: 0.8,
            max_weight_step: 0.15,
            demand_window_ms: 60_000,
            min_weight: 0.001,
            overflow_max_failure_rate: 0.9,
            budget_margin: 0.03,
        }
    }
}

/// How a traffic class is scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassPolicy {
    /// 0 is served first.
    pub priority: u8,
    /// May this class stay on an AT_RISK channel (seed 000: batch may).
    pub accepts_at_risk: bool,
    /// Highest channel score this class tolerates.
    pub max_score: f64,
    /// Whether the class may be shed when capacity is short (else it is
    /// queued on the least-bad channel and reported).
    pub sheddable: bool,
}

/// Per-class policies, keyed by class name in TOML.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClassPolicies {
    pub interactive: ClassPolicy,
    pub core: ClassPolicy,
    pub batch: ClassPolicy,
    pub experimental: ClassPolicy,
}

impl Default for ClassPolicies {
    fn default() -> Self {
        ClassPolicies {
            interactive: ClassPolicy {
                priority: 0,
                accepts_at_risk: false,
                max_score: 0.45,
                sheddable: true,
            },
            core: ClassPolicy {
                priority: 1,
                accepts_at_risk: false,
                max_score: 0.45,
                sheddable: true,
            },
            batch: ClassPolicy {
                priority: 2,
                accepts_at_risk: true,
                max_score: 0.65,
                sheddable: true,
            },
            experimental: ClassPolicy {
                priority: 3,
                accepts_at_risk: true,
                max_score: 0.65,
                sheddable: true,
            },
        }
    }
}

impl ClassPolicies {
    pub fn get(&self, class: TrafficClass) -> &ClassPolicy {
        match class {
            TrafficClass::Interactive => &self.interactive,
            TrafficClass::Core => &self.core,
            TrafficClass::Batch => &self.batch,
            TrafficClass::Experimental => &self.experimental,
        }
    }
    /// Classes in serving order (priority, then schema order).
    pub fn in_priority_order(&self) -> [TrafficClass; 4] {
        let mut all = [
            TrafficClass::Interactive,
            TrafficClass::Core,
            TrafficClass::Batch,
            TrafficClass::Experimental,
        ];
        all.sort_by_key(|c| (self.get(*c).priority, c.index()));
        all
    }
}

// ---------------------------------------------------------------------------
// Channels and groups
// ---------------------------------------------------------------------------

/// How far a channel is trusted; picks the policy layer and initial weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    Free,
    Paid,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Free => "free",
            Tier::Paid => "paid",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTier {
    /// Relative weight a channel of this tier starts with while nothing is
    /// known (seed 004: free 30 / paid 70 instead of 50 / 50).
    initial_weight: Option<f64>,
    policy: Option<toml::Table>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawChannel {
    id: String,
    tier: Tier,
    #[serde(default)]
    price_per_1k_tokens: f64,
    capacity_rps: f64,
    initial_weight: Option<f64>,
    quota: Option<u64>,
    quota_period_ms: Option<i64>,
    policy: Option<toml::Table>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGroup {
    id: String,
    budget_per_hour: Option<f64>,
    #[serde(default)]
    channels: Vec<RawChannel>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    engine: EngineConfig,
    #[serde(default)]
    alerts: AlertConfig,
    #[serde(default)]
    schedule: ScheduleConfig,
    #[serde(default)]
    safety: SafetyConfig,
    #[serde(default)]
    traffic_classes: ClassPolicies,
    policy: Option<toml::Table>,
    #[serde(default)]
    tiers: BTreeMap<Tier, RawTier>,
    #[serde(default)]
    groups: Vec<RawGroup>,
    #[serde(default)]
    kafka: KafkaConfig,
    #[serde(default)]
    redis: RedisConfig,
    #[serde(default)]
    service: ServiceConfig,
}

/// A channel's quota period unless it says otherwise: a day, the period
/// free tiers count in (seed 002).
pub const DEFAULT_QUOTA_PERIOD_MS: i64 = 86_400_000;

/// One upstream route, fully resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelConfig {
    pub id: String,
    pub group: String,
    pub tier: Tier,
    /// Price per 1k tokens (input + output), 0 for free channels.
    pub price_per_1k_tokens: f64,
    /// Requests per second the channel can serve before it degrades.
    pub capacity_rps: f64,
    /// Relative weight while nothing is known (tier default unless set).
    pub initial_weight: f64,
    /// Quota per day if the upstream enforces one (requests), else none.
    /// Attempts the upstream allows per `quota_period_ms` (seed 002's free
    /// tier), used when gateways do not report `quota_remaining`.
    pub quota: Option<u64>,
    /// The quota's period; periods start at multiples of it since the epoch
    /// (a day: midnight UTC).
    pub quota_period_ms: i64,
    pub policy: Arc<HealthPolicy>,
}

/// A set of interchangeable channels.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupConfig {
    pub id: String,
    /// Spend ceiling per hour in the cost currency; none means unbounded.
    pub budget_per_hour: Option<f64>,
    pub channels: Vec<ChannelConfig>,
}

/// The validated configuration the engine runs on.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub engine: EngineConfig,
    pub alerts: AlertConfig,
    pub schedule: ScheduleConfig,
    pub safety: SafetyConfig,
    pub classes: ClassPolicies,
    pub groups: Vec<GroupConfig>,
    /// Where `hermes run` connects to (not used by the engine itself).
    pub kafka: KafkaConfig,
    pub redis: RedisConfig,
    pub service: ServiceConfig,
}

impl Config {
    /// A reloaded config as it may go live next to the running one: the
    /// restart-only sections (`[kafka]`, `[redis]`, `[service]`: clients,
    /// topics, listeners and loops built at start) keep their running
    /// values, so nothing runs half on the old and half on the new. Returns
    /// it with the names of the restart-only sections the file changed.
    pub fn live_reload(&self, mut new: Config) -> (Config, Vec<&'static str>) {
        let mut held = Vec::new();
        if new.kafka != self.kafka {
            held.push("kafka");
            new.kafka = self.kafka.clone();
        }
        if new.redis != self.redis {
            held.push("redis");
            new.redis = self.redis.clone();
        }
        if new.service != self.service {
            held.push("service");
            new.service = self.service.clone();
        }
        (new, held)
    }
}

/// Every section that is checked on its own (not the policy layers or the
/// groups).
fn validate_sections(raw: &RawConfig, v: &mut Issues) {
    raw.engine.validate(v);
    validate_alerts(&raw.alerts, v);
    if raw.alerts.quota_alert_ms <= raw.engine.quota_horizon_ms {
        v.push(
            "alerts.quota_alert_ms",
            format!(
                "must exceed engine.quota_horizon_ms ({} ms): a channel planned down for \
                 its quota keeps its forecast near that horizon, so the alert would never fire",
                raw.engine.quota_horizon_ms
            ),
        );
    }
    validate_schedule(&raw.schedule, v);
    validate_safety(&raw.safety, v);
    raw.kafka.validate(v);
    raw.service.validate(v);
    for class in TrafficClass::ALL {
        let c = raw.traffic_classes.get(*class);
        let name = class.as_str().to_ascii_lowercase();
        v.fraction(format!("traffic_classes.{name}.max_score"), c.max_score);
    }
}

/// The policy layers up to each tier: built-in defaults → `[policy]` →
/// built-in tier defaults → `[tiers.<tier>.policy]`, as TOML (a channel's
/// override merges onto it) and resolved (shared by every channel of the
/// tier that overrides nothing).
struct TierPolicies {
    tables: BTreeMap<Tier, toml::Table>,
    resolved: BTreeMap<Tier, Arc<HealthPolicy>>,
}

impl TierPolicies {
    fn resolve(raw: &RawConfig, v: &mut Issues) -> TierPolicies {
        let mut base = policy_table(&HealthPolicy::default());
        if let Some(p) = &raw.policy {
            deep_merge(&mut base, p);
        }
        // Problems in [policy] itself are reported once, under `policy`, not
        // again under every tier that inherits them.
        let mut base_issue_keys = ahash::AHashSet::new();
        match base.clone().try_into::<HealthPolicy>() {
            Ok(p) => {
                let mut base_issues = Issues::default();
                p.validate("policy", &mut base_issues);
                for i in base_issues.0 {
                    base_issue_keys.insert(i.key["policy".len()..].to_string());
                    v.0.push(i);
                }
            }
            Err(e) => v.push("policy", e.message().to_string()),
        }
        let mut tables = BTreeMap::new();
        let mut resolved = BTreeMap::new();
        for tier in [Tier::Free, Tier::Paid] {
            let mut t = base.clone();
            deep_merge(&mut t, &builtin_tier_policy(tier));
            if let Some(p) = raw.tiers.get(&tier).and_then(|r| r.policy.as_ref()) {
                deep_merge(&mut t, p);
            }
            let at = format!("tiers.{}.policy", tier.as_str());
            match t.clone().try_into::<HealthPolicy>() {
                Ok(p) => {
                    let mut tier_issues = Issues::default();
                    p.validate(&at, &mut tier_issues);
                    v.0.extend(
                        tier_issues
                            .0
                            .into_iter()
                            .filter(|i| !base_issue_keys.contains(&i.key[at.len()..])),
                    );
                    resolved.insert(tier, Arc::new(p));
                }
                Err(e) => v.push(at, e.message().to_string()),
            }
            tables.insert(tier, t);
        }
        TierPolicies { tables, resolved }
    }
}

/// Ids seen so far: unique across the config.
#[derive(Default)]
struct Ids {
    groups: ahash::AHashSet<String>,
    channels: ahash::AHashSet<String>,
}

/// A channel's initial weight: its own, its tier's, or the built-in one.
fn initial_weight_of(raw: &RawConfig, c: &RawChannel) -> f64 {
    c.initial_weight
        .or_else(|| raw.tiers.get(&c.tier).and_then(|t| t.initial_weight))
        .unwrap_or_else(|| builtin_initial_weight(c.tier))
}

fn resolve_group(
    gi: usize,
    g: &RawGroup,
    raw: &RawConfig,
    tiers: &TierPolicies,
    ids: &mut Ids,
    v: &mut Issues,
) -> GroupConfig {
    let gk = format!("groups[{gi}] ({})", g.id);
    if g.id.is_empty() {
        v.push(format!("groups[{gi}].id"), "must not be empty");
    }
    if !ids.groups.insert(g.id.clone()) {
        v.push(format!("{gk}.id"), "duplicate group id");
    }
    if g.id.contains(['{', '}']) {
        v.push(
            format!("{gk}.id"),
            "must not contain braces (they delimit the Redis hash tag)",
        );
    }
    if let Some(b) = g.budget_per_hour {
        v.non_negative(format!("{gk}.budget_per_hour"), b);
    }
    if g.channels.is_empty() {
        v.push(
            format!("{gk}.channels"),
            "a group needs at least one channel",
        );
    }
    let channels = g
        .channels
        .iter()
        .enumerate()
        .filter_map(|(ci, c)| resolve_channel(&gk, ci, c, g, raw, tiers, ids, v))
        .collect();
    if !g.channels.is_empty() && g.channels.iter().all(|c| initial_weight_of(raw, c) <= 0.0) {
        v.push(
            format!("{gk}.channels"),
            "every channel has initial_weight 0: the group could serve nothing",
        );
    }
    GroupConfig {
        id: g.id.clone(),
        budget_per_hour: g.budget_per_hour,
        channels,
    }
}

/// One channel, its policy merged onto its tier's; `None` when the policy
/// does not resolve (the issue is recorded).
#[allow(clippy::too_many_arguments)]
fn resolve_channel(
    gk: &str,
    ci: usize,
    c: &RawChannel,
    g: &RawGroup,
    raw: &RawConfig,
    tiers: &TierPolicies,
    ids: &mut Ids,
    v: &mut Issues,
) -> Option<ChannelConfig> {
    let ck = format!("{gk}.channels[{ci}] ({})", c.id);
    if c.id.is_empty() {
        v.push(format!("{gk}.channels[{ci}].id"), "must not be empty");
    }
    if !ids.channels.insert(c.id.clone()) {
        v.push(
            format!("{ck}.id"),
            "duplicate channel id (a channel belongs to exactly one group)",
        );
    }
    v.non_negative(format!("{ck}.price_per_1k_tokens"), c.price_per_1k_tokens);
    if let Some(ms) = c.quota_period_ms {
        v.positive_ms(format!("{ck}.quota_period_ms"), ms);
    }
    if !(c.capacity_rps > 0.0 && c.capacity_rps.is_finite()) {
        v.push(
            format!("{ck}.capacity_rps"),
            format!("must be a positive number, got {}", c.capacity_rps),
        );
    }
    let initial_weight = initial_weight_of(raw, c);
    if c.initial_weight.is_some() {
        v.fraction(format!("{ck}.initial_weight"), initial_weight);
    }
    let policy = match &c.policy {
        None => tiers.resolved.get(&c.tier).cloned(),
        Some(over) => {
            let mut t = tiers.tables[&c.tier].clone();
            deep_merge(&mut t, over);
            match t.try_into::<HealthPolicy>() {
                Ok(p) => {
                    p.validate(&format!("{ck}.policy"), v);
                    Some(Arc::new(p))
                }
                Err(e) => {
                    v.push(format!("{ck}.policy"), e.message().to_string());
                    None
                }
            }
        }
    }?;
    Some(ChannelConfig {
        id: c.id.clone(),
        group: g.id.clone(),
        tier: c.tier,
        price_per_1k_tokens: c.price_per_1k_tokens,
        capacity_rps: c.capacity_rps,
        initial_weight,
        quota: c.quota,
        quota_period_ms: c.quota_period_ms.unwrap_or(DEFAULT_QUOTA_PERIOD_MS),
        policy,
    })
}

fn deep_merge(base: &mut toml::Table, over: &toml::Table) {
    for (k, v) in over {
        match (base.get_mut(k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => deep_merge(b, o),
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
}

fn policy_table(policy: &HealthPolicy) -> toml::Table {
    match toml::Table::try_from(policy) {
        Ok(t) => t,
        // HealthPolicy is plain numbers, bools and arrays of tables.
        Err(e) => panic!("HealthPolicy must serialize to TOML: {e}"),
    }
}

fn builtin_tier_policy(tier: Tier) -> toml::Table {
    match tier {
        Tier::Free => FREE_TIER_POLICY
            .parse()
            .unwrap_or_else(|e| panic!("built-in free tier policy does not parse: {e}")),
        Tier::Paid => toml::Table::new(),
    }
}

fn builtin_initial_weight(tier: Tier) -> f64 {
    match tier {
        Tier::Free => 0.3,
        Tier::Paid => 0.7,
    }
}

impl Config {
    /// Reads and validates a config file.
    pub fn from_file(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::one(path.display().to_string(), format!("cannot read: {e}"))
        })?;
        Config::from_toml(&text)
    }

    /// Parses and validates config text.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let key = e
                .span()
                .map(|s| format!("line {}", text[..s.start].lines().count().max(1)))
                .unwrap_or_else(|| "config".into());
            ConfigError::one(key, e.message().to_string())
        })?;
        Config::resolve(raw)
    }

    fn resolve(raw: RawConfig) -> Result<Config, ConfigError> {
        let mut v = Issues::default();
        validate_sections(&raw, &mut v);
        let tiers = TierPolicies::resolve(&raw, &mut v);
        for (tier, r) in &raw.tiers {
            if let Some(w) = r.initial_weight {
                v.fraction(format!("tiers.{}.initial_weight", tier.as_str()), w);
            }
        }
        let mut ids = Ids::default();
        if raw.groups.is_empty() {
            v.push("groups", "at least one route group is needed");
        }
        let groups = raw
            .groups
            .iter()
            .enumerate()
            .map(|(gi, g)| resolve_group(gi, g, &raw, &tiers, &mut ids, &mut v))
            .collect();
        if !v.0.is_empty() {
            return Err(ConfigError { issues: v.0 });
        }
        Ok(Config {
            engine: raw.engine,
            alerts: raw.alerts,
            schedule: raw.schedule,
            safety: raw.safety,
            classes: raw.traffic_classes,
            groups,
            kafka: raw.kafka,
            redis: raw.redis,
            service: raw.service,
        })
    }

    /// Every channel, in config order (groups, then channels).
    pub fn channels(&self) -> impl Iterator<Item = &ChannelConfig> {
        self.groups.iter().flat_map(|g| g.channels.iter())
    }

    /// A config with one group of the given channels and all defaults; for
    /// tests and examples.
    pub fn single_group(group: &str, channels: &[(&str, Tier, f64, f64)]) -> Config {
        let mut text = format!("[[groups]]\nid = \"{group}\"\n");
        for (id, tier, price, cap) in channels {
            text.push_str(&format!(
                "[[groups.channels]]\nid = \"{id}\"\ntier = \"{}\"\nprice_per_1k_tokens = {price:?}\ncapacity_rps = {cap:?}\n",
                tier.as_str()
            ));
        }
        match Config::from_toml(&text) {
            Ok(c) => c,
            Err(e) => panic!("single_group config is invalid: {e}"),
        }
    }
}

fn validate_alerts(a: &AlertConfig, v: &mut Issues) {
    v.positive_ms("alerts.dedup_window_ms".into(), a.dedup_window_ms);
    v.positive_ms("alerts.quota_alert_ms".into(), a.quota_alert_ms);
    v.fraction("alerts.p1_error_rate".into(), a.p1_error_rate);
    v.fraction("alerts.rate_limit_spike".into(), a.rate_limit_spike);
    v.non_negative("alerts.p1_p99_ms".into(), a.p1_p99_ms);
    if a.probe_failures_p1 == 0 {
        v.push("alerts.probe_failures_p1", "must be at least 1");
    }
    if !(a.dead_letter_share > 0.0 && a.dead_letter_share <= 1.0) {
        v.push("alerts.dead_letter_share", "must be within (0, 1]");
    }
    v.positive_ms(
        "alerts.dead_letter_window_ms".into(),
        a.dead_letter_window_ms,
    );
}

fn validate_schedule(s: &ScheduleConfig, v: &mut Issues) {
    if !(s.capacity_headroom > 0.0 && s.capacity_headroom <= 1.0) {
        v.push(
            "schedule.capacity_headroom",
            format!("must be within (0, 1], got {}", s.capacity_headroom),
        );
    }
    if !(s.max_weight_step > 0.0 && s.max_weight_step <= 1.0) {
        v.push("schedule.max_weight_step", "must be within (0, 1]");
    }
    v.positive_ms("schedule.demand_window_ms".into(), s.demand_window_ms);
    if !(0.0..0.5).contains(&s.min_weight) {
        v.push("schedule.min_weight", "must be within [0, 0.5)");
    }
    if !(s.overflow_max_failure_rate > 0.0 && s.overflow_max_failure_rate <= 1.0) {
        v.push(
            "schedule.overflow_max_failure_rate",
            "must be within (0, 1]",
        );
    }
    if !(0.0..0.5).contains(&s.budget_margin) {
        v.push("schedule.budget_margin", "must be within [0, 0.5)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reload_keeps_the_restart_only_sections_running() {
        let running = Config::from_toml(MINIMAL).unwrap();
        let mut edited = running.clone();
        edited.kafka.alert_topic = "elsewhere".into();
        edited.service.heartbeat_ms += 1;
        edited.schedule.capacity_headroom = 0.7;
        let (live, held) = running.live_reload(edited);
        assert_eq!(held, ["kafka", "service"]);
        assert_eq!(live.kafka, running.kafka);
        assert_eq!(live.service, running.service);
        assert_eq!(live.schedule.capacity_headroom, 0.7, "policy applies live");
        let (same, held) = running.live_reload(running.clone());
        assert!(held.is_empty() && same == running);
    }

    const MINIMAL: &str = r#"
[[groups]]
id = "chat"
[[groups.channels]]
id = "free-a"
tier = "free"
capacity_rps = 20
[[groups.channels]]
id = "paid-a"
tier = "paid"
price_per_1k_tokens = 0.5
capacity_rps = 40
"#;

    #[test]
    fn minimal_config_gets_seed_defaults_and_tier_layers() {
        let c = Config::from_toml(MINIMAL).unwrap();
        let free = &c.groups[0].channels[0];
        let paid = &c.groups[0].channels[1];
        assert_eq!(free.initial_weight, 0.3);
        assert_eq!(paid.initial_weight, 0.7);
        assert_eq!(free.policy.states.consecutive_failures, 4);
        assert_eq!(paid.policy.states.consecutive_failures, 5);
        assert_eq!(
            paid.policy
                .signals
                .get(crate::signals::SignalKind::P99Latency)
                .normal,
            2000.0
        );
        assert_eq!(
            free.policy
                .signals
                .get(crate::signals::SignalKind::P99Latency)
                .normal,
            1500.0
        );
        assert_eq!(paid.policy.states.at_risk_enter, 0.45);
        assert_eq!(c.engine.outcome_window, 100);
    }

    #[test]
    fn the_example_config_is_valid() {
        let text = include_str!("../hermes.example.toml");
        Config::from_toml(text).unwrap();
    }

    #[test]
    fn the_compose_config_is_valid() {
        let c = Config::from_toml(include_str!("../compose/hermes.toml")).unwrap();
        assert_eq!(c.kafka.brokers, "kafka:9092");
        assert!(c.redis.url.starts_with("redis://redis:"));
    }

    #[test]
    fn service_settings_are_validated_with_their_keys() {
        let text = format!(
            "{MINIMAL}\n[kafka]\nalert_topic = \"hermes.requests\"\n[service]\nhttp_listen = \"nowhere\"\ncommit_interval_ms = 0\n"
        );
        let e = Config::from_toml(&text).unwrap_err().to_string();
        for key in [
            "kafka.alert_topic",
            "service.http_listen",
            "service.commit_interval_ms",
        ] {
            assert!(e.contains(key), "{key} missing in: {e}");
        }
    }

    #[test]
    fn channel_override_touches_one_key() {
        let text =
            format!("{MINIMAL}\n[groups.channels.policy.signals.p99_latency_ms]\nnormal = 900.0\n");
        let c = Config::from_toml(&text).unwrap();
        let paid = &c.groups[0].channels[1];
        assert_eq!(
            paid.policy
                .signals
                .get(crate::signals::SignalKind::P99Latency)
                .normal,
            900.0
        );
        assert_eq!(
            paid.policy
                .signals
                .get(crate::signals::SignalKind::P99Latency)
                .degraded,
            6000.0
        );
    }

    fn issues(text: &str) -> Vec<String> {
        Config::from_toml(text)
            .unwrap_err()
            .issues
            .iter()
            .map(|i| i.to_string())
            .collect()
    }

    #[test]
    fn errors_name_the_offending_key() {
        let bad = MINIMAL.replace("capacity_rps = 40", "capacity_rps = -1")
            + "\n[policy.states]\nat_risk_exit = 0.5\ncooldown_ms = -5\n";
        let all = issues(&bad);
        let joined = all.join("\n");
        assert!(
            joined.contains("groups[0] (chat).channels[1] (paid-a).capacity_rps"),
            "{joined}"
        );
        assert!(joined.contains("policy.states.at_risk_exit: must be below at_risk_enter"));
        assert!(
            !joined.contains("tiers.paid.policy.states.at_risk_exit"),
            "reported once: {joined}"
        );
        assert!(joined.contains("policy.states.cooldown_ms: must be a positive duration"));
    }

    #[test]
    fn unknown_keys_and_crossed_bounds_are_refused() {
        let all = issues(&format!("{MINIMAL}\n[engine]\nslise_ms = 5\n"));
        assert!(all[0].contains("unknown field `slise_ms`"), "{all:?}");

        let all = issues(&format!(
            "{MINIMAL}\n[policy.signals.error_rate]\nweight = -1.0\nnormal = 0.05\ndegraded = 0.05\nmin_samples = 0\n"
        ));
        let joined = all.join("\n");
        assert!(joined.contains("signals.error_rate.weight: must be a finite number >= 0"));
        assert!(all.iter().all(|i| !i.starts_with("tiers.paid")), "{all:?}");
        assert!(joined.contains("signals.error_rate: normal and degraded bounds are equal"));
        assert!(joined.contains("signals.error_rate.min_samples"));
    }

    #[test]
    fn duplicate_channels_and_empty_groups_are_refused() {
        let text = format!(
            "{MINIMAL}\n[[groups]]\nid = \"other\"\n[[groups.channels]]\nid = \"free-a\"\ntier = \"free\"\ncapacity_rps = 1\n[[groups]]\nid = \"empty\"\n"
        );
        let joined = issues(&text).join("\n");
        assert!(joined.contains("groups[1] (other).channels[0] (free-a).id: duplicate channel id"));
        assert!(joined.contains("groups[2] (empty).channels: a group needs at least one channel"));
    }

    #[test]
    fn all_zero_weights_are_refused() {
        let mut text = MINIMAL.to_string();
        for (name, _) in HealthPolicy::default().signals.entries() {
            text.push_str(&format!("[policy.signals.{name}]\nweight = 0.0\n"));
        }
        let joined = issues(&text).join("\n");
        assert!(
            joined.contains("policy.signals: every signal weight is 0"),
            "{joined}"
        );
    }

    #[test]
    fn recovery_schedule_must_reach_full_weight() {
        let text = format!(
            "{MINIMAL}\n[[policy.states.recovery_steps]]\nuntil = 0.5\nstep = 0.1\nevery_ms = 1000\n"
        );
        let joined = issues(&text).join("\n");
        assert!(joined.contains("recovery_steps: the last step must reach until = 1.0"));
    }
}
