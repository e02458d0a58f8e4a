//! One slice of a ring (its counters and digests), the staging buffers that
//! batch values before they reach a digest, and the panes older slices'
//! digests merge into.

use super::counters::{Counters, ProbeCounters};
use super::{STAGE_CAPACITY, STAGE_KINDS};
use crate::digest;
use crate::digest::{MergedDigest, Runs};

/// Values of one slice waiting to be merged into its digests
/// (`SliceRing::stage`), `STAGE_CAPACITY` per kind, kind after kind, in
/// one allocation made at its first value: an event's values (latency,
/// TTFB, output size: up to three kinds) land on one page, where a buffer
/// per kind put them on up to three, each a page-table walk of its own
/// when thousands of channels' state is read at random.
pub(super) struct Staging {
    /// The slice the values belong to (`i64::MIN`: none yet) and its slot.
    pub(super) slice: i64,
    pub(super) slot: usize,
    /// Empty until the first value, then `STAGE_KINDS * STAGE_CAPACITY`.
    pub(super) values: Box<[f32]>,
    pub(super) lens: [u8; STAGE_KINDS],
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
    pub(super) fn push(&mut self, k: usize, v: f32) -> bool {
        if self.values.is_empty() {
            self.values = vec![0.0; STAGE_KINDS * STAGE_CAPACITY].into_boxed_slice();
        }
        let len = self.lens[k] as usize;
        self.values[k * STAGE_CAPACITY + len] = v;
        self.lens[k] += 1;
        len + 1 == STAGE_CAPACITY
    }

    pub(super) fn is_empty(&self) -> bool {
        self.lens.iter().all(|&l| l == 0)
    }

    /// The values of kind `k`.
    pub(super) fn kind(&self, k: usize) -> &[f32] {
        let start = k * STAGE_CAPACITY;
        self.values
            .get(start..start + self.lens[k] as usize)
            .unwrap_or(&[])
    }

    /// Where kind `k`'s next value goes (for a hint; never read through).
    pub(super) fn next_slot(&self, k: usize) -> *const f32 {
        self.values
            .as_ptr()
            .wrapping_add(k * STAGE_CAPACITY + self.lens[k] as usize)
    }

    pub(super) fn clear(&mut self) {
        self.lens = [0; STAGE_KINDS];
    }
}

/// One slice's number and counters. `repr(C)`: the number and what a real
/// (not probe) event counts come first, [`Slice::REAL_BYTES`] of it: the
/// number, which every event checks, shares a cache line with what it adds
/// to. 168 bytes: sixty of them fit the allocator's 10 KiB size class
/// (probe counts in `u16`; a quota report, which most channels never
/// send, is kept apart: [`QuotaReport`]).
#[derive(Clone)]
#[repr(C)]
pub(super) struct Slice {
    /// The slice number the slot holds (`i64::MIN`: never used).
    pub(super) index: i64,
    pub(super) real: Counters,
    /// Real requests and tokens per traffic class (scheduler demand).
    /// Tokens saturate at `u32::MAX` a slice (some 800 M a second for a
    /// 5-second slice); the views sum them in `u64`.
    pub(super) class_requests: [u32; 4],
    pub(super) class_tokens: [u32; 4],
    pub(super) probe: ProbeCounters,
    /// Requests per traffic class the gateways did not send (demand only).
    pub(super) class_unsent: [u32; 4],
}

impl Slice {
    pub(super) const REAL_BYTES: usize = std::mem::offset_of!(Slice, probe);

    /// Slice `index`, holding nothing yet.
    pub(super) fn empty(index: i64) -> Slice {
        Slice {
            index,
            real: Counters::default(),
            probe: ProbeCounters::default(),
            class_requests: [0; 4],
            class_tokens: [0; 4],
            class_unsent: [0; 4],
        }
    }
}

/// A slice's last quota report: its event time (`i64::MIN`: none) and the
/// quota remaining. A ring keeps one per slice only once its channel has
/// reported a quota (`SliceRing::quotas`).
#[derive(Clone, Copy)]
pub(super) struct QuotaReport {
    pub(super) at_ms: i64,
    pub(super) remaining: i64,
}

impl QuotaReport {
    pub(super) const NONE: QuotaReport = QuotaReport {
        at_ms: i64::MIN,
        remaining: 0,
    };

    /// (event time, remaining), if there is one.
    pub(super) fn get(&self) -> Option<(i64, i64)> {
        (self.at_ms != i64::MIN).then_some((self.at_ms, self.remaining))
    }
}

