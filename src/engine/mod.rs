//! The health engine: request events in, per-channel health and alert events
//! out. Pure and synchronous; the service, the demo, the simulator and replay
//! all drive this same type.
//!
//! # Time
//! The engine keeps a watermark: the highest event time it has seen. One
//! engine serves channels that share a watermark, which in the service means
//! one engine per Kafka partition. Evaluation ticks fall every
//! `engine.evaluation_interval_ms` on a fixed grid, cut into
//! `engine.evaluation_phases` phases: route group `i` is evaluated in phase
//! `i % phases`, once per interval, so an interval's work is spread over it
//! instead of pausing the request path at one instant. When an event (or an
//! explicit [`Engine::advance_to`]) moves the watermark past a phase, that
//! phase's channels are evaluated *at the phase's time*, before the event is
//! recorded. Identical input sequences therefore give identical decisions.
//!
//! # Per event (the hot path)
//! Look up the channel (one hash of the id), check lateness, push the event
//! into its slice, update the outcome window and failure streak, and take the
//! consecutive-failure fast path when the streak reaches its threshold. No
//! allocation unless an alert is raised.
//!
//! # Per tick (a phase)
//! For every channel of the phase's groups: measure signals, score them,
//! judge each group as a whole, step the state machine, run the alert rules,
//! and teach the baseline if the channel is healthy. Channels evaluated or
//! changed are remembered for [`Engine::take_touched`], so a caller reports
//! only those.
//!
//! # Files
//! `admit.rs` is the per-event path, `evaluate.rs` the per-tick one,
//! `channel.rs` one channel's runtime (what an evaluation reads from its
//! windows); this file holds the types, configuration, pins, restore and
//! the health a channel reports.

use crate::alert::{AlertEvent, AlertRules};
use crate::config::Config;
use crate::event::RequestEvent;
use crate::health::ChannelHealth;
use crate::id_table::IdTable;
use crate::safety::GroupSafety;
use crate::score::Score;
use crate::signals::{SignalKind, Signals};
use crate::state::{Change, Pin, StateMachine};
use crate::window::ViewCounters;
use std::sync::Arc;

mod admit;
mod channel;
mod kinds;

use kinds::Streaks;
pub use kinds::{Admitted, ApplyError, ChannelHint, ChannelReading, EngineStats};

use channel::ChannelRuntime;
mod evaluate;
#[cfg(test)]
mod tests;

/// Dense index of a channel in the engine (config order).
pub type ChannelIdx = u32;

/// The table of `channels`' ids to their indexes.
fn id_table(channels: &[ChannelRuntime]) -> IdTable {
    IdTable::new(
        channels
            .iter()
            .enumerate()
            .map(|(i, c)| (c.cfg.id.as_str(), i as ChannelIdx)),
    )
}

/// A number no other engine's channel table has had in this process.
fn next_generation() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The health engine for a set of channels sharing one watermark.
pub struct Engine {
    cfg: Arc<Config>,
    channels: Vec<ChannelRuntime>,
    by_id: IdTable,
    /// Changes whenever `by_id` may: a [`ChannelHint`] from another
    /// generation is looked up again.
    generation: u64,
    watermark_ms: Option<i64>,
    first_event_ms: Option<i64>,
    next_eval_ms: Option<i64>,
    rules: AlertRules,
    stats: EngineStats,
    scratch: Vec<Change>,
    /// Evaluate channels no event of this engine has named yet.
    evaluate_unseen: bool,
    /// Per group (config order): the correlated-failure memory.
    safety: Vec<GroupSafety>,
    /// Per group: its channels.
    group_channels: Vec<Vec<usize>>,
    /// Per phase of the evaluation interval: the groups evaluated then
    /// (group `i` in phase `i % engine.evaluation_phases`).
    phases: Vec<Vec<usize>>,
    /// Channels evaluated or changed since [`Engine::take_touched`].
    touched: Vec<ChannelIdx>,
    /// A candidate jump of the watermark, waiting for corroboration.
    jump: crate::clock::JumpGuard,
}

