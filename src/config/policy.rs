//! Health policy (`[policy]`, `[tiers.<tier>.policy]`, a channel's
//! `policy`): signal bounds and weights, the state machine, and the layering
//! that resolves a channel's policy from the built-in defaults up.

use super::{Issues, RawConfig, Tier};
use crate::signals::SignalPolicies;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// One leg of the recovery schedule: while the recovery weight is below
/// `until`, raise it by `step` every `every_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecoveryStep {
    pub until: f64,
    pub step: f64,
    pub every_ms: i64,
}

/// The graded state machine's thresholds and timers (docs/decisions.md#score-and-states).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StatePolicy {
    /// Score at or above which HEALTHY becomes AT_RISK. docs/decisions.md#score-and-states / incident 000.
    pub at_risk_enter: f64,
    /// Score below which AT_RISK returns to HEALTHY (hysteresis: below entry).
    pub at_risk_exit: f64,
    /// Score at or above which a channel is drained once confirmed.
    pub drain_enter: f64,
    /// Health weight factor while AT_RISK. docs/decisions.md#score-and-states / incident 000: weight × 0.3,
    /// keeping only low-risk batch traffic.
    pub at_risk_weight: f64,
    /// Consecutive evaluations at or above `at_risk_enter` before AT_RISK.
    /// Incident 004: free lines trip after 2, paid after 3.
    pub at_risk_confirmations: u32,
    /// Consecutive evaluations at or above `drain_enter` before DRAINED.
    /// docs/decisions.md#score-and-states / incident 000: two consecutive windows.
    pub drain_confirmations: u32,
    /// Consecutive evaluations below `at_risk_exit` before AT_RISK → HEALTHY.
    /// A full short window (12 × 5 s): a channel at 30 % weight sees few
    /// requests, and a periodic fault (incident 004: a pulse every 40 s) must not
    /// slip out between two pulses and flap back in.
    pub healthy_confirmations: u32,
    /// Consecutive hard failures that drain immediately (fast path). docs/decisions.md#score-and-states:
    /// 3–5, lower for free channels.
    pub consecutive_failures: u32,
    /// Base cool-down in DRAINED before OBSERVING. docs/decisions.md#score-and-states: 90–120 s; incident
    /// 002 cut 300 s to 90 s because long cool-downs stalled recovery.
    pub cooldown_ms: i64,
    /// Each remembered incident multiplies the cool-down by this.
    pub cooldown_growth: f64,
    /// Cap on the cool-down grown by one incident's drains and failed
    /// probations: docs/decisions.md#safety-rails's 8 minutes from a fault's end to full weight
    /// must fit it.
    pub max_cooldown_ms: i64,
    /// Cap on the cool-down once relapses after re-admission multiply it
    /// (`cooldown_growth` per relapse, see `state`): an upstream that
    /// alternates good and bad minutes. Envoy's outlier detection caps its
    /// grown ejection time the same way (`max_ejection_time`, 300 s by
    /// default); an upstream flapping every few minutes for an hour needs
    /// a cool-down longer than its cycle, hence 30 minutes.
    pub max_relapse_cooldown_ms: i64,
    /// The incident penalty halves over this much event time.
    pub penalty_half_life_ms: i64,
    /// Share of its group's traffic a channel gets while OBSERVING (incident
    /// 002: 5 % half-open traffic), at least `schedule.half_open_min_rps` and
    /// never above its own normal load; in panic mode, this share of its own
    /// normal load.
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
    /// samples see a fault that hits 2.5 % of requests (incident 004's 1 s pulse
    /// every 40 s) with 99.4 % probability; 100 miss it one time in 13, and
    /// a long fault gets many probations, so luck would let it back in.
    pub probation_min_samples: u32,
    /// Recovery fits the traffic (docs/decisions.md#safety-rails): a probation that has run this
    /// long may pass on fewer than `probation_min_samples` attempts (probes
    /// included), given `probation_floor_samples`. A sparse channel (0.2–1
    /// rps) would otherwise stay OBSERVING for hours.
    pub probation_max_wait_ms: i64,
    /// The least evidence any pass rests on.
    pub probation_floor_samples: u32,
    /// An OBSERVING evaluation passes below this score (docs/decisions.md#score-and-states: 0.4).
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
    /// attempts every few minutes (incident 003's line relapsed after its fault
    /// ended on that), and a line still failing 10 % shows 3 % in 30
    /// attempts often enough to pass. An OBSERVING pass also reads the tail
    /// latency signals at their upper rank (`signals::Probation`): a
    /// periodic pulse that slowed one of 190 attempts leaves the point P99
    /// clean. 0 judges on the point estimate.
    pub probation_confidence_z: f64,
    /// An intermittent fault (docs/decisions.md#signals, incident 004: a 1–2 s latency pulse every
    /// 40 s) leaves a probation at 5 % share looking clean until an attempt
    /// happens to fall inside a pulse, and now and then none does for three
    /// pulses in a row: the probation passes and the channel relapses in
    /// RECOVERING (a re-trip). Once a probation of an incident has relapsed
    /// on the tail alone, with the typical attempt as fast as the healthy
    /// channel's P99 (see `engine`), a later probation of that incident
    /// passes no sooner than this many times the mean time those probations
    /// looked clean. A sustained fault relapses within seconds, so its hold
    /// is short; a relapse on anything else never holds. 0 turns it off.
    pub intermittent_hold_factor: f64,
    /// Cap on that hold: docs/decisions.md#safety-rails's 8 minutes from a fault's end to full
    /// weight must fit the grown cool-down, the hold and the recovery
    /// schedule.
    pub max_intermittent_hold_ms: i64,
    /// RECOVERING weight schedule: each step adds `step` of the channel's
    /// normal weight every `every_ms` while below `until` (default +25 %
    /// every 30 s, so full weight 90 s after the probation passed; incident
    /// 002 used +10 % every 120 s, too slow for docs/decisions.md#safety-rails'
    /// 8 minutes). The first step is also the starting weight.
    pub recovery_steps: Vec<RecoveryStep>,
    /// This many relapses after re-admission (a drain of a channel that
    /// passed a probation, see `state`) within `oscillation_window_ms` raise
    /// the oscillation alarm, once per episode (docs/decisions.md#safety-rails: OSCILLATION only
    /// for a channel that keeps failing after it earned weight back). One
    /// relapse is a fault that outlived its probation; two within the
    /// window is an upstream that flaps.
    pub oscillation_relapses: u32,
    /// The window relapses after re-admission are counted in, and how long
    /// after its re-admission a drain of a HEALTHY channel still counts as
    /// one.
    pub oscillation_window_ms: i64,
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
            // docs/decisions.md#safety-rails: back to full weight within 8 min of a fault ending.
            // A grown cool-down of 180 s, a probation of 15–150 s and the
            // 90 s schedule fit; incident 002 cut 300 s cool-downs to 90 s for
            // the same reason.
            max_cooldown_ms: 180_000,
            max_relapse_cooldown_ms: 1_800_000,
            penalty_half_life_ms: 1_800_000,
            half_open_share: 0.05,
            observe_passes: 3,
            probation_min_samples: 200,
            probation_max_wait_ms: 120_000,
            probation_floor_samples: 20,
            observe_pass_score: 0.40,
            relapse_score: 0.45,
            probation_confidence_z: 1.0,
            intermittent_hold_factor: 3.0,
            // 180 s cool-down + 180 s hold + 90 s schedule + ticks < 480 s.
            max_intermittent_hold_ms: 180_000,
            // docs/decisions.md#safety-rails: full weight within 8 min of a fault ending, with
            // the default config. The docs/decisions.md#score-and-states seed schedule (+10 % / 120 s
            // to 40 %, then +20 %) takes 720 s from its first step, so
            // measured drills took 850–980 s; this one takes 90 s, in steps
            // of 30 s in which a channel at 25 % weight still sees enough
            // attempts for a relapse to be called.
            recovery_steps: vec![RecoveryStep {
                until: 1.0,
                step: 0.25,
                every_ms: 30_000,
            }],
            oscillation_relapses: 2,
            oscillation_window_ms: 3_600_000,
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
    pub(super) fn validate(&self, at: &str, v: &mut Issues) {
        validate_signals(&self.signals, at, v);
        self.states.validate(at, v);
    }
}

