//! Alert rules (`[alerts]`): severities, dedup, the quota and dead-letter
//! alarms.

use super::Issues;
use serde::{Deserialize, Serialize};

/// Alert rules (docs/decisions.md#alerts-and-pages).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlertConfig {
    /// The same (channel, kind) alert is raised at most once per window.
    /// Transitions are never deduplicated: every one is an action.
    pub dedup_window_ms: i64,
    /// docs/decisions.md#alerts-and-pages: error rate above this *and* P99 above `p1_p99_ms` is P1.
    pub p1_error_rate: f64,
    /// docs/decisions.md#alerts-and-pages: P99 above this alone is P2.
    pub p1_p99_ms: f64,
    /// docs/decisions.md#alerts-and-pages: more consecutive probe failures than this is P1 "upstream
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
    /// The window `dead_letter_share` is measured over.
    pub dead_letter_window_ms: i64,
    /// One page per incident (docs/decisions.md#safety-rails): a channel's first P1/P2 alert opens
    /// an incident; until it ends, one escalation pages (UPSTREAM_UNAVAILABLE,
    /// or a page more severe than the first) and every other alert of the
    /// channel is lowered to P3 (still published: the audit trail keeps
    /// it). The incident ends once the channel has been HEALTHY at full
    /// weight, with no alert that would have paged, for this long. Ten
    /// minutes covers a relapse soon after recovery (one episode to the
    /// on-call engineer) and is shorter than a working shift.
    pub incident_quiet_ms: i64,
    /// PARTITION_SPLIT: a channel whose events reached two request
    /// partitions or more, each within this long (wall time), is split:
    /// each partition's engine sees part of its traffic (gateways using
    /// different partitioners; docs/integration.md#producing-events).
    pub partition_split_horizon_ms: i64,
    /// ... and is alerted at most once per this long per channel (the
    /// metric `hermes_channel_split_partitions` shows it all along).
    pub partition_split_every_ms: i64,
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
            incident_quiet_ms: 600_000,
            partition_split_horizon_ms: 60_000,
            partition_split_every_ms: 3_600_000,
        }
    }
}

pub(super) fn validate_alerts(a: &AlertConfig, v: &mut Issues) {
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
    v.positive_ms("alerts.incident_quiet_ms".into(), a.incident_quiet_ms);
    v.positive_ms(
        "alerts.partition_split_horizon_ms".into(),
        a.partition_split_horizon_ms,
    );
    v.positive_ms(
        "alerts.partition_split_every_ms".into(),
        a.partition_split_every_ms,
    );
}