/// A channel's demand over the demand window ([`Engine::demand_at`]).
struct Demand {
    demand_rps: [f64; 4],
    unsent_rps: [f64; 4],
    /// The counters it was read from.
    view: ViewCounters,
    /// The seconds of the window the engine has seen.
    secs: f64,
}

impl Engine {
    /// An engine that owns every channel of the config (the simulator,
    /// replay): a channel without events is evaluated too, and raises the
    /// silent-channel alarm.
    pub fn new(cfg: Arc<Config>) -> Engine {
        Engine::build(cfg, true)
    }

    /// An engine for one Kafka partition of the service. It knows every
    /// channel of the config (which keys land on which partition is the
    /// producers' business), but evaluates only the channels whose events
    /// reached it: the others belong to other partitions, and would
    /// otherwise cost a tick each and raise false silent-channel alarms.
    pub fn for_partition(cfg: Arc<Config>) -> Engine {
        Engine::build(cfg, false)
    }

    fn build(cfg: Arc<Config>, evaluate_unseen: bool) -> Engine {
        let e = &cfg.engine;
        // Sized once: grown by doubling, tens of MB were copied at a start
        // and up to half of it reserved for nothing.
        let mut channels = Vec::with_capacity(channel_count(&cfg));
        for (gi, g) in cfg.groups.iter().enumerate() {
            for c in &g.channels {
                channels.push(ChannelRuntime::new(c, gi, e));
            }
        }
        let (group_channels, phases) = layout(&cfg);
        Engine {
            group_channels,
            phases,
            touched: Vec::new(),
            evaluate_unseen,
            safety: vec![GroupSafety::default(); cfg.groups.len()],
            jump: crate::clock::JumpGuard::default(),
            rules: AlertRules::new(cfg.alerts.clone()),
            cfg,
            by_id: id_table(&channels),
            channels,
            generation: next_generation(),
            watermark_ms: None,
            first_event_ms: None,
            next_eval_ms: None,
            stats: EngineStats::default(),
            scratch: Vec::new(),
        }
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.cfg
    }
    pub fn stats(&self) -> EngineStats {
        self.stats
    }
    /// Whether a channel was evaluated or changed since
    /// [`Engine::take_touched`].
    pub fn has_touched(&self) -> bool {
        !self.touched.is_empty()
    }
    pub fn watermark_ms(&self) -> Option<i64> {
        self.watermark_ms
    }
    pub fn channel_count(&self) -> usize {
        self.channels.len()
    }
    pub fn channel_index(&self, id: &str) -> Option<ChannelIdx> {
        self.by_id.get(id)
    }

    /// Warm once a short window of event time has been seen: before that the
    /// engine's view is too thin to publish (fail static, never "all healthy"
    /// from nothing).
    pub fn is_warm(&self) -> bool {
        match (self.first_event_ms, self.watermark_ms) {
            (Some(first), Some(w)) => w - first >= self.cfg.engine.short_window_ms,
            _ => false,
        }
    }

    /// Pins a channel (operator override), effective now; `note` (who and
    /// why) goes into the OVERRIDE alert's message. Returns false for an
    /// unknown channel.
    pub fn pin(
        &mut self,
        channel: &str,
        pin: Option<Pin>,
        now_ms: i64,
        note: &str,
        out: &mut Vec<AlertEvent>,
    ) -> bool {
        let Some(idx) = self.channel_index(channel) else {
            return false;
        };
        let policy = self.channels[idx as usize].cfg.policy.clone();
        let mut scratch = Vec::new();
        let m = &mut self.channels[idx as usize].machine;
        match pin {
            Some(p) => m.set_pin(now_ms, p, &policy.states, &mut scratch),
            None => m.clear_pin(now_ms, &policy.states, &mut scratch),
        }
        let from = out.len();
        evaluate::emit_changes(self, idx, &scratch, out);
        if !note.is_empty() {
            for a in &mut out[from..] {
                a.message = format!("{} ({note})", a.message);
            }
        }
        true
    }

    /// Every channel an operator pin holds, with the pin.
    pub fn pinned(&self) -> Vec<(String, Pin)> {
        self.channels
            .iter()
            .filter_map(|c| c.machine.pin().map(|p| (c.cfg.id.clone(), p)))
            .collect()
    }

