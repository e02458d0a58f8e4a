//! Engine-wide settings (`[engine]`): how windows are sliced and when
//! channels are evaluated. Window shapes are fixed for an engine's life: a
//! reload that changes them is refused until restart.

use super::Issues;
use serde::{Deserialize, Serialize};

/// How windows are sliced and when channels are evaluated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// Width of one ring slice. docs/decisions.md#signals: 5–10 s slices.
    pub slice_ms: i64,
    /// The short view (docs/decisions.md#signals: 1 min). Must be a multiple of `slice_ms`.
    pub short_window_ms: i64,
    /// The long view (docs/decisions.md#signals: 5 min); signals that lack samples in the short
    /// view fall back to it. Sets the ring length, hence memory per channel.
    pub long_window_ms: i64,
    /// How often every channel is scored and its state machine stepped (event
    /// time). Defaults to one slice.
    pub evaluation_interval_ms: i64,
    /// Events up to this much older than the partition watermark still land in
    /// their slice; older ones are counted (`too_late`) and dropped.
    pub allowed_lateness_ms: i64,
    /// An event stamped further ahead than this of its reference (the wall
    /// clock in the service; the watermark in replay and the simulator) is
    /// refused as `future_timestamp` and moves nothing (see `clock`). At most
    /// `allowed_lateness_ms`, so a gateway ahead by less than this never
    /// makes another gateway's events too late. Unset: equal to it.
    pub max_clock_skew_ms: Option<i64>,
    /// Without a wall clock (replay, the simulator), a jump of the watermark
    /// past the skew is taken when a second gateway's event, or this many
    /// events in a row, land beyond it: a real gap in the traffic.
    pub clock_jump_events: u32,
    /// Size of the count-based window of last outcomes. docs/decisions.md#signals / incident 002:
    /// "the last 100 requests" catches sparse failures a time window misses.
    pub outcome_window: u32,
    /// The largest t-digest compression a slice or a pane may use (the
    /// bound of `slice_tdigest_size` and `pane_tdigest_size`). A view is not
    /// compressed again: its quantiles are read from the union of its
    /// slices' and panes' centroids (`digest::ViewDigest`); per-channel
    /// memory is documented in `window`.
    pub tdigest_size: u32,
    /// t-digest compression of each slice's digests (at most
    /// `tdigest_size`). The tails stay sharp at any compression (the
    /// t-digest scale keeps its outermost centroids small), so a view of
    /// twelve slices at 25 reads its P99 from single values. 25 cuts what a
    /// busy channel holds and what an evaluation tick walks about fourfold
    /// against 100 (docs/performance.md).
    pub slice_tdigest_size: u32,
    /// Slices that have left the short view are merged into panes of this
    /// width (a multiple of `slice_ms`), one merge per slice, and only the
    /// panes are kept: the long view reads a handful of pane digests instead
    /// of every slice's, and a busy channel holds a fraction of the
    /// centroids. Counters stay per slice, so rates are exact over every
    /// view; a pane is whole in or out of a digest view (a view's oldest
    /// edge reads up to one pane further back; a probation's start is never
    /// inside a pane). `slice_ms`: each slice is its own pane. Unset: one
    /// short window (1 min with the defaults).
    pub pane_ms: Option<i64>,
    /// t-digest compression of a pane (within `10..=tdigest_size`). A pane
    /// holds `pane_ms / slice_ms` times a slice's values at the same
    /// compression by default: the t-digest scale keeps its tails sharp,
    /// and the centroids a busy channel keeps fall by about a third
    /// (docs/performance.md).
    pub pane_tdigest_size: u32,
    /// The evaluation interval is cut into this many phases, and route
    /// group `i` is evaluated in phase `i % evaluation_phases`: each group
    /// still once per interval, but an interval's work is spread over it
    /// instead of pausing the request path for every channel at one
    /// instant. Must divide `evaluation_interval_ms`. 1: every group at the
    /// interval's start.
    pub evaluation_phases: u32,
    /// Requests with at least this many input tokens are "long" (their own
    /// latency and error buckets: incident 003, failures only on long requests).
    pub long_input_tokens: u32,
    /// Outputs with fewer tokens count toward the short-output share.
    pub short_output_tokens: u32,
    /// A request slower than this counts toward the slow-request ratio.
    pub slow_request_ms: u32,
    /// How many completed short windows the baseline remembers (the median of
    /// their P99 and output-token median is the baseline). 30 × 1 min.
    pub baseline_windows: u32,
    /// The relative signals do not vote until this many baseline points exist.
    pub baseline_min_windows: u32,
    /// Tail quantiles (P99) are never decided by fewer than this many
    /// requests: over n samples the quantile read is min(0.99, 1 − tail/n).
    /// Three 10 s timeouts in a quiet minute (289 requests) were the P99 and
    /// drained a healthy channel in the 24 h drill. On probation the plain
    /// P99 is used: there a few outliers must count against letting it back.
    pub quantile_min_tail: u32,
    /// How often a channel's median latency (the
    /// `hermes_channel_latency_seconds{percentile="50"}` gauge) is read: at
    /// most once per evaluation. Reading it merges every centroid of the
    /// view (7–8 % of the request path when read at every evaluation, for
    /// a gauge); once per short window, each reading is the median of the
    /// minute before it. Decisions that use the median (an intermittence
    /// verdict) read it when they need it, whatever this says.
    pub latency_median_interval_ms: i64,
    /// A channel with no events for this long while it has weight is
    /// reported silent, when its own traffic would have brought
    /// `silent_min_events` in that time. Incident 004 wants gaps noticed
    /// within a minute. Time without weight (DRAINED, or before weight was
    /// given back) is never silence: Hermes sent nothing there.
    pub silent_after_ms: i64,
    /// A silence is reported only when the channel's traffic since its
    /// weight last fell or came back (the events of its long view over the
    /// time they span, as of the last evaluation that saw an event) would
    /// have brought at least this many events in the gap, and that traffic
    /// counted this many. A gap of a Poisson stream
    /// expected to hold 10 events happens about once in 22 000 (e^-10), so
    /// a sparse channel's ordinary gaps do not page.
    pub silent_min_events: u32,
    /// Quota forecasts look this far ahead (also the scheduler's horizon).
    pub quota_horizon_ms: i64,
    /// An event claiming more input or output tokens than this is refused
    /// as `implausible` (dead-lettered, never applied): no model reads or
    /// writes ten million tokens in one attempt, and one such event would
    /// dominate a channel's token and cost figures for a whole window.
    pub max_tokens_per_attempt: u32,
    /// An event claiming a longer latency (or time to first token) is
    /// refused as `implausible`: a gateway times an attempt out long before
    /// an hour, and one such value would be the channel's P99 for a window.
    pub max_latency_ms: u32,
}

