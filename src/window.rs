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

use crate::digest::{self, MergedDigest, Runs};
use crate::event::{ErrorClass, RequestEvent};

/// Staging buffer kinds (see `SliceRing::staged`) and their capacity.
const STAGE_SHORT: usize = 0;
const STAGE_LONG: usize = 1;
const STAGE_PROBE: usize = 2;
const STAGE_TTFB: usize = 3;
const STAGE_OUTPUT: usize = 4;
const STAGE_KINDS: usize = 5;
const STAGE_CAPACITY: usize = 64;

/// Values of one slice waiting to be merged into its digests
/// (`SliceRing::stage`), `STAGE_CAPACITY` per kind, kind after kind, in
/// one allocation made at its first value: an event's values (latency,
/// TTFB, output size: up to three kinds) land on one page, where a buffer
/// per kind put them on up to three, each a page-table walk of its own
/// when thousands of channels' state is read at random.
struct Staging {
    /// The slice the values belong to (`i64::MIN`: none yet) and its slot.
    slice: i64,
    slot: usize,
    /// Empty until the first value, then `STAGE_KINDS * STAGE_CAPACITY`.
    values: Box<[f32]>,
    lens: [u8; STAGE_KINDS],
}

impl Default for Staging {
    fn default() -> Staging {
        Staging {
            slice: i64::MIN,
            slot: 0,
            values: Box::default(),
            lens: [0; STAGE_KINDS],
        }
    }
}

impl Staging {
    /// Adds a value of kind `k`, which has room (drained when full);
    /// whether that filled it.
    #[inline]
    fn push(&mut self, k: usize, v: f32) -> bool {
        if self.values.is_empty() {
            self.values = vec![0.0; STAGE_KINDS * STAGE_CAPACITY].into_boxed_slice();
        }
        let len = self.lens[k] as usize;
        self.values[k * STAGE_CAPACITY + len] = v;
        self.lens[k] += 1;
        len + 1 == STAGE_CAPACITY
    }

    fn is_empty(&self) -> bool {
        self.lens.iter().all(|&l| l == 0)
    }

    /// The values of kind `k`.
    fn kind(&self, k: usize) -> &[f32] {
        let start = k * STAGE_CAPACITY;
        self.values
            .get(start..start + self.lens[k] as usize)
            .unwrap_or(&[])
    }

    /// Where kind `k`'s next value goes (for a hint; never read through).
    fn next_slot(&self, k: usize) -> *const f32 {
        self.values
            .as_ptr()
            .wrapping_add(k * STAGE_CAPACITY + self.lens[k] as usize)
    }

    fn clear(&mut self) {
        self.lens = [0; STAGE_KINDS];
    }
}

/// Counts for one population (real or probe) over one slice or a view.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counters {
    /// Attempts, excluding cancelled ones (they say nothing about the channel).
    pub requests: u32,
    /// Failed attempts other than client 4xx.
    pub errors: u32,
    /// Client 4xx (counted lightly).
    pub client_errors: u32,
    /// Connect errors, timeouts, resets, 5xx.
    pub hard_failures: u32,
    /// HTTP 429.
    pub rate_limited: u32,
    /// attempt > 0.
    pub retries: u32,
    /// Latency above `engine.slow_request_ms`.
    pub slow: u32,
    /// Successful attempts (the quality population).
    pub successes: u32,
    pub truncated: u32,
    /// Successes of structured requests, and those that failed their schema.
    pub structured: u32,
    pub schema_invalid: u32,
    /// Successes containing U+FFFD.
    pub garbled: u32,
    /// Successes with fewer than `engine.short_output_tokens` output tokens.
    pub short_outputs: u32,
    /// Successes whose answer is bad (docs/decisions.md#safety-rails: truncated, garbled,
    /// schema-invalid, or a real request's short/empty output): failures
    /// with HTTP 200. See [`is_bad_answer`].
    pub bad_answers: u32,
    /// Long-input attempts and their errors.
    pub long_requests: u32,
    pub long_errors: u32,
    /// Spend in the cost currency.
    pub cost: f64,
}

impl Counters {
    /// Counts one sent, not cancelled attempt (`long`: a long-input one).
    #[inline]
    fn count(
        &mut self,
        ev: &RequestEvent<'_>,
        long: bool,
        slow_request_ms: i32,
        short_output_tokens: i32,
    ) {
        self.requests += 1;
        let failed = ev.error_class.is_error();
        match ev.error_class {
            ErrorClass::ClientError => self.client_errors += 1,
            e if e.is_error() => self.errors += 1,
            _ => {}
        }
        self.hard_failures += ev.error_class.is_hard_failure() as u32;
        self.rate_limited += (ev.error_class == ErrorClass::RateLimited) as u32;
        self.retries += (ev.attempt > 0) as u32;
        self.slow += (ev.latency_ms > slow_request_ms) as u32;
        if long {
            self.long_requests += 1;
            if failed && ev.error_class != ErrorClass::ClientError {
                self.long_errors += 1;
            }
        }
        self.cost += ev.cost;
        if !failed {
            self.successes += 1;
            self.truncated += ev.truncated as u32;
            if let Some(valid) = ev.schema_valid {
                self.structured += 1;
                self.schema_invalid += (!valid) as u32;
            }
            self.garbled += (ev.replacement_chars > 0) as u32;
            self.short_outputs += ev
                .output_tokens_reported()
                .is_some_and(|t| t < short_output_tokens) as u32;
            self.bad_answers += is_bad_answer(ev, short_output_tokens) as u32;
        }
    }

