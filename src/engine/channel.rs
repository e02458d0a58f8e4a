//! One channel's runtime: its windows, its machine, and what an evaluation
//! reads from them (the AT_RISK bounds, the episode, the quota burn, the
//! baseline), and how an admitted event is recorded in them.

use super::Streaks;
use crate::config::ChannelConfig;
use crate::event::{ErrorClass, RequestEvent};
use crate::score::{optimistic, pessimistic, score, Score};
use crate::short_str::ShortStr;
use crate::signals::{baseline_point, SignalKind, Signals};
use crate::state::StateMachine;
use crate::window::{Baseline, FailureStreak, OutcomeWindow, SliceRing};

/// One channel's state. `repr(C)` keeps the fields every event reads
/// (admitting and recording it) together at the start, then the ring, whose
/// own hot fields come first: [`ChannelRuntime::prefetch_hot`] hints only
/// those lines, not a dozen scattered over the entry (see
/// [`crate::prefetch`]). Everything after is read by evaluation ticks.
#[repr(C)]
pub(super) struct ChannelRuntime {
    // --- read by every event ---
    /// `cfg.group`, inline: every event is checked against it.
    pub(super) group_id: ShortStr,
    pub(super) last_event_ms: Option<i64>,
    /// Restored state: up to this event time the machine already reflects
    /// what a replay feeds the windows, so it does not step again.
    pub(super) frozen_until_ms: Option<i64>,
    /// Latest unsent-request report naming this channel (demand only).
    pub(super) last_unsent_ms: Option<i64>,
    pub(super) outcomes: OutcomeWindow,
    pub(super) streak: FailureStreak,
    pub(super) probe_streak: u32,
    /// `cfg.quota.is_some()`: events are counted against it.
    pub(super) counts_quota: bool,
    /// In [`Engine::touched`] already.
    pub(super) touched: bool,
    pub(super) ring: SliceRing,
    // --- read by evaluation ticks and changes ---
    pub(super) cfg: ChannelConfig,
    /// Position of the channel's group in the config (`Engine::safety`).
    pub(super) group_idx: usize,
    pub(super) baseline: Baseline,
    pub(super) machine: StateMachine,
    pub(super) score: Option<Score>,
    /// The score at the rate signals' confidence bounds (relapses, passes).
    pub(super) score_low: Option<f64>,
    pub(super) score_high: Option<f64>,
    /// AT_RISK only: the score with the failure rate read over the whole
    /// episode (see `signals::bad_outcome_rate_episode`).
    /// Boxed: a `Score` is 280 bytes and only AT_RISK channels have one.
    pub(super) score_episode: Option<Box<Score>>,
    pub(super) signals: Signals,
    pub(super) next_baseline_ms: Option<i64>,
    /// The median latency last read (`engine.latency_median_interval_ms`)
    /// and when it is read next.
    pub(super) latency_median: Option<f64>,
    pub(super) next_median_ms: i64,
    /// The configured quota's use in the current period, for gateways that
    /// do not report `quota_remaining`.
    pub(super) quota: QuotaUse,
    /// When the channel's weight last came back from 0 or fell: its
    /// traffic before then says nothing of what it gets now (the silence
    /// rule, `Engine::channel_alarms`). `None`: unchanged since the engine
    /// started.
    pub(super) weight_since_ms: Option<i64>,
    /// The channel's traffic with its weight as it is, as of the last
    /// evaluation that saw an event: (events, over how many ms). What a
    /// silence is measured against.
    pub(super) traffic: Option<(u32, i64)>,
}

/// Attempts counted against a channel's configured `quota` per period
/// (docs/decisions.md#signals: remaining quota and burn rate → time to exhaustion). Only used
/// while no gateway reports the upstream's own `quota_remaining`: a report
/// is the upstream's word and wins.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct QuotaUse {
    pub(super) period_start_ms: i64,
    pub(super) used: u64,
}

