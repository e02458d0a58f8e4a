//! The graded per-channel state machine (docs/decisions.md#score-and-states), a breaker with five states:
//!
//! ```text
//!   HEALTHY ──score≥enter×k──▶ AT_RISK ──score<exit×k──▶ HEALTHY
//!      │                         │
//!      └──score≥drain×k, or N consecutive hard failures (immediate)──▶ DRAINED
//!   DRAINED ──cool-down elapsed──▶ OBSERVING ──k passes──▶ RECOVERING ──full weight──▶ HEALTHY
//!                                  │  relapse                │ relapse
//!                                  └────────▶ DRAINED ◀──────┘
//! ```
//!
//! It is driven by two inputs, both carrying event time: `evaluate` once per
//! evaluation tick with the channel's score, and `on_failure_streak` whenever
//! the consecutive hard-failure counter grows (the fast path, which does not
//! wait for a tick). It holds no clock: timers are event-time deadlines
//! compared with the `now_ms` it is given.
//!
//! Anti-flap: exit thresholds sit below entry thresholds; every score-driven
//! move needs consecutive confirmations; only RECOVERING leads back to
//! HEALTHY; each drain raises a penalty that lengthens the next cool-down
//! (up to `max_cooldown_ms`) and halves over `penalty_half_life_ms`.
//!
//! # Failures after re-admission
//! A channel that passed a probation (OBSERVING → RECOVERING) has *earned
//! weight back*. A drain of such a channel, while it recovers or within
//! `oscillation_window_ms` of its re-admission, is a *relapse after
//! re-admission*: the upstream flaps. Each one
//! - multiplies later cool-downs by `cooldown_growth` once more, up to
//!   `max_relapse_cooldown_ms` (Envoy's ejection time times the ejection
//!   count): an upstream that alternates good and bad minutes is let back a
//!   few times, not every cycle. That multiplier decays only while the
//!   channel is HEALTHY, halving every `penalty_half_life_ms`.
//! - counts toward the oscillation alarm: the `oscillation_relapses`-th
//!   relapse within `oscillation_window_ms` raises it, once per episode (an
//!   episode ends when no relapse is left in the window). It is raised at
//!   the relapse itself, never from a timer and never while the channel is
//!   healthy. A failed probation (OBSERVING → DRAINED) is not a relapse after
//!   re-admission: no traffic was given back; it grows the cool-down within
//!   `max_cooldown_ms` only, so a single long fault is still back at full
//!   weight within minutes of its end.

use crate::config::StatePolicy;
use std::collections::VecDeque;

mod kinds;
mod step;
mod stored;

use kinds::halved;
pub use kinds::*;
#[cfg(test)]
mod tests;

/// The per-channel machine. Cheap to clone (a snapshot for persistence).
/// What one state needs lives in its [`ChannelState`] variant; what spans
/// states (penalties, the pin, relapses after re-admission) lives here.
/// Saved in the flat layout the release before reads, and read in either
/// layout (see `stored`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(from = "stored::StoredMachine", into = "stored::StoredMachine")]
pub struct StateMachine {
    state: ChannelState,
    /// Incident penalty as of `penalty_at_ms`.
    penalty: f64,
    penalty_at_ms: i64,
    pin: Option<Pin>,
    /// The last probation passed (OBSERVING → RECOVERING): the channel
    /// earned weight back then (see the module doc).
    readmitted_at_ms: Option<i64>,
    /// Event times of relapses after re-admission within
    /// `oscillation_window_ms`.
    relapses: VecDeque<i64>,
    /// The cool-down multiplier's exponent from relapses after
    /// re-admission, as of `relapse_decay_from_ms` while HEALTHY (it decays
    /// only then), frozen otherwise.
    relapse_penalty: f64,
    relapse_decay_from_ms: Option<i64>,
    /// The current episode of relapses raised its oscillation alarm.
    oscillation_raised: bool,
    /// An oscillation alarm is due (the relapses in the window); taken by
    /// the caller with [`StateMachine::take_oscillation`].
    oscillation_due: Option<u32>,
}

impl Default for StateMachine {
    fn default() -> Self {
        StateMachine {
            state: ChannelState::HEALTHY,
            penalty: 0.0,
            penalty_at_ms: 0,
            pin: None,
            readmitted_at_ms: None,
            relapses: VecDeque::new(),
            relapse_penalty: 0.0,
            relapse_decay_from_ms: Some(0),
            oscillation_raised: false,
            oscillation_due: None,
        }
    }
}

impl StateMachine {
    pub fn state(&self) -> ChannelState {
        self.state
    }
    pub fn kind(&self) -> StateKind {
        self.state.kind()
    }
    pub fn pin(&self) -> Option<Pin> {
        self.pin
    }

    /// The health weight factor the state alone implies, in [0, 1].
    pub fn state_weight(&self, p: &StatePolicy) -> f64 {
        match self.state {
            ChannelState::Healthy { .. } => 1.0,
            ChannelState::AtRisk { .. } => p.at_risk_weight,
            ChannelState::Drained { .. } => 0.0,
            ChannelState::Observing { .. } => p.half_open_share,
            ChannelState::Recovering { weight, .. } => weight,
        }
    }

    /// The health weight factor in force: a pin overrides the state.
    pub fn weight(&self, p: &StatePolicy) -> f64 {
        match self.pin.map(|pin| pin.kind) {
            Some(PinKind::Drain) => 0.0,
            Some(PinKind::Weight(w)) => w,
            None => self.state_weight(p),
        }
    }

