//! Per tick, as functions of the engine (entered by `Engine::advance_to`):
//! advance event time phase by phase; for each channel of a phase's groups
//! measure, score, judge the group, step the machine and run the alert
//! rules.

use super::{ChannelIdx, Engine};
use crate::alert::{AlertEvent, AlertKind, Subject};
use crate::safety::{PeerHealth, SafetyChange};
use crate::score::{intermittent, score};
use crate::signals::{measure, Horizon, SignalKind};
use crate::state::{Change, Evaluation, StateKind};
use crate::window::{FailureStreak, OutcomeWindow};

/// Moves the watermark to `now_ms` (if later) and runs every evaluation
/// tick up to it. The service calls this for idle partitions; the
/// simulator calls it with simulated time.
pub(super) fn advance_to(engine: &mut Engine, now_ms: i64, out: &mut Vec<AlertEvent>) {
    if engine.watermark_ms.is_some_and(|w| now_ms <= w) {
        return;
    }
    let interval = engine.cfg.engine.evaluation_interval_ms;
    let step = phase_step_ms(engine);
    if engine.first_event_ms.is_none() {
        engine.first_event_ms = Some(now_ms);
        // First phase on the grid after the first event.
        engine.next_eval_ms =
            Some((now_ms.div_euclid(step).saturating_add(1)).saturating_mul(step));
    }
    // After a gap longer than the long view every window is empty: only
    // its last long view is evaluated, so a jump of any length (an
    // outage, a corroborated clock jump) costs a bounded number of ticks.
    let catch_up_from = now_ms
        .saturating_sub(engine.cfg.engine.long_window_ms)
        .div_euclid(interval)
        * interval;
    if engine.next_eval_ms.is_some_and(|t| t < catch_up_from) {
        engine.next_eval_ms = Some(catch_up_from);
    }
    while let Some(tick) = engine.next_eval_ms.filter(|t| *t <= now_ms) {
        engine.watermark_ms = Some(tick);
        let phase = tick.div_euclid(step).rem_euclid(engine.phases.len() as i64) as usize;
        evaluate_phase(engine, phase, tick, out);
        engine.next_eval_ms = Some(tick.saturating_add(step));
        if tick == i64::MAX {
            break;
        }
    }
    engine.watermark_ms = Some(now_ms);
}

/// Time between two phases of the evaluation interval.
pub(super) fn phase_step_ms(engine: &Engine) -> i64 {
    (engine.cfg.engine.evaluation_interval_ms / engine.phases.len() as i64).max(1)
}

/// One phase of the evaluation interval at `now`: the groups of that
/// phase, in three steps: measure and score each channel; judge each
/// group as a whole (`safety`); then step each channel's state machine
/// and run the alert rules. A group is evaluated once per interval, in
/// its own phase, so the work of an interval is spread across it
/// instead of landing at one instant.
pub(super) fn evaluate_phase(
    engine: &mut Engine,
    phase: usize,
    now: i64,
    out: &mut Vec<AlertEvent>,
) {
    if engine.phases[phase].is_empty() {
        return;
    }
    let groups = std::mem::take(&mut engine.phases[phase]);
    let mut due = Vec::new();
    for &gi in &groups {
        due.extend(engine.group_channels[gi].iter().filter(|&&idx| {
            engine.evaluate_unseen || engine.channels[idx].last_event_ms.is_some()
        }));
    }
    for &idx in &due {
        engine.stats.evaluations += 1;
        measure_channel(engine, idx, now);
    }
    judge_groups(engine, now, &groups, &due, out);
    for &idx in &due {
        step_channel(engine, idx, now, out);
        touch(engine, idx as ChannelIdx);
    }
    engine.phases[phase] = groups;
}

/// Marks a channel as evaluated or changed (see [`Engine::take_touched`]).
pub(super) fn touch(engine: &mut Engine, idx: ChannelIdx) {
    let ch = &mut engine.channels[idx as usize];
    if !ch.touched {
        ch.touched = true;
        engine.touched.push(idx);
    }
}

