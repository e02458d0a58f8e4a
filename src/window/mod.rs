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
//! events go to another partition costs about 2.3 KB, its engine state).
//! Then 60 slices of counters (168 B each with the slice number; 16 B more
//! a slice once the channel reports its quota), the short view's 12 slices of
//! digests (96 B of counts and extremes and up to `slice_tdigest_size` centroids per
//! kind, 8 B a centroid: `f32` mean and weight, see `SliceDigests`), about
//! five panes of `pane_tdigest_size` centroids per kind, and 2 × 5 × 64
//! staged `f32`. With the defaults a channel at 20 events/s holds about 10 KB of
//! counters and 20 KB of digests; `hermes bench` measures what a channel
//! really holds, duplicate detection included. The outcome window is a
//! bit an outcome, in the channel's entry up to 128 (`outcome_window`,
//! default 100), the baseline 16 B per point.
//!
//! `ring` is a channel's ring: its shape, how an event is recorded into its
//! slice (staging, panes, retiring slices) and its views.

mod counters;
mod outcomes;
mod ring;
mod slice;

#[cfg(test)]
pub(crate) use counters::is_bad_answer;
pub use counters::{Counters, ViewCounters};
pub use outcomes::{Baseline, FailureStreak, OutcomeWindow};

pub use ring::{RingShape, SliceRing};

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
