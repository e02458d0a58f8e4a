//! Alert rules (docs/decisions.md#alerts-and-pages): every action Hermes takes, and every alarm it
//! raises, becomes an [`AlertEvent`] (`schemas/alert_event.avsc`).
//!
//! Actions (transitions, weight changes, overrides) are never suppressed:
//! they are the audit trail. Alarms (oscillation, 429 spikes, quota, silence,
//! upstream unavailable) are deduplicated per (channel, kind) within
//! `alerts.dedup_window_ms` of event time.
//!
//! Severity, from the seeds and [`SEVERITIES`] (the contract
//! docs/operating.md's table is generated from): a drain with error rate
//! above 2 % together with P99 above 800 ms is P1, and so is a drain on the
//! consecutive-failure fast path (the channel is down, not slow); every
//! other drain is P2: a channel left service, for bad answers as much as
//! for latency, and someone must know. Oscillation is P2; more than 6
//! consecutive probe failures is P1 "upstream unavailable". A move to
//! AT_RISK is P3: Hermes lowered the channel's weight and keeps watching, a
//! ticket rather than a page. An operator's override is INFO: the audit
//! trail of what someone did on purpose.
//!
//! # One page per incident (docs/decisions.md#safety-rails)
//! P1 and P2 page someone. A channel's first page opens an *incident*;
//! while it is open, one more page is let through as its escalation
//! (UPSTREAM_UNAVAILABLE, or a page more severe than the first), and every
//! other alert of the channel is published at P3. Oscillation pages by its
//! own rule (once per episode of relapses, see `state`). The incident ends
//! when the channel has been HEALTHY at full weight, with nothing that
//! would have paged, for `alerts.incident_quiet_ms`.
//!
//! `dead_letters` holds the dead-letter spike alarm.

use crate::config::AlertConfig;
use crate::event::avro_enum;
use crate::score::Score;
use crate::signals::Signals;
use crate::state::{Change, StateKind, TransitionReason};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
mod dead_letters;
pub use dead_letters::*;

avro_enum! {
    /// What an alert is about.
    AlertKind, fallback = Other, {
        Transition => "TRANSITION",
        WeightChange => "WEIGHT_CHANGE",
        Override => "OVERRIDE",
        Oscillation => "OSCILLATION",
        RateLimitSpike => "RATE_LIMIT_SPIKE",
        QuotaForecast => "QUOTA_FORECAST",
        SilentChannel => "SILENT_CHANNEL",
        DecodeErrorSpike => "DECODE_ERROR_SPIKE",
        UpstreamUnavailable => "UPSTREAM_UNAVAILABLE",
        Degraded => "DEGRADED",
        Other => "OTHER",
        CorrelatedFailure => "CORRELATED_FAILURE",
        PartitionSplit => "PARTITION_SPLIT",
    }
}

avro_enum! {
    /// P1 pages someone; INFO is the audit trail.
    Severity, fallback = Info, {
        P1 => "P1",
        P2 => "P2",
        P3 => "P3",
        Info => "INFO",
    }
}

/// The severity of each alert Hermes raises: the code raises them by these
/// names, and [`SEVERITIES`] lists them with when they apply.
pub mod contract {
    use super::Severity;
    /// A move to AT_RISK.
    pub const AT_RISK: Severity = Severity::P3;
    /// A drain on N consecutive hard failures: the channel is down.
    pub const DRAIN_HARD: Severity = Severity::P1;
    /// A drain with errors and latency both above their page bounds.
    pub const DRAIN_ERRORS_AND_SLOW: Severity = Severity::P1;
    /// Any other drain (bad answers, latency, a relapse): a channel left
    /// service.
    pub const DRAIN: Severity = Severity::P2;
    /// Weight given back: OBSERVING, RECOVERING, HEALTHY, a recovery step.
    pub const BACK: Severity = Severity::Info;
    /// An operator's pin or freeze.
    pub const OVERRIDE: Severity = Severity::Info;
    pub const OSCILLATION: Severity = Severity::P2;
    pub const UPSTREAM_UNAVAILABLE: Severity = Severity::P1;
    pub const RATE_LIMIT_SPIKE: Severity = Severity::P2;
    pub const QUOTA_FORECAST: Severity = Severity::P2;
    pub const SILENT_CHANNEL: Severity = Severity::P2;
    pub const DECODE_ERROR_SPIKE: Severity = Severity::P2;
    pub const CORRELATED_FAILURE: Severity = Severity::P1;
    pub const CORRELATED_FAILURE_ENDED: Severity = Severity::Info;
    pub const PARTITION_SPLIT: Severity = Severity::P3;
    /// Any other alert of a channel while its incident is open (one page
    /// per incident; see the module doc).
    pub const WITHIN_AN_INCIDENT: Severity = Severity::P3;
}

