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

use crate::alert::{AlertEvent, AlertKind, AlertRules, Severity, Subject};
use crate::config::{ChannelConfig, Config};
use crate::event::{ErrorClass, RequestEvent};
use crate::health::ChannelHealth;
use crate::id_table::IdTable;
use crate::safety::{GroupSafety, PeerHealth, SafetyChange};
use crate::score::{intermittent, optimistic, pessimistic, score, Score};
use crate::short_str::ShortStr;
use crate::signals::{baseline_point, measure, Horizon, SignalKind, Signals};
use crate::state::{Change, Evaluation, Pin, StateKind, StateMachine};
use crate::window::{Baseline, FailureStreak, OutcomeWindow, SliceRing, ViewCounters};
use std::sync::Arc;

/// Dense index of a channel in the engine (config order).
pub type ChannelIdx = u32;

/// Why an event was not applied. Each is counted in [`EngineStats`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApplyError {
    #[error("unknown channel `{channel}`")]
    UnknownChannel { channel: String },
    #[error("channel `{channel}` belongs to group `{expected}`, event says `{got}`")]
    GroupMismatch {
        channel: String,
        expected: String,
        got: String,
    },
    #[error("event is {lag_ms} ms behind the watermark, past the allowed lateness")]
    TooLate { lag_ms: i64 },
    #[error(
        "event is stamped {ahead_ms} ms ahead of {reference}, past the allowed clock skew \
         (engine.max_clock_skew_ms)"
    )]
    FutureTimestamp {
        ahead_ms: i64,
        reference: &'static str,
    },
    #[error("{field} is {value}, over the plausible {limit} (engine.{key})")]
    Implausible {
        field: &'static str,
        value: i64,
        limit: i64,
        key: &'static str,
    },
}

impl ApplyError {
    /// Bounded metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            ApplyError::UnknownChannel { .. } => "unknown_channel",
            ApplyError::GroupMismatch { .. } => "group_mismatch",
            ApplyError::TooLate { .. } => "too_late",
            ApplyError::FutureTimestamp { .. } => "future_timestamp",
            ApplyError::Implausible { .. } => "implausible",
        }
    }
}

/// An event's channel looked up ahead of its apply
/// ([`Engine::prefetch_entry`]), so a batch looks each channel up once.
/// Taken only by the engine it came from, with its channels unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelHint {
    generation: u64,
    idx: ChannelIdx,
}

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

/// Counters the shell exports as metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub applied: u64,
    pub too_late: u64,
    pub unknown_channel: u64,
    pub group_mismatch: u64,
    pub evaluations: u64,
    /// Events refused as stamped too far ahead (`clock`).
    pub future_timestamp: u64,
    /// Applied events that reported an unsent request (demand only).
    pub unsent: u64,
}

/// One channel's state. `repr(C)` keeps the fields every event reads
/// (admitting and recording it) together at the start, then the ring, whose
/// own hot fields come first: [`ChannelRuntime::prefetch_hot`] hints only
/// those lines, not a dozen scattered over the entry (see
/// [`crate::prefetch`]). Everything after is read by evaluation ticks.
#[repr(C)]
struct ChannelRuntime {
    // --- read by every event ---
    /// `cfg.group`, inline: every event is checked against it.
    group_id: ShortStr,
    last_event_ms: Option<i64>,
    /// Restored state: up to this event time the machine already reflects
    /// what a replay feeds the windows, so it does not step again.
    frozen_until_ms: Option<i64>,
    /// Latest unsent-request report naming this channel (demand only).
    last_unsent_ms: Option<i64>,
    outcomes: OutcomeWindow,
    streak: FailureStreak,
    probe_streak: u32,
    /// `cfg.quota.is_some()`: events are counted against it.
    counts_quota: bool,
    /// In [`Engine::touched`] already.
    touched: bool,
    ring: SliceRing,
    // --- read by evaluation ticks and changes ---
    cfg: ChannelConfig,
    /// Position of the channel's group in the config (`Engine::safety`).
    group_idx: usize,
    baseline: Baseline,
    machine: StateMachine,
    score: Option<Score>,
    /// The score at the rate signals' confidence bounds (relapses, passes).
    score_low: Option<f64>,
    score_high: Option<f64>,
    /// AT_RISK only: the score with the failure rate read over the whole
    /// episode (see `signals::bad_outcome_rate_episode`).
    score_episode: Option<Score>,
    signals: Signals,
    next_baseline_ms: Option<i64>,
    /// The median latency last read (`engine.latency_median_interval_ms`)
    /// and when it is read next.
    latency_median: Option<f64>,
    next_median_ms: i64,
    /// The configured quota's use in the current period, for gateways that
    /// do not report `quota_remaining`.
    quota: QuotaUse,
}

/// Attempts counted against a channel's configured `quota` per period
/// (docs/decisions.md#signals: remaining quota and burn rate → time to exhaustion). Only used
/// while no gateway reports the upstream's own `quota_remaining`: a report
/// is the upstream's word and wins.
#[derive(Debug, Clone, Copy, Default)]
struct QuotaUse {
    period_start_ms: i64,
    used: u64,
}

impl QuotaUse {
    fn record(&mut self, t_ms: i64, period_ms: i64) {
        let start = t_ms.div_euclid(period_ms) * period_ms;
        if start > self.period_start_ms {
            *self = QuotaUse {
                period_start_ms: start,
                used: 0,
            };
        }
        if start == self.period_start_ms {
            self.used += 1;
        }
    }

    /// (remaining, forecast ms to exhaustion) at `now_ms`, burning at
    /// `attempts_per_ms`; `None` for the forecast when nothing burns or the
    /// period ends first (the quota refills then).
    fn forecast(
        &self,
        quota: u64,
        period_ms: i64,
        now_ms: i64,
        attempts_per_ms: f64,
    ) -> (i64, Option<i64>) {
        let start = now_ms.div_euclid(period_ms) * period_ms;
        let used = if start == self.period_start_ms {
            self.used
        } else {
            0
        };
        let remaining = quota.saturating_sub(used).min(i64::MAX as u64) as i64;
        if remaining == 0 {
            return (0, Some(0));
        }
        let period_left_ms = start + period_ms - now_ms;
        let forecast = (attempts_per_ms > 0.0)
            .then(|| (remaining as f64 / attempts_per_ms) as i64)
            .filter(|ms| *ms < period_left_ms);
        (remaining, forecast)
    }
}

impl ChannelRuntime {
    fn new(c: &ChannelConfig, group_idx: usize, e: &crate::config::EngineConfig) -> ChannelRuntime {
        // The config and what is kept of it: `configure` below.
        let mut rt = ChannelRuntime {
            cfg: c.clone(),
            group_id: ShortStr::new(""),
            counts_quota: false,
            group_idx,
            ring: SliceRing::new(e.ring_shape()),
            outcomes: OutcomeWindow::new(e.outcome_window),
            streak: FailureStreak::default(),
            probe_streak: 0,
            baseline: Baseline::new(e.baseline_windows),
            machine: StateMachine::default(),
            score: None,
            score_low: None,
            score_high: None,
            score_episode: None,
            signals: Signals::default(),
            last_event_ms: None,
            last_unsent_ms: None,
            next_baseline_ms: None,
            latency_median: None,
            next_median_ms: i64::MIN,
            frozen_until_ms: None,
            quota: QuotaUse::default(),
            touched: false,
        };
        rt.configure(c, group_idx);
        rt
    }

