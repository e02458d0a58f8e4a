//! The catalogue (`[[groups]]`, `[[groups.channels]]`, `[tiers]`): route
//! groups and their channels, resolved with their tier's defaults.

use super::{builtin_initial_weight, deep_merge, HealthPolicy, Issues, RawConfig, TierPolicies};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

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
pub(super) struct RawTier {
    /// Relative weight a channel of this tier starts with while nothing is
    /// known (incident 004: free 30 / paid 70 instead of 50 / 50).
    pub(super) initial_weight: Option<f64>,
    /// A partial `[policy]` table layered over the built-in tier layer.
    pub(super) policy: Option<toml::Table>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawChannel {
    pub(super) id: String,
    pub(super) tier: Tier,
    #[serde(default)]
    price_per_1k_tokens: f64,
    pub(super) capacity_rps: f64,
    pub(super) initial_weight: Option<f64>,
    pub(super) quota: Option<u64>,
    pub(super) quota_period_ms: Option<i64>,
    pub(super) policy: Option<toml::Table>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGroup {
    pub(super) id: String,
    pub(super) budget_per_hour: Option<f64>,
    #[serde(default)]
    pub(super) channels: Vec<RawChannel>,
}

/// A channel's quota period unless it says otherwise: a day, the period
/// free tiers count in (incident 002).
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
    /// Attempts the upstream allows per `quota_period_ms` (incident 002's free
    /// tier), used when gateways do not report `quota_remaining`; unset: no quota.
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

/// Ids seen so far: unique across the config.
#[derive(Default)]
pub(super) struct Ids {
    pub(super) groups: ahash::AHashSet<String>,
    pub(super) channels: ahash::AHashSet<String>,
}

/// A channel's initial weight: its own, its tier's, or the built-in one.
pub(super) fn initial_weight_of(raw: &RawConfig, c: &RawChannel) -> f64 {
    c.initial_weight
        .or_else(|| raw.tiers.get(&c.tier).and_then(|t| t.initial_weight))
        .unwrap_or_else(|| builtin_initial_weight(c.tier))
}

pub(super) fn resolve_group(
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
pub(super) fn resolve_channel(
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