/// One row of the severity contract.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SeverityRule {
    pub kind: AlertKind,
    pub when: &'static str,
    pub severity: Severity,
}

/// Every alert Hermes raises, when, and its severity: P1 and P2 page, P3
/// is a ticket, INFO the audit trail. docs/operating.md's table is
/// generated from this list and the alert tests hold the code to it.
pub const SEVERITIES: &[SeverityRule] = &[
    SeverityRule { kind: AlertKind::Transition, when: "a channel goes AT_RISK (weight × 0.3; Hermes keeps watching)", severity: contract::AT_RISK },
    SeverityRule { kind: AlertKind::Transition, when: "a drain on N consecutive hard failures (the channel is down)", severity: contract::DRAIN_HARD },
    SeverityRule { kind: AlertKind::Transition, when: "a drain with the error rate above `alerts.p1_error_rate` and the P99 above `alerts.p1_p99_ms`", severity: contract::DRAIN_ERRORS_AND_SLOW },
    SeverityRule { kind: AlertKind::Transition, when: "any other drain: bad answers (truncated, garbled, schema-invalid, empty), latency, a relapse on probation", severity: contract::DRAIN },
    SeverityRule { kind: AlertKind::Transition, when: "weight given back: OBSERVING, RECOVERING, HEALTHY", severity: contract::BACK },
    SeverityRule { kind: AlertKind::WeightChange, when: "a recovery step", severity: contract::BACK },
    SeverityRule { kind: AlertKind::Override, when: "an operator's pin or freeze applied or released (the message names who and why)", severity: contract::OVERRIDE },
    SeverityRule { kind: AlertKind::Oscillation, when: "the second relapse after re-admission within the hour, once per episode", severity: contract::OSCILLATION },
    SeverityRule { kind: AlertKind::UpstreamUnavailable, when: "more than `alerts.probe_failures_p1` consecutive probe failures", severity: contract::UPSTREAM_UNAVAILABLE },
    SeverityRule { kind: AlertKind::RateLimitSpike, when: "over `alerts.rate_limit_spike` of a channel's attempts got 429", severity: contract::RATE_LIMIT_SPIKE },
    SeverityRule { kind: AlertKind::QuotaForecast, when: "the quota runs out within `alerts.quota_alert_ms` at the current burn", severity: contract::QUOTA_FORECAST },
    SeverityRule { kind: AlertKind::SilentChannel, when: "no events while it has weight, longer than its own traffic makes likely", severity: contract::SILENT_CHANNEL },
    SeverityRule { kind: AlertKind::DecodeErrorSpike, when: "one dead-letter reason reaches `alerts.dead_letter_share` of the records read", severity: contract::DECODE_ERROR_SPIKE },
    SeverityRule { kind: AlertKind::CorrelatedFailure, when: "a group enters panic mode (a correlated failure)", severity: contract::CORRELATED_FAILURE },
    SeverityRule { kind: AlertKind::CorrelatedFailure, when: "it ends", severity: contract::CORRELATED_FAILURE_ENDED },
    SeverityRule { kind: AlertKind::PartitionSplit, when: "a channel's events reach more than one request partition (once an hour per channel)", severity: contract::PARTITION_SPLIT },
    SeverityRule { kind: AlertKind::Other, when: "any other alert of a channel while its incident is open, past its page and one escalation", severity: contract::WITHIN_AN_INCIDENT },
];

/// One alert, as published on `hermes.alerts`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlertEvent {
    pub alert_id: String,
    pub event_time_ms: i64,
    pub route_group: String,
    pub channel_id: Option<String>,
    pub kind: AlertKind,
    pub severity: Severity,
    pub from_state: Option<String>,
    pub to_state: Option<String>,
    pub reason: String,
    pub score: Option<f64>,
    pub breakdown: BTreeMap<String, f64>,
    pub weight: Option<f64>,
    pub message: String,
}

impl AlertEvent {
    /// Whether the alert pages someone (P1 or P2); P3 is a ticket, INFO the
    /// audit trail.
    pub fn pages(&self) -> bool {
        matches!(self.severity, Severity::P1 | Severity::P2)
    }

