//! Per-channel sliding windows in event time.
//!
//! # How slices rotate
//! Time is cut into slices of `engine.slice_ms`. Slice number `s = t / slice_ms`
//! lives in ring slot `s % ring_len`, where `ring_len = long_window_ms /
//! slice_ms`. A slot remembers which slice it holds; writing slice `s` into a
//! slot that still holds an older slice resets it first, so the ring never
//! needs a timer: it rotates as events and queries arrive. A view of the last
//! `w` ms at time `now` sums the slots whose slice lies in
//! `(now/slice - w/slice, now/slice]` and ignores slots holding anything else.
//!
//! Each slice keeps counters for real and probe traffic. Its values
//! (latency of real short-input, real long-input and probe attempts, TTFB and
//! output tokens of real ones) go to five t-digests: staged per channel in
//! small reused buffers (64 a kind; two, for the two slices the channel
//! last took events for, since events from gateways whose clocks differ go
//! back and forth across a boundary) and merged into the slice's digests
//! 64 at a time (and when a third slice takes the buffer, when the slice
//! leaves the short view, and before any query).
//!
//! # Panes: digests cost O(new data)
//! Only the slices of the short view keep digests of their own (`fine`,
//! `short_slices` slots). A slice that leaves the short view is merged once
//! into its pane (`pane_slices` aligned slices, compressed to
//! `pane_tdigest_size`) and its own digests are freed; panes that have left
//! the ring are dropped. The short view reads its slices exactly; a longer
//! view reads the panes that reach into it whole, so its digest may hold up
//! to one pane of slices older than its counters. Counters stay per slice:
//! every rate is exact over every view. A probation's view starts at a slice
//! boundary (`not_before_ms`), and no pane holds slices from both sides of the
//! latest one (`split`): what a drained channel did before it was let back in
//! never counts in its probation.
//!
//! # Memory per channel
//! Nothing until the channel's first event (a configured channel whose
//! events go to another partition costs about 3 KB, its engine state).
//! Then 60 slices of counters (224 B each), the short view's 12 slices of
//! digests (~140 B of summaries and up to `slice_tdigest_size` centroids per
//! kind, 8 B a centroid: `f32` mean and weight, see `SliceDigests`), about
//! five panes of `pane_tdigest_size` centroids per kind, and 2 × 5 × 64
//! staged `f32`. With the defaults a channel at 20 events/s holds about 15 KB of
//! counters and 20 KB of digests; `hermes bench` measures what a channel
//! really holds, duplicate detection included. The outcome window is
//! `outcome_window` bytes, the baseline 16 B per point.
//!
//! `record` puts an event into its slice (staging, panes, retiring slices);
//! this file holds the ring's shape and its views.

use crate::digest;

mod counters;
mod outcomes;
mod slice;
#[cfg(test)]
mod tests;

pub use counters::{is_bad_answer, Counters, ViewCounters};
pub use outcomes::{Baseline, FailureStreak, OutcomeWindow};
use slice::{Pane, Slice, SliceDigests, Staging};
mod record;

/// Staging buffer kinds (see `SliceRing::staged`) and their capacity.
const STAGE_SHORT: usize = 0;
const STAGE_LONG: usize = 1;
const STAGE_PROBE: usize = 2;
const STAGE_TTFB: usize = 3;
const STAGE_OUTPUT: usize = 4;
const STAGE_KINDS: usize = 5;
const STAGE_CAPACITY: usize = 64;

/// Which digest of a slice to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Digest {
    /// Real traffic, short and long input together.
    Latency,
    /// Real traffic with long input only.
    LatencyLong,
    /// Probe latency.
    LatencyProbe,
    /// Real time to first token.
    Ttfb,
    /// Output tokens of real successes.
    OutputTokens,
}

