//! A view's merged t-digest, built without allocating or sorting from scratch.
//!
//! On every evaluation tick each channel merges, per digest kind, the
//! centroids of the slices and panes in a view and reads a few quantiles.
//! `tdigest::TDigest::new` did that with a generic stable sort of all of
//! them (about 300: twelve slices' runs of up to 25, interleaved) and a
//! fresh allocation per digest: a third of the request path's time at
//! steady state, most of it in the sort.
//!
//! [`MergedDigest`] is the same digest: the same centroids, bit for bit,
//! and the same quantile estimates. Its arithmetic is `tdigest` 1.0.1's
//! (`TDigest::new`, `merge_digests`, `merge_unsorted`, `estimate_quantile`),
//! copied in the
//! same order of operations, and `tests::same_digest_as_the_crate` compares
//! the two on random views. What differs is how it gets there:
//! - each slice's centroids are already in order, so the runs are merged
//!   pairwise (`log₂ runs` linear passes) instead of sorted; a run that is
//!   not in order (two `f64` means that narrowed to one `f32`) sends the
//!   whole view to `sort_unstable_by`. Centroids are ordered by mean, then
//!   weight, both with `total_cmp`, so two that compare equal are equal bit
//!   for bit and every correct sort gives the same sequence;
//! - a window keeps its centroids as `f32` pairs, so each is gathered as one
//!   `u64` sort key (mean's bits above weight's, mapped so that unsigned
//!   order is `total_cmp`'s): merging compares integers without a branch on
//!   which run is next, and moves 8 bytes a centroid instead of 16;
//! - the gathered centroids live in per-thread buffers reused across calls.
//!
//! `runs` gathers and merges the centroids; this file builds the digest and
//! reads its quantiles.

use std::cell::RefCell;
use std::cmp::Ordering;
use std::thread::LocalKey;
mod runs;
pub use runs::*;

/// A centroid: the mean of `weight` values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Centroid {
    pub mean: f64,
    pub weight: f64,
}

impl Centroid {
    /// `tdigest::Centroid`'s order: mean, then weight.
    fn cmp(&self, other: &Centroid) -> Ordering {
        self.mean
            .total_cmp(&other.mean)
            .then_with(|| self.weight.total_cmp(&other.weight))
    }

    /// `tdigest::Centroid::merge`.
    fn merge(&mut self, mean: f64, weight: f64) {
        let new_weight = self.weight + weight;
        if self.mean == mean {
            self.weight = new_weight;
            return;
        }
        let added_fraction = weight / new_weight;
        let combined = self.mean * (1.0 - added_fraction) + mean * added_fraction;
        self.mean = if !combined.is_finite()
            || (combined < self.mean && combined < mean)
            || (combined > self.mean && combined > mean)
        {
            interpolate(self.mean, mean, added_fraction)
        } else {
            combined
        };
        self.weight = new_weight;
    }
}

/// `tdigest`'s linear interpolation.
fn interpolate(left: f64, right: f64, fraction: f64) -> f64 {
    if left == right {
        left
    } else if left.is_sign_negative() == right.is_sign_negative() {
        left + (right - left) * fraction
    } else {
        left * (1.0 - fraction) + right * fraction
    }
}

/// `tdigest`'s scale function: the share of a digest's count its first
/// `k` centroids may hold (`k < max_size`; the weight limit is this times
/// the count, and none from `max_size` on).
fn scale(k: f64, max_size: usize) -> f64 {
    let k_div_d = k / max_size as f64;
    if k_div_d >= 0.5 {
        let base = 1.0 - k_div_d;
        1.0 - 2.0 * base * base
    } else {
        2.0 * k_div_d * k_div_d
    }
}

/// [`scale`] for every `k` below one `max_size`, computed once per thread
/// and size: a compression asks for one per centroid it keeps, and the
/// division and branches on its path were a tenth of a slice's merge. The
/// same expression gives the same bits, so the limits are `tdigest`'s.
struct Scales {
    /// Per `max_size` asked for (a slice's and a pane's): the scales of
    /// `k` = 0..max_size.
    sizes: Vec<(usize, Vec<f64>)>,
}

impl Scales {
    fn of(&mut self, max_size: usize) -> &[f64] {
        let i = match self.sizes.iter().position(|(s, _)| *s == max_size) {
            Some(i) => i,
            None => {
                let table = (0..max_size).map(|k| scale(k as f64, max_size)).collect();
                self.sizes.push((max_size, table));
                self.sizes.len() - 1
            }
        };
        &self.sizes[i].1
    }
}

