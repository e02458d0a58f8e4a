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
            until_ms: 8 + p.cooldown_ms,
            incident: Incident {
                since_ms: 8,
                penalty_before: 0.0,
                intermittent_relapses: 0,
                intermittent_clean_ms: 0,
                sustained_relapse: false,
                intermittent_drain: false,
            }
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
    let grown = ((p.cooldown_ms as f64 * p.cooldown_growth.powf(m.penalty(t, &p) - 1.0)) as i64)
        .min(p.max_cooldown_ms);
    let ChannelState::Drained {
        since_ms, until_ms, ..
    } = m.state()
    else {
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
        ChannelState::Drained {
            since_ms, until_ms, ..
        } => until_ms - since_ms,
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
    let ChannelState::Drained {
        since_ms, until_ms, ..
    } = m.state()
    else {
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
    let ChannelState::Drained {
        since_ms, until_ms, ..
    } = m2.state()
    else {
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

/// A machine saved by a release that kept every state's data beside the
/// state (flat fields): its persisted JSON with the given state and
/// counters, and an incident that began at 400 with penalty 0.5 before it.
fn flat_json(state: &str, over_at_risk: u32, over_drain: u32, under_exit: u32) -> String {
    format!(
        r#"{{"state":{state},"over_at_risk":{over_at_risk},"over_drain":{over_drain},"under_exit":{under_exit},"penalty":1.0,"penalty_at_ms":500,"incident_cooldown_ms":90000,"incident_since_ms":400,"penalty_before_incident":0.5,"probation_since_ms":900,"intermittent_relapses":2,"intermittent_clean_ms":60000,"sustained_relapse":false,"intermittent_drain":true,"pin":null,"readmitted_at_ms":1000,"relapses":[],"relapse_penalty":0.0,"relapse_decay_from_ms":null,"oscillation_raised":false,"oscillation_due":null}}"#
    )
}

#[test]
fn a_machine_saved_with_flat_fields_resumes_where_it_was() {
    let p = policy();
    // HEALTHY, two confirmations toward AT_RISK already counted.
    let mut m: StateMachine = serde_json::from_str(&flat_json(r#""Healthy""#, 2, 0, 0)).unwrap();
    assert_eq!(eval(&mut m, 2_000, 0.5)[0].to, StateKind::AtRisk);
    // AT_RISK, one confirmation short of HEALTHY, or of DRAINED.
    let at_risk = flat_json(
        r#"{"AtRisk":{"since_ms":100}}"#,
        0,
        1,
        p.healthy_confirmations - 1,
    );
    let mut m: StateMachine = serde_json::from_str(&at_risk).unwrap();
    assert_eq!(m.at_risk_since_ms(), Some(100));
    assert_eq!(eval(&mut m, 2_000, 0.0)[0].to, StateKind::Healthy);
    let mut m: StateMachine = serde_json::from_str(&at_risk).unwrap();
    assert_eq!(eval(&mut m, 2_000, 1.0)[0].to, StateKind::Drained);
    // RECOVERING, in an incident that began at 400 with two intermittent
    // relapses that had looked clean for 30 s on average.
    let recovering = flat_json(
        r#"{"Recovering":{"since_ms":1000,"weight":0.25,"next_step_ms":31000}}"#,
        0,
        0,
        0,
    );
    let mut m: StateMachine = serde_json::from_str(&recovering).unwrap();
    assert_eq!(m.kind(), StateKind::Recovering);
    assert_eq!(m.incident_since_ms(), Some(400));
    assert_eq!(m.intermittent_hold_ms(&p), 90_000);
    assert_eq!(m.weight(&p), 0.25);
    let mut out = Vec::new();
    assert!(!m.release_common_cause(2_000, 401, &p, &mut out));
    assert!(m.release_common_cause(2_000, 400, &p, &mut out));
    assert_eq!(m.kind(), StateKind::Healthy);
    assert!((m.penalty(2_000, &p) - 0.5).abs() < 1e-12);
    // A relapse while RECOVERING: the probation began at 900 and looked
    // clean for 1.1 s, which joins the incident's intermittent record.
    let mut m: StateMachine = serde_json::from_str(&recovering).unwrap();
    let mut out = Vec::new();
    let e = Evaluation {
        score: Some(1.0),
        score_low: None,
        score_high: None,
        evidence: u32::MAX,
        correlated: false,
        intermittent: true,
        thin_evidence: false,
    };
    m.step(2_000, e, &p, &mut out);
    assert_eq!(m.kind(), StateKind::Drained);
    assert_eq!(m.incident_since_ms(), Some(2_000));
    assert_eq!(
        m.intermittent_hold_ms(&p),
        (p.intermittent_hold_factor * (61_100.0 / 3.0)) as i64
    );
}

#[test]
fn a_saved_machine_round_trips() {
    let p = policy();
    let mut m = drained();
    let mut out = Vec::new();
    m.evaluate(p.cooldown_ms, Some(0.0), &p, &mut out);
    assert_eq!(m.kind(), StateKind::Observing);
    let json = serde_json::to_string(&m).unwrap();
    assert_eq!(serde_json::from_str::<StateMachine>(&json).unwrap(), m);
    // Saved in the flat layout, which the release before reads: the same
    // fields, and the state without its data.
    let keys = |j: &str| -> Vec<String> {
        let v: serde_json::Value = serde_json::from_str(j).unwrap();
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&json), keys(&flat_json(r#""Healthy""#, 0, 0, 0)));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        v["state"],
        serde_json::json!({"Observing": {"since_ms": p.cooldown_ms, "passes": 0}})
    );
}

#[test]
fn a_machine_in_the_variant_layout_is_read_too() {
    // What a later release may save: each state's data in its variant.
    let json = r#"{"state":{"AtRisk":{"since_ms":100,"over_drain":1,"under_exit":0}},"penalty":0.0,"penalty_at_ms":0,"pin":null,"readmitted_at_ms":null,"relapses":[],"relapse_penalty":0.0,"relapse_decay_from_ms":null,"oscillation_raised":false,"oscillation_due":null}"#;
    let mut m: StateMachine = serde_json::from_str(json).unwrap();
    assert_eq!(m.at_risk_since_ms(), Some(100));
    assert_eq!(eval(&mut m, 2_000, 1.0)[0].to, StateKind::Drained);
}
