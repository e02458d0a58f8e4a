//! The dead-letter spike alarm: dead letters counted per reason over a
//! sliding window of event time, raised when they pass the rule's rate.

use super::{AlertEvent, AlertKind};
use crate::config::AlertConfig;
use std::collections::BTreeMap;

/// DECODE_ERROR_SPIKE: the share of records dead-lettered for one reason
/// over a sliding window (`alerts.dead_letter_*`), on a clock the caller
/// gives (the service's wall clock: dead letters have no trustworthy event
/// time). Raised per reason, at most once per `alerts.dedup_window_ms`.
/// The alert's `route_group` is `*`: bad input belongs to no group.
pub struct DeadLetterRule {
    pub(super) cfg: AlertConfig,
    /// Twelve buckets over the window: (bucket number, records, dead by reason).
    pub(super) buckets: std::collections::VecDeque<(i64, u64, BTreeMap<&'static str, u64>)>,
    pub(super) last_raised: BTreeMap<&'static str, i64>,
    pub(super) seq: u64,
}

/// What [`DeadLetterRule::record`] found: the alert and the share behind it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetterSpike {
    pub reason: &'static str,
    pub share: f64,
    pub records: u64,
    pub alert: AlertEvent,
}

impl DeadLetterRule {
    const BUCKETS: i64 = 12;

    pub fn new(cfg: AlertConfig) -> DeadLetterRule {
        DeadLetterRule {
            cfg,
            buckets: std::collections::VecDeque::new(),
            last_raised: BTreeMap::new(),
            seq: 0,
        }
    }

    /// Counts one record read at `now_ms`, dead-lettered for `dead` (or
    /// handled). Returns a spike when this record's reason crosses the share.
    pub fn record(&mut self, now_ms: i64, dead: Option<&'static str>) -> Option<DeadLetterSpike> {
        let width = (self.cfg.dead_letter_window_ms / Self::BUCKETS).max(1);
        let b = now_ms.div_euclid(width);
        while self
            .buckets
            .front()
            .is_some_and(|(x, _, _)| *x <= b - Self::BUCKETS)
        {
            self.buckets.pop_front();
        }
        if self.buckets.back().is_none_or(|(x, _, _)| *x < b) {
            self.buckets.push_back((b, 0, BTreeMap::new()));
        }
        let last = self.buckets.back_mut().expect("just pushed");
        last.1 += 1;
        let reason = dead?;
        *last.2.entry(reason).or_default() += 1;
        let records: u64 = self.buckets.iter().map(|x| x.1).sum();
        let dead: u64 = self
            .buckets
            .iter()
            .map(|x| x.2.get(reason).copied().unwrap_or(0))
            .sum();
        let share = dead as f64 / records as f64;
        if records < u64::from(self.cfg.dead_letter_min_records)
            || share < self.cfg.dead_letter_share
        {
            return None;
        }
        if self
            .last_raised
            .get(reason)
            .is_some_and(|t| now_ms - t < self.cfg.dedup_window_ms)
        {
            return None;
        }
        self.last_raised.insert(reason, now_ms);
        self.seq += 1;
        let secs = self.cfg.dead_letter_window_ms / 1000;
        Some(DeadLetterSpike {
            reason,
            share,
            records,
            alert: AlertEvent {
                alert_id: format!("*/DECODE_ERROR_SPIKE/{reason}/{now_ms}/{}", self.seq),
                event_time_ms: now_ms,
                route_group: "*".into(),
                channel_id: None,
                kind: AlertKind::DecodeErrorSpike,
                severity: super::contract::DECODE_ERROR_SPIKE,
                from_state: None,
                to_state: None,
                reason: format!("dead_letters(reason={reason},share={share:.3})"),
                score: None,
                breakdown: BTreeMap::new(),
                weight: None,
                message: format!(
                    "{:.1} % of the {records} records read in the last {secs} s were \
                     dead-lettered as {reason}",
                    share * 100.0
                ),
            },
        })
    }
}
