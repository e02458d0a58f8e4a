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

/// The state without its data: for labels, metrics and alert events.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum StateKind {
    Healthy,
    AtRisk,
    Drained,
    Observing,
    Recovering,
}

impl StateKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StateKind::Healthy => "HEALTHY",
            StateKind::AtRisk => "AT_RISK",
            StateKind::Drained => "DRAINED",
            StateKind::Observing => "OBSERVING",
            StateKind::Recovering => "RECOVERING",
        }
    }
}

impl std::fmt::Display for StateKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A channel's state and the data that state needs.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum ChannelState {
    Healthy,
    AtRisk {
        since_ms: i64,
    },
    /// Weight 0 until `until_ms` (the cool-down end).
    Drained {
        since_ms: i64,
        until_ms: i64,
    },
    /// Half-open share; `passes` consecutive passing evaluations so far.
    Observing {
        since_ms: i64,
        passes: u32,
    },
    /// Stepping back up: `weight` now, next step at `next_step_ms`.
    Recovering {
        since_ms: i64,
        weight: f64,
        next_step_ms: i64,
    },
}

impl ChannelState {
    pub fn kind(&self) -> StateKind {
        match self {
            ChannelState::Healthy => StateKind::Healthy,
            ChannelState::AtRisk { .. } => StateKind::AtRisk,
            ChannelState::Drained { .. } => StateKind::Drained,
            ChannelState::Observing { .. } => StateKind::Observing,
            ChannelState::Recovering { .. } => StateKind::Recovering,
        }
    }
}

/// Why a channel's state or weight changed: its own type for observability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TransitionReason {
    /// Score at or above `at_risk_enter` for `evaluations` evaluations.
    ScoreAtRisk { score: f64, evaluations: u32 },
    /// Score below `at_risk_exit` for `evaluations` evaluations.
    ScoreRecovered { score: f64, evaluations: u32 },
    /// Score at or above `drain_enter` for `evaluations` evaluations.
    ScoreDrain { score: f64, evaluations: u32 },
    /// The fast path: `n` consecutive hard failures.
    ConsecutiveFailures { n: u32 },
    /// Cool-down of `cooldown_ms` elapsed.
    CooldownElapsed { cooldown_ms: i64 },
    /// `passes` consecutive passing evaluations while observing.
    ObservationPassed { passes: u32 },
    /// A failing evaluation while observing or recovering.
    Relapse { score: f64 },
    /// A recovery step was taken.
    RecoveryStep { weight: f64 },
    /// The recovery schedule reached full weight.
    RecoveryComplete,
    /// The route group's failure is correlated (docs/decisions.md#safety-rails, panic mode): a
    /// channel drained by the common cause is let back at once.
    CorrelatedFailure,
    /// An operator pin took effect.
    PinApplied,
    /// An operator pin expired or was cleared.
    PinReleased,
}

impl std::fmt::Display for TransitionReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransitionReason::ScoreAtRisk { score, evaluations } => {
                write!(
                    f,
                    "score_at_risk(score={score:.3}, evaluations={evaluations})"
                )
            }
            TransitionReason::ScoreRecovered { score, evaluations } => {
                write!(
                    f,
                    "score_recovered(score={score:.3}, evaluations={evaluations})"
                )
            }
            TransitionReason::ScoreDrain { score, evaluations } => {
                write!(
                    f,
                    "score_drain(score={score:.3}, evaluations={evaluations})"
                )
            }
            TransitionReason::ConsecutiveFailures { n } => write!(f, "consecutive_failures(n={n})"),
            TransitionReason::CooldownElapsed { cooldown_ms } => {
                write!(f, "cooldown_elapsed(cooldown_ms={cooldown_ms})")
            }
            TransitionReason::ObservationPassed { passes } => {
                write!(f, "observation_passed(passes={passes})")
            }
            TransitionReason::Relapse { score } => write!(f, "relapse(score={score:.3})"),
            TransitionReason::RecoveryStep { weight } => {
                write!(f, "recovery_step(weight={weight:.2})")
            }
            TransitionReason::RecoveryComplete => f.write_str("recovery_complete"),
            TransitionReason::CorrelatedFailure => f.write_str("correlated_failure"),
            TransitionReason::PinApplied => f.write_str("pin_applied"),
            TransitionReason::PinReleased => f.write_str("pin_released"),
        }
    }
}

/// One change of state or weight, as the machine reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Change {
    pub at_ms: i64,
    pub from: StateKind,
    pub to: StateKind,
    pub reason: TransitionReason,
    pub weight_before: f64,
    pub weight_after: f64,
}

impl Change {
    pub fn is_transition(&self) -> bool {
        self.from != self.to
    }
}

/// An operator override (docs/decisions.md#score-and-states manual mode).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum PinKind {
    /// Weight 0 whatever the health.
    Drain,
    /// This health weight factor, in [0, 1].
    Weight(f64),
}

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Pin {
    pub kind: PinKind,
    /// The pin lapses at this event time; `None` holds until cleared.
    pub until_ms: Option<i64>,
}

