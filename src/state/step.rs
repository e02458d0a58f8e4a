//! One evaluation: HEALTHY and AT_RISK confirm moves down or back, a
//! cool-down ends in OBSERVING, a probation passes into RECOVERING or
//! relapses, recovery steps the weight back up.

use super::kinds::{next_weight, step_interval};
use super::{
    enough_evidence, Change, ChannelState, Evaluation, StateKind, StateMachine, TransitionReason,
};
use crate::config::StatePolicy;

/// One evaluation tick (see [`Evaluation`]). Timers (cool-downs,
/// recovery steps, pin expiry) run even when the score is `None`.
pub(super) fn step(
    m: &mut StateMachine,
    now_ms: i64,
    e: Evaluation,
    p: &StatePolicy,
    out: &mut Vec<Change>,
) {
    m.expire_pin(now_ms, p, out);
    match m.state {
        ChannelState::Healthy { .. } | ChannelState::AtRisk { .. } => {
            if let Some(s) = e.score {
                // Leaving AT_RISK is judged on the pessimistic reading:
                // at its reduced weight the channel shows fewer attempts,
                // which lowers the optimistic bound the score uses and
                // would let a channel still failing back to full weight
                // only to drain it moments later (a re-trip).
                let exit = e.score_high.map_or(s, |h| h.max(s));
                serving(m, now_ms, s, exit, e, p, out);
            }
        }
        ChannelState::Drained {
            since_ms,
            until_ms,
            incident,
        } => {
            if now_ms >= until_ms {
                m.set_state(
                    now_ms,
                    ChannelState::Observing {
                        since_ms: now_ms,
                        passes: 0,
                        incident,
                    },
                    TransitionReason::CooldownElapsed {
                        cooldown_ms: until_ms - since_ms,
                    },
                    p,
                    out,
                );
            }
        }
        ChannelState::Observing {
            since_ms, passes, ..
        } => {
            if let Some(s) = e.score {
                let low = e.score_low.unwrap_or(s);
                if low >= p.relapse_score {
                    m.relapse(now_ms, s, e.intermittent, p, out);
                } else {
                    let s = e.score_high.map_or(s, |h| h.max(s));
                    observing(m, now_ms, (since_ms, passes), s, e.evidence, p, out);
                }
            }
        }
        ChannelState::Recovering {
            weight,
            next_step_ms,
            ..
        } => {
            let relapse = e
                .score
                .filter(|s| e.score_low.unwrap_or(*s) >= p.relapse_score);
            if let Some(s) = relapse {
                m.relapse(now_ms, s, e.intermittent, p, out);
            } else if now_ms >= next_step_ms {
                recovery(m, now_ms, weight, p, out);
            }
        }
    }
}

/// HEALTHY and AT_RISK: confirmations toward AT_RISK, DRAINED or back to
/// HEALTHY. While the group's failure is correlated nothing moves down:
/// the channel is no worse than its peers.
fn serving(
    m: &mut StateMachine,
    now_ms: i64,
    s: f64,
    exit_score: f64,
    e: Evaluation,
    p: &StatePolicy,
    out: &mut Vec<Change>,
) {
    let Some((over_at_risk, over_drain, under_exit)) = confirmations(m) else {
        return;
    };
    let count = |c: u32, hit: bool| if hit && !e.correlated { c + 1 } else { 0 };
    let over_drain = count(over_drain, s >= p.drain_enter);
    let over_at_risk = count(over_at_risk, s >= p.at_risk_enter);
    let under_exit = if exit_score < p.at_risk_exit {
        under_exit + 1
    } else {
        0
    };
    let healthy = matches!(m.state, ChannelState::Healthy { .. });
    // From AT_RISK a drain is confirmed by what the channel did since
    // it went AT_RISK (`score_low` there): even read optimistically it
    // would not leave AT_RISK. The mirror of the exit, which needs even
    // the pessimistic reading under `at_risk_exit`.
    let confirmed = if healthy {
        !e.thin_evidence
    } else {
        e.score_low.is_none_or(|l| l >= p.at_risk_exit)
    };
    if over_drain >= p.drain_confirmations && confirmed {
        let evaluations = over_drain;
        let reason = TransitionReason::ScoreDrain {
            score: s,
            evaluations,
        };
        m.drain(now_ms, reason, e.intermittent, p, out);
    } else if healthy && over_at_risk >= p.at_risk_confirmations {
        let evaluations = over_at_risk;
        let reason = TransitionReason::ScoreAtRisk {
            score: s,
            evaluations,
        };
        m.set_state(
            now_ms,
            ChannelState::AtRisk {
                since_ms: now_ms,
                over_drain: 0,
                under_exit: 0,
            },
            reason,
            p,
            out,
        );
    } else if !healthy && under_exit >= p.healthy_confirmations {
        let evaluations = under_exit;
        let reason = TransitionReason::ScoreRecovered {
            score: exit_score,
            evaluations,
        };
        m.set_state(now_ms, ChannelState::HEALTHY, reason, p, out);
    } else {
        // No move: the confirmations so far stay with the state.
        keep_confirmations(m, over_at_risk, over_drain, under_exit);
    }
}