/// A slice's five t-digests in one allocation: centroids as `f32` pairs
/// (mean, weight, packed as their sort key: [`digest::Packed`]) back to
/// back, kind after kind, with each kind's count and extremes (96 bytes
/// before the centroids; no sum, which only a mean would read).
/// A `tdigest::TDigest` is 104 bytes before its first centroid and holds
/// 16 bytes per centroid; five of them in each of 60 slices made most of a
/// channel's memory. Latencies and token counts are integers well inside
/// `f32`'s exact range, and a centroid mean keeps 24 bits (7 digits).
#[derive(Clone, Default)]
pub(super) struct SliceDigests {
    pub(super) centroids: Vec<digest::Packed>,
    /// Where each kind's centroids end in `centroids`.
    pub(super) ends: [u16; 5],
    pub(super) count: [u32; 5],
    pub(super) min: [f32; 5],
    pub(super) max: [f32; 5],
    /// Bit `k` set: kind `k`'s centroids are out of key order (two means
    /// that narrowed to one `f32` swapped), for [`Runs::add_in_order`].
    pub(super) unordered: u8,
}

impl SliceDigests {
    pub(super) fn range(&self, k: usize) -> std::ops::Range<usize> {
        let start = if k == 0 { 0 } else { self.ends[k - 1] as usize };
        start..self.ends[k] as usize
    }

    pub(super) fn is_empty(&self, k: usize) -> bool {
        self.count[k] == 0
    }

    /// Empty, holding its centroids in `buffer` (a spare pane's).
    pub(super) fn in_buffer(mut buffer: Vec<digest::Packed>) -> SliceDigests {
        buffer.clear();
        SliceDigests {
            centroids: buffer,
            ..SliceDigests::default()
        }
    }

    /// Holds nothing again, keeping its buffer (a fine slot's next slice).
    pub(super) fn clear(&mut self) {
        *self = SliceDigests::in_buffer(std::mem::take(&mut self.centroids));
    }

    /// Adds kind `k` (if it holds values) to a merged digest's runs.
    pub(super) fn add_to(&self, runs: &mut Runs, k: usize) {
        if self.is_empty(k) {
            return;
        }
        let (centroids, count) = (&self.centroids[self.range(k)], self.count[k] as f64);
        let (min, max) = (self.min[k] as f64, self.max[k] as f64);
        if self.unordered & (1 << k) == 0 {
            runs.add_in_order(centroids, count, min, max);
        } else {
            runs.add(centroids, count, min, max);
        }
    }

    /// Merges every kind of `other` into this one, compressing each to
    /// `size` (a slice into its pane).
    pub(super) fn merge_from(&mut self, other: &SliceDigests, size: usize) {
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
    pub(super) fn store_merged(&mut self, k: usize, d: &MergedDigest) {
        let range = self.range(k);
        let (old, new) = (range.len(), d.centroids().len());
        // Grown to size, never doubled (the buffer is most of a slice's
        // memory), and not shrunk back either: a slice's kinds stay about
        // the size of their compression once they hold values.
        if new > old {
            self.centroids.reserve_exact(new - old);
        }
        // The kinds after this one move to where its new centroids end.
        let len = self.centroids.len();
        if new != old {
            if new > old {
                self.centroids
                    .resize(len + new - old, digest::Packed::default());
            }
            self.centroids
                .copy_within(range.end..len, range.start + new);
            self.centroids.truncate(len + new - old);
        }
        let stored = &mut self.centroids[range.start..range.start + new];
        for (slot, c) in stored.iter_mut().zip(d.centroids()) {
            *slot = digest::Packed::of(c);
        }
        let ordered = digest::in_order(stored);
        self.unordered = (self.unordered & !(1 << k)) | ((!ordered as u8) << k);
        for end in &mut self.ends[k..] {
            *end = (*end as usize + new - old) as u16;
        }
        self.count[k] = d.count() as u32;
        self.min[k] = d.min() as f32;
        self.max[k] = d.max() as f32;
    }
}

/// A fine slot: the digests of slice `index` (`i64::MIN`: none), one of
/// the short view's.
#[derive(Clone)]
pub(super) struct Fine {
    pub(super) index: i64,
    pub(super) digests: SliceDigests,
}

impl Default for Fine {
    fn default() -> Fine {
        Fine {
            index: i64::MIN,
            digests: SliceDigests::default(),
        }
    }
}

/// The merged digests of the slices `lo..=hi`; `held` is the range of
/// those that had values (what a view decides on).
pub(super) struct Pane {
    pub(super) lo: i64,
    pub(super) hi: i64,
    pub(super) held: (i64, i64),
    pub(super) digests: SliceDigests,
}

impl Pane {
    pub(super) fn hold(&mut self, index: i64) -> &mut SliceDigests {
        self.held = (self.held.0.min(index), self.held.1.max(index));
        &mut self.digests
    }
}