    /// Records an operator's group manual-mode switch as an alert.
    pub fn record_group_override(
        &mut self,
        group: &str,
        on: bool,
        now_ms: i64,
        out: &mut Vec<AlertEvent>,
    ) {
        out.push(self.rules.group_override(group, on, now_ms, ""));
    }

    /// Restores a channel's state machine saved at event time `saved_at_ms`
    /// (a takeover). Until the watermark passes `saved_at_ms` the machine
    /// does not step: the events replayed up to there are already reflected
    /// in it, and only rebuild the windows. Returns the channel's index,
    /// `None` for an unknown channel.
    pub fn restore(
        &mut self,
        channel: &str,
        machine: StateMachine,
        saved_at_ms: i64,
    ) -> Option<ChannelIdx> {
        let idx = self.channel_index(channel)?;
        let ch = &mut self.channels[idx as usize];
        // A channel restored below full weight: the replayed traffic may be
        // from before its weight fell (the silence rule reads only what came
        // after).
        if machine.weight(&ch.cfg.policy.states) < 1.0 {
            ch.weight_since_ms = Some(saved_at_ms);
        }
        ch.machine = machine;
        ch.frozen_until_ms = Some(saved_at_ms);
        Some(idx)
    }

    /// Whether any event of this channel reached this engine (a partition
    /// reports only the channels whose events it carries).
    pub fn has_events(&self, idx: ChannelIdx) -> bool {
        let ch = &self.channels[idx as usize];
        ch.last_event_ms.is_some() || ch.last_unsent_ms.is_some()
    }

    /// Swaps in a new config (for an engine that serves every channel of
    /// it), keeping every surviving channel's windows and state (a hot
    /// reload). Channels new to the config start empty; removed
    /// ones are dropped. The window shape (`[engine]`) cannot change while
    /// running: that needs a restart, and the reload is refused.
    ///
    /// Returns where each channel went: entry `i` is the new index of the
    /// channel that was at index `i`, `None` for one the config dropped
    /// (for state others keep by index).
    pub fn reconfigure(&mut self, cfg: Arc<Config>) -> Result<Vec<Option<ChannelIdx>>, String> {
        if cfg.engine != self.cfg.engine {
            return Err(
                "[engine] settings changed: window shape needs a restart; keeping the running config"
                    .into(),
            );
        }
        let old_ids: Vec<String> = self.channels.iter().map(|c| c.cfg.id.clone()).collect();
        let mut old: ahash::AHashMap<String, ChannelRuntime> = std::mem::take(&mut self.channels)
            .into_iter()
            .map(|c| (c.cfg.id.clone(), c))
            .collect();
        let mut channels = Vec::with_capacity(channel_count(&cfg));
        for (gi, g) in cfg.groups.iter().enumerate() {
            for c in &g.channels {
                let mut rt = old
                    .remove(&c.id)
                    .unwrap_or_else(|| ChannelRuntime::new(c, gi, &cfg.engine));
                rt.configure(c, gi);
                channels.push(rt);
            }
        }
        // Groups keep their panic memory by id; new ones start calm.
        let safety = cfg
            .groups
            .iter()
            .map(|g| {
                self.cfg
                    .groups
                    .iter()
                    .position(|o| o.id == g.id)
                    .map_or_else(GroupSafety::default, |i| self.safety[i])
            })
            .collect();
        self.safety = safety;
        self.by_id = id_table(&channels);
        // Every index may have moved: the groups' channel lists, the phases
        // and the channels touched since the last report follow the new
        // order (a touched channel carries its flag; a removed one is gone).
        (self.group_channels, self.phases) = layout(&cfg);
        self.touched = (0..channels.len() as ChannelIdx)
            .filter(|&idx| channels[idx as usize].touched)
            .collect();
        self.channels = channels;
        self.generation = next_generation();
        let moved: Vec<Option<ChannelIdx>> = old_ids.iter().map(|id| self.by_id.get(id)).collect();
        if cfg.alerts != self.cfg.alerts {
            // Dedup memory starts over with new alert rules.
            self.rules = AlertRules::new(cfg.alerts.clone());
        } else {
            self.rules
                .renumber(|old| moved.get(old as usize).copied().flatten());
        }
        self.cfg = cfg;
        Ok(moved)
    }