/// A merged digest: centroids in ascending order, and the count and
/// extremes of the values behind them (not their sum: `tdigest` keeps one
/// for its mean, and no signal reads a mean). Never empty.
#[derive(Debug, Clone, PartialEq)]
pub struct MergedDigest {
    centroids: Vec<Centroid>,
    count: f64,
    min: f64,
    max: f64,
}

impl MergedDigest {
    pub fn centroids(&self) -> &[Centroid] {
        &self.centroids
    }

    pub fn count(&self) -> f64 {
        self.count
    }

    pub fn min(&self) -> f64 {
        self.min
    }

    pub fn max(&self) -> f64 {
        self.max
    }

    /// The value at quantile `q` (`tdigest::TDigest::estimate_quantile`,
    /// whose `None` is for an empty digest). The tests' reference reading.
    #[cfg(test)]
    pub fn estimate_quantile(&self, q: f64) -> f64 {
        let count = self.count;
        let rank = q * count;
        let mut pos: usize;
        let mut t: f64;
        if q > 0.5 {
            if q >= 1.0 {
                return self.max;
            }
            pos = 0;
            t = count;
            for (k, centroid) in self.centroids.iter().enumerate().rev() {
                t -= centroid.weight;
                if rank >= t {
                    pos = k;
                    break;
                }
            }
        } else {
            if q <= 0.0 {
                return self.min;
            }
            pos = self.centroids.len() - 1;
            t = 0.0;
            for (k, centroid) in self.centroids.iter().enumerate() {
                if rank < t + centroid.weight {
                    pos = k;
                    break;
                }
                t += centroid.weight;
            }
        }
        self.interpolate_quantile(pos, rank, t)
    }

    #[cfg(test)]
    fn interpolate_quantile(&self, pos: usize, rank: f64, weight_before: f64) -> f64 {
        let c = &self.centroids;
        interpolate_at(
            c[pos],
            pos.checked_sub(1).map(|p| c[p]),
            c.get(pos + 1).copied(),
            rank,
            weight_before,
            (self.min, self.max),
        )
    }
}

/// `tdigest::TDigest::estimate_quantile`'s last step: the value at `rank`
/// inside `centroid`, which `weight_before` values precede, interpolated
/// towards its neighbour below or above (`None`: the digest's min or max).
fn interpolate_at(
    centroid: Centroid,
    below: Option<Centroid>,
    above: Option<Centroid>,
    rank: f64,
    weight_before: f64,
    (min, max): (f64, f64),
) -> f64 {
    let offset = (rank - weight_before) / centroid.weight - 0.5;
    let (neighbor, weight_fraction) = if offset < 0.0 {
        match below {
            None => (min, 1.0),
            Some(previous) => (
                previous.mean,
                centroid.weight / (previous.weight + centroid.weight),
            ),
        }
    } else {
        match above {
            None => (max, 1.0),
            Some(next) => (next.mean, centroid.weight / (centroid.weight + next.weight)),
        }
    };
    let offset_magnitude = if offset < 0.0 { -offset } else { offset };
    interpolate(
        centroid.mean,
        neighbor,
        (offset_magnitude * 2.0 * weight_fraction).clamp(0.0, 1.0),
    )
    .clamp(min, max)
}

/// The digests of a view, for quantile queries: the union of their
/// centroids, not compressed again. Get one from [`view`].
///
/// An evaluation tick reads a handful of quantiles per view, and merging
/// the view's runs into one digest compressed to `engine.tdigest_size`
/// (sorting and re-clustering every centroid) was most of its cost. A
/// quantile of the union is `tdigest`'s `estimate_quantile` over every
/// centroid of the view in order (what `TDigest::new` keeps when its size
/// holds them all; `tests::view_quantiles_are_the_crates_over_the_union`):
/// one compression fewer between the values and the answer. A tail
/// quantile walks in from its end, taking the next centroid from the runs'
/// ends, a few steps per run; one nearer the middle sorts the runs once
/// (merged pairwise, as [`gather`] does) and walks the sorted sequence.
pub struct ViewDigest {
    runs: Runs,
}

/// Quantiles this far from either end are walked to across the runs
/// without sorting them (a few centroids per run lie beyond them).
const TAIL: f64 = 0.1;