impl EngineConfig {
    /// The pane width: `pane_ms`, or one short window.
    pub fn pane_ms(&self) -> i64 {
        self.pane_ms.unwrap_or(self.short_window_ms)
    }

    /// The allowed clock skew: `max_clock_skew_ms`, or the allowed lateness.
    pub fn clock_skew_ms(&self) -> i64 {
        self.max_clock_skew_ms.unwrap_or(self.allowed_lateness_ms)
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            slice_ms: 5_000,
            short_window_ms: 60_000,
            long_window_ms: 300_000,
            evaluation_interval_ms: 5_000,
            allowed_lateness_ms: 10_000,
            max_clock_skew_ms: None,
            max_tokens_per_attempt: 10_000_000,
            max_latency_ms: 3_600_000,
            clock_jump_events: 20,
            outcome_window: 100,
            tdigest_size: 100,
            slice_tdigest_size: 25,
            pane_ms: None,
            pane_tdigest_size: 25,
            evaluation_phases: 250,
            long_input_tokens: 4_000,
            short_output_tokens: 50,
            slow_request_ms: 5_000,
            baseline_windows: 30,
            baseline_min_windows: 5,
            quantile_min_tail: 5,
            latency_median_interval_ms: 60_000,
            silent_after_ms: 60_000,
            silent_min_events: 10,
            quota_horizon_ms: 3_600_000,
        }
    }
}

impl EngineConfig {
    /// Number of slices in the ring.
    pub fn ring_slices(&self) -> usize {
        (self.long_window_ms / self.slice_ms) as usize
    }
    /// The slice ring every channel keeps.
    pub fn ring_shape(&self) -> crate::window::RingShape {
        crate::window::RingShape {
            slice_ms: self.slice_ms,
            slices: self.ring_slices(),
            slice_tdigest_size: self.slice_tdigest_size,
            pane_slices: (self.pane_ms() / self.slice_ms).max(1) as usize,
            short_slices: self.short_slices(),
            pane_tdigest_size: self.pane_tdigest_size,
            long_input_tokens: self.long_input_tokens,
            short_output_tokens: self.short_output_tokens,
            slow_request_ms: self.slow_request_ms,
        }
    }
    /// The views signals are measured over.
    pub fn horizons(&self) -> crate::signals::Horizons {
        crate::signals::Horizons {
            short_window_ms: self.short_window_ms,
            long_window_ms: self.long_window_ms,
            quantile_min_tail: self.quantile_min_tail,
            baseline_min_windows: self.baseline_min_windows,
        }
    }
    /// Number of slices in the short view.
    pub fn short_slices(&self) -> usize {
        (self.short_window_ms / self.slice_ms) as usize
    }

