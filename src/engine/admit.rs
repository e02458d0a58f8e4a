//! Per event: find the channel, check lateness and the event's clock, record
//! it in its windows, and take the consecutive-failure fast path.

use super::{Admitted, ApplyError, ChannelHint, ChannelIdx, Engine, Streaks};
use crate::alert::{AlertEvent, Subject};
use crate::event::{ErrorClass, RequestEvent};

impl Engine {
    /// Hints where [`Engine::prefetch_entry`] will look `ev`'s channel up,
    /// and returns the id's hash it takes; the first of three steps.
    pub fn prefetch_lookup(&self, ev: &RequestEvent<'_>) -> u64 {
        let hash = self.by_id.hash(ev.channel_id);
        self.by_id.prefetch(hash);
        hash
    }

    /// Looks `ev`'s channel up (`id_hash`: its [`Engine::prefetch_lookup`])
    /// and hints the parts of its entry that applying it reads (see
    /// `crate::prefetch`); the second step, once the lookup's slot had
    /// time to load.
    pub fn prefetch_entry(&self, ev: &RequestEvent<'_>, id_hash: u64) -> Option<ChannelHint> {
        let idx = self.by_id.get_hashed(ev.channel_id, id_hash)?;
        self.channels[idx as usize].prefetch_hot();
        Some(ChannelHint {
            generation: self.generation,
            idx,
        })
    }

    /// The channel of `ev`: `hint` if it was looked up for this engine's
    /// channels as they are, else looked up now.
    pub(super) fn channel_of(
        &self,
        ev: &RequestEvent<'_>,
        hint: Option<ChannelHint>,
    ) -> Option<ChannelIdx> {
        let idx = match hint {
            Some(h) if h.generation == self.generation => h.idx,
            _ => self.by_id.get(ev.channel_id)?,
        };
        debug_assert_eq!(self.channels[idx as usize].cfg.id, ev.channel_id);
        Some(idx)
    }

    /// Hints what applying `ev` reads through its channel's entry: its
    /// slice, staging buffers and outcome window. The second
    /// step, once [`Engine::prefetch_entry`] had time to load the entry.
    pub fn prefetch_windows(&self, ev: &RequestEvent<'_>, hint: Option<ChannelHint>) {
        let Some(idx) = self.channel_of(ev, hint) else {
            return;
        };
        let ch = &self.channels[idx as usize];
        ch.ring.prefetch(ev);
        ch.outcomes.prefetch();
    }

    /// Applies one event of a recording or a simulation: an event stamped
    /// far ahead is judged against the watermark (`clock`). Alerts it causes
    /// (the fast path, evaluation ticks it crosses) are appended to `out`.
    pub fn apply(
        &mut self,
        ev: &RequestEvent<'_>,
        out: &mut Vec<AlertEvent>,
    ) -> Result<(), ApplyError> {
        self.apply_against(ev, Some(crate::clock::Reference::Watermark), None, out)
    }

    /// Applies one event as it arrives live: an event stamped further ahead
    /// of the wall clock `wall_ms` than the allowed skew is refused.
    pub fn apply_live(
        &mut self,
        ev: &RequestEvent<'_>,
        wall_ms: i64,
        out: &mut Vec<AlertEvent>,
    ) -> Result<(), ApplyError> {
        self.apply_live_hinted(ev, wall_ms, None, out)
    }

    /// [`Engine::apply_live`] with the channel looked up ahead
    /// ([`Engine::prefetch_entry`] on this event).
    pub fn apply_live_hinted(
        &mut self,
        ev: &RequestEvent<'_>,
        wall_ms: i64,
        hint: Option<ChannelHint>,
        out: &mut Vec<AlertEvent>,
    ) -> Result<(), ApplyError> {
        self.apply_live_once(ev, wall_ms, hint, || true, out)
            .map(|_| ())
    }

    /// [`Engine::apply_live_hinted`] for a caller that remembers which
    /// events it has seen, keyed by event time (the service's dedup): once
    /// the clock check let `ev` through, `first_seen` says whether it is
    /// new, and a duplicate goes no further. The clock is checked before the
    /// caller's memory is touched (a far-future time would expire every
    /// remembered id) and once per event.
    pub fn apply_live_once(
        &mut self,
        ev: &RequestEvent<'_>,
        wall_ms: i64,
        hint: Option<ChannelHint>,
        first_seen: impl FnOnce() -> bool,
        out: &mut Vec<AlertEvent>,
    ) -> Result<Admitted, ApplyError> {
        self.check_clock(ev, crate::clock::Reference::Wall(wall_ms))?;
        if !first_seen() {
            return Ok(Admitted::Duplicate);
        }
        self.apply_against(ev, None, hint, out)?;
        Ok(Admitted::Applied)
    }