    fn add(&mut self, o: &Counters) {
        self.requests += o.requests;
        self.errors += o.errors;
        self.client_errors += o.client_errors;
        self.hard_failures += o.hard_failures;
        self.rate_limited += o.rate_limited;
        self.retries += o.retries;
        self.slow += o.slow;
        self.successes += o.successes;
        self.truncated += o.truncated;
        self.structured += o.structured;
        self.schema_invalid += o.schema_invalid;
        self.garbled += o.garbled;
        self.short_outputs += o.short_outputs;
        self.bad_answers += o.bad_answers;
        self.long_requests += o.long_requests;
        self.long_errors += o.long_errors;
        self.cost += o.cost;
    }
}

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

/// One slice's counters. `repr(C)`: what a real (not probe) event counts
/// comes first, [`Slice::REAL_BYTES`] of it.
#[derive(Clone)]
#[repr(C)]
struct Slice {
    real: Counters,
    /// Real requests and tokens per traffic class (scheduler demand).
    class_requests: [u32; 4],
    class_tokens: [u64; 4],
    probe: Counters,
    /// Requests per traffic class the gateways did not send (demand only).
    class_unsent: [u32; 4],
    /// Last quota report in this slice: its event time (`i64::MIN`: none;
    /// an `Option` costs 8 more bytes in each of 60 slices) and the quota
    /// remaining. See [`Slice::quota`].
    quota_at_ms: i64,
    quota_remaining: i64,
}

impl Slice {
    const REAL_BYTES: usize = std::mem::offset_of!(Slice, probe);

    fn empty() -> Slice {
        Slice {
            real: Counters::default(),
            probe: Counters::default(),
            class_requests: [0; 4],
            class_tokens: [0; 4],
            class_unsent: [0; 4],
            quota_at_ms: i64::MIN,
            quota_remaining: 0,
        }
    }

    /// The slice's last quota report: (event time, remaining).
    fn quota(&self) -> Option<(i64, i64)> {
        (self.quota_at_ms != i64::MIN).then_some((self.quota_at_ms, self.quota_remaining))
    }
}

/// A slice's five t-digests in one allocation: centroids as `f32` pairs
/// (mean, weight, packed as their sort key: [`digest::Packed`]) back to
/// back, kind after kind, with each kind's summary.
/// A `tdigest::TDigest` is 104 bytes before its first centroid and holds
/// 16 bytes per centroid; five of them in each of 60 slices made most of a
/// channel's memory. Latencies and token counts are integers well inside
/// `f32`'s exact range, and a centroid mean keeps 24 bits (7 digits).
#[derive(Clone, Default)]
struct SliceDigests {
    centroids: Vec<digest::Packed>,
    /// Where each kind's centroids end in `centroids`.
    ends: [u16; 5],
    count: [u32; 5],
    sum: [f64; 5],
    min: [f32; 5],
    max: [f32; 5],
}

impl SliceDigests {
    fn range(&self, k: usize) -> std::ops::Range<usize> {
        let start = if k == 0 { 0 } else { self.ends[k - 1] as usize };
        start..self.ends[k] as usize
    }

    fn is_empty(&self, k: usize) -> bool {
        self.count[k] == 0
    }

    /// Empty, with room for `centroids` centroids.
    fn with_capacity(centroids: usize) -> SliceDigests {
        SliceDigests {
            centroids: Vec::with_capacity(centroids),
            ..SliceDigests::default()
        }
    }

    /// Holds nothing again, keeping its buffer (a fine slot's next slice).
    fn clear(&mut self) {
        let mut centroids = std::mem::take(&mut self.centroids);
        centroids.clear();
        *self = SliceDigests {
            centroids,
            ..SliceDigests::default()
        };
    }

    /// Adds kind `k` (if it holds values) to a merged digest's runs.
    fn add_to(&self, runs: &mut Runs, k: usize) {
        if self.is_empty(k) {
            return;
        }
        runs.add(
            &self.centroids[self.range(k)],
            self.count[k] as f64,
            self.sum[k],
            self.min[k] as f64,
            self.max[k] as f64,
        );
    }

    /// Merges every kind of `other` into this one, compressing each to
    /// `size` (a slice into its pane).
    fn merge_from(&mut self, other: &SliceDigests, size: usize) {
        for k in 0..5 {
            if other.is_empty(k) {
                continue;
            }
            let merged = digest::gather(size, |runs| {
                self.add_to(runs, k);
                other.add_to(runs, k);
            });
            if let Some(merged) = merged {
                self.store_merged(k, &merged);
            }
        }
    }

    /// Replaces kind `k` with a merged digest.
    fn store_merged(&mut self, k: usize, d: &MergedDigest) {
        let range = self.range(k);
        let old = range.len();
        let new = d.centroids().len();
        // Grown to size, never doubled (the buffer is most of a slice's
        // memory), and not shrunk back either: a slice's kinds stay about
        // the size of their compression once they hold values.
        if new > old {
            self.centroids.reserve_exact(new - old);
        }
        self.centroids
            .splice(range, d.centroids().iter().map(digest::Packed::of));
        for end in &mut self.ends[k..] {
            *end = (*end as usize + new - old) as u16;
        }
        self.count[k] = d.count() as u32;
        self.sum[k] = d.sum();
        self.min[k] = d.min() as f32;
        self.max[k] = d.max() as f32;
    }
}