    /// The state machine of a channel (read-only).
    pub fn machine(&self, idx: ChannelIdx) -> &StateMachine {
        &self.channels[idx as usize].machine
    }

    /// Latest score with its breakdown: the windows' reading, which the
    /// scheduler reads. (An AT_RISK channel's state is judged on the worse
    /// of this and its episode's reading; its alerts carry that one.)
    pub fn score(&self, idx: ChannelIdx) -> Option<&Score> {
        self.channels[idx as usize].score.as_ref()
    }

    /// Latest measured signals.
    pub fn signals(&self, idx: ChannelIdx) -> &Signals {
        &self.channels[idx as usize].signals
    }

    /// A channel's median latency as last read (refreshed every
    /// `engine.latency_median_interval_ms` while it has a P99; `None`
    /// while it has none).
    pub fn latency_median(&self, idx: ChannelIdx) -> Option<f64> {
        self.channels[idx as usize].latency_median
    }

    /// A channel's demand and its unsent part per traffic class (rps) over
    /// the demand window up to `now`: real attempts made plus requests
    /// gateways reported unsent.
    fn demand_at(&self, idx: usize, now: i64) -> Demand {
        let ch = &self.channels[idx];
        let window_ms = self.cfg.schedule.demand_window_ms;
        // Demand over complete slices only: the current one is still filling
        // and would bias the rate low.
        let slice_ms = self.cfg.engine.slice_ms;
        let last_complete = now.div_euclid(slice_ms) * slice_ms - 1;
        let view = ch.ring.counters(last_complete, window_ms, i64::MIN / 2);
        // ... and over the part of the window the engine has actually seen.
        let seen_ms = self.first_event_ms.map_or(window_ms, |f| {
            let first_complete = (f.div_euclid(slice_ms) + 1) * slice_ms;
            (last_complete + 1 - first_complete).clamp(slice_ms, window_ms)
        });
        let secs = seen_ms as f64 / 1000.0;
        let mut demand_rps = [0.0; 4];
        let mut unsent_rps = [0.0; 4];
        for k in 0..4 {
            unsent_rps[k] = view.class_unsent[k] as f64 / secs;
            demand_rps[k] = view.class_requests[k] as f64 / secs + unsent_rps[k];
        }
        Demand {
            demand_rps,
            unsent_rps,
            view,
            secs,
        }
    }

    /// What a report of one channel reads, in one call: its health, state
    /// machine, signals, score and median latency as of the last
    /// evaluation; `None` for a channel no event of which reached this
    /// engine (a partition reports only the channels it carries).
    pub fn reading(&self, idx: ChannelIdx) -> Option<ChannelReading<'_>> {
        if !self.has_events(idx) {
            return None;
        }
        let ch = &self.channels[idx as usize];
        Some(ChannelReading {
            health: self.health(idx),
            machine: &ch.machine,
            signals: &ch.signals,
            score: ch.score.as_ref(),
            latency_median_ms: ch.latency_median,
        })
    }

    /// Health of one channel as of the last evaluation.
    pub fn health(&self, idx: ChannelIdx) -> ChannelHealth {
        let ch = &self.channels[idx as usize];
        let now = self.watermark_ms.unwrap_or(0);
        let Demand {
            demand_rps,
            unsent_rps,
            view,
            secs,
        } = self.demand_at(idx as usize, now);
        let real_requests: u32 = view.class_requests.iter().sum();
        let tokens: u64 = view.class_tokens.iter().sum();
        ChannelHealth {
            id: ch.cfg.id.clone(),
            group: ch.cfg.group.clone(),
            state: ch.machine.kind(),
            weight: ch.machine.weight(&ch.cfg.policy.states),
            score: ch.score.map(|s| s.value),
            signals: ch
                .score
                .map(|s| {
                    s.breakdown()
                        .into_iter()
                        .take(crate::health::TOP_SIGNALS)
                        .map(|(k, c)| (k.name().to_string(), c))
                        .collect()
                })
                .unwrap_or_default(),
            pinned: ch.machine.pin().is_some(),
            demand_rps,
            unsent_rps,
            tokens_per_request: (real_requests > 0).then(|| tokens as f64 / real_requests as f64),
            spend_per_hour: (view.real.cost + view.probe.cost) / secs * 3600.0,
            p99_ms: ch.signals.latency.map(|l| l.p99_ms),
            error_rate: ch.signals.error_rate,
            // The short view lags a channel that just went hard down (a
            // minute of good answers still in it); the last outcomes do not.
            failure_rate: [SignalKind::BadOutcomeRate, SignalKind::RecentFailureRate]
                .iter()
                .filter_map(|k| ch.signals.get(*k).map(|m| m.value))
                .reduce(f64::max),
            failure_streak: ch.streak.count,
            quota_remaining: ch.signals.quota_remaining,
            quota_exhausted_in_ms: ch.signals.quota_exhausted_in_ms,
            correlated: self.safety[ch.group_idx].in_panic(),
            incident_since_ms: ch.machine.incident_since_ms(),
        }
    }
}