    /// Encodes the alert as a bare Avro datum in `alert_event.avsc`.
    pub fn to_avro(&self) -> Result<Vec<u8>, crate::codec::CodecError> {
        let mut cfg = serde_avro_fast::ser::SerializerConfig::new(crate::codec::alert_schema());
        serde_avro_fast::to_datum_vec(self, &mut cfg).map_err(|e| {
            crate::codec::CodecError::Malformed {
                reason: format!("cannot encode alert: {e}"),
            }
        })
    }

    /// The record value for the alert topic: Confluent-framed with
    /// `schema_id` (magic byte 0, the id big-endian, the datum), or a bare
    /// datum when `None`.
    pub fn to_record(&self, schema_id: Option<u32>) -> Result<Vec<u8>, crate::codec::CodecError> {
        let datum = self.to_avro()?;
        Ok(match schema_id {
            Some(id) => {
                let mut out = Vec::with_capacity(datum.len() + 5);
                out.push(crate::codec::CONFLUENT_MAGIC);
                out.extend_from_slice(&id.to_be_bytes());
                out.extend_from_slice(&datum);
                out
            }
            None => datum,
        })
    }

    /// Decodes an alert record, framed or plain. Unambiguous for alerts: a
    /// plain datum starts with the length of `alert_id`, which Hermes never
    /// leaves empty, so its first byte is never the magic byte 0. The
    /// schema id is not looked up: every alert schema version Hermes wrote
    /// decodes with the current one (the contract test keeps them FULL
    /// compatible).
    pub fn from_record(bytes: &[u8]) -> Result<AlertEvent, crate::codec::CodecError> {
        match bytes {
            [crate::codec::CONFLUENT_MAGIC, _, _, _, _, datum @ ..] => AlertEvent::from_avro(datum),
            _ => AlertEvent::from_avro(bytes),
        }
    }

    /// Decodes an alert datum (consumers and tests).
    pub fn from_avro(bytes: &[u8]) -> Result<AlertEvent, crate::codec::CodecError> {
        serde_avro_fast::from_datum_slice(bytes, crate::codec::alert_schema()).map_err(|e| {
            crate::codec::CodecError::Malformed {
                reason: format!("cannot decode alert: {e}"),
            }
        })
    }
}

/// What the rules need to know about the channel an alert concerns.
pub struct Subject<'a> {
    pub group: &'a str,
    pub channel: &'a str,
    /// Dense channel index, for the dedup table.
    pub index: u32,
}

fn breakdown_map(score: Option<&Score>) -> BTreeMap<String, f64> {
    score
        .map(|s| {
            s.breakdown()
                .into_iter()
                .map(|(k, c)| (k.name().to_string(), c))
                .collect()
        })
        .unwrap_or_default()
}

/// Stateful alert rules: dedup memory, open incidents, and a sequence for
/// deterministic ids.
pub struct AlertRules {
    cfg: AlertConfig,
    last_raised: ahash::AHashMap<(u32, AlertKind), i64>,
    /// Per channel index: its open incident (see the module doc).
    incidents: ahash::AHashMap<u32, Incident>,
    seq: u64,
}

/// A channel's open incident, for paging.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Incident {
    /// Severity of the page that opened it.
    first: Severity,
    escalated: bool,
    /// Since when the channel has been HEALTHY at full weight with nothing
    /// that would have paged.
    calm_since_ms: Option<i64>,
}

/// P1 is the most severe.
fn rank(s: Severity) -> u8 {
    match s {
        Severity::P1 => 3,
        Severity::P2 => 2,
        Severity::P3 => 1,
        Severity::Info => 0,
    }
}

impl AlertRules {
    pub fn new(cfg: AlertConfig) -> AlertRules {
        AlertRules {
            cfg,
            last_raised: ahash::AHashMap::new(),
            incidents: ahash::AHashMap::new(),
            seq: 0,
        }
    }

    /// The channels were numbered anew (a config reload): each remembered
    /// alarm and open incident follows its channel to `renumbered(old)`,
    /// and is dropped with a channel the config no longer has.
    pub fn renumber(&mut self, renumbered: impl Fn(u32) -> Option<u32>) {
        self.last_raised = std::mem::take(&mut self.last_raised)
            .into_iter()
            .filter_map(|((idx, kind), t)| Some(((renumbered(idx)?, kind), t)))
            .collect();
        self.incidents = std::mem::take(&mut self.incidents)
            .into_iter()
            .filter_map(|(idx, inc)| Some((renumbered(idx)?, inc)))
            .collect();
    }

