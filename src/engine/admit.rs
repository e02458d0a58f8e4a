//! Per event, as functions of the engine (its public entry points are the
//! `Engine::apply*` methods): find the channel, check lateness and the
//! event's clock, record it in its windows, and take the consecutive-failure
//! fast path.

use super::{evaluate, ApplyError, ChannelHint, ChannelIdx, Engine, Streaks};
use crate::alert::{AlertEvent, Subject};
use crate::config::EngineConfig;
use crate::event::RequestEvent;

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
    if !ev.was_sent() {
        engine.stats.unsent += 1;
    }
    if let Some(streaks) = engine.channels[idx as usize].record(ev) {
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
    check_plausible(&engine.cfg.engine, ev)?;
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

/// Token counts and latencies within `engine.max_tokens_per_attempt` and
/// `engine.max_latency_ms`.
pub(super) fn check_plausible(e: &EngineConfig, ev: &RequestEvent<'_>) -> Result<(), ApplyError> {
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