/// Summed counters of a view.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ViewCounters {
    pub real: Counters,
    pub probe: Counters,
    pub class_requests: [u32; 4],
    pub class_tokens: [u64; 4],
    /// Unsent requests per class (shed, or no channel): demand only.
    pub class_unsent: [u32; 4],
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

/// The merged digests of the slices `lo..=hi`; `held` is the range of
/// those that had values (what a view decides on).
struct Pane {
    lo: i64,
    hi: i64,
    held: (i64, i64),
    digests: SliceDigests,
}

impl Pane {
    fn hold(&mut self, index: i64) -> &mut SliceDigests {
        self.held = (self.held.0.min(index), self.held.1.max(index));
        &mut self.digests
    }
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

    /// The slot of the slice holding event time `t`, recycled if it held an
    /// older slice, and the staging buffer its values go to (`cur`); `None`
    /// if `t` is older than the ring.
    fn slot_for(&mut self, t: i64) -> Option<usize> {
        let (index, slot) = if self.in_last_slice(t) {
            (self.last.0, self.last.2)
        } else {
            // Off the hot path (a new slice); the first event of all lands
            // here too, since `last` starts matching nothing.
            if self.slices.is_empty() {
                self.slices = vec![Slice::empty(); self.len];
                self.indices = vec![i64::MIN; self.len];
                self.fine = vec![SliceDigests::default(); self.short_slices];
                self.fine_indices = vec![i64::MIN; self.short_slices];
                self.panes = std::collections::VecDeque::with_capacity(self.most_panes());
                let pane = STAGE_KINDS * self.pane_size;
                self.spare = (0..self.live_panes())
                    .map(|_| SliceDigests::with_capacity(pane))
                    .collect();
            }
            let index = self.slice_of(t);
            let slot = self.slot(index);
            self.last = (index, index * self.slice_ms, slot);
            // Whatever has left the short view ending here moves to its
            // pane first (its staged values with it), so the fine slot
            // `index` takes is free.
            let through = index - self.short_slices as i64;
            for b in 0..2 {
                if self.staged[b].slice <= through {
                    self.drain_stage(b);
                }
            }
            self.retire_through(through);
            self.cur = match self.staged.iter().position(|s| s.slice == index) {
                Some(b) => b,
                None => {
                    // The older of the two buffers takes the new slice.
                    let b = (self.staged[1].slice < self.staged[0].slice) as usize;
                    self.drain_stage(b);
                    (self.staged[b].slice, self.staged[b].slot) = (index, slot);
                    b
                }
            };
            (index, slot)
        };
        if self.indices[slot] != index {
            if self.indices[slot] > index {
                return None;
            }
            self.slices[slot] = Slice::empty();
            self.indices[slot] = index;
        }
        Some(slot)
    }

    /// Adds one event. The caller has already checked lateness, so the event's
    /// slice is never older than the ring; if it somehow is, it is ignored and
    /// `false` returned.
    pub fn record(&mut self, ev: &RequestEvent<'_>) -> bool {
        let Some(slot) = self.slot_for(ev.event_time_ms) else {
            return false;
        };
        if !ev.was_sent() {
            // Demand only: no attempt was made, so nothing else is measured.
            self.slices[slot].class_unsent[ev.traffic_class.index()] += 1;
            return true;
        }
        let long_input_tokens = self.long_input_tokens;
        let short_output_tokens = self.short_output_tokens;
        let slow_request_ms = self.slow_request_ms;
        let s = &mut self.slices[slot];
        if ev.error_class == ErrorClass::Cancelled {
            return true;
        }
        let long = ev.input_tokens >= long_input_tokens;
        let c = if ev.is_probe {
            &mut s.probe
        } else {
            &mut s.real
        };
        c.count(ev, long, slow_request_ms, short_output_tokens);
        let tokens = ev.input_tokens as u64 + ev.output_tokens_reported().unwrap_or(0) as u64;
        if let Some(q) = ev.quota_remaining {
            if ev.event_time_ms >= s.quota_at_ms {
                (s.quota_at_ms, s.quota_remaining) = (ev.event_time_ms, q);
            }
        }
        if !ev.is_probe {
            let class = ev.traffic_class.index();
            s.class_requests[class] += 1;
            s.class_tokens[class] += tokens;
        }
        if self.stage(ev) {
            self.drain_stage(self.cur);
        }
        true
    }

    /// Hints what [`SliceRing::record`] touches for `ev` when it lands in
    /// the slice the last event landed in (nearly every event at steady
    /// state): the slice's counters it adds to and where the staging
    /// buffers it adds to take their next value (see [`crate::prefetch`]).
    /// It reads the ring's hot fields: hint those first
    /// ([`SliceRing::HOT_BYTES`]).
    pub fn prefetch(&self, ev: &RequestEvent<'_>) {
        if self.slices.is_empty() || !self.in_last_slice(ev.event_time_ms) {
            return;
        }
        let slot = self.last.2;
        let slice = &self.slices[slot];
        if ev.is_probe || !ev.was_sent() {
            crate::prefetch::value(slice);
        } else {
            crate::prefetch::lines(slice as *const Slice, Slice::REAL_BYTES);
        }
        crate::prefetch::value(&self.indices[slot]);
        for k in self.stage_targets(ev).into_iter().flatten() {
            crate::prefetch::lines(self.staged[self.cur].next_slot(k), 4);
        }
    }

