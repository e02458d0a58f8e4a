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

mod incident;
mod pins;
mod step;
mod stored;

use incident::halved;
#[cfg(test)]
mod tests;

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
    /// Every state, in the machine's order.
    pub const ALL: [StateKind; 5] = [
        StateKind::Healthy,
        StateKind::AtRisk,
        StateKind::Drained,
        StateKind::Observing,
        StateKind::Recovering,
    ];

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
    /// Full weight. Consecutive evaluations at or above `at_risk_enter`
    /// and `drain_enter` so far (the confirmations of a move down).
    Healthy { over_at_risk: u32, over_drain: u32 },
    /// Reduced weight since `since_ms`. Consecutive evaluations at or above
    /// `drain_enter`, and below `at_risk_exit`, so far.
    AtRisk {
        since_ms: i64,
        over_drain: u32,
        under_exit: u32,
    },
    /// Weight 0 until `until_ms` (the cool-down end).
    Drained {
        since_ms: i64,
        until_ms: i64,
        incident: Incident,
    },
    /// Half-open share; `passes` consecutive passing evaluations so far.
    Observing {
        since_ms: i64,
        passes: u32,
        incident: Incident,
    },
    /// Stepping back up: `weight` now, next step at `next_step_ms`; the
    /// probation began (OBSERVING entered) at `probation_since_ms`.
    Recovering {
        since_ms: i64,
        weight: f64,
        next_step_ms: i64,
        probation_since_ms: i64,
        incident: Incident,
    },
}

/// What an incident carries from the drain that opens it until the channel
/// is HEALTHY again (through DRAINED, OBSERVING and RECOVERING).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Incident {
    /// When it began (its first drain, or a relapse while recovering).
    pub since_ms: i64,
    /// The decayed penalty just before it began: what a release for a
    /// correlated failure (not this channel's fault) restores.
    pub penalty_before: f64,
    /// Probations since the channel was drained from service that relapsed
    /// on an intermittent reading, and for how long in all they had looked
    /// clean (see `StatePolicy::intermittent_hold_factor`).
    pub intermittent_relapses: u32,
    pub intermittent_clean_ms: i64,
    /// A probation relapsed on something else: the fault is sustained, and a
    /// later relapse that reads intermittent is its leftovers (slow attempts
    /// begun before it ended), not a pulse.
    pub sustained_relapse: bool,
    /// The incident began on an intermittent reading.
    pub intermittent_drain: bool,
}

impl ChannelState {
    /// HEALTHY with no confirmation counted.
    pub const HEALTHY: ChannelState = ChannelState::Healthy {
        over_at_risk: 0,
        over_drain: 0,
    };

    pub fn kind(&self) -> StateKind {
        match self {
            ChannelState::Healthy { .. } => StateKind::Healthy,
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