impl ViewDigest {
    pub fn count(&self) -> f64 {
        self.runs.count
    }

    pub fn min(&self) -> f64 {
        self.runs.min.expect("a view holds a run")
    }

    pub fn max(&self) -> f64 {
        self.runs.max.expect("a view holds a run")
    }

    /// The value at quantile `q`: `tdigest::TDigest::estimate_quantile` of
    /// the view's centroids, all of them, in order.
    pub fn estimate_quantile(&mut self, q: f64) -> f64 {
        let bounds = (self.min(), self.max());
        let count = self.runs.count;
        let rank = q * count;
        let descending = q > 0.5;
        if descending && q >= 1.0 {
            return bounds.1;
        }
        if !descending && q <= 0.0 {
            return bounds.0;
        }
        if q > TAIL && q < 1.0 - TAIL {
            if !descending && self.runs.starts.len() > 2 {
                if let Some(v) = self.bracketed(q, rank, bounds) {
                    return v;
                }
            }
            // In order since `view` made them so.
            self.runs.merge_runs();
        }
        if let [_] = self.runs.starts[..] {
            // One run: walked by index.
            let items = &self.runs.items[..];
            let (mut lo, mut hi) = (0, items.len());
            let next = || {
                (lo < hi).then(|| {
                    if descending {
                        hi -= 1;
                        centroid(items[hi])
                    } else {
                        lo += 1;
                        centroid(items[lo - 1])
                    }
                })
            };
            return walk_to(rank, count, descending, bounds, next);
        }
        let mut walk = Walk::new(&mut self.runs, descending);
        walk_to(rank, count, descending, bounds, || walk.next())
    }

    /// The ascending walk of [`ViewDigest::estimate_quantile`] to `rank`
    /// (quantile `q`, nearer the middle), without merging every run: only
    /// the keys between the lowest and highest of the runs' own answers
    /// at `q` are merged and walked, from the weight of all keys below
    /// them. `None` when the bounds miss the walk's answer or a weight is
    /// not a whole number (the caller merges every run and walks them).
    ///
    /// The same answer to the bit: the keys between the bounds are a
    /// stretch of the merged sequence, the key before them is the largest
    /// below the lower bound, the one after the smallest above the upper.
    /// The walk sums weights in another order; a centroid's weight is a
    /// count of values, a whole number, and sums of whole numbers below
    /// 2^53 are exact in any order.
    fn bracketed(&mut self, q: f64, rank: f64, bounds: (f64, f64)) -> Option<f64> {
        let runs = &mut self.runs;
        let n = runs.items.len();
        // Each key's weight with those before it in its run.
        runs.weight_through.resize(n, 0.0);
        let mut whole = true;
        for (lo, hi) in spans(&runs.starts, n) {
            let mut sum = 0.0;
            for (&k, through) in runs.items[lo..hi]
                .iter()
                .zip(&mut runs.weight_through[lo..hi])
            {
                let w = centroid(k).weight;
                // A whole `u32` (a count): their sums stay far below 2^53.
                whole &= w as u32 as f64 == w;
                sum += w;
                *through = sum;
            }
        }
        if !whole {
            return None;
        }
        let (items, starts, through) = (&runs.items, &runs.starts, &runs.weight_through);
        // The bounds: the lowest and highest of the runs' own answers,
        // the key at which a run's weight passes its share `q`. No key
        // below the lowest passes the rank (each run's part below it
        // weighs at most its share), and the highest passes it (each
        // run's part up to it weighs more than its share).
        let (mut lower, mut upper) = (u64::MAX, 0);
        for (lo, hi) in spans(starts, n) {
            if lo == hi {
                continue;
            }
            let share = q * through[hi - 1];
            let at = lo + through[lo..hi].partition_point(|&w| w <= share);
            let answer = items[at.min(hi - 1)];
            lower = lower.min(answer);
            upper = upper.max(answer);
        }
        // The keys between the bounds, run by run; the weight below them;
        // the keys next to them.
        runs.near.clear();
        runs.near_starts.clear();
        let mut below = 0.0;
        let (mut before, mut after): (Option<u64>, Option<u64>) = (None, None);
        for (lo, hi) in spans(starts, n) {
            let run = &items[lo..hi];
            let from = run.partition_point(|&k| k < lower);
            let to = run.partition_point(|&k| k <= upper);
            if from > 0 {
                below += through[lo + from - 1];
                before = before.max(Some(run[from - 1]));
            }
            if let Some(&k) = run.get(to) {
                after = Some(after.map_or(k, |a| a.min(k)));
            }
            if from < to {
                runs.near_starts.push(runs.near.len());
                runs.near.extend_from_slice(&run[from..to]);
            }
        }
        if below > rank {
            return None;
        }
        merge_pairwise(&mut runs.near, &mut runs.near_starts, &mut runs.spare);
        let near = &runs.near;
        let mut t = below;
        let mut prev = before.map(centroid);
        for (i, &k) in near.iter().enumerate() {
            let c = centroid(k);
            if rank < t + c.weight {
                let next = near.get(i + 1).copied().or(after).map(centroid);
                return Some(interpolate_at(c, prev, next, rank, t, bounds));
            }
            t += c.weight;
            prev = Some(c);
        }
        None
    }
}

