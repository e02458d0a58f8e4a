//! The time-sliced ring of one channel: its shape and views, and
//! recording, an event into its slice (staged in a small buffer per digest
//! kind and drained in batches), panes split off the newest slice, and
//! slices retired as event time moves on.

use super::slice::{Fine, Pane, QuotaReport, Slice, SliceDigests, Staging};
use super::{
    Digest, ViewCounters, STAGE_KINDS, STAGE_LONG, STAGE_OUTPUT, STAGE_PROBE, STAGE_SHORT,
    STAGE_TTFB,
};
use crate::digest;
use crate::event::{ErrorClass, RequestEvent};

#[cfg(test)]
#[path = "tests.rs"]
mod tests;

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
    /// Empty until the first event, then `len` slots, each with the slice
    /// number it holds (in the cache line an event adds to).
    slices: Vec<Slice>,
    /// Each slot's last quota report: empty until the channel's first
    /// report, then `len` slots (most channels never report one).
    quotas: Box<[QuotaReport]>,
    long_input_tokens: i32,
    short_output_tokens: i32,
    slow_request_ms: i32,
    // --- read when slices change and by queries ---
    len: usize,
    /// Compression of slice digests.
    slice_size: usize,
    /// The digests of the slices still in the short view: slice `s` in
    /// slot `s % short_slices`. A slice leaving the short view is merged
    /// into its pane.
    fine: Vec<Fine>,
    /// Digests of the older slices, a pane per `pane_slices` aligned
    /// slices (split at `split`), oldest first.
    panes: std::collections::VecDeque<Pane>,
    /// Centroid buffers for the next panes: reserved at the first event
    /// (one per pane the ring holds, each the size of a pane's digests),
    /// then those of the panes that left the ring. A pane made later takes
    /// one instead of growing its own (see [`SliceRing::most_panes`]).
    spare: Vec<Vec<digest::Packed>>,
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
            quotas: Box::default(),
            fine: Vec::new(),
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
        let [out] = self.counters_of(now_ms, [(window_ms, not_before_ms)]);
        out
    }

    /// Counters of several views ending at `now_ms`, each a window and the
    /// time it reads nothing before, in one pass over the slices: a
    /// channel's evaluation reads its short and long views together, and
    /// the long one's slices (60 by default) are most of a channel's
    /// counters. Each view sums its slices in the order [`Self::counters`]
    /// does, so the sums are the same to the bit (the cost is a float).
    pub fn counters_of<const N: usize>(
        &self,
        now_ms: i64,
        views: [(i64, i64); N],
    ) -> [ViewCounters; N] {
        let ranges =
            views.map(|(window_ms, not_before_ms)| self.range(now_ms, window_ms, not_before_ms));
        let mut out = [ViewCounters::default(); N];
        for s in &self.slices {
            for (out, &(first, last)) in out.iter_mut().zip(&ranges) {
                if s.index >= first && s.index <= last {
                    add_slice(out, s);
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
            .filter(|f| f.index >= first && f.index <= last)
            .map(|f| &f.digests);
        // Panes hold slices up to `moved_through` only: a view that starts
        // after it (a short view) reads none, and touches none of their
        // headers (a cache miss each, at every evaluation).
        let panes_in_view = if first <= self.moved_through {
            self.panes.len()
        } else {
            0
        };
        debug_assert!(self.panes.iter().all(|p| p.held.1 <= self.moved_through));
        let panes = self
            .panes
            .iter()
            .take(panes_in_view)
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
        for (r, s) in self.quotas.iter().zip(&self.slices) {
            if s.index < first || s.index > last {
                continue;
            }
            if let Some(q) = r.get() {
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

impl SliceRing {
    /// The slot of the slice holding event time `t`, recycled if it held an
    /// older slice, and the staging buffer its values go to (`cur`); `None`
    /// if `t` is older than the ring.
    pub(super) fn slot_for(&mut self, t: i64) -> Option<usize> {
        let (index, slot) = if self.in_last_slice(t) {
            (self.last.0, self.last.2)
        } else {
            // Off the hot path (a new slice); the first event of all lands
            // here too, since `last` starts matching nothing.
            if self.slices.is_empty() {
                self.slices = vec![Slice::empty(i64::MIN); self.len];
                self.fine = vec![Fine::default(); self.short_slices];
                self.panes = std::collections::VecDeque::with_capacity(self.most_panes());
                let pane = STAGE_KINDS * self.pane_size;
                self.spare = (0..self.live_panes())
                    .map(|_| Vec::with_capacity(pane))
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
        let held = self.slices[slot].index;
        if held != index {
            if held > index {
                return None;
            }
            self.slices[slot] = Slice::empty(index);
            if let Some(q) = self.quotas.get_mut(slot) {
                *q = QuotaReport::NONE;
            }
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
        if ev.is_probe {
            s.probe
                .count(ev, long, slow_request_ms, short_output_tokens);
        } else {
            s.real.count(ev, long, slow_request_ms, short_output_tokens);
            let class = ev.traffic_class.index();
            s.class_requests[class] += 1;
            let tokens = ev.input_tokens as u64 + ev.output_tokens_reported().unwrap_or(0) as u64;
            let tokens = tokens.min(u32::MAX as u64) as u32;
            s.class_tokens[class] = s.class_tokens[class].saturating_add(tokens);
        }
        if let Some(q) = ev.quota_remaining {
            self.report_quota(slot, ev.event_time_ms, q);
        }
        if self.stage(ev) {
            self.drain_stage(self.cur);
        }
        true
    }

    /// Keeps a quota report if it is the slot's latest.
    fn report_quota(&mut self, slot: usize, at_ms: i64, remaining: i64) {
        if self.quotas.is_empty() {
            self.quotas = vec![QuotaReport::NONE; self.len].into_boxed_slice();
        }
        let r = &mut self.quotas[slot];
        if at_ms >= r.at_ms {
            *r = QuotaReport { at_ms, remaining };
        }
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
        for k in self.stage_targets(ev).into_iter().flatten() {
            crate::prefetch::lines(self.staged[self.cur].next_slot(k), 4);
        }
    }

    /// The staging buffers an event's values go to (`STAGE_*`): its
    /// latency's, then its TTFB's and output size's if it has them.
    #[inline]
    pub(super) fn stage_targets(&self, ev: &RequestEvent<'_>) -> [Option<usize>; 3] {
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
    pub(super) fn stage(&mut self, ev: &RequestEvent<'_>) -> bool {
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
    pub(super) fn drain_stage(&mut self, b: usize) {
        let (index, slot) = (self.staged[b].slice, self.staged[b].slot);
        if self.staged[b].is_empty() {
            return;
        }
        let mut staged = std::mem::take(&mut self.staged[b]);
        let live = index != i64::MIN && self.slices[slot].index == index;
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
    pub(super) fn digests_of(&mut self, index: i64) -> Option<(&mut SliceDigests, usize)> {
        if index > self.moved_through {
            let fine = &mut self.fine[index.rem_euclid(self.short_slices as i64) as usize];
            if fine.index != index {
                if fine.index > index {
                    return None;
                }
                debug_assert!(fine.index <= self.moved_through);
                fine.digests.clear();
                fine.index = index;
            }
            return Some((&mut fine.digests, self.slice_size));
        }
        let i = self.pane_for(index);
        Some((self.panes[i].hold(index), self.pane_size))
    }

    /// The pane slice `index` belongs in: aligned runs of `pane_slices`
    /// slices, cut at `split`. Made (in order) if it does not exist.
    pub(super) fn pane_for(&mut self, index: i64) -> usize {
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
                        digests: SliceDigests::in_buffer(self.spare.pop().unwrap_or_default()),
                    },
                );
                i
            }
        }
    }

    /// Moves the digests of every slice up to `through` from the short view
    /// into its pane, oldest first (each slice is merged once), and forgets
    /// panes that have left the ring.
    pub(super) fn retire_through(&mut self, through: i64) {
        if through <= self.moved_through || self.fine.is_empty() {
            return;
        }
        // Nothing newer than `through` has come: a quiet channel frees its
        // buffers rather than keep them for slices that may never come.
        let busy = self.last.0 > through;
        // Oldest first; a slot keeps its buffer for the slice that takes
        // it next (`digests_of`) while the channel has newer slices.
        while let Some((index, f)) = (0..self.fine.len())
            .filter(|&f| self.fine[f].index != i64::MIN && self.fine[f].index <= through)
            .map(|f| (self.fine[f].index, f))
            .min()
        {
            self.fine[f].index = i64::MIN;
            if (0..5).all(|k| self.fine[f].digests.is_empty(k)) {
                continue;
            }
            let i = self.pane_for(index);
            self.panes[i]
                .hold(index)
                .merge_from(&self.fine[f].digests, self.pane_size);
            if busy {
                self.fine[f].digests.clear();
            } else {
                self.fine[f].digests = SliceDigests::default();
            }
        }
        if !busy {
            self.spare = Vec::new();
        }
        self.moved_through = through;
        let oldest = through + self.short_slices as i64 - self.len as i64 + 1;
        while self.panes.front().is_some_and(|p| p.held.1 < oldest) {
            let Some(gone) = self.panes.pop_front() else {
                break;
            };
            // Kept for the pane made next.
            if busy && self.spare.len() < self.live_panes() {
                self.spare.push(gone.digests.centroids);
            }
        }
    }

    /// A probation starts at slice `first`: no pane made from here on
    /// holds slices from both sides of it. Panes only hold slices that left
    /// the short view, and the engine measures a probation from its next
    /// evaluation on, so a pane reaching past `first` holds nothing from
    /// there yet and is cut short. (A view asked later still reads a pane
    /// whose values all lie after its start: see `digest`.)
    pub(super) fn split_at(&mut self, first: i64) {
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
}

/// Adds a slice's counts to a view's.
#[inline]
fn add_slice(out: &mut ViewCounters, s: &Slice) {
    out.real.add(&s.real);
    out.probe.add(&s.probe);
    for i in 0..4 {
        out.class_requests[i] += s.class_requests[i];
        out.class_tokens[i] += s.class_tokens[i] as u64;
        out.class_unsent[i] += s.class_unsent[i];
    }
}