    /// The staging buffers an event's values go to (`STAGE_*`): its
    /// latency's, then its TTFB's and output size's if it has them.
    #[inline]
    fn stage_targets(&self, ev: &RequestEvent<'_>) -> [Option<usize>; 3] {
        if ev.is_probe {
            return [Some(STAGE_PROBE), None, None];
        }
        let long = ev.input_tokens >= self.long_input_tokens;
        [
            Some(if long { STAGE_LONG } else { STAGE_SHORT }),
            ev.ttfb_ms.map(|_| STAGE_TTFB),
            (!ev.error_class.is_error() && ev.output_tokens_reported().is_some())
                .then_some(STAGE_OUTPUT),
        ]
    }

    /// Stages the event's latency (and TTFB and output size) for its
    /// slice's digests; whether that filled a buffer (to be drained: each
    /// is drained the moment it fills, so only these can be full).
    #[inline]
    fn stage(&mut self, ev: &RequestEvent<'_>) -> bool {
        let values = [
            ev.latency_ms as f32,
            ev.ttfb_ms.unwrap_or(0) as f32,
            ev.output_tokens as f32,
        ];
        let mut full = false;
        for (k, v) in self.stage_targets(ev).into_iter().zip(values) {
            if let Some(k) = k {
                full |= self.staged[self.cur].push(k, v);
            }
        }
        full
    }

    /// Merges buffer `b`'s staged values into their slice's digests: its
    /// fine slot while it is in the short view, its pane once it has left
    /// (a late event).
    fn drain_stage(&mut self, b: usize) {
        let (index, slot) = (self.staged[b].slice, self.staged[b].slot);
        if self.staged[b].is_empty() {
            return;
        }
        let mut staged = std::mem::take(&mut self.staged[b]);
        let live = index != i64::MIN && self.indices[slot] == index;
        if let Some((digests, size)) = live.then(|| self.digests_of(index)).flatten() {
            for k in 0..STAGE_KINDS {
                let values = staged.kind(k);
                if values.is_empty() {
                    continue;
                }
                let merged = digest::add_values(size, |runs| digests.add_to(runs, k), values);
                if let Some(merged) = merged {
                    digests.store_merged(k, &merged);
                }
            }
        }
        staged.clear();
        self.staged[b] = staged;
    }

    /// Where slice `index`'s digests live, and their compression: its fine
    /// slot (taken if it holds an older slice, already moved to its pane),
    /// or, once it has left the short view, its pane (made if it has none).
    fn digests_of(&mut self, index: i64) -> Option<(&mut SliceDigests, usize)> {
        if index > self.moved_through {
            let f = index.rem_euclid(self.short_slices as i64) as usize;
            if self.fine_indices[f] != index {
                if self.fine_indices[f] > index {
                    return None;
                }
                debug_assert!(self.fine_indices[f] <= self.moved_through);
                self.fine[f].clear();
                self.fine_indices[f] = index;
            }
            return Some((&mut self.fine[f], self.slice_size));
        }
        let i = self.pane_for(index);
        Some((self.panes[i].hold(index), self.pane_size))
    }

    /// The pane slice `index` belongs in: aligned runs of `pane_slices`
    /// slices, cut at `split`. Made (in order) if it does not exist.
    fn pane_for(&mut self, index: i64) -> usize {
        let p = self.pane_slices;
        let mut lo = index.div_euclid(p) * p;
        let mut hi = lo + p - 1;
        if self.split > lo && self.split <= hi {
            if index < self.split {
                hi = self.split - 1;
            } else {
                lo = self.split;
            }
        }
        match self.panes.iter().rposition(|x| x.lo <= index) {
            Some(i) if self.panes[i].hi >= index => i,
            at => {
                let i = at.map_or(0, |i| i + 1);
                let lo = at.map_or(lo, |j| lo.max(self.panes[j].hi + 1));
                let hi = self.panes.get(i).map_or(hi, |n| hi.min(n.lo - 1));
                self.panes.insert(
                    i,
                    Pane {
                        lo,
                        hi,
                        held: (i64::MAX, i64::MIN),
                        digests: self.spare.pop().unwrap_or_default(),
                    },
                );
                i
            }
        }
    }