/// `estimate_quantile`'s walk to `rank` over centroids `next` yields in
/// ascending (descending) order, `count` values in all.
fn walk_to(
    rank: f64,
    count: f64,
    descending: bool,
    bounds: (f64, f64),
    mut next: impl FnMut() -> Option<Centroid>,
) -> f64 {
    // The centroid walked before the current one, and the one before
    // that: a neighbour when the walk runs off the far end.
    let (mut prev, mut prev2): (Option<Centroid>, Option<Centroid>) = (None, None);
    if descending {
        let mut t = count;
        while let Some(c) = next() {
            t -= c.weight;
            if rank >= t {
                return interpolate_at(c, next(), prev, rank, t, bounds);
            }
            (prev2, prev) = (prev, Some(c));
        }
        // Never reached: the lowest centroid, as `estimate_quantile`
        // leaves it.
        let c = prev.expect("a view holds a centroid");
        interpolate_at(c, None, prev2, rank, t, bounds)
    } else {
        let mut t = 0.0;
        while let Some(c) = next() {
            if rank < t + c.weight {
                return interpolate_at(c, prev, next(), rank, t, bounds);
            }
            t += c.weight;
            (prev2, prev) = (prev, Some(c));
        }
        let c = prev.expect("a view holds a centroid");
        interpolate_at(c, prev2, None, rank, t, bounds)
    }
}

impl Drop for ViewDigest {
    fn drop(&mut self) {
        let mut runs = std::mem::take(&mut self.runs);
        runs.clear();
        keep_spare(&VIEW_RUNS, runs);
    }
}

/// The centroids of every run in ascending or descending order, each step
/// taking the smallest (largest) key left at the runs' near ends.
struct Walk<'a> {
    items: &'a [u64],
    /// Per run, the part not yet taken.
    left: &'a mut Vec<(usize, usize)>,
    /// Per run, the key at its near end: a step scans these alone,
    /// without a branch on which is best.
    heads: &'a mut Vec<u64>,
    descending: bool,
}

