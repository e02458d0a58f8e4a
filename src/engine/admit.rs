//! Per event, as functions of the engine (its public entry points are the
//! `Engine::apply*` methods): find the channel, check lateness and the
//! event's clock, record it in its windows, and take the consecutive-failure
//! fast path.

use super::{evaluate, ApplyError, ChannelHint, ChannelIdx, Engine, Streaks};
use crate::alert::{AlertEvent, Subject};
use crate::event::{ErrorClass, RequestEvent};

/// The channel of `ev`: `hint` if it was looked up for this engine's
/// channels as they are, else looked up now.
pub(super) fn channel_of(
    engine: &Engine,
    ev: &RequestEvent<'_>,
    hint: Option<ChannelHint>,
) -> Option<ChannelIdx> {
    let idx = match hint {
        Some(h) if h.generation == engine.generation => h.idx,
        _ => engine.by_id.get(ev.channel_id)?,
    };
    debug_assert_eq!(engine.channels[idx as usize].cfg.id, ev.channel_id);
    Some(idx)
}

/// Refuses an event stamped too far ahead of `reference` (`clock`).
pub(super) fn check_clock(
    engine: &mut Engine,
    ev: &RequestEvent<'_>,
    reference: crate::clock::Reference,
) -> Result<(), ApplyError> {
    use crate::clock::{is_ahead, Reference};
    let t = ev.event_time_ms;
    let skew = engine.cfg.engine.clock_skew_ms();
    let refused = match (reference, engine.watermark_ms) {
        (Reference::Wall(now), _) => is_ahead(t, now, skew).then_some((now, "the wall clock")),
        (Reference::Watermark, Some(w)) if is_ahead(t, w, skew) => {
            let needed = engine.cfg.engine.clock_jump_events;
            (!engine.jump.corroborated(ev.gateway_id, needed)).then_some((w, "the watermark"))
        }
        (Reference::Watermark, _) => {
            engine.jump.clear();
            None
        }
    };
    match refused {
        Some((r, reference)) => {
            engine.stats.future_timestamp += 1;
            Err(ApplyError::FutureTimestamp {
                ahead_ms: t.saturating_sub(r),
                reference,
            })
        }
        None => Ok(()),
    }
}

/// Admits and records `ev`, its clock checked against `reference`
/// (`None`: the caller checked it).
pub(super) fn apply_against(
    engine: &mut Engine,
    ev: &RequestEvent<'_>,
    reference: Option<crate::clock::Reference>,
    hint: Option<ChannelHint>,
    out: &mut Vec<AlertEvent>,
) -> Result<(), ApplyError> {
    let idx = admit(engine, ev, reference, hint)?;
    let t = ev.event_time_ms;
    if engine.watermark_ms.is_none_or(|w| t > w) {
        evaluate::advance_to(engine, t, out);
    }
    engine.stats.applied += 1;
    if let Some(streaks) = record(engine, idx, ev) {
        on_streaks(engine, idx, t, ev.is_probe, streaks, out);
    }
    Ok(())
}

/// The channel an event is for, if the engine takes it: a known channel
/// of the event's group, within the allowed lateness, stamped by a clock
/// in line with `reference` (`None`: the caller checked it).
pub(super) fn admit(
    engine: &mut Engine,
    ev: &RequestEvent<'_>,
    reference: Option<crate::clock::Reference>,
    hint: Option<ChannelHint>,
) -> Result<ChannelIdx, ApplyError> {
    let Some(idx) = channel_of(engine, ev, hint) else {
        engine.stats.unknown_channel += 1;
        return Err(ApplyError::UnknownChannel {
            channel: ev.channel_id.to_string(),
        });
    };
    let t = ev.event_time_ms;
    if let Some(w) = engine.watermark_ms {
        if t < w - engine.cfg.engine.allowed_lateness_ms {
            engine.stats.too_late += 1;
            return Err(ApplyError::TooLate { lag_ms: w - t });
        }
    }
    check_plausible(engine, ev)?;
    if let Some(reference) = reference {
        check_clock(engine, ev, reference)?;
    }
    let ch = &engine.channels[idx as usize];
    if ch.group_id != *ev.route_group {
        engine.stats.group_mismatch += 1;
        return Err(ApplyError::GroupMismatch {
            channel: ev.channel_id.to_string(),
            expected: ch.cfg.group.clone(),
            got: ev.route_group.to_string(),
        });
    }
    Ok(idx)
}