    fn id(&mut self, channel: &str, kind: AlertKind, t: i64) -> String {
        self.seq += 1;
        format!("{channel}/{}/{t}/{}", kind.as_str(), self.seq)
    }

    /// The severity an alert of `kind` for channel `index` is published at:
    /// `severity`, unless the channel's open incident has paged already
    /// (see the module doc). Opens the incident on a first page.
    fn page(&mut self, index: u32, kind: AlertKind, severity: Severity) -> Severity {
        if rank(severity) < rank(Severity::P2) || kind == AlertKind::Oscillation {
            return severity;
        }
        match self.incidents.get_mut(&index) {
            None => {
                self.incidents.insert(
                    index,
                    Incident {
                        first: severity,
                        escalated: false,
                        calm_since_ms: None,
                    },
                );
                severity
            }
            Some(inc) => {
                inc.calm_since_ms = None;
                let escalation =
                    kind == AlertKind::UpstreamUnavailable || rank(severity) > rank(inc.first);
                if escalation && !inc.escalated {
                    inc.escalated = true;
                    severity
                } else {
                    contract::WITHIN_AN_INCIDENT
                }
            }
        }
    }

    /// Tells the incident rule how channel `index` stands at tick `now_ms`:
    /// `calm` is HEALTHY at full weight. An open incident ends after
    /// `alerts.incident_quiet_ms` of calm.
    pub fn observe_channel(&mut self, index: u32, now_ms: i64, calm: bool) {
        let Some(inc) = self.incidents.get_mut(&index) else {
            return;
        };
        if !calm {
            inc.calm_since_ms = None;
            return;
        }
        let since = *inc.calm_since_ms.get_or_insert(now_ms);
        if now_ms - since >= self.cfg.incident_quiet_ms {
            self.incidents.remove(&index);
        }
    }

    /// Severity of a move to a worse state, from the signals behind it.
    pub fn degradation_severity(&self, reason: &TransitionReason, signals: &Signals) -> Severity {
        if matches!(reason, TransitionReason::ConsecutiveFailures { .. }) {
            return contract::DRAIN_HARD;
        }
        let p99_high = signals
            .latency
            .is_some_and(|l| l.p99_ms > self.cfg.p1_p99_ms);
        let errors_high = signals
            .error_rate
            .is_some_and(|e| e > self.cfg.p1_error_rate);
        if errors_high && p99_high {
            contract::DRAIN_ERRORS_AND_SLOW
        } else {
            contract::DRAIN
        }
    }

    /// The alert for one state-machine change. Never deduplicated.
    pub fn on_change(
        &mut self,
        who: &Subject<'_>,
        change: &Change,
        score: Option<&Score>,
        signals: &Signals,
    ) -> AlertEvent {
        let worse = |k: StateKind| matches!(k, StateKind::AtRisk | StateKind::Drained);
        let (kind, severity) = match change.reason {
            TransitionReason::PinApplied | TransitionReason::PinReleased => {
                (AlertKind::Override, contract::OVERRIDE)
            }
            TransitionReason::RecoveryStep { .. } => (AlertKind::WeightChange, contract::BACK),
            _ if change.to == StateKind::AtRisk && change.from != StateKind::AtRisk => {
                (AlertKind::Transition, contract::AT_RISK)
            }
            _ if worse(change.to) && change.from != StateKind::Drained => (
                AlertKind::Transition,
                self.degradation_severity(&change.reason, signals),
            ),
            _ => (AlertKind::Transition, contract::BACK),
        };
        let severity = self.page(who.index, kind, severity);
        let message = if change.is_transition() {
            format!(
                "channel {} {} -> {} ({}), weight {:.2} -> {:.2}",
                who.channel,
                change.from,
                change.to,
                change.reason,
                change.weight_before,
                change.weight_after
            )
        } else {
            format!(
                "channel {} {} ({}), weight {:.2} -> {:.2}",
                who.channel, change.to, change.reason, change.weight_before, change.weight_after
            )
        };
        AlertEvent {
            alert_id: self.id(who.channel, kind, change.at_ms),
            event_time_ms: change.at_ms,
            route_group: who.group.to_string(),
            channel_id: Some(who.channel.to_string()),
            kind,
            severity,
            from_state: Some(change.from.as_str().to_string()),
            to_state: Some(change.to.as_str().to_string()),
            reason: change.reason.to_string(),
            score: score.map(|s| s.value),
            breakdown: breakdown_map(score),
            weight: Some(change.weight_after),
            message,
        }
    }

