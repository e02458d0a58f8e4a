//! An incident: the drain that opens it, its cool-down growing with the
//! penalty, relapses and oscillation, a correlated failure's release, and
//! the recovery schedule.

use super::{Change, ChannelState, Incident, StateKind, StateMachine, TransitionReason};
use crate::config::StatePolicy;

impl StateMachine {
    /// A drain of a channel that had earned weight back (see the module
    /// doc): remembered, it grows the relapse penalty and may make an
    /// oscillation alarm due.
    pub(super) fn note_relapse(&mut self, now_ms: i64, p: &StatePolicy) {
        let earned = match self.state {
            ChannelState::Recovering { .. } => true,
            ChannelState::Healthy { .. } | ChannelState::AtRisk { .. } => self
                .readmitted_at_ms
                .is_some_and(|t| now_ms - t <= p.oscillation_window_ms),
            ChannelState::Drained { .. } | ChannelState::Observing { .. } => false,
        };
        if !earned {
            return;
        }
        let from = now_ms - p.oscillation_window_ms;
        while self.relapses.front().is_some_and(|t| *t < from) {
            self.relapses.pop_front();
        }
        if self.relapses.is_empty() {
            // A new episode.
            self.oscillation_raised = false;
        }
        self.relapses.push_back(now_ms);
        self.relapse_penalty = self.relapse_penalty(now_ms, p) + 1.0;
        self.relapse_decay_from_ms = None;
        if self.relapses.len() >= p.oscillation_relapses as usize && !self.oscillation_raised {
            self.oscillation_raised = true;
            self.oscillation_due = Some(self.relapses.len() as u32);
        }
    }

    pub(super) fn set_state(
        &mut self,
        now_ms: i64,
        to: ChannelState,
        reason: TransitionReason,
        p: &StatePolicy,
        out: &mut Vec<Change>,
    ) {
        let weight_before = self.weight(p);
        let from = self.state.kind();
        if from == StateKind::Healthy && to.kind() != StateKind::Healthy {
            // The relapse penalty decays only while HEALTHY: fold it in.
            self.relapse_penalty = self.relapse_penalty(now_ms, p);
            self.relapse_decay_from_ms = None;
        } else if from != StateKind::Healthy && to.kind() == StateKind::Healthy {
            self.relapse_decay_from_ms = Some(now_ms);
        }
        self.state = to;
        let weight_after = self.weight(p);
        out.push(Change {
            at_ms: now_ms,
            from,
            to: to.kind(),
            reason,
            weight_before,
            weight_after,
        });
    }

    /// A probation (OBSERVING or RECOVERING) failed: drain again, and
    /// remember how long it had looked clean if the fault is intermittent.
    pub(super) fn relapse(
        &mut self,
        now_ms: i64,
        score: f64,
        intermittent: bool,
        p: &StatePolicy,
        out: &mut Vec<Change>,
    ) {
        let probation_since_ms = match self.state {
            ChannelState::Observing { since_ms, .. } => since_ms,
            ChannelState::Recovering {
                probation_since_ms, ..
            } => probation_since_ms,
            _ => now_ms,
        };
        let clean_ms = (now_ms - probation_since_ms).max(0);
        self.drain(
            now_ms,
            TransitionReason::Relapse { score },
            intermittent,
            p,
            out,
        );
        if let Some(incident) = self.incident_mut() {
            if intermittent {
                incident.intermittent_relapses += 1;
                incident.intermittent_clean_ms += clean_ms;
            } else {
                incident.sustained_relapse = true;
            }
        }
    }

    /// How long a probation must run before it may pass: the incident's
    /// intermittent relapses looked clean for a while before the fault
    /// showed, so a pass sooner than a few times that is luck, not health
    /// (see `StatePolicy::intermittent_hold_factor`).
    pub fn intermittent_hold_ms(&self, p: &StatePolicy) -> i64 {
        let Some(i) = self.incident() else {
            return 0;
        };
        if i.sustained_relapse || p.intermittent_hold_factor == 0.0 {
            return 0;
        }
        if i.intermittent_relapses == 0 {
            // No probation has shown how long the fault hides yet.
            return if i.intermittent_drain {
                p.max_intermittent_hold_ms
            } else {
                0
            };
        }
        let mean = i.intermittent_clean_ms as f64 / i.intermittent_relapses as f64;
        ((p.intermittent_hold_factor * mean) as i64).min(p.max_intermittent_hold_ms)
    }