    /// Moves the digests of every slice up to `through` from the short view
    /// into its pane, oldest first (each slice is merged once), and forgets
    /// panes that have left the ring.
    fn retire_through(&mut self, through: i64) {
        if through <= self.moved_through || self.fine.is_empty() {
            return;
        }
        // Nothing newer than `through` has come: a quiet channel frees its
        // buffers rather than keep them for slices that may never come.
        let busy = self.last.0 > through;
        // Oldest first; a slot keeps its buffer for the slice that takes
        // it next (`digests_of`) while the channel has newer slices.
        while let Some((index, f)) = (0..self.fine.len())
            .filter(|&f| self.fine_indices[f] != i64::MIN && self.fine_indices[f] <= through)
            .map(|f| (self.fine_indices[f], f))
            .min()
        {
            self.fine_indices[f] = i64::MIN;
            if (0..5).all(|k| self.fine[f].is_empty(k)) {
                continue;
            }
            let i = self.pane_for(index);
            self.panes[i]
                .hold(index)
                .merge_from(&self.fine[f], self.pane_size);
            if busy {
                self.fine[f].clear();
            } else {
                self.fine[f] = SliceDigests::default();
            }
        }
        if !busy {
            self.spare = Vec::new();
        }
        self.moved_through = through;
        let oldest = through + self.short_slices as i64 - self.len as i64 + 1;
        while self.panes.front().is_some_and(|p| p.held.1 < oldest) {
            let Some(mut gone) = self.panes.pop_front() else {
                break;
            };
            // Kept for the pane made next.
            if busy && self.spare.len() < self.live_panes() {
                gone.digests.clear();
                self.spare.push(gone.digests);
            }
        }
    }