/// The channels evaluated or changed since the last call, in the order
/// they were first touched: what a caller that reports incrementally
/// has to report.
pub(super) fn take_touched(engine: &mut Engine) -> Vec<ChannelIdx> {
    for &idx in &engine.touched {
        engine.channels[idx as usize].touched = false;
    }
    std::mem::take(&mut engine.touched)
}

/// Signals, score, and the baseline (which learns once per short window,
/// only while the channel is healthy).
pub(super) fn measure_channel(engine: &mut Engine, idx: usize, now: i64) {
    let short_ms = engine.cfg.engine.short_window_ms;
    let ch = &mut engine.channels[idx];
    let policy = &*ch.cfg.policy;
    let since = ch.machine.evidence_since_ms().unwrap_or(i64::MIN / 2);
    let median = ch.latency_median.is_none() || now >= ch.next_median_ms;
    let horizon = if ch.machine.kind() == StateKind::Observing {
        Horizon::Whole
    } else {
        Horizon::Recent
    };
    ch.signals = measure(
        &mut ch.ring,
        &ch.outcomes,
        &ch.baseline,
        &engine.cfg.engine.horizons(),
        &policy.signals,
        now,
        since,
        horizon,
        policy.states.probation(),
        median,
    );
    match ch.signals.latency {
        Some(l) => {
            if let Some(p50) = l.p50_ms {
                ch.latency_median = Some(p50);
                ch.next_median_ms = now + engine.cfg.engine.latency_median_interval_ms;
            }
        }
        None => ch.latency_median = None,
    }
    ch.count_quota(engine.cfg.engine.long_window_ms, now);
    let sc = score(&ch.signals, &ch.cfg.policy.signals);
    let voted = sc.voters() > 0;
    ch.score = voted.then_some(sc);
    let horizons = engine.cfg.engine.horizons();
    (ch.score_low, ch.score_high) = match voted {
        true => ch.bounds(&horizons, now),
        false => (None, None),
    };
    ch.score_episode = voted
        .then(|| ch.episode_score(&horizons, now))
        .flatten()
        .map(Box::new);
    ch.learn_baseline(now, short_ms);
}

/// docs/decisions.md#safety-rails: is a group's failure correlated? On entering panic, the
/// channels the common cause drained are let back and one P1 is raised.
pub(super) fn judge_groups(
    engine: &mut Engine,
    now: i64,
    groups: &[usize],
    due: &[usize],
    out: &mut Vec<AlertEvent>,
) {
    let window_ms = engine.cfg.safety.correlation_window_ms;
    // The share is of the group's whole capacity: a partition engine
    // that carries two of a group's ten channels must not call the
    // group down when those two fail. Channels this engine does not
    // evaluate count as not bad here; the group writer judges again
    // with every channel's report.
    let mut peers: Vec<PeerHealth> = Vec::new();
    for &gi in groups {
        peers.clear();
        for &i in &engine.group_channels[gi] {
            let ch = &engine.channels[i];
            let evaluated = engine.evaluate_unseen || ch.last_event_ms.is_some();
            peers.push(PeerHealth {
                capacity_rps: ch.cfg.capacity_rps,
                load_rps: 0.0,
                bad: evaluated
                    && crate::safety::is_bad(
                        ch.score.map(|s| s.value),
                        ch.cfg.policy.states.at_risk_enter,
                        ch.machine.incident_since_ms(),
                        now,
                        window_ms,
                    ),
                pinned: ch.machine.pin().is_some(),
            });
        }
        if crate::safety::may_panic(&peers, &engine.cfg.safety) {
            // Where the traffic would move: measured only when the share
            // rule leaves the question open.
            for (p, &i) in peers.iter_mut().zip(&engine.group_channels[gi]) {
                p.load_rps = engine.demand_at(i, now).demand_rps.iter().sum();
            }
        }
        let headroom = engine.cfg.schedule.capacity_headroom;
        let Some(change) = engine.safety[gi].update(now, &peers, &engine.cfg.safety, headroom)
        else {
            continue;
        };
        let group = engine.cfg.groups[gi].id.clone();
        out.push(engine.rules.correlated_failure(&group, now, &change));
        if !matches!(change, SafetyChange::Entered { .. }) {
            continue;
        }
        for &idx in due {
            if engine.channels[idx].group_idx != gi || engine.channels[idx].frozen_at(now) {
                continue;
            }
            let states = engine.channels[idx].cfg.policy.states.clone();
            engine.scratch.clear();
            let mut scratch = std::mem::take(&mut engine.scratch);
            engine.channels[idx].machine.release_common_cause(
                now,
                now - window_ms,
                &states,
                &mut scratch,
            );
            emit_changes(engine, idx as ChannelIdx, &scratch, out);
            engine.scratch = scratch;
        }
    }
}