    /// The alert recording an operator putting a whole group in (or out of)
    /// manual mode. Never deduplicated: it is an action.
    /// `note` (who and why) is appended to the message.
    pub fn group_override(&mut self, group: &str, on: bool, now_ms: i64, note: &str) -> AlertEvent {
        let mut message = if on {
            format!("group {group}: manual mode on, weights frozen by an operator")
        } else {
            format!("group {group}: manual mode off, Hermes schedules again")
        };
        if !note.is_empty() {
            message = format!("{message} ({note})");
        }
        AlertEvent {
            alert_id: self.id(group, AlertKind::Override, now_ms),
            event_time_ms: now_ms,
            route_group: group.to_string(),
            channel_id: None,
            kind: AlertKind::Override,
            severity: contract::OVERRIDE,
            from_state: None,
            to_state: None,
            reason: format!("manual_mode(on={on})"),
            score: None,
            breakdown: BTreeMap::new(),
            weight: None,
            message,
        }
    }

    /// A channel's events arrive on more than one request partition: each
    /// partition's engine judges it on part of its traffic. P3 (a
    /// misconfigured gateway, not an outage); the caller limits it to once
    /// per `alerts.partition_split_every_ms`.
    pub fn partition_split(
        &mut self,
        group: &str,
        channel: &str,
        partitions: &[i32],
        now_ms: i64,
    ) -> AlertEvent {
        let list = partitions
            .iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(",");
        AlertEvent {
            alert_id: self.id(channel, AlertKind::PartitionSplit, now_ms),
            event_time_ms: now_ms,
            route_group: group.to_string(),
            channel_id: Some(channel.to_string()),
            kind: AlertKind::PartitionSplit,
            severity: contract::PARTITION_SPLIT,
            from_state: None,
            to_state: None,
            reason: format!("partitions={list}"),
            score: None,
            breakdown: BTreeMap::new(),
            weight: None,
            message: format!(
                "channel {channel}: its events arrive on request partitions {list}, so each \
                 partition's engine judges it on part of its traffic; every gateway must key \
                 events by channel id with the same partitioner (murmur2, Kafka's default; \
                 clients on the C library set partitioner=murmur2_random)"
            ),
        }
    }

    /// A route group's failure is correlated (docs/decisions.md#safety-rails panic mode), or is
    /// no longer: one P1 for the group when it starts, INFO when it ends.
    /// Never deduplicated: both are actions (draining stops, then resumes).
    pub fn correlated_failure(
        &mut self,
        group: &str,
        now_ms: i64,
        change: &crate::safety::SafetyChange,
    ) -> AlertEvent {
        use crate::safety::SafetyChange;
        let (severity, reason, message) = match change {
            SafetyChange::Entered {
                bad_share,
                bad_channels,
                displaced_rps,
                room_rps,
            } => (
                contract::CORRELATED_FAILURE,
                format!("correlated_failure(bad_share={bad_share:.2}, channels={bad_channels})"),
                format!(
                    "group {group}: {bad_channels} channels carrying {:.0} % of its capacity \
                     degraded at once, and the healthy channels have room for {room_rps:.1} of \
                     the {displaced_rps:.1} rps they carry; a common cause (the model \
                     everywhere, or the gateways' egress), not a channel fault: draining \
                     stops, traffic goes to the least-bad channels",
                    bad_share * 100.0
                ),
            ),
            SafetyChange::Ended { lasted_ms } => (
                contract::CORRELATED_FAILURE_ENDED,
                format!("correlated_failure_ended(lasted_ms={lasted_ms})"),
                format!(
                    "group {group}: the correlated failure ended after {} s; channels are \
                     judged one by one again",
                    lasted_ms / 1000
                ),
            ),
        };
        AlertEvent {
            alert_id: self.id(group, AlertKind::CorrelatedFailure, now_ms),
            event_time_ms: now_ms,
            route_group: group.to_string(),
            channel_id: None,
            kind: AlertKind::CorrelatedFailure,
            severity,
            from_state: None,
            to_state: None,
            reason,
            score: None,
            breakdown: BTreeMap::new(),
            weight: None,
            message,
        }
    }