    /// Refuses an event stamped too far ahead of `reference` (`clock`).
    pub(super) fn check_clock(
        &mut self,
        ev: &RequestEvent<'_>,
        reference: crate::clock::Reference,
    ) -> Result<(), ApplyError> {
        use crate::clock::{is_ahead, Reference};
        let t = ev.event_time_ms;
        let skew = self.cfg.engine.clock_skew_ms();
        let refused = match (reference, self.watermark_ms) {
            (Reference::Wall(now), _) => is_ahead(t, now, skew).then_some((now, "the wall clock")),
            (Reference::Watermark, Some(w)) if is_ahead(t, w, skew) => {
                let needed = self.cfg.engine.clock_jump_events;
                (!self.jump.corroborated(ev.gateway_id, needed)).then_some((w, "the watermark"))
            }
            (Reference::Watermark, _) => {
                self.jump.clear();
                None
            }
        };
        match refused {
            Some((r, reference)) => {
                self.stats.future_timestamp += 1;
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
        &mut self,
        ev: &RequestEvent<'_>,
        reference: Option<crate::clock::Reference>,
        hint: Option<ChannelHint>,
        out: &mut Vec<AlertEvent>,
    ) -> Result<(), ApplyError> {
        let idx = self.admit(ev, reference, hint)?;
        let t = ev.event_time_ms;
        if self.watermark_ms.is_none_or(|w| t > w) {
            self.advance_to(t, out);
        }
        self.stats.applied += 1;
        if let Some(streaks) = self.record(idx, ev) {
            self.on_streaks(idx, t, ev.is_probe, streaks, out);
        }
        Ok(())
    }

    /// The channel an event is for, if the engine takes it: a known channel
    /// of the event's group, within the allowed lateness, stamped by a clock
    /// in line with `reference` (`None`: the caller checked it).
    pub(super) fn admit(
        &mut self,
        ev: &RequestEvent<'_>,
        reference: Option<crate::clock::Reference>,
        hint: Option<ChannelHint>,
    ) -> Result<ChannelIdx, ApplyError> {
        let Some(idx) = self.channel_of(ev, hint) else {
            self.stats.unknown_channel += 1;
            return Err(ApplyError::UnknownChannel {
                channel: ev.channel_id.to_string(),
            });
        };
        let t = ev.event_time_ms;
        if let Some(w) = self.watermark_ms {
            if t < w - self.cfg.engine.allowed_lateness_ms {
                self.stats.too_late += 1;
                return Err(ApplyError::TooLate { lag_ms: w - t });
            }
        }
        self.check_plausible(ev)?;
        if let Some(reference) = reference {
            self.check_clock(ev, reference)?;
        }
        let ch = &self.channels[idx as usize];
        if ch.group_id != *ev.route_group {
            self.stats.group_mismatch += 1;
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
    pub(super) fn record(&mut self, idx: ChannelIdx, ev: &RequestEvent<'_>) -> Option<Streaks> {
        let t = ev.event_time_ms;
        let ch = &mut self.channels[idx as usize];
        ch.ring.record(ev);
        if !ev.was_sent() {
            // Demand only: says nothing about the channel's health.
            self.stats.unsent += 1;
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
    pub(super) fn check_plausible(&self, ev: &RequestEvent<'_>) -> Result<(), ApplyError> {
        let e = &self.cfg.engine;
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
        &mut self,
        idx: ChannelIdx,
        t: i64,
        probe: bool,
        streaks: Streaks,
        out: &mut Vec<AlertEvent>,
    ) {
        let ch = &self.channels[idx as usize];
        if streaks.grew {
            let policy = ch.cfg.policy.clone();
            let correlated = self.safety[ch.group_idx].in_panic();
            self.scratch.clear();
            let mut scratch = std::mem::take(&mut self.scratch);
            self.channels[idx as usize].machine.on_failure_streak(
                t,
                streaks.failures,
                correlated,
                &policy.states,
                &mut scratch,
            );
            self.emit_changes(idx, &scratch, out);
            self.scratch = scratch;
        }
        if probe && streaks.probes > 0 {
            let ch = &self.channels[idx as usize];
            let who = Subject {
                group: &ch.cfg.group,
                channel: &ch.cfg.id,
                index: idx,
            };
            self.rules.on_probe_streak(&who, t, streaks.probes, out);
        }
    }
}