    /// Takes the channel's config (at start and on every reload) and what
    /// the entry keeps of it for the hot path.
    /// The score the channel is judged on: the windows' reading, or for an
    /// AT_RISK channel the episode's when that is worse (see
    /// `signals::bad_outcome_rate_episode`).
    fn judged_score(&self) -> Option<Score> {
        match (self.score, self.score_episode) {
            (Some(w), Some(e)) if e.value > w.value => Some(e),
            (w, _) => w,
        }
    }

    /// The score read optimistically and pessimistically (see
    /// `score::optimistic`): what a move down and a move up are judged on.
    fn bounds(&self, horizons: &crate::signals::Horizons, now: i64) -> (Option<f64>, Option<f64>) {
        let policy = &*self.cfg.policy;
        let z = policy.states.probation_confidence_z;
        let Some(since) = self.machine.at_risk_since_ms() else {
            return (
                Some(optimistic(&self.signals, &policy.signals, z)),
                Some(pessimistic(&self.signals, &policy.signals, z)),
            );
        };
        // AT_RISK is left, and drained from, only on what the channel did
        // since it went AT_RISK (see `signals::bad_outcome_rate_since` and
        // `state`): at its reduced weight the failures that put it there
        // stay in the windows while new answers arrive slowly, so the
        // windows' share rises by Hermes' own action.
        let rate = crate::signals::bad_outcome_rate_since(
            &self.ring,
            horizons,
            &policy.signals,
            now,
            since,
        );
        let k = SignalKind::BadOutcomeRate as usize;
        let mut since_at_risk = self.signals.clone();
        since_at_risk.values[k] = Some(rate.exit);
        let min = SignalKind::BadOutcomeRate
            .policy(&policy.signals)
            .min_samples;
        let waited = now - since >= policy.states.probation_max_wait_ms;
        // A sparse channel at its reduced weight cannot bring the evidence
        // an exit needs in hours (docs/decisions.md#safety-rails: recovery
        // fits the traffic): after the probation's wait it is judged on the
        // serving score, whose rates are read at bounds that widen as
        // evidence thins.
        let exit = (rate.exit.samples >= min || !waited)
            .then(|| pessimistic(&since_at_risk, &policy.signals, z));
        since_at_risk.values[k] = Some(rate.drain);
        (Some(optimistic(&since_at_risk, &policy.signals, z)), exit)
    }

    /// AT_RISK only: the score with the failure rate of the episode that
    /// put the channel there (`signals::bad_outcome_rate_episode`).
    fn episode_score(&mut self, horizons: &crate::signals::Horizons, now: i64) -> Option<Score> {
        let since = self.machine.at_risk_since_ms()?;
        let policy = &*self.cfg.policy;
        // The windows' signals with the failure rate swapped for the
        // episode's, scored, then put back (no copy of the rest).
        let k = SignalKind::BadOutcomeRate as usize;
        let episode = crate::signals::bad_outcome_rate_episode(
            &self.ring,
            horizons,
            &policy.signals,
            now,
            since,
        );
        let windows = self.signals.values[k].replace(episode);
        let judged = score(&self.signals, &policy.signals);
        self.signals.values[k] = windows;
        Some(judged)
    }

    /// No upstream report of the quota left: count against the configured
    /// quota, at the burn of the long view (probes use quota too).
    fn count_quota(&mut self, long_window_ms: i64, now: i64) {
        let (Some(quota), None) = (self.cfg.quota, self.signals.quota_remaining) else {
            return;
        };
        let long = self.ring.counters(now, long_window_ms, i64::MIN / 2);
        let attempts = (long.real.requests + long.probe.requests) as f64;
        let rate = attempts / long_window_ms as f64;
        let (remaining, forecast) = self
            .quota
            .forecast(quota, self.cfg.quota_period_ms, now, rate);
        self.signals.quota_remaining = Some(remaining);
        self.signals.quota_exhausted_in_ms = forecast;
    }

    /// The baseline learns once per short window, only from a healthy
    /// channel's scored reading under the AT_RISK score.
    fn learn_baseline(&mut self, now: i64, short_ms: i64) {
        let next_learn = *self.next_baseline_ms.get_or_insert(now + short_ms);
        if now < next_learn {
            return;
        }
        self.next_baseline_ms = Some(next_learn + short_ms);
        let policy = &*self.cfg.policy;
        let calm = self
            .score
            .is_some_and(|sc| sc.value < policy.states.at_risk_enter);
        if self.machine.is_healthy() && calm {
            let (p99, out_median) = baseline_point(&self.signals, &policy.signals);
            if p99.is_finite() || out_median.is_finite() {
                self.baseline.learn(p99, out_median);
            }
        }
    }

    fn configure(&mut self, c: &ChannelConfig, group_idx: usize) {
        self.cfg = c.clone();
        self.group_id = ShortStr::new(&c.group);
        self.counts_quota = c.quota.is_some();
        self.group_idx = group_idx;
    }

    /// Hints the lines of the entry that admitting and recording an event
    /// read: the fields before the ring and the ring's own hot fields.
    #[inline]
    fn prefetch_hot(&self) {
        let bytes = std::mem::offset_of!(ChannelRuntime, ring) + SliceRing::HOT_BYTES;
        crate::prefetch::lines(self as *const ChannelRuntime, bytes);
        self.group_id.prefetch_heap();
    }

    fn frozen_at(&self, t: i64) -> bool {
        self.frozen_until_ms.is_some_and(|f| t <= f)
    }
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

/// A channel's consecutive-failure counts after an event.
#[derive(Debug, Clone, Copy)]
struct Streaks {
    /// The hard-failure streak grew with this event.
    grew: bool,
    failures: u32,
    /// Consecutive hard-failed probes.
    probes: u32,
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
        let mut channels = Vec::new();
        let mut group_channels = vec![Vec::new(); cfg.groups.len()];
        for (gi, g) in cfg.groups.iter().enumerate() {
            for c in &g.channels {
                group_channels[gi].push(channels.len());
                channels.push(ChannelRuntime::new(c, gi, e));
            }
        }
        let mut phases = vec![Vec::new(); e.evaluation_phases.max(1) as usize];
        let n = phases.len();
        for gi in 0..cfg.groups.len() {
            phases[gi % n].push(gi);
        }
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
    pub fn watermark_ms(&self) -> Option<i64> {
        self.watermark_ms
    }
    pub fn channel_count(&self) -> usize {
        self.channels.len()
    }
    pub fn channel_index(&self, id: &str) -> Option<ChannelIdx> {
        self.by_id.get(id)
    }

    /// Hints where [`Engine::prefetch_entry`] will look `ev`'s channel up,
    /// and returns the id's hash it takes; the first of three steps.
    pub fn prefetch_lookup(&self, ev: &RequestEvent<'_>) -> u64 {
        let hash = self.by_id.hash(ev.channel_id);
        self.by_id.prefetch(hash);
        hash
    }