/// What one evaluation tick tells the machine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    /// The channel's score; `None` when no signal had enough samples to
    /// vote (neither confirms nor refutes anything). For an AT_RISK channel
    /// the worse of its windows' reading and the reading over the whole
    /// episode since the view that put it there: at its reduced weight the
    /// windows hold too few answers to confirm a drain.
    pub score: Option<f64>,
    /// The score at the rate signals' confidence bound (see
    /// `score::optimistic`): a channel on probation relapses only when this
    /// reaches `relapse_score`. For an AT_RISK channel it reads what the
    /// channel did since it went AT_RISK, and a drain needs it at
    /// `at_risk_exit` or above. `None`: judge on `score`.
    pub score_low: Option<f64>,
    /// The score at the rate signals' other confidence bound (see
    /// `score::pessimistic`): an OBSERVING evaluation passes only when this
    /// is below `observe_pass_score` too. `None`: judge on `score`.
    pub score_high: Option<f64>,
    /// Attempts the score rests on since the channel was let back in (see
    /// [`enough_evidence`]); a relapse needs none.
    pub evidence: u32,
    /// The route group is failing as a whole (docs/decisions.md#safety-rails panic mode): no
    /// score-driven move down, no fast-path drain.
    pub correlated: bool,
    /// The reading is of an intermittent fault: only the tail is bad, the
    /// typical attempt is as fast as the healthy channel's P99 (judged by
    /// the caller). A relapse on such a reading holds the incident's later
    /// probations (see `StatePolicy::intermittent_hold_factor`).
    pub intermittent: bool,
    /// The failure rate rests on thin evidence (fewer judged answers than
    /// `signals.confidence_full_samples`, or too few to vote): a HEALTHY
    /// channel's drain-level score only puts it AT_RISK, where fresh
    /// evidence at its reduced weight must confirm a drain (docs/decisions.md#safety-rails:
    /// evidence proportionate to its samples).
    pub thin_evidence: bool,
}

/// Whether a probation that has run `elapsed_ms` with `evidence` attempts
/// may pass. Recovery must fit the traffic (docs/decisions.md#safety-rails): a busy channel shows
/// `probation_min_samples` attempts within seconds, and that many are needed
/// to see a fault that hits a few percent of requests (incident 004's pulses);
/// a sparse one (0.2–1 rps, mostly probes) never would, so after
/// `probation_max_wait_ms` what arrived is enough, given at least
/// `probation_floor_samples`.
pub fn enough_evidence(elapsed_ms: i64, evidence: u32, p: &StatePolicy) -> bool {
    evidence >= p.probation_min_samples
        || elapsed_ms >= p.probation_max_wait_ms && evidence >= p.probation_floor_samples
}

/// The per-channel machine. Cheap to clone (a snapshot for persistence).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StateMachine {
    state: ChannelState,
    over_at_risk: u32,
    over_drain: u32,
    under_exit: u32,
    /// Incident penalty as of `penalty_at_ms`.
    penalty: f64,
    penalty_at_ms: i64,
    /// The cool-down of the current incident.
    incident_cooldown_ms: i64,
    /// When the current incident began (its first drain), and the decayed
    /// penalty just before it: what a release for a correlated failure
    /// (not this channel's fault) restores.
    #[serde(default)]
    incident_since_ms: i64,
    #[serde(default)]
    penalty_before_incident: f64,
    /// When the current probation began (OBSERVING entered); kept through
    /// RECOVERING.
    #[serde(default)]
    probation_since_ms: i64,
    /// Probations since the channel was last drained from service that
    /// relapsed on an intermittent reading, and for how long in all they
    /// had looked clean (see `StatePolicy::intermittent_hold_factor`); and
    /// whether any relapsed on anything else: then the fault is sustained,
    /// and a later relapse that reads intermittent is its leftovers (slow
    /// attempts begun before it ended), not a pulse.
    #[serde(default)]
    intermittent_relapses: u32,
    #[serde(default)]
    intermittent_clean_ms: i64,
    #[serde(default)]
    sustained_relapse: bool,
    /// The incident began on an intermittent reading.
    #[serde(default)]
    intermittent_drain: bool,
    pin: Option<Pin>,
    /// The last probation passed (OBSERVING → RECOVERING): the channel
    /// earned weight back then (see the module doc).
    #[serde(default)]
    readmitted_at_ms: Option<i64>,
    /// Event times of relapses after re-admission within
    /// `oscillation_window_ms`.
    #[serde(default)]
    relapses: VecDeque<i64>,
    /// The cool-down multiplier's exponent from relapses after
    /// re-admission, as of `relapse_decay_from_ms` while HEALTHY (it decays
    /// only then), frozen otherwise.
    #[serde(default)]
    relapse_penalty: f64,
    #[serde(default)]
    relapse_decay_from_ms: Option<i64>,
    /// The current episode of relapses raised its oscillation alarm.
    #[serde(default)]
    oscillation_raised: bool,
    /// An oscillation alarm is due (the relapses in the window); taken by
    /// the caller with [`StateMachine::take_oscillation`].
    #[serde(default)]
    oscillation_due: Option<u32>,
}

impl Default for StateMachine {
    fn default() -> Self {
        StateMachine {
            state: ChannelState::Healthy,
            over_at_risk: 0,
            over_drain: 0,
            under_exit: 0,
            penalty: 0.0,
            penalty_at_ms: 0,
            incident_cooldown_ms: 0,
            incident_since_ms: 0,
            penalty_before_incident: 0.0,
            probation_since_ms: 0,
            intermittent_relapses: 0,
            intermittent_clean_ms: 0,
            sustained_relapse: false,
            intermittent_drain: false,
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
            ChannelState::Healthy => 1.0,
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
            ChannelState::AtRisk { since_ms } => Some(since_ms),
            _ => None,
        }
    }

    /// When the current incident began, while the channel is in one
    /// (DRAINED, OBSERVING or RECOVERING).
    pub fn incident_since_ms(&self) -> Option<i64> {
        matches!(
            self.state,
            ChannelState::Drained { .. }
                | ChannelState::Observing { .. }
                | ChannelState::Recovering { .. }
        )
        .then_some(self.incident_since_ms)
    }