    pub(super) fn validate(&self, v: &mut Issues) {
        for (k, x) in [
            ("slice_ms", self.slice_ms),
            ("pane_ms", self.pane_ms()),
            ("short_window_ms", self.short_window_ms),
            ("long_window_ms", self.long_window_ms),
            ("evaluation_interval_ms", self.evaluation_interval_ms),
            ("silent_after_ms", self.silent_after_ms),
            ("quota_horizon_ms", self.quota_horizon_ms),
            (
                "latency_median_interval_ms",
                self.latency_median_interval_ms,
            ),
        ] {
            v.positive_ms(format!("engine.{k}"), x);
        }
        if self.allowed_lateness_ms < 0 {
            v.push("engine.allowed_lateness_ms", "must be >= 0");
        }
        if self
            .max_clock_skew_ms
            .is_some_and(|k| k < 0 || k > self.allowed_lateness_ms)
        {
            v.push(
                "engine.max_clock_skew_ms",
                "must be within [0, engine.allowed_lateness_ms] (a gateway ahead by less than \
                 the skew must not make the others' events too late)",
            );
        }
        if self.clock_jump_events == 0 {
            v.push("engine.clock_jump_events", "must be at least 1");
        }
        if self.silent_min_events == 0 {
            v.push("engine.silent_min_events", "must be at least 1");
        }

        if self.max_tokens_per_attempt == 0 {
            v.push("engine.max_tokens_per_attempt", "must be at least 1");
        }
        if self.max_latency_ms == 0 {
            v.push("engine.max_latency_ms", "must be at least 1");
        }
        self.validate_windows(v);
        if self.outcome_window == 0 || self.outcome_window > 10_000 {
            v.push("engine.outcome_window", "must be within 1..=10000");
        }
        if !(20..=1000).contains(&self.tdigest_size) {
            v.push("engine.tdigest_size", "must be within 20..=1000");
        }
        if self.evaluation_phases == 0
            || self.evaluation_phases as i64 > self.evaluation_interval_ms
            || self.evaluation_interval_ms % self.evaluation_phases as i64 != 0
        {
            v.push(
                "engine.evaluation_phases",
                "must be at least 1 and divide engine.evaluation_interval_ms",
            );
        }
        if self.slice_tdigest_size < 10 || self.slice_tdigest_size > self.tdigest_size {
            v.push(
                "engine.slice_tdigest_size",
                "must be within 10..=engine.tdigest_size",
            );
        }
        if self.pane_tdigest_size < 10 || self.pane_tdigest_size > self.tdigest_size {
            v.push(
                "engine.pane_tdigest_size",
                "must be within 10..=engine.tdigest_size",
            );
        }
        if self.baseline_windows == 0 {
            v.push("engine.baseline_windows", "must be at least 1");
        }
        if self.baseline_min_windows > self.baseline_windows {
            v.push(
                "engine.baseline_min_windows",
                "must not exceed engine.baseline_windows",
            );
        }
    }

    /// The slice ring's shape: windows whole multiples of the slice, the
    /// short inside the long, late events with a slice to land in.
    fn validate_windows(&self, v: &mut Issues) {
        if self.slice_ms > 0 {
            if self.short_window_ms % self.slice_ms != 0 {
                v.push(
                    "engine.short_window_ms",
                    "must be a multiple of engine.slice_ms",
                );
            }
            if self.long_window_ms % self.slice_ms != 0 {
                v.push(
                    "engine.long_window_ms",
                    "must be a multiple of engine.slice_ms",
                );
            }
            let pane_ms = self.pane_ms();
            if pane_ms < self.slice_ms
                || pane_ms % self.slice_ms != 0
                || pane_ms > self.long_window_ms
            {
                v.push(
                    "engine.pane_ms",
                    "must be a multiple of engine.slice_ms within engine.long_window_ms",
                );
            }
            if self.long_window_ms / self.slice_ms > 720 {
                v.push(
                    "engine.long_window_ms",
                    "is more than 720 slices: memory per channel grows with the ring",
                );
            }
            if self.allowed_lateness_ms + self.short_window_ms > self.long_window_ms {
                v.push(
                    "engine.allowed_lateness_ms",
                    "plus short_window_ms must fit in long_window_ms (late events need a slice to land in)",
                );
            }
        }
        if self.short_window_ms > self.long_window_ms {
            v.push(
                "engine.short_window_ms",
                "must not exceed engine.long_window_ms",
            );
        }
    }
}