impl QuotaUse {
    pub(super) fn record(&mut self, t_ms: i64, period_ms: i64) {
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
    pub(super) fn forecast(
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
    pub(super) fn new(
        c: &ChannelConfig,
        group_idx: usize,
        e: &crate::config::EngineConfig,
    ) -> ChannelRuntime {
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
            weight_since_ms: None,
            traffic: None,
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
    pub(super) fn judged_score(&self) -> Option<Score> {
        match (self.score, self.score_episode.as_deref()) {
            (Some(w), Some(e)) if e.value > w.value => Some(*e),
            (w, _) => w,
        }
    }

    /// The score read optimistically and pessimistically (see
    /// `score::optimistic`): what a move down and a move up are judged on.
    pub(super) fn bounds(
        &mut self,
        horizons: &crate::signals::Horizons,
        now: i64,
    ) -> (Option<f64>, Option<f64>) {
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
        // The windows' failure rate swapped for the readings since AT_RISK,
        // judged, then put back (no copy of the rest).
        let k = SignalKind::BadOutcomeRate as usize;
        let windows = self.signals.values[k].replace(rate.exit);
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
            .then(|| pessimistic(&self.signals, &policy.signals, z));
        self.signals.values[k] = Some(rate.drain);
        let drain = optimistic(&self.signals, &policy.signals, z);
        self.signals.values[k] = windows;
        (Some(drain), exit)
    }

    /// AT_RISK only: the score with the failure rate of the episode that
    /// put the channel there (`signals::bad_outcome_rate_episode`).
    pub(super) fn episode_score(
        &mut self,
        horizons: &crate::signals::Horizons,
        now: i64,
    ) -> Option<Score> {
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
    pub(super) fn count_quota(&mut self, long_window_ms: i64, now: i64) {
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
    pub(super) fn learn_baseline(&mut self, now: i64, short_ms: i64) {
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

    pub(super) fn configure(&mut self, c: &ChannelConfig, group_idx: usize) {
        self.cfg = c.clone();
        self.group_id = ShortStr::new(&c.group);
        self.counts_quota = c.quota.is_some();
        self.group_idx = group_idx;
    }

    /// Hints the lines of the entry that admitting and recording an event
    /// read: the fields before the ring and the ring's own hot fields. It
    /// reads nothing of the entry: a read here would wait for the very
    /// lines it hints (what is reached through them is hinted by
    /// [`ChannelRuntime::prefetch_windows`], a step later).
    #[inline]
    pub(super) fn prefetch_hot(&self) {
        let bytes = std::mem::offset_of!(ChannelRuntime, ring) + SliceRing::HOT_BYTES;
        crate::prefetch::lines(self as *const ChannelRuntime, bytes);
    }

    /// Hints what admitting and recording `ev` reaches through the entry
    /// (its slice, staging buffers, outcome window and, for a long group
    /// id, its heap block), once [`ChannelRuntime::prefetch_hot`] had time
    /// to load the entry.
    #[inline]
    pub(super) fn prefetch_windows(&self, ev: &RequestEvent<'_>) {
        self.group_id.prefetch_heap();
        self.ring.prefetch(ev);
        self.outcomes.prefetch();
    }

    /// Records an admitted event in its channel's windows, outcomes and
    /// failure streaks. The streaks, when the machine may act on them (a
    /// sent, not cancelled attempt of a channel not frozen by a restore).
    pub(super) fn record(&mut self, ev: &RequestEvent<'_>) -> Option<Streaks> {
        let t = ev.event_time_ms;
        self.ring.record(ev);
        if !ev.was_sent() {
            // Demand only: says nothing about the channel's health.
            self.last_unsent_ms = Some(self.last_unsent_ms.map_or(t, |l| l.max(t)));
            return None;
        }
        if self.counts_quota && ev.quota_remaining.is_none() {
            self.quota.record(t, self.cfg.quota_period_ms);
        }
        self.last_event_ms = Some(self.last_event_ms.map_or(t, |l| l.max(t)));
        if ev.error_class == ErrorClass::Cancelled {
            return None;
        }
        if ev.is_probe {
            if ev.error_class.is_hard_failure() {
                self.probe_streak += 1;
            } else if ev.error_class == ErrorClass::None {
                self.probe_streak = 0;
            }
        }
        if ev.error_class == ErrorClass::None || ev.error_class.is_hard_failure() {
            self.outcomes.record(ev.error_class.is_hard_failure());
        }
        let before = self.streak.count;
        let n = self.streak.record(ev.error_class);
        (!self.frozen_at(t)).then_some(Streaks {
            grew: n > before,
            failures: n,
            probes: self.probe_streak,
        })
    }

    pub(super) fn frozen_at(&self, t: i64) -> bool {
        self.frozen_until_ms.is_some_and(|f| t <= f)
    }
}