/// Steps one channel's machine with its score and runs its alert rules.
pub(super) fn step_channel(engine: &mut Engine, idx: usize, now: i64, out: &mut Vec<AlertEvent>) {
    let ch = &mut engine.channels[idx];
    if ch.frozen_at(now) {
        // Replaying what the restored state already reflects.
        return;
    }
    let policy = ch.cfg.policy.clone();
    let evaluation = Evaluation {
        score: ch.judged_score().map(|s| s.value),
        score_low: ch.score_low,
        score_high: ch.score_high,
        // Probes are evidence only when there is no half-open share.
        evidence: if policy.states.half_open_share > 0.0 {
            ch.signals.evidence_real
        } else {
            ch.signals.evidence_real + ch.signals.evidence_probe
        },
        correlated: engine.safety[ch.group_idx].in_panic(),
        thin_evidence: ch
            .signals
            .get(SignalKind::BadOutcomeRate)
            .is_none_or(|m| m.samples < policy.signals.confidence_full_samples),
        // Judged only on a reading bad enough to matter (the baseline's
        // median is a sort).
        intermittent: ch.score.is_some_and(|sc| {
            sc.value >= policy.states.at_risk_enter
                && intermittent(
                    &sc,
                    || {
                        let l = ch.signals.latency?;
                        crate::signals::read_latency_median(&mut ch.ring, &l, now)
                    },
                    &ch.baseline,
                    &policy,
                    engine.cfg.engine.baseline_min_windows,
                )
        }),
    };
    engine.scratch.clear();
    let mut scratch = std::mem::take(&mut engine.scratch);
    ch.machine
        .step(now, evaluation, &policy.states, &mut scratch);
    emit_changes(engine, idx as ChannelIdx, &scratch, out);
    engine.scratch = scratch;
    channel_alarms(engine, idx, now, out);
}

/// Alarms a tick may raise for one channel: the signal rules and
/// silence. (Oscillation is raised by the relapse itself, in
/// `emit_changes`, never from a timer.)
pub(super) fn channel_alarms(engine: &mut Engine, idx: usize, now: i64, out: &mut Vec<AlertEvent>) {
    let first_event = engine.first_event_ms.unwrap_or(now);
    let ch = &engine.channels[idx];
    let policy = &ch.cfg.policy;
    let who = Subject {
        group: &ch.cfg.group,
        channel: &ch.cfg.id,
        index: idx as ChannelIdx,
    };
    let calm =
        ch.machine.kind() == StateKind::Healthy && ch.machine.weight(&policy.states) >= 1.0 - 1e-9;
    engine.rules.observe_channel(who.index, now, calm);
    let sc = ch.score.unwrap_or_default();
    engine.rules.on_evaluation(&who, now, &ch.signals, &sc, out);
    if let Some(silent_ms) = silence(engine, idx, now, first_event) {
        let ch = &engine.channels[idx];
        let who = Subject {
            group: &ch.cfg.group,
            channel: &ch.cfg.id,
            index: idx as ChannelIdx,
        };
        engine.rules.alarm(
            &who,
            AlertKind::SilentChannel,
            crate::alert::contract::SILENT_CHANNEL,
            now,
            format!("silent_ms={silent_ms}"),
            format!(
                "channel {}: no events for {} s while it has weight",
                ch.cfg.id,
                silent_ms / 1000
            ),
            None,
            out,
        );
    }
}