/// Events in: the per-event path (admit.rs) and the evaluation ticks
/// (evaluate.rs) it crosses.
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

    /// Hints what applying `ev` reads through its channel's entry: its
    /// slice, staging buffers, outcome window and a long group id's heap
    /// block. The third step, once [`Engine::prefetch_entry`] had time to
    /// load the entry.
    pub fn prefetch_windows(&self, ev: &RequestEvent<'_>, hint: Option<ChannelHint>) {
        let Some(idx) = admit::channel_of(self, ev, hint) else {
            return;
        };
        self.channels[idx as usize].prefetch_windows(ev);
    }

    /// Applies one event of a recording or a simulation: an event stamped
    /// far ahead is judged against the watermark (`clock`). Alerts it causes
    /// (the fast path, evaluation ticks it crosses) are appended to `out`.
    pub fn apply(
        &mut self,
        ev: &RequestEvent<'_>,
        out: &mut Vec<AlertEvent>,
    ) -> Result<(), ApplyError> {
        admit::apply_against(
            self,
            ev,
            Some(crate::clock::Reference::Watermark),
            None,
            out,
        )
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
        admit::check_clock(self, ev, crate::clock::Reference::Wall(wall_ms))?;
        if !first_seen() {
            return Ok(Admitted::Duplicate);
        }
        admit::apply_against(self, ev, None, hint, out)?;
        Ok(Admitted::Applied)
    }

    /// Moves the watermark to `now_ms` (if later) and runs every evaluation
    /// tick up to it. The service calls this for idle partitions; the
    /// simulator calls it with simulated time.
    pub fn advance_to(&mut self, now_ms: i64, out: &mut Vec<AlertEvent>) {
        evaluate::advance_to(self, now_ms, out)
    }

    /// The channels evaluated or changed since the last call, in the order
    /// they were first touched: what a caller that reports incrementally
    /// has to report.
    pub fn take_touched(&mut self) -> Vec<ChannelIdx> {
        evaluate::take_touched(self)
    }
}

/// Each group's channel indices (the channels in config order, group by
/// group) and each phase's groups (group `i` in phase `i % phases`).
fn layout(cfg: &Config) -> (Vec<Vec<usize>>, Vec<Vec<usize>>) {
    let mut group_channels = vec![Vec::new(); cfg.groups.len()];
    let mut next = 0;
    for (gi, g) in cfg.groups.iter().enumerate() {
        group_channels[gi] = (next..next + g.channels.len()).collect();
        next += g.channels.len();
    }
    let mut phases = vec![Vec::new(); cfg.engine.evaluation_phases.max(1) as usize];
    let n = phases.len();
    for gi in 0..cfg.groups.len() {
        phases[gi % n].push(gi);
    }
    (group_channels, phases)
}

/// Channels configured, over every group.
fn channel_count(cfg: &Config) -> usize {
    cfg.groups.iter().map(|g| g.channels.len()).sum()
}