/// A serving state's confirmations so far: toward AT_RISK, toward
/// DRAINED, toward HEALTHY (0 where the state counts none).
fn confirmations(m: &StateMachine) -> Option<(u32, u32, u32)> {
    match m.state {
        ChannelState::Healthy {
            over_at_risk,
            over_drain,
        } => Some((over_at_risk, over_drain, 0)),
        ChannelState::AtRisk {
            over_drain,
            under_exit,
            ..
        } => Some((0, over_drain, under_exit)),
        _ => None,
    }
}

fn keep_confirmations(m: &mut StateMachine, over_at_risk: u32, over_drain: u32, under_exit: u32) {
    match &mut m.state {
        ChannelState::Healthy {
            over_at_risk: a,
            over_drain: d,
        } => (*a, *d) = (over_at_risk, over_drain),
        ChannelState::AtRisk {
            over_drain: d,
            under_exit: x,
            ..
        } => (*d, *x) = (over_drain, under_exit),
        _ => {}
    }
}

/// An OBSERVING evaluation of score `s`, in the probation that began at
/// `since_ms` with `passes` so far.
fn observing(
    m: &mut StateMachine,
    now_ms: i64,
    (since_ms, passes): (i64, u32),
    s: f64,
    evidence: u32,
    p: &StatePolicy,
    out: &mut Vec<Change>,
) {
    let ChannelState::Observing {
        passes: streak,
        incident,
        ..
    } = &mut m.state
    else {
        return;
    };
    let incident = *incident;
    if s >= p.observe_pass_score {
        // Between pass and relapse: not a pass, so the streak restarts.
        *streak = 0;
        return;
    }
    if !enough_evidence(now_ms - since_ms, evidence, p)
        || now_ms - since_ms < m.intermittent_hold_ms(p)
    {
        // Too little evidence to call it a pass yet: keep the streak.
        return;
    }
    let passes = passes + 1;
    if passes < p.observe_passes {
        if let ChannelState::Observing { passes: streak, .. } = &mut m.state {
            *streak = passes;
        }
        return;
    }
    let first = p.recovery_steps[0].step.min(1.0);
    m.readmitted_at_ms = Some(now_ms);
    m.set_state(
        now_ms,
        ChannelState::Recovering {
            since_ms: now_ms,
            weight: first,
            next_step_ms: now_ms + step_interval(first, p),
            probation_since_ms: since_ms,
            incident,
        },
        TransitionReason::ObservationPassed { passes },
        p,
        out,
    );
}

/// RECOVERING: the next step of the schedule, HEALTHY at full weight.
fn recovery(
    m: &mut StateMachine,
    now_ms: i64,
    weight: f64,
    p: &StatePolicy,
    out: &mut Vec<Change>,
) {
    let next = next_weight(weight, p);
    if next >= 1.0 - 1e-9 {
        let reason = TransitionReason::RecoveryComplete;
        m.set_state(now_ms, ChannelState::HEALTHY, reason, p, out);
        return;
    }
    let before = m.weight(p);
    if let ChannelState::Recovering {
        weight,
        next_step_ms,
        ..
    } = &mut m.state
    {
        *weight = next;
        *next_step_ms = now_ms + step_interval(next, p);
    }
    let after = m.weight(p);
    out.push(Change {
        at_ms: now_ms,
        from: StateKind::Recovering,
        to: StateKind::Recovering,
        reason: TransitionReason::RecoveryStep { weight: next },
        weight_before: before,
        weight_after: after,
    });
}