    /// Raises an alarm unless the same (channel, kind) was raised within the
    /// dedup window.
    #[allow(clippy::too_many_arguments)]
    pub fn alarm(
        &mut self,
        who: &Subject<'_>,
        kind: AlertKind,
        severity: Severity,
        now_ms: i64,
        reason: String,
        message: String,
        score: Option<&Score>,
        out: &mut Vec<AlertEvent>,
    ) {
        let key = (who.index, kind);
        if self
            .last_raised
            .get(&key)
            .is_some_and(|t| now_ms - *t < self.cfg.dedup_window_ms)
        {
            return;
        }
        self.last_raised.insert(key, now_ms);
        let severity = self.page(who.index, kind, severity);
        out.push(AlertEvent {
            alert_id: self.id(who.channel, kind, now_ms),
            event_time_ms: now_ms,
            route_group: who.group.to_string(),
            channel_id: Some(who.channel.to_string()),
            kind,
            severity,
            from_state: None,
            to_state: None,
            reason,
            score: score.map(|s| s.value),
            breakdown: breakdown_map(score),
            weight: None,
            message,
        });
    }

    /// Alarms read off one evaluation's signals.
    pub fn on_evaluation(
        &mut self,
        who: &Subject<'_>,
        now_ms: i64,
        signals: &Signals,
        score: &Score,
        out: &mut Vec<AlertEvent>,
    ) {
        let total = signals.short_real.requests + signals.short_probe.requests;
        if let Some(r) = signals.rate_limited_rate {
            if r > self.cfg.rate_limit_spike && total >= self.cfg.rate_limit_min_samples {
                self.alarm(
                    who,
                    AlertKind::RateLimitSpike,
                    contract::RATE_LIMIT_SPIKE,
                    now_ms,
                    format!("rate_limited_rate={r:.3}"),
                    format!(
                        "channel {}: {:.1} % of attempts got 429",
                        who.channel,
                        r * 100.0
                    ),
                    Some(score),
                    out,
                );
            }
        }
        if let Some(ms) = signals.quota_exhausted_in_ms {
            if ms < self.cfg.quota_alert_ms {
                self.alarm(
                    who,
                    AlertKind::QuotaForecast,
                    contract::QUOTA_FORECAST,
                    now_ms,
                    format!("quota_exhausted_in_ms={ms}"),
                    format!(
                        "channel {}: quota forecast to run out in {} s (remaining {:?})",
                        who.channel,
                        ms / 1000,
                        signals.quota_remaining
                    ),
                    None,
                    out,
                );
            }
        }
    }