    /// The time from which evidence counts: while a channel is on probation
    /// (observing or recovering) only what happened since it was let back in.
    pub fn evidence_since_ms(&self) -> Option<i64> {
        match self.state {
            ChannelState::Observing { since_ms, .. } => Some(since_ms),
            ChannelState::Recovering { since_ms, .. } => Some(since_ms),
            _ => None,
        }
    }

    /// When the channel went AT_RISK, while it is.
    pub fn at_risk_since_ms(&self) -> Option<i64> {
        match self.state {
            ChannelState::AtRisk { since_ms, .. } => Some(since_ms),
            _ => None,
        }
    }

    /// When the current incident began, while the channel is in one
    /// (DRAINED, OBSERVING or RECOVERING).
    pub fn incident_since_ms(&self) -> Option<i64> {
        self.incident().map(|i| i.since_ms)
    }

    /// The current incident, while the channel is in one.
    pub fn incident(&self) -> Option<&Incident> {
        match &self.state {
            ChannelState::Drained { incident, .. }
            | ChannelState::Observing { incident, .. }
            | ChannelState::Recovering { incident, .. } => Some(incident),
            ChannelState::Healthy { .. } | ChannelState::AtRisk { .. } => None,
        }
    }

    fn incident_mut(&mut self) -> Option<&mut Incident> {
        match &mut self.state {
            ChannelState::Drained { incident, .. }
            | ChannelState::Observing { incident, .. }
            | ChannelState::Recovering { incident, .. } => Some(incident),
            ChannelState::Healthy { .. } | ChannelState::AtRisk { .. } => None,
        }
    }

    /// Is the channel somewhere a healthy baseline can be learned from.
    pub fn is_healthy(&self) -> bool {
        matches!(self.state, ChannelState::Healthy { .. })
    }

    /// The decayed incident penalty at `now_ms`.
    pub fn penalty(&self, now_ms: i64, p: &StatePolicy) -> f64 {
        halved(self.penalty, now_ms - self.penalty_at_ms, p)
    }

    /// The relapse penalty at `now_ms`: decayed over the time the channel
    /// has been HEALTHY since it last relapsed (see the module doc).
    pub fn relapse_penalty(&self, now_ms: i64, p: &StatePolicy) -> f64 {
        match self.relapse_decay_from_ms {
            Some(from) => halved(self.relapse_penalty, now_ms - from, p),
            None => self.relapse_penalty,
        }
    }

    /// Time left of the cool-down at `now_ms` (0 unless DRAINED).
    pub fn cooldown_remaining_ms(&self, now_ms: i64) -> i64 {
        match self.state {
            ChannelState::Drained { until_ms, .. } => (until_ms - now_ms).max(0),
            _ => 0,
        }
    }

    /// The oscillation alarm, when one is due: the number of relapses after
    /// re-admission within `oscillation_window_ms`, and the event time of
    /// the one that made it due. Taken once.
    pub fn take_oscillation(&mut self) -> Option<(u32, i64)> {
        let n = self.oscillation_due.take()?;
        Some((n, self.relapses.back().copied().unwrap_or_default()))
    }
}

impl StateMachine {
    /// One evaluation tick. `score` is `None` when no signal had enough
    /// samples to vote: that neither confirms nor refutes anything, but timers
    /// (cool-downs, recovery steps, pin expiry) still run.
    pub fn evaluate(
        &mut self,
        now_ms: i64,
        score: Option<f64>,
        p: &StatePolicy,
        out: &mut Vec<Change>,
    ) {
        self.step(
            now_ms,
            Evaluation {
                score,
                score_low: None,
                score_high: None,
                evidence: u32::MAX,
                correlated: false,
                intermittent: false,
                thin_evidence: false,
            },
            p,
            out,
        )
    }

    /// One evaluation tick (see [`Evaluation`]). Timers (cool-downs,
    /// recovery steps, pin expiry) run even when the score is `None`.
    pub fn step(&mut self, now_ms: i64, e: Evaluation, p: &StatePolicy, out: &mut Vec<Change>) {
        step::step(self, now_ms, e, p, out)
    }
}

/// Pins: an operator's drain or fixed weight, its expiry.
impl StateMachine {
    /// Applies an operator pin. Recorded as a change (and so an alert).
    pub fn set_pin(&mut self, now_ms: i64, pin: Pin, p: &StatePolicy, out: &mut Vec<Change>) {
        self.repin(now_ms, Some(pin), TransitionReason::PinApplied, p, out);
    }

    /// Removes the pin, if any.
    pub fn clear_pin(&mut self, now_ms: i64, p: &StatePolicy, out: &mut Vec<Change>) {
        if self.pin.is_some() {
            self.repin(now_ms, None, TransitionReason::PinReleased, p, out);
        }
    }

    /// Sets or clears the pin; the state stays, the weight may move.
    fn repin(
        &mut self,
        now_ms: i64,
        pin: Option<Pin>,
        reason: TransitionReason,
        p: &StatePolicy,
        out: &mut Vec<Change>,
    ) {
        let before = self.weight(p);
        self.pin = pin;
        let k = self.kind();
        out.push(Change {
            at_ms: now_ms,
            from: k,
            to: k,
            reason,
            weight_before: before,
            weight_after: self.weight(p),
        });
    }

    pub(super) fn expire_pin(&mut self, now_ms: i64, p: &StatePolicy, out: &mut Vec<Change>) {
        if self
            .pin
            .and_then(|pin| pin.until_ms)
            .is_some_and(|until| now_ms >= until)
        {
            self.clear_pin(now_ms, p, out);
        }
    }
}

/// An incident: the drain that opens it, its cool-down growing with the
/// penalty, relapses and oscillation, a correlated failure's release.
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