    /// Looks `ev`'s channel up (`id_hash`: its [`Engine::prefetch_lookup`])
    /// and hints the parts of its entry that applying it reads (see
    /// [`crate::prefetch`]); the second step, once the lookup's slot had
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
    fn channel_of(&self, ev: &RequestEvent<'_>, hint: Option<ChannelHint>) -> Option<ChannelIdx> {
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

    /// Warm once a short window of event time has been seen: before that the
    /// engine's view is too thin to publish (fail static, never "all healthy"
    /// from nothing).
    pub fn is_warm(&self) -> bool {
        match (self.first_event_ms, self.watermark_ms) {
            (Some(first), Some(w)) => w - first >= self.cfg.engine.short_window_ms,
            _ => false,
        }
    }

    /// Applies one event of a recording or a simulation: an event stamped
    /// far ahead is judged against the watermark (`clock`). Alerts it causes
    /// (the fast path, evaluation ticks it crosses) are appended to `out`.
    pub fn apply(
        &mut self,
        ev: &RequestEvent<'_>,
        out: &mut Vec<AlertEvent>,
    ) -> Result<(), ApplyError> {
        self.apply_against(ev, crate::clock::Reference::Watermark, None, out)
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
        self.apply_against(ev, crate::clock::Reference::Wall(wall_ms), hint, out)
    }

    /// Refuses an event stamped too far ahead of the wall clock, as
    /// [`Engine::apply_live`] would, without applying it: for a caller that
    /// keys its own state by event time (dedup) before applying.
    pub fn check_live_clock(
        &mut self,
        ev: &RequestEvent<'_>,
        wall_ms: i64,
    ) -> Result<(), ApplyError> {
        self.check_clock(ev, crate::clock::Reference::Wall(wall_ms))
    }

    /// Refuses an event stamped too far ahead of `reference` (`clock`).
    fn check_clock(
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

    fn apply_against(
        &mut self,
        ev: &RequestEvent<'_>,
        reference: crate::clock::Reference,
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
    /// in line with `reference`.
    fn admit(
        &mut self,
        ev: &RequestEvent<'_>,
        reference: crate::clock::Reference,
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
        self.check_clock(ev, reference)?;
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
    fn record(&mut self, idx: ChannelIdx, ev: &RequestEvent<'_>) -> Option<Streaks> {
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
    fn check_plausible(&self, ev: &RequestEvent<'_>) -> Result<(), ApplyError> {
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
    fn on_streaks(
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

    /// Moves the watermark to `now_ms` (if later) and runs every evaluation
    /// tick up to it. The service calls this for idle partitions; the
    /// simulator calls it with simulated time.
    pub fn advance_to(&mut self, now_ms: i64, out: &mut Vec<AlertEvent>) {
        if self.watermark_ms.is_some_and(|w| now_ms <= w) {
            return;
        }
        let interval = self.cfg.engine.evaluation_interval_ms;
        let step = self.phase_step_ms();
        if self.first_event_ms.is_none() {
            self.first_event_ms = Some(now_ms);
            // First phase on the grid after the first event.
            self.next_eval_ms =
                Some((now_ms.div_euclid(step).saturating_add(1)).saturating_mul(step));
        }
        // After a gap longer than the long view every window is empty: only
        // its last long view is evaluated, so a jump of any length (an
        // outage, a corroborated clock jump) costs a bounded number of ticks.
        let catch_up_from = now_ms
            .saturating_sub(self.cfg.engine.long_window_ms)
            .div_euclid(interval)
            * interval;
        if self.next_eval_ms.is_some_and(|t| t < catch_up_from) {
            self.next_eval_ms = Some(catch_up_from);
        }
        while let Some(tick) = self.next_eval_ms.filter(|t| *t <= now_ms) {
            self.watermark_ms = Some(tick);
            let phase = tick.div_euclid(step).rem_euclid(self.phases.len() as i64) as usize;
            self.evaluate_phase(phase, tick, out);
            self.next_eval_ms = Some(tick.saturating_add(step));
            if tick == i64::MAX {
                break;
            }
        }
        self.watermark_ms = Some(now_ms);
    }

    /// Time between two phases of the evaluation interval.
    fn phase_step_ms(&self) -> i64 {
        (self.cfg.engine.evaluation_interval_ms / self.phases.len() as i64).max(1)
    }

    /// One phase of the evaluation interval at `now`: the groups of that
    /// phase, in three steps: measure and score each channel; judge each
    /// group as a whole (`safety`); then step each channel's state machine
    /// and run the alert rules. A group is evaluated once per interval, in
    /// its own phase, so the work of an interval is spread across it
    /// instead of landing at one instant.
    fn evaluate_phase(&mut self, phase: usize, now: i64, out: &mut Vec<AlertEvent>) {
        if self.phases[phase].is_empty() {
            return;
        }
        let groups = std::mem::take(&mut self.phases[phase]);
        let mut due = Vec::new();
        for &gi in &groups {
            due.extend(self.group_channels[gi].iter().filter(|&&idx| {
                self.evaluate_unseen || self.channels[idx].last_event_ms.is_some()
            }));
        }
        for &idx in &due {
            self.stats.evaluations += 1;
            self.measure_channel(idx, now);
        }
        self.judge_groups(now, &groups, &due, out);
        for &idx in &due {
            self.step_channel(idx, now, out);
            self.touch(idx as ChannelIdx);
        }
        self.phases[phase] = groups;
    }

    /// Marks a channel as evaluated or changed (see [`Engine::take_touched`]).
    fn touch(&mut self, idx: ChannelIdx) {
        let ch = &mut self.channels[idx as usize];
        if !ch.touched {
            ch.touched = true;
            self.touched.push(idx);
        }
    }

    /// The channels evaluated or changed since the last call, in the order
    /// they were first touched: what a caller that reports incrementally
    /// has to report.
    pub fn take_touched(&mut self) -> Vec<ChannelIdx> {
        for &idx in &self.touched {
            self.channels[idx as usize].touched = false;
        }
        std::mem::take(&mut self.touched)
    }

    /// Signals, score, and the baseline (which learns once per short window,
    /// only while the channel is healthy).
    fn measure_channel(&mut self, idx: usize, now: i64) {
        let short_ms = self.cfg.engine.short_window_ms;
        let ch = &mut self.channels[idx];
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
            &self.cfg.engine.horizons(),
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
                    ch.next_median_ms = now + self.cfg.engine.latency_median_interval_ms;
                }
            }
            None => ch.latency_median = None,
        }
        ch.count_quota(self.cfg.engine.long_window_ms, now);
        let sc = score(&ch.signals, &ch.cfg.policy.signals);
        let voted = sc.voters() > 0;
        ch.score = voted.then_some(sc);
        let horizons = self.cfg.engine.horizons();
        (ch.score_low, ch.score_high) = match voted {
            true => ch.bounds(&horizons, now),
            false => (None, None),
        };
        ch.score_episode = voted.then(|| ch.episode_score(&horizons, now)).flatten();
        ch.learn_baseline(now, short_ms);
    }

    /// docs/decisions.md#safety-rails: is a group's failure correlated? On entering panic, the
    /// channels the common cause drained are let back and one P1 is raised.
    fn judge_groups(
        &mut self,
        now: i64,
        groups: &[usize],
        due: &[usize],
        out: &mut Vec<AlertEvent>,
    ) {
        let window_ms = self.cfg.safety.correlation_window_ms;
        // The share is of the group's whole capacity: a partition engine
        // that carries two of a group's ten channels must not call the
        // group down when those two fail. Channels this engine does not
        // evaluate count as not bad here; the group writer judges again
        // with every channel's report.
        let mut peers: Vec<PeerHealth> = Vec::new();
        for &gi in groups {
            peers.clear();
            for &i in &self.group_channels[gi] {
                let ch = &self.channels[i];
                let evaluated = self.evaluate_unseen || ch.last_event_ms.is_some();
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
            if crate::safety::may_panic(&peers, &self.cfg.safety) {
                // Where the traffic would move: measured only when the share
                // rule leaves the question open.
                for (p, &i) in peers.iter_mut().zip(&self.group_channels[gi]) {
                    p.load_rps = self.demand_at(i, now).demand_rps.iter().sum();
                }
            }
            let headroom = self.cfg.schedule.capacity_headroom;
            let Some(change) = self.safety[gi].update(now, &peers, &self.cfg.safety, headroom)
            else {
                continue;
            };
            let group = self.cfg.groups[gi].id.clone();
            out.push(self.rules.correlated_failure(&group, now, &change));
            if !matches!(change, SafetyChange::Entered { .. }) {
                continue;
            }
            for &idx in due {
                if self.channels[idx].group_idx != gi || self.channels[idx].frozen_at(now) {
                    continue;
                }
                let states = self.channels[idx].cfg.policy.states.clone();
                self.scratch.clear();
                let mut scratch = std::mem::take(&mut self.scratch);
                self.channels[idx].machine.release_common_cause(
                    now,
                    now - window_ms,
                    &states,
                    &mut scratch,
                );
                self.emit_changes(idx as ChannelIdx, &scratch, out);
                self.scratch = scratch;
            }
        }
    }

    /// Steps one channel's machine with its score and runs its alert rules.
    fn step_channel(&mut self, idx: usize, now: i64, out: &mut Vec<AlertEvent>) {
        let ch = &mut self.channels[idx];
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
            correlated: self.safety[ch.group_idx].in_panic(),
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
                        self.cfg.engine.baseline_min_windows,
                    )
            }),
        };
        self.scratch.clear();
        let mut scratch = std::mem::take(&mut self.scratch);
        ch.machine
            .step(now, evaluation, &policy.states, &mut scratch);
        self.emit_changes(idx as ChannelIdx, &scratch, out);
        self.scratch = scratch;
        self.channel_alarms(idx, now, out);
    }

    /// Alarms a tick may raise for one channel: the signal rules and
    /// silence. (Oscillation is raised by the relapse itself, in
    /// `emit_changes`, never from a timer.)
    fn channel_alarms(&mut self, idx: usize, now: i64, out: &mut Vec<AlertEvent>) {
        let silent_after = self.cfg.engine.silent_after_ms;
        let first_event = self.first_event_ms.unwrap_or(now);
        let ch = &self.channels[idx];
        let policy = &ch.cfg.policy;
        let who = Subject {
            group: &ch.cfg.group,
            channel: &ch.cfg.id,
            index: idx as ChannelIdx,
        };
        let calm = ch.machine.kind() == StateKind::Healthy
            && ch.machine.weight(&policy.states) >= 1.0 - 1e-9;
        self.rules.observe_channel(who.index, now, calm);
        let sc = ch.score.unwrap_or_default();
        self.rules.on_evaluation(&who, now, &ch.signals, &sc, out);
        let quiet_since = ch.last_event_ms.unwrap_or(first_event);
        if now - quiet_since > silent_after && ch.machine.weight(&policy.states) > 0.0 {
            self.rules.alarm(
                &who,
                AlertKind::SilentChannel,
                Severity::P2,
                now,
                format!("silent_ms={}", now - quiet_since),
                format!(
                    "channel {}: no events for {} s while it has weight",
                    ch.cfg.id,
                    (now - quiet_since) / 1000
                ),
                None,
                out,
            );
        }
    }

    /// Turns machine changes into alerts and applies their side effects.
    fn emit_changes(&mut self, idx: ChannelIdx, changes: &[Change], out: &mut Vec<AlertEvent>) {
        let window = self.cfg.engine.outcome_window;
        let ch = &mut self.channels[idx as usize];
        for c in changes {
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
                self.rules
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
            self.rules.alarm(
                &who,
                AlertKind::Oscillation,
                Severity::P2,
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
            self.touch(idx);
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
        self.emit_changes(idx, &scratch, out);
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
    /// in it, and only rebuild the windows. Returns false for an unknown
    /// channel.
    pub fn restore(&mut self, channel: &str, machine: StateMachine, saved_at_ms: i64) -> bool {
        let Some(idx) = self.channel_index(channel) else {
            return false;
        };
        let ch = &mut self.channels[idx as usize];
        ch.machine = machine;
        ch.frozen_until_ms = Some(saved_at_ms);
        true
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
    pub fn reconfigure(&mut self, cfg: Arc<Config>) -> Result<(), String> {
        if cfg.engine != self.cfg.engine {
            return Err(
                "[engine] settings changed: window shape needs a restart; keeping the running config"
                    .into(),
            );
        }
        let mut old: ahash::AHashMap<String, ChannelRuntime> = std::mem::take(&mut self.channels)
            .into_iter()
            .map(|c| (c.cfg.id.clone(), c))
            .collect();
        let mut channels = Vec::new();
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
        self.channels = channels;
        self.generation = next_generation();
        if cfg.alerts != self.cfg.alerts {
            // Dedup memory starts over with new alert rules.
            self.rules = AlertRules::new(cfg.alerts.clone());
        }
        self.cfg = cfg;
        Ok(())
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
            quota_remaining: ch.signals.quota_remaining,
            quota_exhausted_in_ms: ch.signals.quota_exhausted_in_ms,
            correlated: self.safety[ch.group_idx].in_panic(),
            incident_since_ms: ch.machine.incident_since_ms(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::tests::sample_event;
    use crate::config::Tier;
    use crate::event::TrafficClass;
    use crate::state::TransitionReason;

    const T0: i64 = 1_764_000_000_000;

    #[test]
    fn implausible_sizes_and_latencies_are_refused_without_moving_anything() {
        let mut e = engine();
        let mut out = Vec::new();
        e.apply(&ev("free-a", T0), &mut out).unwrap();
        for (field, set) in [
            (
                "output_tokens",
                (|x: &mut RequestEvent| x.output_tokens = 1_000_000_000) as fn(&mut RequestEvent),
            ),
            ("input_tokens", |x| x.input_tokens = 20_000_000),
            ("latency_ms", |x| x.latency_ms = 7_200_000),
            ("ttfb_ms", |x| x.ttfb_ms = Some(4_000_000)),
        ] {
            let mut x = ev("free-a", T0 + 1_000);
            set(&mut x);
            match e.apply(&x, &mut out) {
                Err(err @ ApplyError::Implausible { field: f, .. }) => {
                    assert_eq!(f, field);
                    assert_eq!(err.kind(), "implausible");
                }
                other => panic!("{field}: {other:?}"),
            }
        }
        assert_eq!(e.stats().applied, 1);
        assert_eq!(e.watermark_ms(), Some(T0), "a refused event moves no clock");
    }

    fn engine() -> Engine {
        Engine::new(Arc::new(Config::single_group(
            "chat",
            &[
                ("free-a", Tier::Free, 0.0, 50.0),
                ("paid-a", Tier::Paid, 1.0, 100.0),
            ],
        )))
    }

    fn ev(channel: &'static str, t: i64) -> RequestEvent<'static> {
        let mut e = sample_event();
        e.channel_id = channel;
        e.event_time_ms = t;
        e.traffic_class = TrafficClass::Core;
        e.attempt = 0;
        e.latency_ms = 800;
        e.truncated = false;
        e
    }

    /// Feeds healthy traffic at `rps` to both channels over [from, to).
    fn healthy(e: &mut Engine, from: i64, to: i64, rps: i64, out: &mut Vec<AlertEvent>) {
        let step = 1000 / rps;
        let mut t = from;
        while t < to {
            e.apply(&ev("free-a", t), out).unwrap();
            e.apply(&ev("paid-a", t), out).unwrap();
            t += step;
        }
    }

    fn from(gateway: &'static str, channel: &'static str, t: i64) -> RequestEvent<'static> {
        let mut e = ev(channel, t);
        e.gateway_id = gateway;
        e
    }

    #[test]
    fn a_channel_that_just_went_hard_down_reports_it_fails_everything() {
        // The scheduler sends no overflow to a channel failing about
        // everything (`schedule.overflow_max_failure_rate`): seconds after
        // it went hard down, the minute's rate still reads half good.
        let mut e = engine();
        let mut out = Vec::new();
        healthy(&mut e, T0, T0 + 120_000, 20, &mut out);
        let mut t = T0 + 120_000;
        while t < T0 + 130_000 {
            let mut x = ev("free-a", t);
            x.error_class = crate::event::ErrorClass::ServerError;
            e.apply(&x, &mut out).unwrap();
            e.apply(&ev("paid-a", t), &mut out).unwrap();
            t += 50;
        }
        let idx = e.channel_index("free-a").unwrap();
        let h = e.health(idx);
        let minute = e.channels[idx as usize]
            .signals
            .get(SignalKind::BadOutcomeRate)
            .unwrap()
            .value;
        assert!(minute < 0.5, "the minute's rate {minute}");
        assert_eq!(h.failure_rate, Some(1.0));
    }

    #[test]
    fn at_risk_is_left_only_on_what_the_channel_did_since() {
        // At 0.3 weight a channel sees few attempts; its short view lacks
        // the samples and the long view reaches back into the healthy time
        // before the fault. Leaving AT_RISK on that would put a channel
        // still failing 7.5 % (AT_RISK level, under the drain bound) back at
        // full weight.
        let mut e = engine();
        let mut out = Vec::new();
        let idx = e.channel_index("free-a").unwrap();
        let kind = |e: &Engine| e.machine(idx).kind();
        healthy(&mut e, T0, T0 + 240_000, 20, &mut out);
        // `free-a` every `every_ms`, 6 answers in 80 (7.5 %, spread) empty; `paid-a` at 20/s throughout.
        let feed = |e: &mut Engine,
                    from: i64,
                    to: i64,
                    every_ms: i64,
                    bad: bool,
                    out: &mut Vec<AlertEvent>| {
            let mut t = from;
            while t < to {
                if t % every_ms == 0 {
                    let mut x = ev("free-a", t);
                    if bad && (t / every_ms * 6) % 80 < 6 {
                        x.output_tokens = 2;
                    }
                    e.apply(&x, out).unwrap();
                }
                e.apply(&ev("paid-a", t), out).unwrap();
                t += 50;
            }
        };
        let mut t = T0 + 240_000;
        while kind(&e) != StateKind::AtRisk {
            assert!(t < T0 + 420_000, "AT_RISK within three minutes");
            feed(&mut e, t, t + 5_000, 50, true, &mut out);
            t += 5_000;
        }
        // One attempt every 2 s now, still 7.5 % bad: too few for the
        // short view, so the rates fall back to the long one. Still AT_RISK
        // two minutes later (an exit needs twelve confirmations, a minute).
        let end = t + 120_000;
        while t < end {
            feed(&mut e, t, t + 5_000, 2_000, true, &mut out);
            t += 5_000;
            assert_eq!(kind(&e), StateKind::AtRisk, "at {} s", (t - T0) / 1000);
        }
        // Clean again at 5 a second: back to HEALTHY within three minutes,
        // not held in AT_RISK.
        let end = t + 180_000;
        while kind(&e) != StateKind::Healthy {
            assert!(
                t < end,
                "still {:?} three minutes after it healed",
                kind(&e)
            );
            feed(&mut e, t, t + 5_000, 200, false, &mut out);
            t += 5_000;
        }
    }

    #[test]
    fn one_event_years_ahead_is_refused_and_moves_nothing() {
        let mut e = engine();
        let mut out = Vec::new();
        healthy(&mut e, T0, T0 + 60_000, 10, &mut out);
        let w = e.watermark_ms();
        let ten_years = T0 + 10 * 365 * 86_400_000;
        let err = e.apply(&from("gw-bad", "free-a", ten_years), &mut out);
        assert!(
            matches!(err, Err(ApplyError::FutureTimestamp { .. })),
            "{err:?}"
        );
        assert_eq!(e.watermark_ms(), w);
        healthy(&mut e, T0 + 60_000, T0 + 120_000, 10, &mut out);
        assert_eq!(e.stats().too_late, 0);
        assert_eq!(e.stats().future_timestamp, 1);
        // Live, the wall clock is the reference.
        let err = e.apply_live(
            &from("gw-bad", "free-a", T0 + 200_000),
            T0 + 120_000,
            &mut out,
        );
        assert!(
            matches!(err, Err(ApplyError::FutureTimestamp { .. })),
            "{err:?}"
        );
        e.apply_live(
            &from("gw-ok", "free-a", T0 + 125_000),
            T0 + 120_000,
            &mut out,
        )
        .unwrap();
    }

    #[test]
    fn a_gateway_an_hour_fast_drops_none_of_the_others_events() {
        let mut e = engine();
        let mut out = Vec::new();
        let mut t = T0;
        let mut refused = 0;
        let mut i = 0u64;
        while t < T0 + 600_000 {
            for (g, skew) in [
                ("gw-a", 0),
                ("gw-b", 0),
                ("gw-fast", 3_600_000),
                ("gw-c", 0),
            ] {
                i += 1;
                let ch = if i.is_multiple_of(2) {
                    "free-a"
                } else {
                    "paid-a"
                };
                match e.apply(&from(g, ch, t + skew), &mut out) {
                    Ok(()) => assert_ne!(g, "gw-fast", "a fast event was taken at {t}"),
                    Err(ApplyError::FutureTimestamp { .. }) => refused += 1,
                    Err(err) => panic!("{g}: {err}"),
                }
            }
            t += 100;
        }
        assert_eq!(e.stats().too_late, 0);
        assert_eq!(refused, 6_000);
        assert!(e.watermark_ms().unwrap() < T0 + 600_000);
    }

    #[test]
    fn a_real_gap_is_crossed_once_corroborated_in_bounded_work() {
        let mut e = engine();
        let mut out = Vec::new();
        healthy(&mut e, T0, T0 + 60_000, 10, &mut out);
        let evaluations = e.stats().evaluations;
        // One gateway, silent for a year, then back: the first events after
        // the gap wait for corroboration, then the watermark jumps.
        let back = T0 + 365 * 86_400_000;
        let needed = e.config().engine.clock_jump_events as i64;
        for k in 0..needed {
            let r = e.apply(&from("gw-a", "free-a", back + k * 100), &mut out);
            assert_eq!(r.is_ok(), k == needed - 1, "event {k}: {r:?}");
        }
        assert_eq!(e.watermark_ms(), Some(back + (needed - 1) * 100));
        let ticks = e.stats().evaluations - evaluations;
        let per_long_view =
            e.config().engine.long_window_ms / e.config().engine.evaluation_interval_ms;
        assert!(
            ticks <= 2 * (per_long_view as u64 + 2),
            "{ticks} evaluations"
        );
        // A second gateway corroborates at once.
        let later = back + 30 * 86_400_000;
        assert!(e.apply(&from("gw-a", "free-a", later), &mut out).is_err());
        e.apply(&from("gw-b", "paid-a", later + 5), &mut out)
            .unwrap();
    }

    #[test]
    fn a_first_event_years_ahead_costs_bounded_work() {
        let mut e = engine();
        let mut out = Vec::new();
        let far = crate::codec::MAX_EVENT_TIME_MS;
        e.apply(&from("gw-a", "free-a", far), &mut out).unwrap();
        e.advance_to(far + 3_600_000, &mut out);
        assert!(e.stats().evaluations < 1_000, "{}", e.stats().evaluations);
    }

    #[test]
    fn a_partition_carrying_two_of_a_groups_channels_still_drains_them() {
        // Two small channels of a group whose capacity sits elsewhere: both
        // failing is 2 of 10 capacity units, not a group-wide failure.
        let cfg = Arc::new(Config::single_group(
            "chat",
            &[
                ("free-a", Tier::Free, 0.0, 100.0),
                ("free-b", Tier::Free, 0.0, 100.0),
                ("paid-a", Tier::Paid, 1.0, 400.0),
                ("paid-b", Tier::Paid, 1.0, 400.0),
            ],
        ));
        let mut e = Engine::for_partition(cfg);
        let mut out = Vec::new();
        let mut t = T0;
        while t < T0 + 90_000 {
            e.apply(&ev("free-a", t), &mut out).unwrap();
            e.apply(&ev("free-b", t), &mut out).unwrap();
            t += 50;
        }
        for (ch, start) in [("free-a", t), ("free-b", t + 5_000)] {
            let mut tt = start;
            while tt < start + 1_000 {
                let mut bad = ev(ch, tt);
                bad.error_class = ErrorClass::ServerError;
                bad.http_status = 503;
                e.apply(&bad, &mut out).unwrap();
                let other = if ch == "free-a" { "free-b" } else { "free-a" };
                let _ = e.apply(&ev(other, tt), &mut out);
                tt += 50;
            }
        }
        // Ticks after both drains: the group rule runs with both bad.
        e.advance_to(t + 20_000, &mut out);
        for ch in ["free-a", "free-b"] {
            let m = e.machine(e.channel_index(ch).unwrap());
            assert_eq!(m.kind(), StateKind::Drained, "{ch}");
        }
        assert!(
            !out.iter()
                .any(|a| a.kind == crate::alert::AlertKind::CorrelatedFailure),
            "no panic mode"
        );
    }

    #[test]
    fn unsent_requests_are_demand_and_nothing_else() {
        let mut e = engine();
        let mut out = Vec::new();
        healthy(&mut e, T0, T0 + 120_000, 10, &mut out);
        let served = e.health(e.channel_index("paid-a").unwrap());
        // As many core requests again shed for paid-a and reported unsent
        // (in every other field they look like instant successes).
        let mut t = T0 + 120_000;
        while t < T0 + 240_000 {
            e.apply(&ev("free-a", t), &mut out).unwrap();
            e.apply(&ev("paid-a", t), &mut out).unwrap();
            let mut unsent = ev("paid-a", t + 50);
            unsent.dispatch = crate::event::Dispatch::Shed;
            unsent.latency_ms = 0;
            e.apply(&unsent, &mut out).unwrap();
            t += 100;
        }
        let h = e.health(e.channel_index("paid-a").unwrap());
        let core = TrafficClass::Core.index();
        assert!(
            (h.demand_rps[core] - 20.0).abs() < 0.5,
            "{:?}",
            h.demand_rps
        );
        assert!(
            (h.unsent_rps[core] - 10.0).abs() < 0.5,
            "{:?}",
            h.unsent_rps
        );
        assert!((served.demand_rps[core] - 10.0).abs() < 0.5);
        assert_eq!(h.tokens_per_request, served.tokens_per_request);
        assert_eq!(h.p99_ms, served.p99_ms, "no latency of an unsent request");
        assert_eq!(e.stats().unsent, 1200);
    }

    #[test]
    fn three_sparse_failures_far_apart_still_count() {
        // The last-100 window sees failures a time window forgets (incident 002):
        // 9 hard failures spread over 4 minutes among 91 successes: 9 %,
        // enough that the evidence says more than the normal 3 % at its
        // lower bound (4 in 100 would not: a 2 % line shows that often).
        let mut e = engine();
        let mut out = Vec::new();
        let mut t = T0;
        for i in 0..100 {
            let mut x = ev("paid-a", t);
            if i % 12 == 0 {
                x.error_class = ErrorClass::ServerError;
            }
            e.apply(&x, &mut out).unwrap();
            t += 2_400; // 100 events over 4 minutes: ~2 per 5 s slice
        }
        e.advance_to(t, &mut out);
        let idx = e.channel_index("paid-a").unwrap();
        let s = e.signals(idx);
        let recent = s.get(SignalKind::RecentFailureRate).unwrap();
        assert_eq!(recent.samples, 100);
        assert!((recent.value - 0.09).abs() < 1e-9);
        // Each failure alone is nowhere near the short window's sample minimum.
        assert!(s.short_real.requests < 30);
        let c = e.score(idx).unwrap().contributions[SignalKind::RecentFailureRate as usize];
        assert!(c.unwrap() > 0.0, "sparse failures vote");
    }

    #[test]
    fn one_slow_outlier_does_not_move_a_healthy_channel() {
        let mut e = engine();
        let mut out = Vec::new();
        healthy(&mut e, T0, T0 + 120_000, 10, &mut out);
        let mut slow = ev("paid-a", T0 + 120_000);
        slow.latency_ms = 60_000;
        e.apply(&slow, &mut out).unwrap();
        healthy(&mut e, T0 + 120_001, T0 + 240_000, 10, &mut out);
        let idx = e.channel_index("paid-a").unwrap();
        assert_eq!(e.machine(idx).kind(), StateKind::Healthy);
        assert!(
            out.iter().all(|a| a.kind != AlertKind::Transition),
            "{out:?}"
        );
    }

    #[test]
    fn the_median_gauge_is_read_once_per_its_interval() {
        // 800 ms for two minutes, then slower and slower (1 s to 3.4 s
        // over two minutes): the median follows once per
        // `latency_median_interval_ms` (P99 at every evaluation), or at
        // every evaluation when the interval is one.
        for every_evaluation in [false, true] {
            let mut cfg = Config::single_group(
                "chat",
                &[
                    ("free-a", Tier::Free, 0.0, 50.0),
                    ("paid-a", Tier::Paid, 1.0, 100.0),
                ],
            );
            if every_evaluation {
                cfg.engine.latency_median_interval_ms = cfg.engine.evaluation_interval_ms;
            }
            let interval = cfg.engine.latency_median_interval_ms;
            let mut e = Engine::new(Arc::new(cfg));
            let mut out = Vec::new();
            healthy(&mut e, T0, T0 + 120_000, 10, &mut out);
            let idx = e.channel_index("paid-a").unwrap();
            assert_eq!(e.latency_median(idx), Some(800.0));
            let (mut changes, mut p99_moved) = (Vec::new(), None);
            let (mut last, mut last_p99) = (e.latency_median(idx), e.signals(idx).latency);
            for t in (T0 + 120_000..T0 + 240_000).step_by(100) {
                let mut slow = ev("paid-a", t);
                slow.latency_ms = 1_000 + ((t - T0 - 120_000) / 50) as i32;
                e.apply(&slow, &mut out).unwrap();
                let now = e.latency_median(idx);
                if now != last {
                    changes.push(t);
                    last = now;
                }
                let p99 = e.signals(idx).latency;
                if p99_moved.is_none() && p99.map(|l| l.p99_ms) != last_p99.map(|l| l.p99_ms) {
                    p99_moved = Some(t);
                }
                last_p99 = p99;
            }
            assert!(
                changes.windows(2).all(|w| w[1] - w[0] >= interval),
                "{changes:?}"
            );
            assert!(!changes.is_empty() && changes[0] <= T0 + 120_000 + 60_000 + interval);
            assert!(e.latency_median(idx).is_some_and(|m| m > 1_200.0));
            if every_evaluation {
                assert!(changes.len() >= 12, "{changes:?}");
            } else {
                assert!(changes.len() <= 2, "{changes:?}");
                // The P99 is read at every evaluation all the same: it
                // moved at the first one, long before the median.
                let moved = p99_moved.expect("the P99 moved");
                let eval = e.cfg.engine.evaluation_interval_ms;
                assert!(
                    moved <= T0 + 120_000 + eval && moved < changes[0],
                    "{moved}"
                );
            }
        }
    }

    #[test]
    fn consecutive_failures_drain_on_the_event_not_the_tick() {
        let mut e = engine();
        let mut out = Vec::new();
        healthy(&mut e, T0, T0 + 60_000, 10, &mut out);
        // free tier: 4 consecutive hard failures
        for (i, t) in [60_001, 60_002, 60_003, 60_004].iter().enumerate() {
            let mut x = ev("free-a", T0 + t);
            x.error_class = ErrorClass::ConnectionReset;
            e.apply(&x, &mut out).unwrap();
            let idx = e.channel_index("free-a").unwrap();
            let expect = if i < 3 {
                StateKind::Healthy
            } else {
                StateKind::Drained
            };
            assert_eq!(e.machine(idx).kind(), expect);
        }
        let a = out.last().unwrap();
        assert_eq!(a.kind, AlertKind::Transition);
        assert_eq!(a.event_time_ms, T0 + 60_004);
        assert_eq!(a.to_state.as_deref(), Some("DRAINED"));
        assert_eq!(
            a.reason,
            TransitionReason::ConsecutiveFailures { n: 4 }.to_string()
        );
    }

    /// A takeover: the machine was saved OBSERVING (after a drain and its
    /// cool-down); the replay of the window feeds the old failures again. A
    /// machine that stepped on them would relapse to DRAINED; the restored
    /// one does not step before the time it was saved at.
    #[test]
    fn a_restored_machine_does_not_step_on_what_the_replay_already_covers() {
        fn history(e: &mut Engine, out: &mut Vec<AlertEvent>) {
            healthy(e, T0, T0 + 60_000, 10, out);
            for t in [60_001, 60_002, 60_003, 60_004] {
                let mut x = ev("free-a", T0 + t);
                x.error_class = ErrorClass::ConnectionReset;
                e.apply(&x, out).unwrap();
            }
            healthy(e, T0 + 60_005, T0 + 170_000, 10, out);
        }
        let mut live = engine();
        let mut out = Vec::new();
        history(&mut live, &mut out);
        let idx = live.channel_index("free-a").unwrap();
        let saved = live.machine(idx).clone();
        assert_eq!(saved.kind(), StateKind::Observing, "{out:?}");
        let saved_at = live.watermark_ms().unwrap();

        let mut taken = engine();
        assert!(taken.restore("free-a", saved.clone(), saved_at));
        assert!(!taken.restore("nope", saved.clone(), 0));
        let mut replay_out = Vec::new();
        history(&mut taken, &mut replay_out);
        let idx = taken.channel_index("free-a").unwrap();
        assert_eq!(taken.machine(idx), &saved, "not stepped during the replay");
        assert!(
            replay_out.iter().all(|a| a.kind != AlertKind::Transition),
            "no transition raised again: {replay_out:?}"
        );
        // After the save point it runs again.
        let mut after = Vec::new();
        healthy(&mut taken, saved_at + 1, saved_at + 60_000, 10, &mut after);
        assert_ne!(taken.machine(idx), &saved, "{after:?}");
    }

    #[test]
    fn a_reload_keeps_windows_and_state_and_refuses_a_new_window_shape() {
        let mut e = engine();
        let mut out = Vec::new();
        healthy(&mut e, T0, T0 + 60_000, 10, &mut out);
        for t in [60_001, 60_002, 60_003, 60_004] {
            let mut x = ev("free-a", T0 + t);
            x.error_class = ErrorClass::ConnectionReset;
            e.apply(&x, &mut out).unwrap();
        }
        let applied = e.stats().applied;
        let three = Arc::new(Config::single_group(
            "chat",
            &[
                ("free-a", Tier::Free, 0.0, 50.0),
                ("paid-a", Tier::Paid, 1.0, 100.0),
                ("paid-b", Tier::Paid, 2.0, 100.0),
            ],
        ));
        e.reconfigure(three.clone()).unwrap();
        let free = e.channel_index("free-a").unwrap();
        assert_eq!(e.machine(free).kind(), StateKind::Drained, "state kept");
        assert!(e.has_events(free), "windows kept");
        let b = e.channel_index("paid-b").expect("new channel added");
        assert!(!e.has_events(b));
        assert_eq!(e.stats().applied, applied);
        let mut other = (*three).clone();
        other.engine.slice_ms *= 2;
        assert!(e.reconfigure(Arc::new(other)).is_err());
    }

    /// A channel looked up before a reload that renumbered the channels
    /// is looked up again: the event lands in its own channel.
    #[test]
    fn a_channel_hint_from_before_a_reload_is_not_taken() {
        let mut e = engine();
        let hint = e.prefetch_entry(&ev("paid-a", T0), e.prefetch_lookup(&ev("paid-a", T0)));
        assert_eq!(hint.map(|h| h.idx), e.channel_index("paid-a"));
        let swapped = Arc::new(Config::single_group(
            "chat",
            &[
                ("paid-a", Tier::Paid, 1.0, 100.0),
                ("free-a", Tier::Free, 0.0, 50.0),
            ],
        ));
        e.reconfigure(swapped).unwrap();
        assert_ne!(hint.map(|h| h.idx), e.channel_index("paid-a"));
        let mut out = Vec::new();
        e.apply_live_hinted(&ev("paid-a", T0), T0, hint, &mut out)
            .unwrap();
        assert!(e.has_events(e.channel_index("paid-a").unwrap()));
        assert!(!e.has_events(e.channel_index("free-a").unwrap()));
        // A hint of the engine as it is is taken.
        let fresh = e.prefetch_entry(&ev("free-a", T0), e.prefetch_lookup(&ev("free-a", T0)));
        e.apply_live_hinted(&ev("free-a", T0), T0, fresh, &mut out)
            .unwrap();
        assert!(e.has_events(e.channel_index("free-a").unwrap()));
    }

    #[test]
    fn a_partition_engine_leaves_other_partitions_channels_alone() {
        let cfg = Arc::new(Config::single_group(
            "chat",
            &[
                ("free-a", Tier::Free, 0.0, 50.0),
                ("paid-a", Tier::Paid, 1.0, 100.0),
            ],
        ));
        let silent = cfg.engine.silent_after_ms;
        let run = |mut e: Engine| {
            let mut out = Vec::new();
            let mut t = T0;
            while t < T0 + 3 * silent {
                e.apply(&ev("paid-a", t), &mut out).unwrap();
                t += 100;
            }
            out.iter()
                .filter(|a| a.kind == AlertKind::SilentChannel)
                .map(|a| a.channel_id.clone().unwrap_or_default())
                .collect::<Vec<_>>()
        };
        // Owning every channel: free-a never sent anything, that is news.
        assert!(run(Engine::new(cfg.clone())).contains(&"free-a".to_string()));
        // One partition of many: free-a lives elsewhere.
        assert!(run(Engine::for_partition(cfg)).is_empty());
    }

    #[test]
    fn a_configured_quota_is_counted_when_gateways_do_not_report_it() {
        let mut cfg = Config::single_group(
            "chat",
            &[
                ("free-a", Tier::Free, 0.0, 50.0),
                ("paid-a", Tier::Paid, 1.0, 100.0),
            ],
        );
        cfg.groups[0].channels[0].quota = Some(10_000);
        cfg.groups[0].channels[0].quota_period_ms = 86_400_000;
        let mut e = Engine::new(Arc::new(cfg));
        let mut out = Vec::new();
        // 10 attempts/s for 5 min, no quota reports: 3 000 used, 7 000
        // left, 700 s to go at this burn.
        let mut t = T0;
        while t < T0 + 300_000 {
            for ch in ["free-a", "paid-a"] {
                let mut x = ev(ch, t);
                x.quota_remaining = None;
                e.apply(&x, &mut out).unwrap();
            }
            t += 100;
        }
        e.advance_to(T0 + 300_000, &mut out);
        let h = e.health(e.channel_index("free-a").unwrap());
        let left = h.quota_remaining.expect("counted");
        assert!((6_900..=7_100).contains(&left), "{left}");
        let ms = h.quota_exhausted_in_ms.expect("forecast");
        assert!((600_000..=800_000).contains(&ms), "{ms}");
        assert!(
            out.iter().any(|a| a.kind == AlertKind::QuotaForecast),
            "forecast under the alert horizon raises the alert"
        );
        // A channel without a quota has no forecast.
        let paid = e.health(e.channel_index("paid-a").unwrap());
        assert_eq!(paid.quota_remaining, None);
    }

    #[test]
    fn late_and_too_late_events() {
        let mut e = engine();
        let mut out = Vec::new();
        e.apply(&ev("paid-a", T0 + 100_000), &mut out).unwrap();
        // 8 s late: within the 10 s allowed lateness, lands in its slice.
        e.apply(&ev("paid-a", T0 + 92_000), &mut out).unwrap();
        // 11 s late: counted and dropped.
        let err = e.apply(&ev("paid-a", T0 + 89_000), &mut out).unwrap_err();
        assert_eq!(err, ApplyError::TooLate { lag_ms: 11_000 });
        let s = e.stats();
        assert_eq!((s.applied, s.too_late), (2, 1));
        let idx = e.channel_index("paid-a").unwrap();
        let view = e.channels[idx as usize]
            .ring
            .counters(T0 + 100_000, 60_000, i64::MIN / 2);
        assert_eq!(view.real.requests, 2);
    }

    #[test]
    fn unknown_channel_and_group_mismatch_are_errors() {
        let mut e = engine();
        let mut out = Vec::new();
        let err = e.apply(&ev("nope", T0), &mut out).unwrap_err();
        assert_eq!(err.to_string(), "unknown channel `nope`");
        let mut x = ev("paid-a", T0);
        x.route_group = "other";
        assert_eq!(e.apply(&x, &mut out).unwrap_err().kind(), "group_mismatch");
    }

    /// A reload that moves a channel to another group checks its events
    /// against the new group (ids of any length).
    #[test]
    fn a_channel_moved_to_another_group_is_checked_against_it() {
        let long = "a-route-group-id-longer-than-any-inline-buffer";
        let cfg = |group: &str| {
            Arc::new(
                Config::from_toml(&format!(
                    "[[groups]]\nid = \"{group}\"\n[[groups.channels]]\nid = \"c1\"\n\
                     tier = \"free\"\nprice_per_1k_tokens = 0.0\ncapacity_rps = 10.0\n"
                ))
                .unwrap(),
            )
        };
        let mut e = Engine::new(cfg("a"));
        let mut out = Vec::new();
        let mut x = ev("c1", T0);
        x.route_group = "a";
        e.apply(&x, &mut out).unwrap();
        for group in [long, "b"] {
            e.reconfigure(cfg(group)).unwrap();
            let err = e.apply(&x, &mut out).unwrap_err();
            assert_eq!(err.kind(), "group_mismatch", "{group}");
            let mut moved = ev("c1", T0);
            moved.route_group = group;
            e.apply(&moved, &mut out).unwrap();
            x.route_group = group;
        }
    }

    /// Two groups, `phases` phases: which channels each phase evaluates.
    fn phased(phases: u32) -> Vec<(i64, Vec<String>)> {
        let mut cfg = Config::from_toml(
            "[[groups]]\nid = \"a\"\n[[groups.channels]]\nid = \"a1\"\ntier = \"free\"\n\
             price_per_1k_tokens = 0.0\ncapacity_rps = 10.0\n\
             [[groups]]\nid = \"b\"\n[[groups.channels]]\nid = \"b1\"\ntier = \"free\"\n\
             price_per_1k_tokens = 0.0\ncapacity_rps = 10.0\n",
        )
        .unwrap();
        cfg.engine.evaluation_phases = phases;
        let mut e = Engine::new(Arc::new(cfg));
        let mut out = Vec::new();
        let mut seen = Vec::new();
        let mut x = ev("a1", T0);
        x.route_group = "a";
        e.apply(&x, &mut out).unwrap();
        e.take_touched();
        for t in (T0 + 1..T0 + 10_001).step_by(50) {
            e.advance_to(t, &mut out);
            let touched: Vec<String> = e
                .take_touched()
                .into_iter()
                .map(|i| e.health(i).id)
                .collect();
            if !touched.is_empty() {
                seen.push((t - T0, touched));
            }
        }
        seen
    }

    #[test]
    fn each_group_is_evaluated_once_per_interval_in_its_own_phase() {
        // The interval is 5 s; 50 phases are 100 ms apart. Group a (index
        // 0) is evaluated at the interval's start, b (index 1) one phase
        // later; sampled every 50 ms from T0 + 1.
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            phased(50),
            vec![
                (101, names(&["b1"])),
                (5_001, names(&["a1"])),
                (5_101, names(&["b1"])),
            ]
        );
        assert_eq!(
            phased(1),
            vec![(5_001, names(&["a1", "b1"]))],
            "one phase: every group at the interval's start"
        );
    }

    #[test]
    fn warm_up_needs_a_short_window_of_event_time() {
        let mut e = engine();
        let mut out = Vec::new();
        healthy(&mut e, T0, T0 + 59_000, 5, &mut out);
        assert!(!e.is_warm());
        healthy(&mut e, T0 + 59_000, T0 + 61_000, 5, &mut out);
        assert!(e.is_warm());
    }

    #[test]
    fn same_input_same_decisions() {
        let run = || {
            let mut e = engine();
            let mut out = Vec::new();
            let mut t = T0;
            for i in 0..5_000i64 {
                let mut x = ev(if i % 2 == 0 { "free-a" } else { "paid-a" }, t);
                if i > 2_000 && i % 2 == 0 {
                    x.truncated = i % 3 == 0;
                    x.output_tokens = 120;
                    x.latency_ms = 5_000;
                }
                let _ = e.apply(&x, &mut out);
                t += 40;
            }
            out
        };
        let a = run();
        assert!(!a.is_empty());
        assert_eq!(a, run());
    }
}