/// Records an admitted event in its channel's windows, outcomes and
/// failure streaks. The streaks, when the machine may act on them (a
/// sent, not cancelled attempt of a channel not frozen by a restore).
pub(super) fn record(
    engine: &mut Engine,
    idx: ChannelIdx,
    ev: &RequestEvent<'_>,
) -> Option<Streaks> {
    let t = ev.event_time_ms;
    let ch = &mut engine.channels[idx as usize];
    ch.ring.record(ev);
    if !ev.was_sent() {
        // Demand only: says nothing about the channel's health.
        engine.stats.unsent += 1;
        ch.last_unsent_ms = Some(ch.last_unsent_ms.map_or(t, |l| l.max(t)));
        return None;
    }
    if ch.counts_quota && ev.quota_remaining.is_none() {
        ch.quota.record(t, ch.cfg.quota_period_ms);
    }
    ch.last_event_ms = Some(ch.last_event_ms.map_or(t, |l| l.max(t)));
    if ev.error_class == ErrorClass::Cancelled {
        return None;
    }
    if ev.is_probe {
        if ev.error_class.is_hard_failure() {
            ch.probe_streak += 1;
        } else if ev.error_class == ErrorClass::None {
            ch.probe_streak = 0;
        }
    }
    if ev.error_class == ErrorClass::None || ev.error_class.is_hard_failure() {
        ch.outcomes.record(ev.error_class.is_hard_failure());
    }
    let before = ch.streak.count;
    let n = ch.streak.record(ev.error_class);
    (!ch.frozen_at(t)).then_some(Streaks {
        grew: n > before,
        failures: n,
        probes: ch.probe_streak,
    })
}

/// Token counts and latencies within `engine.max_tokens_per_attempt` and
/// `engine.max_latency_ms`.
pub(super) fn check_plausible(engine: &Engine, ev: &RequestEvent<'_>) -> Result<(), ApplyError> {
    let e = &engine.cfg.engine;
    let tokens = e.max_tokens_per_attempt as i64;
    let latency = e.max_latency_ms as i64;
    let checks = [
        (
            "input_tokens",
            ev.input_tokens as i64,
            tokens,
            "max_tokens_per_attempt",
        ),
        (
            "output_tokens",
            ev.output_tokens as i64,
            tokens,
            "max_tokens_per_attempt",
        ),
        (
            "latency_ms",
            ev.latency_ms as i64,
            latency,
            "max_latency_ms",
        ),
        (
            "ttfb_ms",
            ev.ttfb_ms.unwrap_or(0) as i64,
            latency,
            "max_latency_ms",
        ),
    ];
    for (field, value, limit, key) in checks {
        if value > limit {
            return Err(ApplyError::Implausible {
                field,
                value,
                limit,
                key,
            });
        }
    }
    Ok(())
}

/// The fast path (docs/decisions.md#score-and-states: N consecutive hard failures drain at once)
/// and the probe-streak alarm.
pub(super) fn on_streaks(
    engine: &mut Engine,
    idx: ChannelIdx,
    t: i64,
    probe: bool,
    streaks: Streaks,
    out: &mut Vec<AlertEvent>,
) {
    let ch = &engine.channels[idx as usize];
    if streaks.grew {
        let policy = ch.cfg.policy.clone();
        let correlated = engine.safety[ch.group_idx].in_panic();
        engine.scratch.clear();
        let mut scratch = std::mem::take(&mut engine.scratch);
        engine.channels[idx as usize].machine.on_failure_streak(
            t,
            streaks.failures,
            correlated,
            &policy.states,
            &mut scratch,
        );
        evaluate::emit_changes(engine, idx, &scratch, out);
        engine.scratch = scratch;
    }
    if probe && streaks.probes > 0 {
        let ch = &engine.channels[idx as usize];
        let who = Subject {
            group: &ch.cfg.group,
            channel: &ch.cfg.id,
            index: idx,
        };
        engine.rules.on_probe_streak(&who, t, streaks.probes, out);
    }
}