impl<'a> Walk<'a> {
    fn new(runs: &'a mut Runs, descending: bool) -> Walk<'a> {
        let n = runs.items.len();
        runs.walk.clear();
        let starts = &runs.starts;
        runs.walk
            .extend(spans(starts, n).filter(|(lo, hi)| lo < hi));
        let items = &runs.items;
        runs.heads.clear();
        runs.heads.extend(
            runs.walk
                .iter()
                .map(|&(lo, hi)| if descending { items[hi - 1] } else { items[lo] }),
        );
        Walk {
            items,
            left: &mut runs.walk,
            heads: &mut runs.heads,
            descending,
        }
    }

    fn next(&mut self) -> Option<Centroid> {
        let (&first, rest) = self.heads.split_first()?;
        // Equal keys are the same centroid: either may go first.
        let (mut r, mut best) = (0, first);
        if self.descending {
            for (i, &k) in rest.iter().enumerate() {
                let better = k > best;
                best = best.max(k);
                r = if better { i + 1 } else { r };
            }
        } else {
            for (i, &k) in rest.iter().enumerate() {
                let better = k < best;
                best = best.min(k);
                r = if better { i + 1 } else { r };
            }
        }
        let run = &mut self.left[r];
        if self.descending {
            run.1 -= 1;
        } else {
            run.0 += 1;
        }
        if run.0 == run.1 {
            self.left.swap_remove(r);
            self.heads.swap_remove(r);
        } else {
            self.heads[r] = self.items[if self.descending { run.1 - 1 } else { run.0 }];
        }
        Some(centroid(best))
    }
}

/// `tdigest`'s compression (`merge_digests`, `compress_sorted`) of a
/// stream of centroids in ascending order, `count` values in all.
fn compress(
    sorted: impl Iterator<Item = Centroid>,
    capacity: usize,
    max_size: usize,
    count: f64,
) -> Vec<Centroid> {
    let mut compressed = spare_centroids(capacity);
    compress_into(sorted, max_size, count, &mut compressed);
    compressed
}

/// A buffer for a merged digest's centroids: one a dropped digest left on
/// this thread, or a new one. A slice stores its digests as it takes staged
/// values, several times a slice per channel: a fresh allocation each time
/// was a tenth of that work.
fn spare_centroids(capacity: usize) -> Vec<Centroid> {
    let mut v = take_spare(&SPARE_CENTROIDS);
    v.clear();
    v.reserve(capacity);
    v
}

/// Buffers kept for reuse per thread and kind.
const SPARE_KEPT: usize = 8;

/// A buffer from this thread's `pool`, or a new one.
fn take_spare<T: Default>(pool: &'static LocalKey<RefCell<Vec<T>>>) -> T {
    pool.try_with(|p| p.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Gives a buffer back to this thread's `pool` (dropped if it is full, or
/// if the thread is exiting).
fn keep_spare<T>(pool: &'static LocalKey<RefCell<Vec<T>>>, buffer: T) {
    let _ = pool.try_with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < SPARE_KEPT {
            p.push(buffer);
        }
    });
}

impl Drop for MergedDigest {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.centroids);
        if v.capacity() > 0 {
            keep_spare(&SPARE_CENTROIDS, v);
        }
    }
}

/// [`compress`] into `compressed` (cleared first), reusing its buffer.
fn compress_into(
    sorted: impl Iterator<Item = Centroid>,
    max_size: usize,
    count: f64,
    compressed: &mut Vec<Centroid>,
) {
    let compress = |scales: &[f64]| compress_scaled(sorted, scales, count, compressed);
    SCALES.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scales) => compress(scales.of(max_size)),
        Err(_) => compress(Scales { sizes: Vec::new() }.of(max_size)),
    })
}

/// `tdigest`'s `compress_sorted` loop, the weight limit of the first `k`
/// centroids read from `scales` (`max_size` of them: none past it).
fn compress_scaled(
    mut sorted: impl Iterator<Item = Centroid>,
    scales: &[f64],
    count: f64,
    compressed: &mut Vec<Centroid>,
) {
    let limit = |k: usize| scales.get(k).map_or(f64::INFINITY, |q| q * count);
    compressed.clear();
    let mut k_limit = 1;
    let mut q_limit_times_count = limit(k_limit);
    k_limit += 1;
    let Some(mut curr) = sorted.next() else {
        return;
    };
    let mut weight_so_far = curr.weight;
    for centroid in sorted {
        weight_so_far += centroid.weight;
        if weight_so_far <= q_limit_times_count {
            curr.merge(centroid.mean, centroid.weight);
        } else {
            compressed.push(curr);
            q_limit_times_count = limit(k_limit);
            k_limit += 1;
            curr = centroid;
        }
    }
    compressed.push(curr);
    if !compressed
        .windows(2)
        .all(|w| w[0].cmp(&w[1]) != Ordering::Greater)
    {
        compressed.sort_unstable_by(Centroid::cmp);
    }
}

thread_local! {
    static SCALES: RefCell<Scales> = const { RefCell::new(Scales { sizes: Vec::new() }) };
    static RUNS: RefCell<Runs> = RefCell::new(Runs::default());
    /// Buffers of the views alive or dropped on this thread, for reuse.
    static VIEW_RUNS: RefCell<Vec<Runs>> = const { RefCell::new(Vec::new()) };
    /// Centroid buffers of dropped merged digests (`spare_centroids`).
    static SPARE_CENTROIDS: RefCell<Vec<Vec<Centroid>>> = const { RefCell::new(Vec::new()) };
}

/// Gathers runs with `fill` into a view for quantile queries (`None` if
/// `fill` added nothing). Its buffers are this thread's, reused once the
/// view is dropped.
pub fn view(fill: impl FnOnce(&mut Runs)) -> Option<ViewDigest> {
    let mut runs = take_spare(&VIEW_RUNS);
    runs.clear();
    fill(&mut runs);
    // A walk takes runs in order.
    runs.order_runs();
    let view = ViewDigest { runs };
    (!view.runs.items.is_empty()).then_some(view)
}