/// The time-sliced ring of one channel. `repr(C)`: the fields recording an
/// event reads come first, [`SliceRing::HOT_BYTES`] of them.
#[repr(C)]
pub struct SliceRing {
    // --- read by every event ---
    /// The slice the last event landed in: (number, start ms, slot). Events
    /// of a channel nearly always land in the same slice as the previous one,
    /// and this saves the two 64-bit divisions per event on the hot path.
    last: (i64, i64, usize),
    /// Values waiting to be merged into their slice's digests: two
    /// small reused buffers per channel, for the two slices it last took
    /// events for, instead of t-digest's 5 × size push buffer per digest
    /// per slice (that allocated tens of MB of fresh memory per thousand
    /// channels). Two, because gateways' clocks differ by seconds: near a
    /// slice boundary a channel's events go back and forth between two
    /// slices, and one buffer was drained at each crossing. A buffer is
    /// drained when full, when a third slice takes it (the older of the
    /// two), before its slice leaves the short view, and before every
    /// query. `cur`: the buffer of the slice in `last`.
    staged: [Staging; 2],
    cur: usize,
    slice_ms: i64,
    /// Empty until the first event, then `len` slots.
    slices: Vec<Slice>,
    /// The slice number each slot holds (`i64::MIN`: never used). Kept apart
    /// from the slices so that the per-tick range scans touch one compact
    /// array, not a cache line per slot.
    indices: Vec<i64>,
    long_input_tokens: i32,
    short_output_tokens: i32,
    slow_request_ms: i32,
    // --- read when slices change and by queries ---
    len: usize,
    /// Compression of slice digests.
    slice_size: usize,
    /// The digests of the slices still in the short view: slice `s` in
    /// slot `s % short_slices` (`fine_indices` says which slice a slot
    /// holds). A slice leaving the short view is merged into its pane.
    fine: Vec<SliceDigests>,
    fine_indices: Vec<i64>,
    /// Digests of the older slices, a pane per `pane_slices` aligned
    /// slices (split at `split`), oldest first.
    panes: std::collections::VecDeque<Pane>,
    /// Buffers for the next panes: reserved at the first event (one per
    /// pane the ring holds, each the size of a pane's digests), then those
    /// of the panes that left the ring. A pane made later takes one
    /// instead of growing its own (see [`SliceRing::most_panes`]).
    spare: Vec<SliceDigests>,
    /// Every slice up to this one has been moved out of `fine`.
    moved_through: i64,
    /// The first slice of the latest probation (`i64::MIN`: none): no pane
    /// holds slices from both sides of it, so a view clipped there is exact.
    split: i64,
    short_slices: usize,
    pane_slices: i64,
    pane_size: usize,
}

/// What a ring is built to hold (from `EngineConfig::ring_shape`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingShape {
    pub slice_ms: i64,
    pub slices: usize,
    /// Compression of each slice's digests.
    pub slice_tdigest_size: u32,
    /// Slices per pane, slices in the short view, compression of a pane.
    pub pane_slices: usize,
    pub short_slices: usize,
    pub pane_tdigest_size: u32,
    pub long_input_tokens: u32,
    pub short_output_tokens: u32,
    pub slow_request_ms: u32,
}

impl SliceRing {
    /// Bytes from the start of a ring that recording an event reads (its
    /// fields up to `len`), at steady state.
    pub const HOT_BYTES: usize = std::mem::offset_of!(SliceRing, len);

    pub fn new(cfg: RingShape) -> SliceRing {
        let size = cfg.slice_tdigest_size as usize;
        SliceRing {
            slice_ms: cfg.slice_ms,
            // Allocated at the first event (`slot_for`): a configured
            // channel whose events never come here costs next to nothing.
            slices: Vec::new(),
            indices: Vec::new(),
            fine: Vec::new(),
            fine_indices: Vec::new(),
            panes: Default::default(),
            spare: Vec::new(),
            moved_through: i64::MIN,
            split: i64::MIN,
            short_slices: cfg.short_slices.clamp(1, cfg.slices.max(1)),
            pane_slices: cfg.pane_slices.max(1) as i64,
            pane_size: cfg.pane_tdigest_size as usize,
            len: cfg.slices,
            slice_size: size,
            // Start at i64::MAX: the first event never matches (and never overflows).
            last: (i64::MIN, i64::MAX, 0),
            staged: Default::default(),
            cur: 0,
            long_input_tokens: cfg.long_input_tokens.min(i32::MAX as u32) as i32,
            short_output_tokens: cfg.short_output_tokens.min(i32::MAX as u32) as i32,
            slow_request_ms: cfg.slow_request_ms.min(i32::MAX as u32) as i32,
        }
    }

    fn slot(&self, index: i64) -> usize {
        index.rem_euclid(self.len as i64) as usize
    }

    /// How many panes a ring holds at most, but for several probations
    /// starting within one long window: the slices older than the short
    /// view in aligned runs of `pane_slices` (one more when they are not
    /// aligned), one cut at a probation's start, and for a moment (before
    /// [`SliceRing::retire_through`] forgets those that left the ring) the
    /// panes a channel back from a quiet spell makes for its short view's
    /// slices. Reserved at a channel's first event: grown later, it grew
    /// for every channel in the same second (one long window after they
    /// started together, as at a service's start), each into fresh memory,
    /// which with huge pages is a fault of 2 MB: the longest pause of the
    /// request path.
    fn most_panes(&self) -> usize {
        let p = self.pane_slices as usize;
        self.live_panes() + 1 + self.short_slices.div_ceil(p) + 1
    }

