//! Recording: an event into its slice (staged in a small buffer per
//! digest kind and drained in batches), panes split off the newest slice,
//! and slices retired as event time moves on.

use super::slice::{Pane, Slice, SliceDigests};
use super::{
    SliceRing, STAGE_KINDS, STAGE_LONG, STAGE_OUTPUT, STAGE_PROBE, STAGE_SHORT, STAGE_TTFB,
};
use crate::digest;
use crate::event::{ErrorClass, RequestEvent};

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
    pub(super) fn digests_of(&mut self, index: i64) -> Option<(&mut SliceDigests, usize)> {
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