/// Gathers runs with `fill` and returns their merged digest of at most
/// `max_size` centroids (`None` if `fill` added nothing). The buffers are
/// this thread's, reused across calls; a nested call gets fresh ones.
pub fn gather(max_size: usize, fill: impl FnOnce(&mut Runs)) -> Option<MergedDigest> {
    with_runs(|runs| {
        fill(runs);
        runs.finish(max_size)
    })
}

/// A digest (added by `fill`, one run at most) with `values` merged in,
/// compressed to `max_size`: what `tdigest` gives for
/// `TDigest::new(..).merge_unsorted(values)` (a slice taking its staged
/// values), bit for bit, without its allocations but the result's.
pub fn add_values(
    max_size: usize,
    fill: impl FnOnce(&mut Runs),
    values: &[f32],
) -> Option<MergedDigest> {
    with_runs(|runs| {
        fill(runs);
        debug_assert!(runs.starts.len() <= 1, "one digest takes the values");
        runs.finish_with_values(max_size, values)
    })
}

/// Runs `f` on this thread's cleared buffers (fresh ones if they are taken).
fn with_runs<R>(f: impl FnOnce(&mut Runs) -> R) -> R {
    RUNS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut runs) => {
            runs.clear();
            let out = f(&mut runs);
            runs.clear();
            out
        }
        Err(_) => f(&mut Runs::default()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tdigest::TDigest;

    /// A small deterministic generator (xorshift), so failures replay.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// One random slice digest as a window keeps it: a crate digest of
    /// compression `size`, narrowed to `f32` centroids.
    fn slice(rng: &mut Rng, size: usize) -> Slice {
        let n = 1 + rng.below(120) as usize;
        let spread = [3, 50, 2_000, 60_000][rng.below(4) as usize];
        let base = rng.below(1_000) as f64;
        let values: Vec<f64> = (0..n).map(|_| base + rng.below(spread) as f64).collect();
        let t = TDigest::new_with_size(size).merge_unsorted(values);
        let cs = t
            .centroids()
            .iter()
            .map(|c| (c.mean() as f32, c.weight() as f32))
            .collect();
        (
            cs,
            t.count(),
            t.sum(),
            t.min().unwrap() as f32,
            t.max().unwrap() as f32,
        )
    }

    type Slice = (Vec<(f32, f32)>, f64, f64, f32, f32);

    /// Up to `most` random slices of random compressions.
    fn random_slices(rng: &mut Rng, most: u64) -> Vec<Slice> {
        (0..1 + rng.below(most))
            .map(|_| {
                let size = [5, 25, 25, 100][rng.below(4) as usize];
                slice(rng, size)
            })
            .collect()
    }

    /// The crate's digest of the slices' centroids widened and their
    /// summaries summed in order, at `max_size` (`None`: all of them kept).
    fn crate_digest(slices: &[Slice], max_size: Option<usize>) -> TDigest {
        let mut all = Vec::new();
        let (mut sum, mut count) = (0.0, 0.0);
        let (mut lo, mut hi): (Option<f64>, Option<f64>) = (None, None);
        for (cs, n, s, mn, mx) in slices {
            all.extend(
                cs.iter()
                    .map(|c| tdigest::Centroid::new(c.0 as f64, c.1 as f64)),
            );
            sum += s;
            count += n;
            lo = Some(lo.map_or(*mn as f64, |m| m.min(*mn as f64)));
            hi = Some(hi.map_or(*mx as f64, |m| m.max(*mx as f64)));
        }
        let size = max_size.unwrap_or(all.len());
        TDigest::new(all, sum, count, hi, lo, size)
    }

    /// Adds each slice as a run, as a window does.
    fn add_slices(runs: &mut Runs, slices: &[Slice]) {
        for (cs, n, _, mn, mx) in slices {
            let packed: Vec<Packed> = cs.iter().map(|c| Packed::new(c.0, c.1)).collect();
            runs.add(&packed, *n, *mn as f64, *mx as f64);
        }
    }

    /// `got` is `expected`, bit for bit: centroids and summary.
    fn same(got: &MergedDigest, expected: &TDigest, case: usize) {
        let want: Vec<(u64, u64)> = expected
            .centroids()
            .iter()
            .map(|c| (c.mean().to_bits(), c.weight().to_bits()))
            .collect();
        let have: Vec<(u64, u64)> = got
            .centroids()
            .iter()
            .map(|c| (c.mean.to_bits(), c.weight.to_bits()))
            .collect();
        assert_eq!(have, want, "case {case}: centroids");
        assert_eq!(got.count(), expected.count(), "case {case}");
        assert_eq!(
            (Some(got.min()), Some(got.max())),
            (expected.min(), expected.max())
        );
    }

    #[test]
    fn same_digest_as_the_crate() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for case in 0..2_000 {
            let slices = random_slices(&mut rng, 17);
            let max_size = [10, 25, 100, 100][rng.below(4) as usize];
            // What the window did before: every centroid widened, summaries
            // summed in order, `TDigest::new`.
            let expected = crate_digest(&slices, Some(max_size));
            let got = gather(max_size, |runs| add_slices(runs, &slices)).unwrap();
            same(&got, &expected, case);
            for q in [0.0, 0.01, 0.1, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0] {
                let (a, b) = (got.estimate_quantile(q), expected.estimate_quantile(q));
                assert_eq!(Some(a.to_bits()), b.map(f64::to_bits), "case {case} q {q}");
            }
        }
    }

    /// A view's quantiles are the crate's `estimate_quantile` over the
    /// union of its runs' centroids, none compressed again: bit for bit,
    /// whether the walk goes across the runs (tails) or over them sorted,
    /// and whatever was asked of the view before.
    #[test]
    fn view_quantiles_are_the_crates_over_the_union() {
        let mut rng = Rng(0x51_7cc1_b727_220a);
        let qs = [
            0.0, 0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 0.5001, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0,
        ];
        for case in 0..2_000 {
            let slices = random_slices(&mut rng, 30);
            // Kept whole: a size that holds every centroid.
            let expected = crate_digest(&slices, None);
            let make = || view(|runs| add_slices(runs, &slices)).unwrap();
            // The same view asked in turn (sorted by a middle quantile
            // partway), and a fresh view per quantile.
            let mut shared = make();
            assert_eq!(shared.count(), expected.count());
            assert_eq!(
                (Some(shared.min()), Some(shared.max())),
                (expected.min(), expected.max())
            );
            let start = rng.below(qs.len() as u64) as usize;
            for i in 0..qs.len() {
                let q = qs[(start + i) % qs.len()];
                let want = expected.estimate_quantile(q).map(f64::to_bits);
                assert_eq!(
                    Some(shared.estimate_quantile(q).to_bits()),
                    want,
                    "case {case} q {q}"
                );
                assert_eq!(
                    Some(make().estimate_quantile(q).to_bits()),
                    want,
                    "case {case} q {q}"
                );
            }
        }
        assert!(view(|_| {}).is_none());
    }

    #[test]
    fn a_middle_quantile_read_between_bounds_is_the_full_walks() {
        // Slices of one traffic (as a channel's are) and of shifting ones.
        let mut rng = Rng(0x2d35_8dcc_aa6c_78a5);
        let (mut held, mut cases) = (0, 0);
        for case in 0..2_000 {
            let slices: Vec<Slice> = match rng.below(2) {
                0 => random_slices(&mut rng, 30),
                _ => {
                    let n = 3 + rng.below(24) as usize;
                    let base = rng.below(5_000) as f64;
                    let spread = 1 + rng.below(3_000);
                    (0..n)
                        .map(|_| {
                            let values: Vec<f64> = (0..1 + rng.below(150))
                                .map(|_| base + rng.below(spread) as f64)
                                .collect();
                            let t = TDigest::new_with_size(25).merge_unsorted(values);
                            let cs = t
                                .centroids()
                                .iter()
                                .map(|c| (c.mean() as f32, c.weight() as f32))
                                .collect();
                            let (lo, hi) = (t.min().unwrap() as f32, t.max().unwrap() as f32);
                            (cs, t.count(), t.sum(), lo, hi)
                        })
                        .collect()
                }
            };
            for q in [0.11, 0.25, 0.4, 0.5] {
                let mut full = view(|runs| add_slices(runs, &slices)).unwrap();
                let mut near = view(|runs| add_slices(runs, &slices)).unwrap();
                if near.runs.starts.len() < 3 {
                    continue;
                }
                cases += 1;
                let rank = q * full.count();
                let bounds = (full.min(), full.max());
                full.runs.merge_runs();
                let want = full.estimate_quantile(q).to_bits();
                if let Some(got) = near.bracketed(q, rank, bounds) {
                    held += 1;
                    assert_eq!(got.to_bits(), want, "case {case} q {q}");
                }
            }
        }
        // The bounds hold nearly always: the shortcut is the usual path.
        assert!(held * 10 > cases * 9, "{held} of {cases}");
    }

    #[test]
    fn values_are_added_as_the_crate_adds_them() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for case in 0..2_000 {
            let size = [5, 25, 25, 100][rng.below(4) as usize];
            // Mostly stored at the compression it takes values at; now
            // and then at another (a larger one is compressed first).
            let stored = match rng.below(5) {
                0 => [5, 25, 100][rng.below(3) as usize],
                _ => size,
            };
            let existing = (rng.below(4) != 0).then(|| slice(&mut rng, stored));
            let spread = [3, 50, 2_000, 60_000][rng.below(4) as usize];
            let values: Vec<f32> = (0..rng.below(130))
                .map(|_| rng.below(spread) as f32 + 0.25 * rng.below(4) as f32)
                .collect();
            let crate_digest = match &existing {
                None => TDigest::new_with_size(size),
                Some((cs, n, s, mn, mx)) => TDigest::new(
                    cs.iter()
                        .map(|c| tdigest::Centroid::new(c.0 as f64, c.1 as f64))
                        .collect(),
                    *s,
                    *n,
                    Some(*mx as f64),
                    Some(*mn as f64),
                    size,
                ),
            };
            let expected = crate_digest.merge_unsorted(values.iter().map(|&v| v as f64).collect());
            let got = add_values(
                size,
                |runs| {
                    if let Some((cs, n, _, mn, mx)) = &existing {
                        runs.add(
                            &cs.iter().map(|c| Packed::new(c.0, c.1)).collect::<Vec<_>>(),
                            *n,
                            *mn as f64,
                            *mx as f64,
                        );
                    }
                },
                &values,
            );
            let Some(got) = got else {
                assert!(expected.is_empty(), "case {case}");
                continue;
            };
            same(&got, &expected, case);
        }
    }

    #[test]
    fn a_run_out_of_order_is_sorted_whole() {
        // Two means that narrowed to one f32 keep their f64 order by mean,
        // not by weight: the run (1.0, 5), (1.0, 3) is out of order.
        let got = gather(100, |runs| {
            let p =
                |cs: &[(f32, f32)]| cs.iter().map(|c| Packed::new(c.0, c.1)).collect::<Vec<_>>();
            runs.add(&p(&[(1.0, 5.0), (1.0, 3.0), (2.0, 1.0)]), 9.0, 1.0, 2.0);
            runs.add(&p(&[(0.5, 1.0), (1.0, 4.0)]), 5.0, 0.5, 1.0);
        })
        .unwrap();
        let order: Vec<(f64, f64)> = got.centroids().iter().map(|c| (c.mean, c.weight)).collect();
        assert_eq!(
            order,
            vec![(0.5, 1.0), (1.0, 3.0), (1.0, 4.0), (1.0, 5.0), (2.0, 1.0)]
        );
        assert_eq!(got.count(), 14.0);
    }

    #[test]
    fn merging_from_both_ends_gives_the_sorted_sequence() {
        let mut rng = Rng(0x5851_f42d_4c95_7f2d);
        for case in 0..5_000 {
            // Small alphabets make ties; the extremes test the ends' stand-ins.
            let alphabet = [2, 5, 1_000, u64::MAX][rng.below(4) as usize];
            let key = |rng: &mut Rng| match rng.below(10) {
                0 => 0,
                1 => u64::MAX,
                _ => rng.next() % alphabet,
            };
            let mut a: Vec<u64> = (0..rng.below(40)).map(|_| key(&mut rng)).collect();
            let mut b: Vec<u64> = (0..rng.below(40)).map(|_| key(&mut rng)).collect();
            a.sort_unstable();
            b.sort_unstable();
            let mut out = vec![7; a.len() + b.len()];
            merge_into(&a, &b, &mut out);
            let mut expected = [a.clone(), b.clone()].concat();
            expected.sort_unstable();
            assert_eq!(out, expected, "case {case}: {a:?} + {b:?}");
        }
    }

    #[test]
    fn nothing_gathered_is_no_digest() {
        assert!(gather(100, |_| {}).is_none());
    }
}
