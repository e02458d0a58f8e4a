//! The health model: what a partition owner says about its channels, and
//! what the scheduler plans from. An engine produces [`ChannelHealth`] at
//! each tick; the owner of the partition sends it to the group's writer in a
//! [`HealthReport`] (the `hermes.health` topic in the service, a function
//! call in the simulator); the writer's [`crate::board::GroupBoard`] keeps
//! the newest per channel.

use crate::state::StateKind;
use serde::{Deserialize, Serialize};

/// A channel's health as the scheduler and the status view read it (and as
/// partition owners report it on the health topic).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChannelHealth {
    pub id: String,
    pub group: String,
    pub state: StateKind,
    /// Health weight factor in [0, 1] (state, or the pin when pinned).
    pub weight: f64,
    /// Latest score; `None` before any signal had enough samples.
    pub score: Option<f64>,
    /// The score's largest contributions (signal name, contribution),
    /// largest first, at most [`TOP_SIGNALS`]: why the channel is where it
    /// is, for people (`hermes status`, `/status`), not for decisions.
    #[serde(default)]
    pub signals: Vec<(String, f64)>,
    pub pinned: bool,
    /// Observed demand per traffic class (schema order), requests per
    /// second: real attempts made plus requests gateways reported unsent.
    pub demand_rps: [f64; 4],
    /// The unsent part of `demand_rps` (shed, or no channel). All zero while
    /// gateways shed nothing, or when they do not report what they shed.
    #[serde(default)]
    pub unsent_rps: [f64; 4],
    /// Mean tokens per real request over the demand window.
    pub tokens_per_request: Option<f64>,
    /// What the channel was measured to cost over the demand window (real
    /// requests and probes), per hour.
    #[serde(default)]
    pub spend_per_hour: f64,
    pub p99_ms: Option<f64>,
    pub error_rate: Option<f64>,
    /// The larger of the short view's hard failures and bad answers over
    /// judged outcomes (`bad_outcome_rate`) and the hard failures among the
    /// last outcomes (`recent_failure_rate`), if either is measured: what
    /// the scheduler's overflow rule reads, so a channel that went hard
    /// down seconds ago reads as failing everything.
    #[serde(default)]
    pub failure_rate: Option<f64>,
    /// Consecutive hard failures up to the channel's last attempt (0: it
    /// answered). With `failure_rate`, panic mode tells a channel still
    /// failing nearly everything from one whose common cause just ended
    /// while its windows still remember the failures.
    #[serde(default)]
    pub failure_streak: u32,
    pub quota_remaining: Option<i64>,
    pub quota_exhausted_in_ms: Option<i64>,
    /// The channel's group is in a correlated failure (docs/decisions.md#safety-rails panic mode,
    /// see `safety`) as this engine saw it at its last tick.
    #[serde(default)]
    pub correlated: bool,
    /// When the channel's current incident (a drain) began, while it is in
    /// one: the group writer judges correlation across partitions with it.
    #[serde(default)]
    pub incident_since_ms: Option<i64>,
}

#[cfg(test)]
impl ChannelHealth {
    /// A channel in `state` with an unremarkable report (tests).
    pub fn fixture(id: &str, state: StateKind) -> ChannelHealth {
        ChannelHealth {
            id: id.into(),
            group: "chat".into(),
            state,
            weight: if state == StateKind::Drained {
                0.0
            } else {
                1.0
            },
            score: Some(0.1),
            signals: Vec::new(),
            pinned: false,
            demand_rps: [0.0, 5.0, 0.0, 0.0],
            unsent_rps: [0.0; 4],
            tokens_per_request: Some(500.0),
            spend_per_hour: 0.0,
            p99_ms: Some(900.0),
            error_rate: Some(0.0),
            failure_rate: Some(0.0),
            failure_streak: 0,
            quota_remaining: None,
            quota_exhausted_in_ms: None,
            correlated: false,
            incident_since_ms: None,
        }
    }
}

/// How many of a score's contributions a health report carries.
pub const TOP_SIGNALS: usize = 3;

/// Format version of [`HealthReport`] (the topic is internal: JSON).
pub const REPORT_FORMAT: u32 = 1;

/// One partition owner's view of one group's channels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthReport {
    pub format: u32,
    pub group: String,
    /// The reporting instance and request partition (for operators).
    pub instance: String,
    pub partition: i32,
    /// Event-time watermark of that partition.
    pub watermark_ms: i64,
    pub channels: Vec<ChannelHealth>,
    /// Set when a channel of the report changed state: the wall time the
    /// record behind the change was handled. The writer re-plans at once and
    /// measures record → Redis write (`hermes_decision_publish_seconds`).
    #[serde(default)]
    pub changed_at_wall_ms: Option<i64>,
}

impl HealthReport {
    pub fn to_json(&self) -> Vec<u8> {
        // Plain data: numbers, strings, enums.
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn from_json(bytes: &[u8]) -> Result<HealthReport, String> {
        let r: HealthReport =
            serde_json::from_slice(bytes).map_err(|e| format!("not a health report: {e}"))?;
        if r.format != REPORT_FORMAT {
            return Err(format!(
                "health report format {} (this build reads {REPORT_FORMAT})",
                r.format
            ));
        }
        Ok(r)
    }
}