/// How long a channel has been silent at `now`, when that is news
/// (docs/decisions.md#alerts-and-pages: nobody is paged for what Hermes
/// did itself). Silence counts from the later of its last event and
/// the moment its weight last came back or fell, so time spent drained
/// and the instant weight is given back are never silence; and it is
/// reported only when the channel's own traffic since that moment
/// (`engine.silent_min_events` events at least, read over the long view
/// at the last evaluation that saw an event) would have brought that
/// many events in the gap.
pub(super) fn silence(engine: &mut Engine, idx: usize, now: i64, first_event: i64) -> Option<i64> {
    let e = &engine.cfg.engine;
    let ch = &mut engine.channels[idx];
    let last_event = ch.last_event_ms?;
    let weighted_from = ch.weight_since_ms.unwrap_or(i64::MIN).max(first_event);
    if last_event >= now - e.evaluation_interval_ms && last_event >= weighted_from {
        // Events since the last evaluation: the traffic with the weight
        // as it is, over the long view (the rate a silence is judged by).
        let from = weighted_from.max(now - e.long_window_ms);
        let view = ch.ring.counters(now, e.long_window_ms, from);
        let events = view.real.requests + view.probe.requests;
        ch.traffic = Some((events, (last_event - from).max(e.slice_ms)));
    }
    if ch.machine.weight(&ch.cfg.policy.states) <= 0.0 {
        return None;
    }
    let silent_ms = now - last_event.max(weighted_from);
    let (events, span_ms) = ch.traffic?;
    let expected = events as f64 * silent_ms as f64 / span_ms as f64;
    let min = e.silent_min_events;
    (silent_ms > e.silent_after_ms && events >= min && expected >= min as f64).then_some(silent_ms)
}

/// Turns machine changes into alerts and applies their side effects.
pub(super) fn emit_changes(
    engine: &mut Engine,
    idx: ChannelIdx,
    changes: &[Change],
    out: &mut Vec<AlertEvent>,
) {
    let window = engine.cfg.engine.outcome_window;
    let ch = &mut engine.channels[idx as usize];
    for c in changes {
        if c.weight_after < c.weight_before || c.weight_before <= 0.0 && c.weight_after > 0.0 {
            ch.weight_since_ms = Some(c.at_ms);
            ch.traffic = None;
        }
        if c.to == StateKind::Observing && c.from != StateKind::Observing {
            // Fresh evidence for the probation: the incident's failures
            // have been acted on and must not block recovery (incident 002).
            ch.outcomes = OutcomeWindow::new(window);
            ch.streak = FailureStreak::default();
        }
        let who = Subject {
            group: &ch.cfg.group,
            channel: &ch.cfg.id,
            index: idx,
        };
        out.push(
            engine
                .rules
                .on_change(&who, c, ch.judged_score().as_ref(), &ch.signals),
        );
    }
    if let Some((relapses, now)) = ch.machine.take_oscillation() {
        let states = &ch.cfg.policy.states;
        let who = Subject {
            group: &ch.cfg.group,
            channel: &ch.cfg.id,
            index: idx,
        };
        let cooldown_s = ch.machine.cooldown_remaining_ms(now) / 1000;
        engine.rules.alarm(
            &who,
            AlertKind::Oscillation,
            crate::alert::contract::OSCILLATION,
            now,
            format!("relapses_after_readmission(n={relapses})"),
            format!(
                "channel {}: failed again after being let back, {relapses} times within \
                 {} min; it flaps. Next probation in {cooldown_s} s (the cool-down grows \
                 with each relapse, up to {} min)",
                ch.cfg.id,
                states.oscillation_window_ms / 60_000,
                states.max_relapse_cooldown_ms / 60_000
            ),
            ch.score.as_ref(),
            out,
        );
    }
    if !changes.is_empty() {
        touch(engine, idx);
    }
}