/// Every signal's bounds and weight, and the two signal settings.
pub(super) fn validate_signals(signals: &SignalPolicies, at: &str, v: &mut Issues) {
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
    for (key, z) in [
        ("bad_outcome_confidence_z", signals.bad_outcome_confidence_z),
        ("rate_confidence_z", signals.rate_confidence_z),
    ] {
        if !(0.0..=5.0).contains(&z) {
            v.push(format!("{at}.signals.{key}"), "must be within [0, 5]");
        }
    }
    let total: f64 = signals.entries().iter().map(|(_, s)| s.weight).sum();
    if total.is_nan() || total <= 0.0 {
        v.push(
            format!("{at}.signals"),
            "every signal weight is 0: the score could never move",
        );
    }
    if signals.confidence_full_samples == 0 {
        v.push(
            format!("{at}.signals.confidence_full_samples"),
            "must be at least 1",
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
            floor_samples: self.probation_floor_samples,
        }
    }

    pub(super) fn validate(&self, at: &str, v: &mut Issues) {
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
            ("oscillation_relapses", st.oscillation_relapses),
        ] {
            if x == 0 {
                v.push(sk(k), "must be at least 1");
            }
        }
        self.validate_timing(at, v);
        self.validate_recovery_steps(at, v);
    }

    /// Cool-downs, waits and probation evidence: positive times, bounded
    /// factors, and the maxima above what they cap.
    fn validate_timing(&self, at: &str, v: &mut Issues) {
        let st = self;
        let sk = |k: &str| format!("{at}.states.{k}");
        for (k, x) in [
            ("cooldown_ms", st.cooldown_ms),
            ("max_cooldown_ms", st.max_cooldown_ms),
            ("penalty_half_life_ms", st.penalty_half_life_ms),
            ("oscillation_window_ms", st.oscillation_window_ms),
            ("max_relapse_cooldown_ms", st.max_relapse_cooldown_ms),
            ("probation_max_wait_ms", st.probation_max_wait_ms),
            ("max_intermittent_hold_ms", st.max_intermittent_hold_ms),
        ] {
            v.positive_ms(sk(k), x);
        }
        if !(st.probation_confidence_z >= 0.0 && st.probation_confidence_z <= 5.0) {
            v.push(sk("probation_confidence_z"), "must be within [0, 5]");
        }
        if !(st.intermittent_hold_factor >= 0.0 && st.intermittent_hold_factor <= 20.0) {
            v.push(sk("intermittent_hold_factor"), "must be within [0, 20]");
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
        if st.max_relapse_cooldown_ms < st.max_cooldown_ms {
            v.push(
                sk("max_relapse_cooldown_ms"),
                "must be at least max_cooldown_ms",
            );
        }
        if !(st.cooldown_growth >= 1.0 && st.cooldown_growth <= 10.0) {
            v.push(sk("cooldown_growth"), "must be within [1, 10]");
        }
    }

    /// The recovery schedule: steps in (0, 1], `until` rising to 1.0.
    pub(super) fn validate_recovery_steps(&self, at: &str, v: &mut Issues) {
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

/// Built-in free-tier overrides (partial policy). Incident 004 made trust tiers
/// explicit: free lines trip faster and on lower thresholds ("P99 500 ms twice
/// vs paid 800 ms three times", scaled to our LLM latency bounds); incident 002
/// lowered the free error threshold below the paid one and cut the cool-down
/// to 90 s.
pub(super) const FREE_TIER_POLICY: &str = r#"
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

/// The policy layers up to each tier: built-in defaults → `[policy]` →
/// built-in tier defaults → `[tiers.<tier>.policy]`, as TOML (a channel's
/// override merges onto it) and resolved (shared by every channel of the
/// tier that overrides nothing).
pub(super) struct TierPolicies {
    pub(super) tables: BTreeMap<Tier, toml::Table>,
    pub(super) resolved: BTreeMap<Tier, Arc<HealthPolicy>>,
}

impl TierPolicies {
    pub(super) fn resolve(raw: &RawConfig, v: &mut Issues) -> TierPolicies {
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

pub(super) fn deep_merge(base: &mut toml::Table, over: &toml::Table) {
    for (k, v) in over {
        match (base.get_mut(k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => deep_merge(b, o),
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
}

pub(super) fn policy_table(policy: &HealthPolicy) -> toml::Table {
    match toml::Table::try_from(policy) {
        Ok(t) => t,
        // HealthPolicy is plain numbers, bools and arrays of tables.
        Err(e) => panic!("HealthPolicy must serialize to TOML: {e}"),
    }
}

pub(super) fn builtin_tier_policy(tier: Tier) -> toml::Table {
    match tier {
        Tier::Free => FREE_TIER_POLICY
            .parse()
            .unwrap_or_else(|e| panic!("built-in free tier policy does not parse: {e}")),
        Tier::Paid => toml::Table::new(),
    }
}

pub(super) fn builtin_initial_weight(tier: Tier) -> f64 {
    match tier {
        Tier::Free => 0.3,
        Tier::Paid => 0.7,
    }
}

/// Keys the file sets in `[policy]` that a built-in tier layer sets above
/// it (and the file does not set again under that tier): they do not apply
/// to that tier's channels, which a user editing `[policy]` would not
/// guess. One warning each, naming the section that would apply. A key
/// written at its default changes nothing, so nothing fails to apply.
pub(super) fn shadowed_by_tiers(file: &toml::Table) -> Vec<String> {
    let Some(policy) = file.get("policy").and_then(|v| v.as_table()) else {
        return Vec::new();
    };
    let defaults = policy_table(&HealthPolicy::default());
    let mut out = Vec::new();
    for tier in [Tier::Free, Tier::Paid] {
        let builtin = builtin_tier_policy(tier);
        let user = file
            .get("tiers")
            .and_then(|t| t.get(tier.as_str()))
            .and_then(|t| t.get("policy"))
            .and_then(|p| p.as_table());
        let at = Layers {
            builtin: &builtin,
            defaults: &defaults,
            user_tier: user,
        };
        shadowed(policy, at, tier, &mut Vec::new(), &mut out);
    }
    out
}

/// The same level of the built-in tier layer, the defaults and the
/// file's own tier layer.
#[derive(Clone, Copy)]
struct Layers<'a> {
    builtin: &'a toml::Table,
    defaults: &'a toml::Table,
    user_tier: Option<&'a toml::Table>,
}

fn shadowed(
    set: &toml::Table,
    at: Layers<'_>,
    tier: Tier,
    path: &mut Vec<String>,
    out: &mut Vec<String>,
) {
    let empty = toml::Table::new();
    for (k, v) in set {
        let Some(b) = at.builtin.get(k) else { continue };
        let user = at.user_tier.and_then(|u| u.get(k));
        let default = at.defaults.get(k);
        match (v, b) {
            (toml::Value::Table(v), toml::Value::Table(b)) => {
                path.push(k.clone());
                let inner = Layers {
                    builtin: b,
                    defaults: default.and_then(|d| d.as_table()).unwrap_or(&empty),
                    user_tier: user.and_then(|u| u.as_table()),
                };
                shadowed(v, inner, tier, path, out);
                path.pop();
            }
            _ if user.is_none() && v != b && Some(v) != default => {
                let section = path.join(".");
                out.push(format!(
                    "policy.{section}.{k} = {v} does not apply to {t} channels: the built-in \
                     {t} tier sets {k} = {b} above [policy]; set it under \
                     [tiers.{t}.policy.{section}] to change it for them",
                    t = tier.as_str()
                ));
            }
            _ => {}
        }
    }
}
