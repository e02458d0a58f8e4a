//! The machine's vocabulary: states with their data, why a move happened,
//! what one evaluation tells the machine, pins, and the recovery schedule's
//! arithmetic.

use crate::config::StatePolicy;

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