    /// A probation starts at slice `first`: no pane made from here on
    /// holds slices from both sides of it. Panes only hold slices that left
    /// the short view, and the engine measures a probation from its next
    /// evaluation on, so a pane reaching past `first` holds nothing from
    /// there yet and is cut short. (A view asked later still reads a pane
    /// whose values all lie after its start: see `digest`.)
    fn split_at(&mut self, first: i64) {
        if first <= self.split {
            return;
        }
        self.split = first;
        for p in self.panes.iter_mut() {
            if p.lo < first && p.hi >= first && p.held.1 < first {
                p.hi = first - 1;
            }
        }
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

/// A successful attempt whose answer is no good to the caller (docs/decisions.md#safety-rails: "a
/// bad answer is a failed request"): truncated, garbled (U+FFFD), failing its
/// schema, or, for real traffic, shorter than `short_output_tokens` (an empty
/// or cut answer; probes ask fixed short questions, so their length says
/// nothing). Errors are failures already and are not bad *answers*.
pub fn is_bad_answer(ev: &RequestEvent<'_>, short_output_tokens: i32) -> bool {
    ev.error_class == ErrorClass::None
        && (ev.truncated
            || ev.replacement_chars > 0
            || ev.schema_valid == Some(false)
            || !ev.is_probe
                && ev
                    .output_tokens_reported()
                    .is_some_and(|t| t < short_output_tokens))
}

/// The last N outcomes, however far apart in time (docs/decisions.md#signals, incident 002).
/// Only outcomes that say something about the channel count: a success or a
/// hard failure. 429s, client errors and cancellations are left out. Bad
/// answers are not recorded here: `bad_outcome_rate` counts them (with the
/// hard failures) over the time views, and counting them in both would score
/// a 2 % bad-answer day twice.
#[derive(Debug, Clone)]
pub struct OutcomeWindow {
    outcomes: Vec<bool>,
    next: usize,
    len: usize,
    failures: u32,
}

impl OutcomeWindow {
    pub fn new(capacity: u32) -> OutcomeWindow {
        OutcomeWindow {
            outcomes: vec![false; capacity.max(1) as usize],
            next: 0,
            len: 0,
            failures: 0,
        }
    }

    /// Hints the entry [`OutcomeWindow::record`] writes next.
    pub fn prefetch(&self) {
        if let Some(o) = self.outcomes.get(self.next) {
            crate::prefetch::value(o);
        }
    }

    pub fn record(&mut self, failed: bool) {
        if self.len == self.outcomes.len() {
            self.failures -= self.outcomes[self.next] as u32;
        } else {
            self.len += 1;
        }
        self.outcomes[self.next] = failed;
        self.failures += failed as u32;
        self.next = (self.next + 1) % self.outcomes.len();
    }

    pub fn len(&self) -> u32 {
        self.len as u32
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn failures(&self) -> u32 {
        self.failures
    }
    pub fn failure_rate(&self) -> Option<f64> {
        (self.len > 0).then(|| self.failures as f64 / self.len as f64)
    }
}

/// Consecutive hard failures, reset by a success (docs/decisions.md#signals).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FailureStreak {
    pub count: u32,
}

impl FailureStreak {
    /// Returns the streak after this outcome. Outcomes that are neither a
    /// success nor a hard failure leave it unchanged.
    pub fn record(&mut self, error: ErrorClass) -> u32 {
        if error == ErrorClass::None {
            self.count = 0;
        } else if error.is_hard_failure() {
            self.count += 1;
        }
        self.count
    }
}

/// Medians of previous short windows (docs/decisions.md#signals): the reference for relative
/// latency and output length. The owner only calls `learn` while the channel
/// is healthy, so a sick channel cannot teach itself that sick is normal.
#[derive(Debug, Clone)]
pub struct Baseline {
    points: std::collections::VecDeque<(f64, f64)>,
    capacity: usize,
}

impl Baseline {
    pub fn new(capacity: u32) -> Baseline {
        Baseline {
            points: std::collections::VecDeque::with_capacity(capacity as usize),
            capacity: capacity.max(1) as usize,
        }
    }

    /// Remembers one completed window's P99 latency and output-token median
    /// (NaN when the window lacked that measurement).
    pub fn learn(&mut self, p99_ms: f64, output_median: f64) {
        if self.points.len() == self.capacity {
            self.points.pop_front();
        }
        self.points.push_back((p99_ms, output_median));
    }

    pub fn len(&self) -> u32 {
        self.points.len() as u32
    }
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    fn median_of(&self, pick: impl Fn(&(f64, f64)) -> f64, min_points: u32) -> Option<f64> {
        let mut v: Vec<f64> = self
            .points
            .iter()
            .map(pick)
            .filter(|x| x.is_finite())
            .collect();
        if v.len() < min_points.max(1) as usize {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        Some(if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        })
    }

    /// Median P99 of the remembered windows.
    pub fn p99_ms(&self, min_points: u32) -> Option<f64> {
        self.median_of(|p| p.0, min_points)
    }

    /// Median of the remembered output-token medians.
    pub fn output_median(&self, min_points: u32) -> Option<f64> {
        self.median_of(|p| p.1, min_points)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::tests::sample_event;
    use crate::config::EngineConfig;

    fn cfg() -> EngineConfig {
        EngineConfig::default()
    }

    fn ev_at(t: i64, latency: i32) -> RequestEvent<'static> {
        let mut e = sample_event();
        e.event_time_ms = t;
        e.latency_ms = latency;
        e
    }

    #[test]
    fn views_cover_exactly_their_slices() {
        let mut ring = SliceRing::new(cfg().ring_shape());
        let t0 = 1_000_000_000;
        for i in 0..120 {
            // one event per second for two minutes
            ring.record(&ev_at(t0 + i * 1000, 100));
        }
        let now = t0 + 119_000;
        let short = ring.counters(now, 60_000, i64::MIN / 2);
        let long = ring.counters(now, 300_000, i64::MIN / 2);
        // The short view is 12 whole slices ending with the current one.
        let first = (now / 5000 - 11) * 5000;
        let expected = (t0..=now).step_by(1000).filter(|t| *t >= first).count() as u32;
        assert_eq!(short.real.requests, expected);
        assert_eq!(long.real.requests, 120);
        // not_before clips the view.
        let clipped = ring.counters(now, 300_000, now - 10_000);
        assert!(clipped.real.requests <= 15 && clipped.real.requests >= 10);
    }

    #[test]
    fn ring_rotation_forgets_old_slices() {
        let mut ring = SliceRing::new(cfg().ring_shape());
        let t0 = 1_000_000_000;
        ring.record(&ev_at(t0, 100));
        // Exactly one ring length (5 min) later the same slot is reused.
        let later = t0 + 300_000;
        ring.record(&ev_at(later, 100));
        let view = ring.counters(later, 300_000, i64::MIN / 2);
        assert_eq!(view.real.requests, 1);
        // An event for a slice the ring has already overwritten is refused.
        assert!(!ring.record(&ev_at(t0 + 5, 100)));
    }

    #[test]
    fn quantiles_come_from_the_view() {
        let mut ring = SliceRing::new(cfg().ring_shape());
        let t0 = 2_000_000_000;
        for i in 0..1000 {
            ring.record(&ev_at(t0 + i * 50, (i % 100) as i32 * 10 + 5));
        }
        let now = t0 + 999 * 50;
        let mut d = ring
            .digest(Digest::Latency, now, 60_000, i64::MIN / 2)
            .unwrap();
        let p50 = d.estimate_quantile(0.5);
        let p99 = d.estimate_quantile(0.99);
        assert!((p50 - 500.0).abs() < 30.0, "p50 {p50}");
        assert!((p99 - 985.0).abs() < 30.0, "p99 {p99}");
        assert!(ring
            .digest(Digest::LatencyProbe, now, 60_000, i64::MIN / 2)
            .is_none());
    }

    /// A deterministic spread of latencies over 0..1000 ms.
    fn spread(i: i64) -> i32 {
        (i * 7919 % 1000) as i32
    }

    #[test]
    fn slices_leaving_the_short_view_are_merged_into_panes() {
        let c = cfg();
        let mut ring = SliceRing::new(c.ring_shape());
        let t0 = 1_000_000_000 - 1_000_000_000 % 60_000;
        // 20 events/s for 7 min.
        let mut values = Vec::new();
        for i in 0..(7 * 60 * 20) {
            let t = t0 + i * 50;
            ring.record(&ev_at(t, spread(i)));
            values.push((t, spread(i)));
        }
        let now = t0 + 7 * 60_000 - 1;
        let long = ring.counters(now, c.long_window_ms, i64::MIN / 2);
        let mut d = ring
            .digest(Digest::Latency, now, c.long_window_ms, i64::MIN / 2)
            .unwrap();
        // Only the short view is kept per slice; the rest is in panes of a
        // minute (aligned, so the 4 minutes before the short view and a
        // part of a fifth).
        let kept = ring.fine_indices.iter().filter(|i| **i != i64::MIN).count();
        assert_eq!(kept, c.short_slices());
        assert!(ring.panes.len() <= 5, "{} panes", ring.panes.len());
        for w in ring.panes.iter().collect::<Vec<_>>().windows(2) {
            assert!(w[0].hi < w[1].lo, "panes overlap");
        }
        // Counters are exact; the digest holds the view and at most a pane
        // more at its old edge.
        let per_slice = 100.0;
        assert_eq!(long.real.requests, 6000);
        assert!(
            d.count() >= 6000.0 && d.count() <= 6000.0 + 11.0 * per_slice,
            "{}",
            d.count()
        );
        // The short view is the fine slices alone, exactly.
        let short = ring
            .digest(Digest::Latency, now, c.short_window_ms, i64::MIN / 2)
            .unwrap();
        assert_eq!(short.count(), 1200.0);
        // Quantiles of the long view stay close to the exact ones.
        let first = now - d.count() as i64 * 50;
        let mut exact: Vec<i32> = values
            .iter()
            .filter(|(t, _)| *t > first)
            .map(|v| v.1)
            .collect();
        exact.sort_unstable();
        for q in [0.5, 0.95, 0.99] {
            let want = exact[((exact.len() as f64 * q) as usize).min(exact.len() - 1)] as f64;
            let got = d.estimate_quantile(q);
            assert!((got - want).abs() <= 15.0, "q {q}: {got} vs {want}");
        }
    }

    #[test]
    fn the_panes_never_grow_after_a_channels_first_event() {
        let c = cfg();
        let mut ring = SliceRing::new(c.ring_shape());
        // Not aligned to a pane, queried every 5 s as the engine does, a
        // probation starting mid-pane, and a quiet spell of 3 min.
        let t0 = 1_000_000_000 - 1_000_000_000 % 60_000 + 17_000;
        ring.record(&ev_at(t0, 100));
        let reserved = ring.panes.capacity();
        assert!(reserved >= ring.most_panes(), "{reserved}");
        let buffers: Vec<*const digest::Packed> =
            ring.spare.iter().map(|d| d.centroids.as_ptr()).collect();
        assert_eq!(buffers.len(), ring.live_panes());
        let mut most = 0;
        for i in 1..(15 * 60 * 4) {
            let t = t0 + i * 250;
            let quiet = (8 * 60_000..11 * 60_000).contains(&(t - t0));
            if !quiet {
                ring.record(&ev_at(t, spread(i)));
            }
            if i % 20 == 0 {
                let not_before = if t - t0 >= 6 * 60_000 + 25_000 {
                    t0 + 6 * 60_000 + 25_000
                } else {
                    i64::MIN / 2
                };
                ring.digest(Digest::Latency, t, c.long_window_ms, not_before);
            }
            most = most.max(ring.panes.len());
            assert_eq!(ring.panes.capacity(), reserved, "grown at {} ms", t - t0);
            if t - t0 < 6 * 60_000 + 25_000 {
                // Until the probation (whose cut makes one pane more),
                // every pane's digests are in a buffer reserved at the
                // first event.
                for p in &ring.panes {
                    let at = p.digests.centroids.as_ptr();
                    assert!(buffers.contains(&at), "a new buffer at {} ms", t - t0);
                }
            }
            if quiet && t - t0 > 9 * 60_000 {
                // Quiet, it lets its spare buffers go.
                assert!(ring.spare.is_empty());
            }
        }
        // The run did fill the panes a ring holds.
        assert!(most >= 5, "{most} panes at most");
    }

    #[test]
    fn a_probation_view_never_reads_what_came_before_it() {
        let c = cfg();
        let mut ring = SliceRing::new(c.ring_shape());
        let t0 = 1_000_000_000 - 1_000_000_000 % 60_000;
        // Slow for 3 min, then a probation starts mid-pane (at 3 min 25 s)
        // and everything is fast; evaluated every 5 s as the engine does.
        let since = t0 + 205_000;
        let checks = [since + 30_000, since + 100_000, since + 250_000];
        let mut t = t0;
        let mut checked = 0;
        while t < t0 + 9 * 60_000 {
            let latency = if t < since { 5_000 } else { 100 };
            ring.record(&ev_at(t, latency));
            t += 100;
            if t % 5_000 != 0 {
                continue;
            }
            let not_before = if t > since { since } else { i64::MIN / 2 };
            ring.digest(Digest::Latency, t, c.long_window_ms, not_before);
            // Probation views at every age: within and past the short
            // view, the pane holding `since` included.
            if checks.contains(&t) {
                let counted = ring.counters(t, c.long_window_ms, since).real.requests;
                let d = ring
                    .digest(Digest::Latency, t, c.long_window_ms, since)
                    .unwrap();
                assert_eq!(d.max(), 100.0, "at {}", t - since);
                assert_eq!(d.count() as u32, counted, "at {}", t - since);
                checked += 1;
            }
            if t == checks[1] {
                // The pane holding the probation's start was cut there.
                let cut = ring.slice_of(since) - 1;
                assert!(ring.panes.iter().any(|p| p.hi == cut && p.lo < p.hi));
                assert!(ring.panes.iter().any(|p| p.lo == cut + 1));
            }
        }
        assert_eq!(checked, checks.len());
    }

    #[test]
    fn a_late_event_lands_in_its_pane() {
        let c = cfg();
        let mut ring = SliceRing::new(c.ring_shape());
        let t0 = 1_000_000_000 - 1_000_000_000 % 60_000;
        for i in 0..(3 * 60 * 10) {
            ring.record(&ev_at(t0 + i * 100, 100));
        }
        let now = t0 + 180_000;
        let before = ring
            .digest(Digest::Latency, now, c.long_window_ms, i64::MIN / 2)
            .unwrap();
        // Two minutes old: its slice has left the short view.
        assert!(ring.record(&ev_at(now - 120_000, 9_000)));
        let after = ring
            .digest(Digest::Latency, now, c.long_window_ms, i64::MIN / 2)
            .unwrap();
        assert_eq!(after.count(), before.count() + 1.0);
        assert_eq!(after.max(), 9_000.0);
        let short = ring
            .digest(Digest::Latency, now, c.short_window_ms, i64::MIN / 2)
            .unwrap();
        assert_eq!(short.max(), 100.0);
    }

    #[test]
    fn events_back_and_forth_across_a_boundary_stage_as_in_order() {
        // Two gateways' clocks a few seconds apart: a channel's events
        // alternate between two slices. Each slice takes its values in the
        // same batches as when they come slice by slice, so its digests
        // are the same, bit for bit (one staging buffer drained at every
        // crossing: batches of one).
        let c = cfg();
        let t0 = 1_000_000_000 - 1_000_000_000 % c.slice_ms;
        let at = |i: i64| match i % 2 {
            0 => t0 + 3_000 + i,
            _ => t0 + c.slice_ms + i,
        };
        let (mut mixed, mut sorted) = (
            SliceRing::new(c.ring_shape()),
            SliceRing::new(c.ring_shape()),
        );
        for i in 0..400 {
            assert!(mixed.record(&ev_at(at(i), spread(i))));
        }
        for i in (0..400).step_by(2).chain((1..400).step_by(2)) {
            assert!(sorted.record(&ev_at(at(i), spread(i))));
        }
        let now = t0 + 2 * c.slice_ms - 1;
        for ring in [&mut mixed, &mut sorted] {
            let d = ring.digest(Digest::Latency, now, c.short_window_ms, i64::MIN / 2);
            assert_eq!(d.map(|d| d.count()), Some(400.0));
        }
        let fine = |r: &SliceRing| {
            let mut held: Vec<_> = (r.fine_indices.iter().zip(&r.fine))
                .filter(|(i, _)| **i != i64::MIN)
                .map(|(i, d)| (*i, d.centroids.clone(), d.count, d.sum))
                .collect();
            held.sort_by_key(|h| h.0);
            held
        };
        let (a, b) = (fine(&mixed), fine(&sorted));
        assert_eq!(a.len(), 2);
        assert_eq!(a, b);
    }

    #[test]
    fn slice_digests_keep_each_kind_apart_and_round_trip() {
        let mut d = SliceDigests::default();
        let values =
            |base: f32, n: usize| -> Vec<f32> { (0..n).map(|i| base + i as f32).collect() };
        let add = |d: &mut SliceDigests, k: usize, values: Vec<f32>| {
            let t = digest::add_values(25, |runs| d.add_to(runs, k), &values).unwrap();
            d.store_merged(k, &t);
        };
        // Fill kinds out of order, then grow one in the middle: the others
        // keep their centroids and summaries.
        for (k, base) in [(3, 3000.0), (0, 0.0), (4, 4000.0), (1, 1000.0)] {
            add(&mut d, k, values(base, 100));
        }
        add(&mut d, 1, values(1100.0, 300));
        assert!(d.is_empty(2));
        for (k, lo, hi, n) in [
            (0, 0.0, 99.0, 100),
            (1, 1000.0, 1399.0, 400),
            (3, 3000.0, 3099.0, 100),
            (4, 4000.0, 4099.0, 100),
        ] {
            let t = digest::gather(25, |runs| d.add_to(runs, k)).unwrap();
            assert_eq!(t.count() as u32, n, "kind {k}");
            assert_eq!((t.min(), t.max()), (lo, hi), "kind {k}");
            assert!(t.centroids().len() <= 25);
            let median = t.estimate_quantile(0.5);
            assert!((median - (lo + hi) / 2.0).abs() < 3.0, "kind {k}: {median}");
        }
        assert_eq!(d.ends[4] as usize, d.centroids.len());
    }

    #[test]
    fn outcome_window_keeps_only_the_last_n() {
        let mut w = OutcomeWindow::new(100);
        for i in 0..250 {
            w.record(i % 50 == 0);
        }
        assert_eq!(w.len(), 100);
        assert_eq!(w.failures(), 2);
        assert_eq!(w.failure_rate(), Some(0.02));
    }

    #[test]
    fn failure_streak_resets_on_success_only() {
        let mut s = FailureStreak::default();
        assert_eq!(s.record(ErrorClass::ConnectionReset), 1);
        assert_eq!(s.record(ErrorClass::RateLimited), 1);
        assert_eq!(s.record(ErrorClass::ClientError), 1);
        assert_eq!(s.record(ErrorClass::ServerError), 2);
        assert_eq!(s.record(ErrorClass::None), 0);
    }

    #[test]
    fn baseline_median_needs_enough_points() {
        let mut b = Baseline::new(5);
        for p in [100.0, 300.0, 200.0] {
            b.learn(p, f64::NAN);
        }
        assert_eq!(b.p99_ms(5), None);
        assert_eq!(b.p99_ms(3), Some(200.0));
        assert_eq!(b.output_median(1), None);
        for p in [400.0, 500.0, 600.0] {
            b.learn(p, 10.0);
        }
        // capacity 5: the first point (100) is gone
        assert_eq!(b.p99_ms(1), Some(400.0));
    }
}