    /// Is the channel somewhere a healthy baseline can be learned from.
    pub fn is_healthy(&self) -> bool {
        matches!(self.state, ChannelState::Healthy)
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

    /// A drain of a channel that had earned weight back (see the module
    /// doc): remembered, it grows the relapse penalty and may make an
    /// oscillation alarm due.
    fn note_relapse(&mut self, now_ms: i64, p: &StatePolicy) {
        let earned = match self.state {
            ChannelState::Recovering { .. } => true,
            ChannelState::Healthy | ChannelState::AtRisk { .. } => self
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

    fn set_state(
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
        self.over_at_risk = 0;
        self.over_drain = 0;
        self.under_exit = 0;
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
    fn relapse(
        &mut self,
        now_ms: i64,
        score: f64,
        intermittent: bool,
        p: &StatePolicy,
        out: &mut Vec<Change>,
    ) {
        let clean_ms = (now_ms - self.probation_since_ms).max(0);
        self.drain(
            now_ms,
            TransitionReason::Relapse { score },
            intermittent,
            p,
            out,
        );
        if intermittent {
            self.intermittent_relapses += 1;
            self.intermittent_clean_ms += clean_ms;
        } else {
            self.sustained_relapse = true;
        }
    }

    /// How long a probation must run before it may pass: the incident's
    /// intermittent relapses looked clean for a while before the fault
    /// showed, so a pass sooner than a few times that is luck, not health
    /// (see `StatePolicy::intermittent_hold_factor`).
    pub fn intermittent_hold_ms(&self, p: &StatePolicy) -> i64 {
        if self.sustained_relapse || p.intermittent_hold_factor == 0.0 {
            return 0;
        }
        if self.intermittent_relapses == 0 {
            // No probation has shown how long the fault hides yet.
            return if self.intermittent_drain {
                p.max_intermittent_hold_ms
            } else {
                0
            };
        }
        let mean = self.intermittent_clean_ms as f64 / self.intermittent_relapses as f64;
        ((p.intermittent_hold_factor * mean) as i64).min(p.max_intermittent_hold_ms)
    }

    /// Drains and raises the penalty; the cool-down grows with the penalty
    /// (docs/decisions.md#score-and-states, incident 002) up to `max_cooldown_ms`. A failed probation
    /// (OBSERVING → DRAINED) counts as a repeat of the incident, so an
    /// upstream that keeps failing its probations waits longer each time
    /// instead of being re-admitted every few minutes. Relapses after
    /// re-admission multiply that by `cooldown_growth` each, up to
    /// `max_relapse_cooldown_ms` (see the module doc).
    fn drain(
        &mut self,
        now_ms: i64,
        reason: TransitionReason,
        intermittent: bool,
        p: &StatePolicy,
        out: &mut Vec<Change>,
    ) {
        let penalty = self.penalty(now_ms, p);
        self.note_relapse(now_ms, p);
        if matches!(
            self.state,
            ChannelState::Healthy | ChannelState::AtRisk { .. }
        ) {
            // Drained from service: earlier probations say nothing now.
            self.intermittent_relapses = 0;
            self.intermittent_clean_ms = 0;
            self.sustained_relapse = false;
            self.intermittent_drain = intermittent;
        }
        if !matches!(
            self.state,
            ChannelState::Drained { .. } | ChannelState::Observing { .. }
        ) {
            self.incident_since_ms = now_ms;
            self.penalty_before_incident = penalty;
        }
        let cooldown = self.cooldown_ms(penalty, now_ms, p);
        self.penalty = penalty + 1.0;
        self.penalty_at_ms = now_ms;
        self.incident_cooldown_ms = cooldown;
        self.set_state(
            now_ms,
            ChannelState::Drained {
                since_ms: now_ms,
                until_ms: now_ms + cooldown,
            },
            reason,
            p,
            out,
        );
    }

    /// The cool-down of a drain at `now_ms` with incident penalty `penalty`
    /// (see `drain` and the module doc).
    fn cooldown_ms(&self, penalty: f64, now_ms: i64, p: &StatePolicy) -> i64 {
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
        let in_incident = matches!(
            self.state,
            ChannelState::Drained { .. }
                | ChannelState::Observing { .. }
                | ChannelState::Recovering { .. }
        );
        if !in_incident || self.incident_since_ms < since_ms {
            return false;
        }
        self.penalty = self.penalty_before_incident;
        self.penalty_at_ms = now_ms;
        self.set_state(
            now_ms,
            ChannelState::Healthy,
            TransitionReason::CorrelatedFailure,
            p,
            out,
        );
        true
    }

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
        self.expire_pin(now_ms, p, out);
        match self.state {
            ChannelState::Healthy | ChannelState::AtRisk { .. } => {
                if let Some(s) = e.score {
                    // Leaving AT_RISK is judged on the pessimistic reading:
                    // at its reduced weight the channel shows fewer attempts,
                    // which lowers the optimistic bound the score uses and
                    // would let a channel still failing back to full weight
                    // only to drain it moments later (a re-trip).
                    let exit = e.score_high.map_or(s, |h| h.max(s));
                    self.step_serving(now_ms, s, exit, e, p, out);
                }
            }
            ChannelState::Drained { since_ms, until_ms } => {
                if now_ms >= until_ms {
                    self.probation_since_ms = now_ms;
                    self.set_state(
                        now_ms,
                        ChannelState::Observing {
                            since_ms: now_ms,
                            passes: 0,
                        },
                        TransitionReason::CooldownElapsed {
                            cooldown_ms: until_ms - since_ms,
                        },
                        p,
                        out,
                    );
                }
            }
            ChannelState::Observing { since_ms, passes } => {
                if let Some(s) = e.score {
                    let low = e.score_low.unwrap_or(s);
                    if low >= p.relapse_score {
                        self.relapse(now_ms, s, e.intermittent, p, out);
                    } else {
                        let s = e.score_high.map_or(s, |h| h.max(s));
                        self.step_observing(now_ms, since_ms, passes, s, e.evidence, p, out);
                    }
                }
            }
            ChannelState::Recovering {
                since_ms,
                weight,
                next_step_ms,
            } => {
                let relapse = e
                    .score
                    .filter(|s| e.score_low.unwrap_or(*s) >= p.relapse_score);
                if let Some(s) = relapse {
                    self.relapse(now_ms, s, e.intermittent, p, out);
                } else if now_ms >= next_step_ms {
                    self.step_recovery(now_ms, since_ms, weight, p, out);
                }
            }
        }
    }

    /// HEALTHY and AT_RISK: confirmations toward AT_RISK, DRAINED or back to
    /// HEALTHY. While the group's failure is correlated nothing moves down:
    /// the channel is no worse than its peers.
    fn step_serving(
        &mut self,
        now_ms: i64,
        s: f64,
        exit_score: f64,
        e: Evaluation,
        p: &StatePolicy,
        out: &mut Vec<Change>,
    ) {
        let count = |c: u32, hit: bool| if hit && !e.correlated { c + 1 } else { 0 };
        self.over_drain = count(self.over_drain, s >= p.drain_enter);
        self.over_at_risk = count(self.over_at_risk, s >= p.at_risk_enter);
        self.under_exit = if exit_score < p.at_risk_exit {
            self.under_exit + 1
        } else {
            0
        };
        let healthy = matches!(self.state, ChannelState::Healthy);
        // From AT_RISK a drain is confirmed by what the channel did since
        // it went AT_RISK (`score_low` there): even read optimistically it
        // would not leave AT_RISK. The mirror of the exit, which needs even
        // the pessimistic reading under `at_risk_exit`.
        let confirmed = if healthy {
            !e.thin_evidence
        } else {
            e.score_low.is_none_or(|l| l >= p.at_risk_exit)
        };
        if self.over_drain >= p.drain_confirmations && confirmed {
            let evaluations = self.over_drain;
            let reason = TransitionReason::ScoreDrain {
                score: s,
                evaluations,
            };
            self.drain(now_ms, reason, e.intermittent, p, out);
        } else if healthy && self.over_at_risk >= p.at_risk_confirmations {
            let evaluations = self.over_at_risk;
            let reason = TransitionReason::ScoreAtRisk {
                score: s,
                evaluations,
            };
            self.set_state(
                now_ms,
                ChannelState::AtRisk { since_ms: now_ms },
                reason,
                p,
                out,
            );
        } else if !healthy && self.under_exit >= p.healthy_confirmations {
            let evaluations = self.under_exit;
            let reason = TransitionReason::ScoreRecovered {
                score: exit_score,
                evaluations,
            };
            self.set_state(now_ms, ChannelState::Healthy, reason, p, out);
        }
    }

    /// OBSERVING, short of a relapse (judged by the caller): `observe_passes`
    /// consecutive passes with enough evidence start the recovery; a score
    /// between pass and relapse restarts the streak.
    #[allow(clippy::too_many_arguments)]
    fn step_observing(
        &mut self,
        now_ms: i64,
        since_ms: i64,
        passes: u32,
        s: f64,
        evidence: u32,
        p: &StatePolicy,
        out: &mut Vec<Change>,
    ) {
        if s >= p.observe_pass_score {
            // Between pass and relapse: not a pass, so the streak restarts.
            self.state = ChannelState::Observing {
                since_ms,
                passes: 0,
            };
            return;
        }
        if !enough_evidence(now_ms - since_ms, evidence, p)
            || now_ms - since_ms < self.intermittent_hold_ms(p)
        {
            // Too little evidence to call it a pass yet: keep the streak.
            return;
        }
        let passes = passes + 1;
        if passes < p.observe_passes {
            self.state = ChannelState::Observing { since_ms, passes };
            return;
        }
        let first = p.recovery_steps[0].step.min(1.0);
        self.readmitted_at_ms = Some(now_ms);
        self.set_state(
            now_ms,
            ChannelState::Recovering {
                since_ms: now_ms,
                weight: first,
                next_step_ms: now_ms + step_interval(first, p),
            },
            TransitionReason::ObservationPassed { passes },
            p,
            out,
        );
    }

    /// RECOVERING: the next step of the schedule, HEALTHY at full weight.
    fn step_recovery(
        &mut self,
        now_ms: i64,
        since_ms: i64,
        weight: f64,
        p: &StatePolicy,
        out: &mut Vec<Change>,
    ) {
        let next = next_weight(weight, p);
        if next >= 1.0 - 1e-9 {
            let reason = TransitionReason::RecoveryComplete;
            self.set_state(now_ms, ChannelState::Healthy, reason, p, out);
            return;
        }
        let before = self.weight(p);
        self.state = ChannelState::Recovering {
            since_ms,
            weight: next,
            next_step_ms: now_ms + step_interval(next, p),
        };
        let after = self.weight(p);
        out.push(Change {
            at_ms: now_ms,
            from: StateKind::Recovering,
            to: StateKind::Recovering,
            reason: TransitionReason::RecoveryStep { weight: next },
            weight_before: before,
            weight_after: after,
        });
    }

    /// Applies an operator pin. Recorded as a change (and so an alert).
    pub fn set_pin(&mut self, now_ms: i64, pin: Pin, p: &StatePolicy, out: &mut Vec<Change>) {
        let before = self.weight(p);
        self.pin = Some(pin);
        let after = self.weight(p);
        let k = self.kind();
        out.push(Change {
            at_ms: now_ms,
            from: k,
            to: k,
            reason: TransitionReason::PinApplied,
            weight_before: before,
            weight_after: after,
        });
    }

    /// Removes the pin, if any.
    pub fn clear_pin(&mut self, now_ms: i64, p: &StatePolicy, out: &mut Vec<Change>) {
        if self.pin.is_none() {
            return;
        }
        let before = self.weight(p);
        self.pin = None;
        let after = self.weight(p);
        let k = self.kind();
        out.push(Change {
            at_ms: now_ms,
            from: k,
            to: k,
            reason: TransitionReason::PinReleased,
            weight_before: before,
            weight_after: after,
        });
    }

    fn expire_pin(&mut self, now_ms: i64, p: &StatePolicy, out: &mut Vec<Change>) {
        if self
            .pin
            .and_then(|pin| pin.until_ms)
            .is_some_and(|until| now_ms >= until)
        {
            self.clear_pin(now_ms, p, out);
        }
    }
}

/// `value` after `dt_ms` of halving every `penalty_half_life_ms`.
fn halved(value: f64, dt_ms: i64, p: &StatePolicy) -> f64 {
    value * 0.5f64.powf(dt_ms.max(0) as f64 / p.penalty_half_life_ms as f64)
}

/// The schedule leg that applies at `weight`.
fn leg(weight: f64, p: &StatePolicy) -> &crate::config::RecoveryStep {
    p.recovery_steps
        .iter()
        .find(|s| weight < s.until - 1e-9)
        .unwrap_or_else(|| &p.recovery_steps[p.recovery_steps.len() - 1])
}

fn step_interval(weight: f64, p: &StatePolicy) -> i64 {
    leg(weight, p).every_ms
}

fn next_weight(weight: f64, p: &StatePolicy) -> f64 {
    let l = leg(weight, p);
    // Round to avoid 0.1 + 0.2 drift piling up across steps.
    (((weight + l.step).min(1.0)) * 1e6).round() / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> StatePolicy {
        StatePolicy::default()
    }

    fn eval(m: &mut StateMachine, t: i64, s: f64) -> Vec<Change> {
        let mut out = Vec::new();
        m.evaluate(t, Some(s), &policy(), &mut out);
        out
    }

    /// Drives a machine to DRAINED at t=0 via the fast path.
    fn drained() -> StateMachine {
        let mut m = StateMachine::default();
        let mut out = Vec::new();
        m.on_failure_streak(0, 5, false, &policy(), &mut out);
        assert_eq!(m.kind(), StateKind::Drained);
        m
    }

    #[test]
    fn at_risk_needs_confirmations_and_exits_below_the_exit_threshold() {
        let p = policy();
        let mut m = StateMachine::default();
        assert!(eval(&mut m, 0, 0.5).is_empty());
        assert!(eval(&mut m, 5, 0.5).is_empty());
        let ch = eval(&mut m, 10, 0.5);
        assert_eq!(ch.len(), 1);
        assert_eq!(ch[0].to, StateKind::AtRisk);
        assert_eq!(
            ch[0].reason,
            TransitionReason::ScoreAtRisk {
                score: 0.5,
                evaluations: 3
            }
        );
        assert_eq!(m.weight(&p), p.at_risk_weight);
        // Below entry but not below exit: stays AT_RISK however long.
        for i in 0..20 {
            assert!(eval(&mut m, 15 + i, 0.40).is_empty());
        }
        assert_eq!(m.kind(), StateKind::AtRisk);
        // Below exit, confirmed over `healthy_confirmations` evaluations.
        for i in 0..p.healthy_confirmations - 1 {
            assert!(eval(&mut m, 100 + i as i64, 0.30).is_empty());
        }
        let ch = eval(&mut m, 200, 0.30);
        assert_eq!(ch[0].to, StateKind::Healthy);
        assert_eq!(m.weight(&p), 1.0);
    }

    #[test]
    fn interrupted_confirmation_restarts() {
        let mut m = StateMachine::default();
        eval(&mut m, 0, 0.5);
        eval(&mut m, 5, 0.5);
        eval(&mut m, 10, 0.2);
        eval(&mut m, 15, 0.5);
        eval(&mut m, 20, 0.5);
        assert_eq!(m.kind(), StateKind::Healthy);
    }

    #[test]
    fn drain_needs_two_evaluations_over_the_drain_threshold() {
        let mut m = StateMachine::default();
        assert!(eval(&mut m, 0, 0.8).is_empty());
        let ch = eval(&mut m, 5, 0.8);
        assert_eq!(ch[0].to, StateKind::Drained);
        assert_eq!(
            ch[0].reason,
            TransitionReason::ScoreDrain {
                score: 0.8,
                evaluations: 2
            }
        );
        assert_eq!(ch[0].weight_after, 0.0);
    }

    #[test]
    fn fast_path_drains_immediately_at_n() {
        let p = policy();
        let mut m = StateMachine::default();
        let mut out = Vec::new();
        m.on_failure_streak(7, 4, false, &p, &mut out);
        assert!(out.is_empty());
        m.on_failure_streak(8, 5, false, &p, &mut out);
        assert_eq!(
            out[0].reason,
            TransitionReason::ConsecutiveFailures { n: 5 }
        );
        assert_eq!(
            m.state(),
            ChannelState::Drained {
                since_ms: 8,
                until_ms: 8 + p.cooldown_ms
            }
        );
    }

    #[test]
    fn cooldown_then_observe_then_recover_on_schedule() {
        let p = policy();
        let mut m = drained();
        assert!(eval(&mut m, p.cooldown_ms - 1, 0.0).is_empty());
        let ch = eval(&mut m, p.cooldown_ms, 0.0);
        assert_eq!(ch[0].to, StateKind::Observing);
        assert_eq!(m.weight(&p), p.half_open_share);
        let t = p.cooldown_ms;
        eval(&mut m, t + 5_000, 0.1);
        eval(&mut m, t + 10_000, 0.1);
        let ch = eval(&mut m, t + 15_000, 0.1);
        assert_eq!(ch[0].to, StateKind::Recovering);
        let start = t + 15_000;
        // docs/decisions.md#safety-rails: +25 % every 30 s, full weight 90 s after the pass.
        let mut weights = vec![m.weight(&p)];
        let mut now = start;
        while m.kind() == StateKind::Recovering {
            now += 5_000;
            for c in eval(&mut m, now, 0.1) {
                assert_eq!((c.at_ms - start) % 30_000, 0, "steps land on the 30 s grid");
                weights.push(c.weight_after);
            }
        }
        assert_eq!(weights, vec![0.25, 0.5, 0.75, 1.0]);
        assert_eq!(now - start, 3 * 30_000);
        assert_eq!(m.kind(), StateKind::Healthy);
    }

    #[test]
    fn observing_relapse_repeats_the_incident_and_grows_the_cooldown() {
        let p = policy();
        let mut m = drained();
        eval(&mut m, p.cooldown_ms, 0.0);
        let ch = eval(&mut m, p.cooldown_ms + 5_000, 0.9);
        assert_eq!(ch[0].to, StateKind::Drained);
        assert_eq!(ch[0].reason, TransitionReason::Relapse { score: 0.9 });
        // A failed probation repeats the incident: the cool-down grows.
        let t = p.cooldown_ms + 5_000;
        let grown = ((p.cooldown_ms as f64 * p.cooldown_growth.powf(m.penalty(t, &p) - 1.0))
            as i64)
            .min(p.max_cooldown_ms);
        let ChannelState::Drained { since_ms, until_ms } = m.state() else {
            panic!("{:?}", m.state())
        };
        assert_eq!(since_ms, t);
        assert!(until_ms - since_ms > p.cooldown_ms, "grew");
        assert!((until_ms - since_ms - grown).abs() <= 1, "{until_ms}");
    }

    #[test]
    fn a_correlated_failure_moves_nothing_down_and_releases_the_common_cause() {
        let p = policy();
        let corr = |score: f64| Evaluation {
            score: Some(score),
            score_low: None,
            score_high: None,
            evidence: u32::MAX,
            correlated: true,
            intermittent: false,
            thin_evidence: false,
        };
        // Healthy and bad while the whole group is: no AT_RISK, no drain.
        let mut m = StateMachine::default();
        let mut out = Vec::new();
        for i in 0..10 {
            m.step(i * 5_000, corr(0.9), &p, &mut out);
        }
        m.on_failure_streak(50_000, 10, true, &p, &mut out);
        assert_eq!(m.kind(), StateKind::Healthy);
        assert!(out.is_empty());
        // Drained by the fast path 10 s before the group turned out to be
        // failing as a whole: released at once, penalty taken back.
        let mut m = StateMachine::default();
        m.on_failure_streak(100_000, 5, false, &p, &mut out);
        assert_eq!(m.kind(), StateKind::Drained);
        assert!(m.release_common_cause(110_000, 50_000, &p, &mut out));
        assert_eq!(m.kind(), StateKind::Healthy);
        assert_eq!(
            out.last().unwrap().reason,
            TransitionReason::CorrelatedFailure
        );
        assert_eq!(m.penalty(110_000, &p), 0.0);
        // An older incident of its own is left alone.
        let mut m = StateMachine::default();
        m.on_failure_streak(0, 5, false, &p, &mut out);
        assert!(!m.release_common_cause(110_000, 50_000, &p, &mut out));
        assert_eq!(m.kind(), StateKind::Drained);
    }

    /// From DRAINED: cool-down, three passing evaluations, RECOVERING.
    /// Returns the time it was re-admitted.
    fn readmit(m: &mut StateMachine) -> i64 {
        let ChannelState::Drained { until_ms, .. } = m.state() else {
            panic!("not drained: {:?}", m.state())
        };
        let mut t = until_ms;
        eval(m, t, 0.0);
        assert_eq!(m.kind(), StateKind::Observing);
        for _ in 0..policy().observe_passes {
            t += 5_000;
            eval(m, t, 0.0);
        }
        assert_eq!(m.kind(), StateKind::Recovering);
        t
    }

    fn cooldown_of(m: &StateMachine) -> i64 {
        match m.state() {
            ChannelState::Drained { since_ms, until_ms } => until_ms - since_ms,
            s => panic!("not drained: {s:?}"),
        }
    }

    #[test]
    fn failed_probations_never_raise_an_oscillation_and_stay_under_max_cooldown() {
        let p = policy();
        let mut m = drained();
        for _ in 0..10 {
            // Cool-down elapses, the probation fails again: no traffic was
            // given back, so it is one long incident, not a flapping one.
            let ChannelState::Drained { until_ms, .. } = m.state() else {
                panic!()
            };
            eval(&mut m, until_ms, 0.0);
            eval(&mut m, until_ms + 5_000, 0.9);
            assert_eq!(m.kind(), StateKind::Drained);
            assert!(cooldown_of(&m) <= p.max_cooldown_ms);
            assert_eq!(m.take_oscillation(), None);
        }
    }

    #[test]
    fn relapses_after_readmission_raise_one_oscillation_per_episode_and_grow_the_cooldown() {
        let p = policy();
        let mut m = drained();
        let mut cooldowns = vec![cooldown_of(&m)];
        let mut alarms = Vec::new();
        for _ in 0..5 {
            let t = readmit(&mut m);
            eval(&mut m, t + 5_000, 0.9);
            assert_eq!(m.kind(), StateKind::Drained, "a relapse in RECOVERING");
            cooldowns.push(cooldown_of(&m));
            alarms.push(m.take_oscillation().map(|(n, _)| n));
        }
        // The second relapse within the window raises it; later ones in the
        // same episode do not.
        assert_eq!(alarms, vec![None, Some(2), None, None, None]);
        // Each relapse multiplies the cool-down (the incident part is
        // capped at max_cooldown_ms), up to max_relapse_cooldown_ms.
        for w in cooldowns.windows(2) {
            assert!(w[1] >= w[0], "{cooldowns:?}");
        }
        assert!(cooldowns[2] > p.max_cooldown_ms, "{cooldowns:?}");
        assert_eq!(*cooldowns.last().unwrap(), p.max_relapse_cooldown_ms);
    }

    #[test]
    fn the_relapse_penalty_decays_only_while_healthy() {
        let p = policy();
        let mut m = drained();
        let t = readmit(&mut m);
        eval(&mut m, t + 5_000, 0.9);
        let drained_at = t + 5_000;
        assert!((m.relapse_penalty(drained_at, &p) - 1.0).abs() < 1e-9);
        // Out of service for a half-life: nothing decays.
        let later = drained_at + p.penalty_half_life_ms;
        assert!((m.relapse_penalty(later, &p) - 1.0).abs() < 1e-9);
        // Back to HEALTHY, then a half-life there halves it.
        let t = readmit(&mut m);
        let mut t = t;
        while m.kind() != StateKind::Healthy {
            t += 30_000;
            eval(&mut m, t, 0.0);
        }
        let half = m.relapse_penalty(t + p.penalty_half_life_ms, &p);
        assert!((half - 0.5).abs() < 1e-9, "{half}");
    }

    #[test]
    fn probation_relapses_and_passes_are_judged_on_confidence_bounds() {
        let p = policy();
        let mut m = drained();
        with_evidence(&mut m, p.cooldown_ms, 0.0, 0);
        // A point score over the relapse line whose lower bound is under it:
        // a few unlucky failures, not a relapse.
        let mut out = Vec::new();
        let e = |score, low, high| Evaluation {
            score: Some(score),
            score_low: Some(low),
            score_high: Some(high),
            evidence: u32::MAX,
            correlated: false,
            intermittent: false,
            thin_evidence: false,
        };
        m.step(p.cooldown_ms + 5_000, e(0.6, 0.1, 0.9), &p, &mut out);
        assert_eq!(m.kind(), StateKind::Observing);
        // A clean point score whose upper bound is over the pass line is
        // no pass either.
        for i in 2..10 {
            m.step(p.cooldown_ms + i * 5_000, e(0.0, 0.0, 0.5), &p, &mut out);
        }
        assert_eq!(m.kind(), StateKind::Observing);
        for i in 10..13 {
            m.step(p.cooldown_ms + i * 5_000, e(0.0, 0.0, 0.1), &p, &mut out);
        }
        assert_eq!(m.kind(), StateKind::Recovering);
    }

    fn with_evidence(m: &mut StateMachine, t: i64, score: f64, evidence: u32) -> Vec<Change> {
        let mut out = Vec::new();
        let e = Evaluation {
            score: Some(score),
            score_low: None,
            score_high: None,
            evidence,
            correlated: false,
            intermittent: false,
            thin_evidence: false,
        };
        m.step(t, e, &policy(), &mut out);
        out
    }

    /// Steps `m` every 5 s from `from_ms` with a clean reading (plenty of
    /// evidence) until it leaves OBSERVING or `until_ms`; returns when.
    fn observe_clean(m: &mut StateMachine, from_ms: i64, until_ms: i64) -> i64 {
        let mut t = from_ms;
        while t < until_ms && m.kind() == StateKind::Observing {
            with_evidence(m, t, 0.0, u32::MAX);
            t += 5_000;
        }
        t - 5_000
    }

    #[test]
    fn intermittent_relapses_hold_the_next_probation_sustained_ones_do_not() {
        let p = policy();
        let bad = |intermittent| Evaluation {
            score: Some(0.7),
            score_low: Some(0.7),
            score_high: Some(0.7),
            evidence: u32::MAX,
            correlated: false,
            intermittent,
            thin_evidence: false,
        };
        let mut out = Vec::new();
        // Drained from service on a tail-only reading: no relapse has shown
        // how long the fault hides, so the first probation is held the cap.
        let mut m = StateMachine::default();
        for i in 0..p.drain_confirmations as i64 {
            m.step(i * 5_000, bad(true), &p, &mut out);
        }
        assert_eq!(m.kind(), StateKind::Drained);
        let open = cooldown_end(&m);
        with_evidence(&mut m, open, 0.0, 0);
        assert_eq!(m.kind(), StateKind::Observing);
        assert_eq!(m.intermittent_hold_ms(&p), p.max_intermittent_hold_ms);
        let passed = observe_clean(&mut m, open + 5_000, open + 600_000);
        assert_eq!(m.kind(), StateKind::Recovering);
        assert!(passed - open >= p.max_intermittent_hold_ms, "{passed}");
        // It relapses 40 s into the recovery (120 s clean in all, counted
        // from the probation's start, recovery included)...
        let relapse_at = open + p.max_intermittent_hold_ms + 40_000;
        m.step(relapse_at, bad(true), &p, &mut out);
        assert_eq!(m.kind(), StateKind::Drained);
        let clean = relapse_at - open;
        let hold = (p.intermittent_hold_factor * clean as f64) as i64;
        assert_eq!(
            m.intermittent_hold_ms(&p),
            hold.min(p.max_intermittent_hold_ms)
        );
        // ...and the next probation waits that long however clean it looks,
        // where one without the history passes on three clean evaluations.
        let open = cooldown_end(&m);
        with_evidence(&mut m, open, 0.0, 0);
        let passed = observe_clean(&mut m, open + 5_000, open + 600_000);
        assert!(passed - open >= m_hold(&p, clean), "{}", passed - open);
        // A relapse on anything else says the fault is sustained: its
        // probations relapse on their own, no hold.
        let mut m = drained();
        let open = cooldown_end(&m);
        with_evidence(&mut m, open, 0.0, 0);
        m.step(open + 30_000, bad(true), &p, &mut out);
        assert!(m.intermittent_hold_ms(&p) > 0);
        let open = cooldown_end(&m);
        with_evidence(&mut m, open, 0.0, 0);
        m.step(open + 30_000, bad(false), &p, &mut out);
        assert_eq!(m.intermittent_hold_ms(&p), 0);
        let open = cooldown_end(&m);
        with_evidence(&mut m, open, 0.0, 0);
        let passed = observe_clean(&mut m, open + 5_000, open + 600_000);
        assert_eq!(m.kind(), StateKind::Recovering);
        assert_eq!(passed - open, 15_000);
        // Off at factor 0.
        let off = StatePolicy {
            intermittent_hold_factor: 0.0,
            ..policy()
        };
        let mut m = drained();
        let open = cooldown_end(&m);
        with_evidence(&mut m, open, 0.0, 0);
        m.step(open + 30_000, bad(true), &off, &mut out);
        assert_eq!(m.intermittent_hold_ms(&off), 0);
    }

    fn cooldown_end(m: &StateMachine) -> i64 {
        match m.state() {
            ChannelState::Drained { until_ms, .. } => until_ms,
            other => panic!("not drained: {other:?}"),
        }
    }

    fn m_hold(p: &StatePolicy, clean_ms: i64) -> i64 {
        ((p.intermittent_hold_factor * clean_ms as f64) as i64).min(p.max_intermittent_hold_ms)
    }

    #[test]
    fn an_observing_pass_needs_evidence_a_relapse_does_not() {
        let p = policy();
        let mut m = drained();
        with_evidence(&mut m, p.cooldown_ms, 0.0, 0);
        assert_eq!(m.kind(), StateKind::Observing);
        // Under the wait limit, short of the full sample count: no pass.
        let steps = (p.probation_max_wait_ms / 5_000) - 1;
        for i in 1..=steps {
            let t = p.cooldown_ms + i * 5_000;
            with_evidence(&mut m, t, 0.1, p.probation_min_samples - 1);
        }
        assert_eq!(m.kind(), StateKind::Observing, "no pass on thin evidence");
        with_evidence(&mut m, p.cooldown_ms + 200_000, 0.9, 3);
        assert_eq!(
            m.kind(),
            StateKind::Drained,
            "a relapse on thin evidence still counts"
        );
    }

    #[test]
    fn failure_during_recovery_drops_back_and_lengthens_the_next_cooldown() {
        let p = policy();
        let mut m = drained();
        eval(&mut m, p.cooldown_ms, 0.0);
        for i in 1..=3 {
            eval(&mut m, p.cooldown_ms + i * 5_000, 0.0);
        }
        assert_eq!(m.kind(), StateKind::Recovering);
        let t = p.cooldown_ms + 20_000;
        let ch = eval(&mut m, t, 0.7);
        assert_eq!(ch[0].to, StateKind::Drained);
        let ChannelState::Drained { since_ms, until_ms } = m.state() else {
            panic!()
        };
        let second = until_ms - since_ms;
        // penalty ≈ 1 (decayed over 140 s of a 30 min half-life) → the
        // incident's cool-down ≈ 2×, within max_cooldown_ms; a relapse
        // after re-admission multiplies that by cooldown_growth once more.
        let growth = p.cooldown_growth;
        let incident =
            |x: f64| ((p.cooldown_ms as f64 * x).min(p.max_cooldown_ms as f64) * growth) as i64;
        assert!(
            second >= incident(1.9) && second <= incident(2.0),
            "{second}"
        );
    }

    #[test]
    fn the_penalty_decays_with_its_half_life() {
        let p = policy();
        let m = drained();
        assert!((m.penalty(0, &p) - 1.0).abs() < 1e-12);
        assert!((m.penalty(p.penalty_half_life_ms, &p) - 0.5).abs() < 1e-12);
        // Long after, a new incident gets nearly the base cool-down again.
        let mut m2 = StateMachine::default();
        let mut out = Vec::new();
        m2.on_failure_streak(0, 5, false, &p, &mut out);
        let later = 10 * p.penalty_half_life_ms;
        m2.evaluate(p.cooldown_ms, Some(0.0), &p, &mut out);
        for i in 1..=3 {
            m2.evaluate(p.cooldown_ms + i, Some(0.0), &p, &mut out);
        }
        // Finish recovery, then drain again much later.
        let mut t = p.cooldown_ms + 10;
        while m2.kind() != StateKind::Healthy {
            t += 120_000;
            m2.evaluate(t, Some(0.0), &p, &mut out);
        }
        m2.on_failure_streak(later, 5, false, &p, &mut out);
        let ChannelState::Drained { since_ms, until_ms } = m2.state() else {
            panic!()
        };
        assert!(until_ms - since_ms < p.cooldown_ms * 101 / 100);
    }

    #[test]
    fn only_recovering_leads_back_to_healthy() {
        let p = policy();
        let mut m = drained();
        // However good the score, DRAINED and OBSERVING never jump to HEALTHY.
        let mut seen = vec![m.kind()];
        let mut t = 0;
        while m.kind() != StateKind::Healthy {
            t += 5_000;
            let mut out = Vec::new();
            m.evaluate(t, Some(0.0), &p, &mut out);
            for c in out {
                if c.is_transition() {
                    seen.push(c.to);
                }
            }
        }
        assert_eq!(
            seen,
            vec![
                StateKind::Drained,
                StateKind::Observing,
                StateKind::Recovering,
                StateKind::Healthy
            ]
        );
    }

    #[test]
    fn pins_override_and_expire() {
        let p = policy();
        let mut m = StateMachine::default();
        let mut out = Vec::new();
        m.set_pin(
            0,
            Pin {
                kind: PinKind::Drain,
                until_ms: Some(60_000),
            },
            &p,
            &mut out,
        );
        assert_eq!(m.weight(&p), 0.0);
        assert_eq!(out[0].reason, TransitionReason::PinApplied);
        out.clear();
        m.evaluate(59_999, Some(0.0), &p, &mut out);
        assert!(out.is_empty());
        m.evaluate(60_000, Some(0.0), &p, &mut out);
        assert_eq!(out[0].reason, TransitionReason::PinReleased);
        assert_eq!(m.weight(&p), 1.0);
        // A fixed-weight pin holds through state changes underneath.
        out.clear();
        m.set_pin(
            70_000,
            Pin {
                kind: PinKind::Weight(0.5),
                until_ms: None,
            },
            &p,
            &mut out,
        );
        m.on_failure_streak(71_000, 9, false, &p, &mut out);
        assert_eq!(m.kind(), StateKind::Drained);
        assert_eq!(m.weight(&p), 0.5);
        m.clear_pin(72_000, &p, &mut out);
        assert_eq!(m.weight(&p), 0.0);
    }

    #[test]
    fn no_score_changes_nothing_but_timers_run() {
        let p = policy();
        let mut m = drained();
        let mut out = Vec::new();
        m.evaluate(p.cooldown_ms, None, &p, &mut out);
        assert_eq!(m.kind(), StateKind::Observing);
        out.clear();
        for i in 1..100 {
            m.evaluate(p.cooldown_ms + i * 5_000, None, &p, &mut out);
        }
        assert!(out.is_empty());
        assert_eq!(m.kind(), StateKind::Observing);
    }
}