    /// Drains and raises the penalty; the cool-down grows with the penalty
    /// (docs/decisions.md#score-and-states, incident 002) up to `max_cooldown_ms`. A failed probation
    /// (OBSERVING → DRAINED) counts as a repeat of the incident, so an
    /// upstream that keeps failing its probations waits longer each time
    /// instead of being re-admitted every few minutes. Relapses after
    /// re-admission multiply that by `cooldown_growth` each, up to
    /// `max_relapse_cooldown_ms` (see the module doc).
    pub(super) fn drain(
        &mut self,
        now_ms: i64,
        reason: TransitionReason,
        intermittent: bool,
        p: &StatePolicy,
        out: &mut Vec<Change>,
    ) {
        let penalty = self.penalty(now_ms, p);
        self.note_relapse(now_ms, p);
        let incident = match self.state {
            // Drained from service: a new incident; earlier probations say
            // nothing now.
            ChannelState::Healthy { .. } | ChannelState::AtRisk { .. } => Incident {
                since_ms: now_ms,
                penalty_before: penalty,
                intermittent_relapses: 0,
                intermittent_clean_ms: 0,
                sustained_relapse: false,
                intermittent_drain: intermittent,
            },
            // A relapse after re-admission begins the incident again; what
            // its probations showed stays.
            ChannelState::Recovering { incident, .. } => Incident {
                since_ms: now_ms,
                penalty_before: penalty,
                ..incident
            },
            ChannelState::Drained { incident, .. } | ChannelState::Observing { incident, .. } => {
                incident
            }
        };
        let cooldown = self.cooldown_ms(penalty, now_ms, p);
        self.penalty = penalty + 1.0;
        self.penalty_at_ms = now_ms;
        self.set_state(
            now_ms,
            ChannelState::Drained {
                since_ms: now_ms,
                until_ms: now_ms + cooldown,
                incident,
            },
            reason,
            p,
            out,
        );
    }

    /// The cool-down of a drain at `now_ms` with incident penalty `penalty`
    /// (see `drain` and the module doc).
    pub(super) fn cooldown_ms(&self, penalty: f64, now_ms: i64, p: &StatePolicy) -> i64 {
        let incident =
            (p.cooldown_ms as f64 * p.cooldown_growth.powf(penalty)).min(p.max_cooldown_ms as f64);
        let relapses = p.cooldown_growth.powf(self.relapse_penalty(now_ms, p));
        (incident * relapses).min(p.max_relapse_cooldown_ms as f64) as i64
    }

    /// The fast path: call with the consecutive hard-failure count whenever it
    /// grows. Drains immediately at the policy's threshold, unless the group
    /// is failing as a whole (`correlated`): then no healthy alternative
    /// exists and draining would only shed what the channel still serves.
    pub fn on_failure_streak(
        &mut self,
        now_ms: i64,
        n: u32,
        correlated: bool,
        p: &StatePolicy,
        out: &mut Vec<Change>,
    ) {
        if n < p.consecutive_failures || correlated {
            return;
        }
        if !matches!(self.state, ChannelState::Drained { .. }) {
            let reason = TransitionReason::ConsecutiveFailures { n };
            self.drain(now_ms, reason, false, p, out);
        }
    }

    /// The group's failure turned out to be correlated (docs/decisions.md#safety-rails): if this
    /// channel's current incident began at or after `since_ms`, it was the
    /// common cause, not the channel. Cool-down and probation are skipped
    /// (back to HEALTHY now) and the incident's penalty is taken back.
    /// Returns whether the channel was released.
    pub fn release_common_cause(
        &mut self,
        now_ms: i64,
        since_ms: i64,
        p: &StatePolicy,
        out: &mut Vec<Change>,
    ) -> bool {
        let Some(incident) = self.incident().copied() else {
            return false;
        };
        if incident.since_ms < since_ms {
            return false;
        }
        self.penalty = incident.penalty_before;
        self.penalty_at_ms = now_ms;
        self.set_state(
            now_ms,
            ChannelState::HEALTHY,
            TransitionReason::CorrelatedFailure,
            p,
            out,
        );
        true
    }
}

/// `value` after `dt_ms` of halving every `penalty_half_life_ms`.
pub(super) fn halved(value: f64, dt_ms: i64, p: &StatePolicy) -> f64 {
    value * 0.5f64.powf(dt_ms.max(0) as f64 / p.penalty_half_life_ms as f64)
}

/// The schedule leg that applies at `weight`.
pub(super) fn leg(weight: f64, p: &StatePolicy) -> &crate::config::RecoveryStep {
    p.recovery_steps
        .iter()
        .find(|s| weight < s.until - 1e-9)
        .unwrap_or_else(|| &p.recovery_steps[p.recovery_steps.len() - 1])
}

pub(super) fn step_interval(weight: f64, p: &StatePolicy) -> i64 {
    leg(weight, p).every_ms
}

pub(super) fn next_weight(weight: f64, p: &StatePolicy) -> f64 {
    let l = leg(weight, p);
    // Round to avoid 0.1 + 0.2 drift piling up across steps.
    (((weight + l.step).min(1.0)) * 1e6).round() / 1e6
}