    /// The probe-failure rule: more than `probe_failures_p1` in a row.
    pub fn on_probe_streak(
        &mut self,
        who: &Subject<'_>,
        now_ms: i64,
        streak: u32,
        out: &mut Vec<AlertEvent>,
    ) {
        if streak > self.cfg.probe_failures_p1 {
            self.alarm(
                who,
                AlertKind::UpstreamUnavailable,
                contract::UPSTREAM_UNAVAILABLE,
                now_ms,
                format!("consecutive_probe_failures(n={streak})"),
                format!(
                    "channel {}: {streak} consecutive probe failures, upstream unavailable",
                    who.channel
                ),
                None,
                out,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signals::LatencySummary;

    fn who() -> Subject<'static> {
        Subject {
            group: "chat",
            channel: "free-a",
            index: 0,
        }
    }

    fn change(reason: TransitionReason, to: StateKind) -> Change {
        Change {
            at_ms: 1000,
            from: StateKind::Healthy,
            to,
            reason,
            weight_before: 1.0,
            weight_after: 0.0,
        }
    }

    fn signals(err: f64, p99: f64) -> Signals {
        Signals {
            error_rate: Some(err),
            latency: Some(LatencySummary {
                p99_ms: p99,
                samples: 100,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn severity_follows_the_seed_rules() {
        // A fresh rule set per alert: each is its channel's first page.
        let rules = || AlertRules::new(AlertConfig::default());
        let drain = TransitionReason::ScoreDrain {
            score: 0.7,
            evaluations: 2,
        };
        let a = rules().on_change(
            &who(),
            &change(drain, StateKind::Drained),
            None,
            &signals(0.05, 900.0),
        );
        assert_eq!(a.severity, Severity::P1);
        let a = rules().on_change(
            &who(),
            &change(drain, StateKind::Drained),
            None,
            &signals(0.001, 900.0),
        );
        assert_eq!(a.severity, Severity::P2);
        // A drain with neither bound crossed (silent truncation: normal
        // status and latency) still pages: a channel left service.
        let a = rules().on_change(
            &who(),
            &change(drain, StateKind::Drained),
            None,
            &signals(0.005, 300.0),
        );
        assert_eq!(a.severity, Severity::P2);
        let fast = TransitionReason::ConsecutiveFailures { n: 3 };
        let a = rules().on_change(
            &who(),
            &change(fast, StateKind::Drained),
            None,
            &Signals::default(),
        );
        assert_eq!(a.severity, Severity::P1);
        assert_eq!(a.kind, AlertKind::Transition);
        assert_eq!(a.reason, "consecutive_failures(n=3)");
    }

    /// Every row of [`SEVERITIES`] is what the code raises: each alert
    /// raised through the rules, as a channel's first page, carries the
    /// severity its row says.
    #[test]
    fn the_code_raises_the_severities_of_the_contract() {
        let fresh = || AlertRules::new(AlertConfig::default());
        let cfg = AlertConfig::default();
        let drain = TransitionReason::ScoreDrain {
            score: 0.7,
            evaluations: 2,
        };
        let raised: Vec<(AlertKind, Severity)> = vec![
            {
                let r = TransitionReason::ScoreAtRisk {
                    score: 0.5,
                    evaluations: 2,
                };
                let a = fresh().on_change(
                    &who(),
                    &change(r, StateKind::AtRisk),
                    None,
                    &signals(0.0, 0.0),
                );
                (a.kind, a.severity)
            },
            {
                let r = TransitionReason::ConsecutiveFailures { n: 4 };
                let a = fresh().on_change(
                    &who(),
                    &change(r, StateKind::Drained),
                    None,
                    &Signals::default(),
                );
                (a.kind, a.severity)
            },
            {
                let a = fresh().on_change(
                    &who(),
                    &change(drain, StateKind::Drained),
                    None,
                    &signals(0.05, 900.0),
                );
                (a.kind, a.severity)
            },
            {
                let a = fresh().on_change(
                    &who(),
                    &change(drain, StateKind::Drained),
                    None,
                    &signals(0.0, 100.0),
                );
                (a.kind, a.severity)
            },
            {
                let mut back = change(
                    TransitionReason::CooldownElapsed {
                        cooldown_ms: 90_000,
                    },
                    StateKind::Observing,
                );
                back.from = StateKind::Drained;
                let a = fresh().on_change(&who(), &back, None, &Signals::default());
                (a.kind, a.severity)
            },
            {
                let step = TransitionReason::RecoveryStep { weight: 0.5 };
                let mut c = change(step, StateKind::Recovering);
                c.from = StateKind::Recovering;
                let a = fresh().on_change(&who(), &c, None, &Signals::default());
                (a.kind, a.severity)
            },
            {
                let a = fresh().on_change(
                    &who(),
                    &change(TransitionReason::PinApplied, StateKind::Drained),
                    None,
                    &Signals::default(),
                );
                (a.kind, a.severity)
            },
            {
                let mut out = Vec::new();
                fresh().on_probe_streak(&who(), 0, cfg.probe_failures_p1 + 1, &mut out);
                (out[0].kind, out[0].severity)
            },
            {
                let a = fresh().partition_split("chat", "free-a", &[0, 1], 0);
                (a.kind, a.severity)
            },
            {
                let a = fresh().group_override("chat", true, 0, "");
                (a.kind, a.severity)
            },
        ];
        for (kind, severity) in raised {
            assert!(
                SEVERITIES
                    .iter()
                    .any(|r| r.kind == kind && r.severity == severity),
                "{kind:?} raised at {severity:?}: not a row of the contract"
            );
        }
        assert_eq!(contract::DRAIN_HARD, Severity::P1);
        assert!(contract::DRAIN == Severity::P2 && contract::OVERRIDE == Severity::Info);
    }

    #[test]
    fn one_page_per_incident_then_one_escalation_until_a_quiet_spell() {
        let cfg = AlertConfig::default();
        let mut rules = AlertRules::new(cfg.clone());
        let drain = TransitionReason::ScoreDrain {
            score: 0.7,
            evaluations: 2,
        };
        let at_risk = TransitionReason::ScoreAtRisk {
            score: 0.5,
            evaluations: 3,
        };
        // AT_RISK is a ticket, not a page.
        let a = rules.on_change(
            &who(),
            &change(at_risk, StateKind::AtRisk),
            None,
            &signals(0.05, 900.0),
        );
        assert_eq!(a.severity, Severity::P3);
        // The drain pages (P2: P99 alone) and opens the incident.
        let a = rules.on_change(
            &who(),
            &change(drain, StateKind::Drained),
            None,
            &signals(0.001, 900.0),
        );
        assert_eq!(a.severity, Severity::P2);
        // A second drain of the same incident (a relapse) does not page ...
        let mut relapse = change(drain, StateKind::Drained);
        relapse.from = StateKind::Observing;
        let a = rules.on_change(&who(), &relapse, None, &signals(0.001, 900.0));
        assert_eq!(a.severity, Severity::P3);
        // ... the upstream being unavailable escalates, once.
        let mut out = Vec::new();
        rules.on_probe_streak(&who(), 10_000, cfg.probe_failures_p1 + 1, &mut out);
        let later = 10_000 + cfg.dedup_window_ms;
        rules.on_probe_streak(&who(), later, cfg.probe_failures_p1 + 1, &mut out);
        let severities: Vec<_> = out.iter().map(|a| a.severity).collect();
        assert_eq!(severities, vec![Severity::P1, Severity::P3]);
        // Calm (HEALTHY at full weight) for the quiet spell ends it; the
        // next drain pages again.
        rules.observe_channel(who().index, later, true);
        rules.observe_channel(who().index, later + cfg.incident_quiet_ms - 1, true);
        let a = rules.on_change(
            &who(),
            &change(drain, StateKind::Drained),
            None,
            &signals(0.001, 900.0),
        );
        assert_eq!(a.severity, Severity::P3, "the spell was one ms short");
        rules.observe_channel(who().index, later + 1, true);
        rules.observe_channel(who().index, later + 1 + cfg.incident_quiet_ms, true);
        let a = rules.on_change(
            &who(),
            &change(drain, StateKind::Drained),
            None,
            &signals(0.001, 900.0),
        );
        assert_eq!(a.severity, Severity::P2);
    }

    #[test]
    fn a_dead_letter_share_raises_one_spike_per_reason() {
        let mut r = DeadLetterRule::new(AlertConfig::default());
        let t0 = 1_000_000;
        // 0.5 % invalid: below the 1 % share.
        for i in 0..1_000 {
            let dead = (i % 200 == 0).then_some("invalid");
            assert!(r.record(t0 + i, dead).is_none());
        }
        // A gateway starts writing a schema nobody knows: every third record.
        let mut spikes = Vec::new();
        for i in 0..3_000 {
            let dead = (i % 3 == 0).then_some("unknown_schema_id");
            spikes.extend(r.record(t0 + 1_000 + i * 10, dead));
        }
        assert_eq!(spikes.len(), 1, "deduplicated: {spikes:?}");
        let s = &spikes[0];
        assert_eq!(s.reason, "unknown_schema_id");
        assert!(s.share >= 0.01 && s.records >= 100, "{s:?}");
        assert_eq!(s.alert.kind, AlertKind::DecodeErrorSpike);
        assert!(s.alert.to_avro().is_ok());
        // The window forgets: a minute of clean input, then one bad record.
        let t1 = t0 + 1_000 + 30_000 + 61_000;
        for i in 0..200 {
            assert!(r.record(t1 + i, None).is_none());
        }
        assert!(r.record(t1 + 300, Some("malformed")).is_none(), "1 of 201");
    }

    #[test]
    fn alarms_are_deduplicated_per_channel_and_kind() {
        let mut rules = AlertRules::new(AlertConfig::default());
        let mut out = Vec::new();
        for t in [0, 1000, 299_999] {
            rules.on_probe_streak(&who(), t, 7, &mut out);
        }
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].severity, Severity::P1);
        rules.on_probe_streak(&who(), 300_000, 7, &mut out);
        assert_eq!(out.len(), 2);
        // Another channel is not suppressed.
        let other = Subject {
            group: "chat",
            channel: "free-b",
            index: 1,
        };
        rules.on_probe_streak(&other, 1, 7, &mut out);
        assert_eq!(out.len(), 3);
        // Six is not more than six.
        rules.on_probe_streak(
            &Subject {
                group: "chat",
                channel: "c",
                index: 2,
            },
            1,
            6,
            &mut out,
        );
        assert_eq!(out.len(), 3);
    }

    #[test]
    fn alert_round_trips_through_avro() {
        let mut rules = AlertRules::new(AlertConfig::default());
        let mut score = Score {
            value: 0.7,
            ..Default::default()
        };
        score.contributions[0] = Some(0.25);
        let a = rules.on_change(
            &who(),
            &change(
                TransitionReason::ScoreAtRisk {
                    score: 0.7,
                    evaluations: 2,
                },
                StateKind::AtRisk,
            ),
            Some(&score),
            &signals(0.0, 100.0),
        );
        let bytes = a.to_avro().unwrap();
        assert_eq!(AlertEvent::from_avro(&bytes).unwrap(), a);
        assert_eq!(a.breakdown.get("p99_latency_ms"), Some(&0.25));
    }
}