    /// The panes a busy channel's ring holds at steady state (with a pane
    /// begun for the newest slices out of the short view).
    fn live_panes(&self) -> usize {
        let older = self.len.saturating_sub(self.short_slices);
        older.div_ceil(self.pane_slices as usize) + 1
    }

    /// Slice number of an event time.
    pub fn slice_of(&self, t_ms: i64) -> i64 {
        t_ms.div_euclid(self.slice_ms)
    }

    /// Whether event time `t` lies in the slice the last event landed in.
    fn in_last_slice(&self, t: i64) -> bool {
        t >= self.last.1 && t - self.last.1 < self.slice_ms
    }

    /// Slice numbers covered by the view `(now - window, now]`, clipped to
    /// slices starting at or after `not_before_ms`.
    fn range(&self, now_ms: i64, window_ms: i64, not_before_ms: i64) -> (i64, i64) {
        let last = self.slice_of(now_ms);
        let span = (window_ms / self.slice_ms).max(1);
        let first = (last - span + 1).max(self.slice_of(not_before_ms + self.slice_ms - 1));
        (first, last)
    }

    /// Counters of a view.
    pub fn counters(&self, now_ms: i64, window_ms: i64, not_before_ms: i64) -> ViewCounters {
        let (first, last) = self.range(now_ms, window_ms, not_before_ms);
        let mut out = ViewCounters::default();
        for (s, &index) in self.slices.iter().zip(&self.indices) {
            if index >= first && index <= last {
                out.real.add(&s.real);
                out.probe.add(&s.probe);
                for i in 0..4 {
                    out.class_requests[i] += s.class_requests[i];
                    out.class_tokens[i] += s.class_tokens[i];
                    out.class_unsent[i] += s.class_unsent[i];
                }
            }
        }
        out
    }

    /// One digest kind over a view, for quantile queries (the union of its
    /// slices' and panes' centroids, see [`digest::ViewDigest`]). Returns
    /// `None` when it holds no values. Cost: gathering the view's
    /// centroids, then a walk per quantile (evaluation path only).
    pub fn digest(
        &mut self,
        which: Digest,
        now_ms: i64,
        window_ms: i64,
        not_before_ms: i64,
    ) -> Option<digest::ViewDigest> {
        self.drain_stage(0);
        self.drain_stage(1);
        let clip = self.slice_of(not_before_ms + self.slice_ms - 1);
        if not_before_ms > i64::MIN / 2 {
            self.split_at(clip);
        }
        self.retire_through(self.slice_of(now_ms) - self.short_slices as i64);
        let (first, last) = self.range(now_ms, window_ms, not_before_ms);
        // The fine slices in the view, and the panes whose values reach
        // into it (whole: a pane's oldest slices may be older than the
        // view) but none with values from before `not_before_ms`.
        let fine = self
            .fine
            .iter()
            .zip(&self.fine_indices)
            .filter(|(_, &index)| index >= first && index <= last)
            .map(|(d, _)| d);
        let panes = self
            .panes
            .iter()
            .filter(|p| p.held.1 >= first && p.held.0 <= last && p.held.0 >= clip)
            .map(|p| &p.digests);
        // The view's centroids, in reused buffers (this runs for every
        // channel on every evaluation tick).
        digest::view(|runs| {
            for d in panes.chain(fine) {
                match which {
                    // Real latency: the short- and long-input digests together.
                    Digest::Latency => {
                        d.add_to(runs, STAGE_SHORT);
                        d.add_to(runs, STAGE_LONG);
                    }
                    Digest::LatencyLong => d.add_to(runs, STAGE_LONG),
                    Digest::LatencyProbe => d.add_to(runs, STAGE_PROBE),
                    Digest::Ttfb => d.add_to(runs, STAGE_TTFB),
                    Digest::OutputTokens => d.add_to(runs, STAGE_OUTPUT),
                }
            }
        })
    }

    /// Oldest and newest quota report in the view, for the burn rate.
    pub fn quota_reports(&self, now_ms: i64, window_ms: i64) -> Option<((i64, i64), (i64, i64))> {
        let (first, last) = self.range(now_ms, window_ms, i64::MIN / 2);
        let mut oldest: Option<(i64, i64)> = None;
        let mut newest: Option<(i64, i64)> = None;
        for (s, &index) in self.slices.iter().zip(&self.indices) {
            if index < first || index > last {
                continue;
            }
            if let Some(q) = s.quota() {
                if oldest.is_none_or(|o| q.0 < o.0) {
                    oldest = Some(q);
                }
                if newest.is_none_or(|n| q.0 > n.0) {
                    newest = Some(q);
                }
            }
        }
        Some((oldest?, newest?))
    }
}
