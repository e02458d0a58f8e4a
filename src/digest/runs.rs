//! The gathered centroids of a view: one sorted run per slice or pane, as
//! `u64` keys (mean's bits above weight's, in `total_cmp` order), merged
//! pairwise into one sequence.

use super::{compress, compress_into, spare_centroids, Centroid, MergedDigest};

/// Runs of centroids being gathered for one merged digest, with their
/// counts and extremes. Get one from [`gather`].
///
/// Centroids are kept as sort keys (`key`): a window stores its
/// centroids as `f32` pairs, and one `u64` per centroid orders them exactly
/// as `Centroid::cmp` orders the widened pair, so merging runs compares
/// integers and moves half the bytes.
#[derive(Default)]
pub struct Runs {
    pub(super) items: Vec<u64>,
    /// Where each run starts in `items`.
    pub(super) starts: Vec<usize>,
    pub(super) spare: Vec<u64>,
    /// The ordered keys decoded, when they are few enough to be the digest.
    pub(super) decoded: Vec<Centroid>,
    /// Values being added to one digest (`add_values`), and their keys.
    pub(super) values: Vec<f64>,
    pub(super) value_keys: Vec<u32>,
    /// A view's walk: per run, the part not yet taken.
    pub(super) walk: Vec<(usize, usize)>,
    /// And the key at each one's near end.
    pub(super) heads: Vec<u64>,
    /// A walk to a middle quantile: each key's weight with those before
    /// it in its run, and the keys it merges around the quantile (with
    /// where each run of them starts).
    pub(super) weight_through: Vec<f64>,
    pub(super) near: Vec<u64>,
    pub(super) near_starts: Vec<usize>,
    /// Whether a run was added that is not known to be in order.
    pub(super) unchecked: bool,
    pub(super) count: f64,
    pub(super) min: Option<f64>,
    pub(super) max: Option<f64>,
}

impl Runs {
    /// Adds the centroids of one digest of `count` values (in ascending
    /// order, as a digest keeps them) and its extremes. They are kept
    /// packed, as the keys merging compares: this is a copy.
    pub fn add(&mut self, centroids: &[Packed], count: f64, min: f64, max: f64) {
        self.unchecked = true;
        self.push_run(centroids, count, min, max);
    }

    /// [`Runs::add`] for centroids known to be in ascending key order
    /// (`in_order`), so that merging need not check them again.
    pub fn add_in_order(&mut self, centroids: &[Packed], count: f64, min: f64, max: f64) {
        debug_assert!(in_order(centroids));
        self.push_run(centroids, count, min, max);
    }

    fn push_run(&mut self, centroids: &[Packed], count: f64, min: f64, max: f64) {
        self.starts.push(self.items.len());
        self.items.extend(centroids.iter().map(|c| c.0));
        self.count += count;
        self.min = Some(self.min.map_or(min, |m| m.min(min)));
        self.max = Some(self.max.map_or(max, |m| m.max(max)));
    }

    /// The digest of everything added, compressed to `max_size` centroids
    /// if it holds more (what `TDigest::new` returns for the concatenated
    /// centroids, summed counts and outer extremes); `None` if nothing was
    /// added.
    pub(super) fn finish(&mut self, max_size: usize) -> Option<MergedDigest> {
        assert!(max_size > 0, "a digest holds at least one centroid");
        if self.items.is_empty() {
            return None;
        }
        self.sort();
        let centroids = if self.items.len() > max_size {
            compress(
                self.items.iter().map(|&k| centroid(k)),
                max_size,
                max_size,
                self.count,
            )
        } else {
            let mut v = spare_centroids(self.items.len());
            v.extend(self.items.iter().map(|&k| centroid(k)));
            v
        };
        Some(MergedDigest {
            centroids,
            count: self.count,
            min: self.min.expect("a run was added"),
            max: self.max.expect("a run was added"),
        })
    }

    /// Puts `items` in order: merges the runs pairwise, or sorts them all
    /// when a run is out of order.
    pub(super) fn sort(&mut self) {
        if self.order_runs() {
            self.merge_runs();
        }
    }

    /// Merges runs known to be in order pairwise into one.
    pub(super) fn merge_runs(&mut self) {
        merge_pairwise(&mut self.items, &mut self.starts, &mut self.spare);
    }

    /// Makes sure every run is in order: a run that is not (two `f64`
    /// means that narrowed to one `f32`) has everything sorted into one.
    /// `false` if it came to that.
    pub(super) fn order_runs(&mut self) -> bool {
        if !self.unchecked {
            return true;
        }
        let runs_in_order = spans(&self.starts, self.items.len())
            .all(|(lo, hi)| self.items[lo..hi].windows(2).all(|w| w[0] <= w[1]));
        if !runs_in_order {
            self.items.sort_unstable();
            self.starts.clear();
            self.starts.push(0);
        }
        runs_in_order
    }

    /// The digest `TDigest::new` makes of what was added (one digest, at
    /// most), with `values` merged in as `TDigest::merge_unsorted` merges
    /// them; `None` if both are empty.
    ///
    /// `merge_unsorted` compresses one ascending stream of the digest's
    /// centroids and the sorted values, a centroid first only when its
    /// mean is strictly less. Each value is the centroid `(v, 1)` and is
    /// merged in as its key: a centroid of mean `v` weighs at least 1 (it
    /// is a count of values), so its key is never below the value's, and
    /// one weighing 1 is the same centroid. The keys order as `<` does,
    /// since no value is NaN or `-0.0` (they are `i32`s, see
    /// [`crate::window`]'s staging), so the stream is the same, merged
    /// without a branch on which comes next.
    pub(super) fn finish_with_values(
        &mut self,
        max_size: usize,
        values: &[f32],
    ) -> Option<MergedDigest> {
        assert!(max_size > 0, "a digest holds at least one centroid");
        if values.is_empty() {
            return self.finish(max_size);
        }
        debug_assert!(values
            .iter()
            .all(|v| !v.is_nan() && v.to_bits() != (-0.0f32).to_bits()));
        self.sort();
        // Sorted as `f32` keys of the same total order (cheaper to compare
        // than widened `f64`s; equal keys are equal values).
        self.value_keys.clear();
        self.value_keys
            .extend(values.iter().map(|&v| ordered_bits(v)));
        self.value_keys.sort_unstable();
        let first = from_ordered_bits(self.value_keys[0]) as f64;
        let last = from_ordered_bits(self.value_keys[self.value_keys.len() - 1]) as f64;
        let (min, max) = match (self.count > 0.0, self.min, self.max) {
            (true, Some(lo), Some(hi)) => (lo.min(first), hi.max(last)),
            _ => (first, last),
        };
        let count = self.count + values.len() as f64;
        let compressed = if self.items.len() > max_size {
            self.compressed_then_values(max_size, count)
        } else {
            let one = ordered_bits(1.0) as u64;
            self.spare.clear();
            self.spare
                .extend(self.value_keys.iter().map(|&k| ((k as u64) << 32) | one));
            let m = self.items.len();
            let n = m + self.spare.len();
            self.items.resize(m + n, 0);
            let (centroids, out) = self.items.split_at_mut(m);
            merge_into(centroids, &self.spare, out);
            compress(
                out.iter().map(|&k| centroid(k)),
                max_size.min(n),
                max_size,
                count,
            )
        };
        Some(MergedDigest {
            centroids: compressed,
            count,
            min,
            max,
        })
    }

    /// [`Runs::finish_with_values`] of a digest stored at another
    /// compression: compressed to `max_size` first (its means are no
    /// longer `f32`s, so they are compared as they are), then merged with
    /// the sorted `value_keys`.
    fn compressed_then_values(&mut self, max_size: usize, count: f64) -> Vec<Centroid> {
        self.decoded.clear();
        compress_into(
            self.items.iter().map(|&k| centroid(k)),
            max_size,
            self.count,
            &mut self.decoded,
        );
        self.values.clear();
        self.values
            .extend(self.value_keys.iter().map(|&k| from_ordered_bits(k) as f64));
        // `TDigest::compress_sorted`: the centroids and the values in one
        // ascending stream (a centroid first only when strictly less).
        let (centroids, values) = (&self.decoded, &self.values);
        let (mut i, mut j) = (0, 0);
        let next = || {
            if i < centroids.len() && (j == values.len() || centroids[i].mean < values[j]) {
                i += 1;
                Some(centroids[i - 1])
            } else if j < values.len() {
                j += 1;
                Some(Centroid {
                    mean: values[j - 1],
                    weight: 1.0,
                })
            } else {
                None
            }
        };
        let capacity = max_size.min(centroids.len() + values.len());
        compress(std::iter::from_fn(next), capacity, max_size, count)
    }

    pub(super) fn clear(&mut self) {
        self.items.clear();
        self.starts.clear();
        self.unchecked = false;
        self.count = 0.0;
        self.min = None;
        self.max = None;
    }
}

/// Where each run lies in `n` gathered keys: `(start, end)` per start.
pub(super) fn spans(starts: &[usize], n: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
    (0..starts.len()).map(move |r| (starts[r], starts.get(r + 1).copied().unwrap_or(n)))
}

/// Merges the ordered runs of `items` (each starting at one of `starts`)
/// pairwise, pass after pass, into one; `spare` is the other buffer of
/// each pass.
pub(super) fn merge_pairwise(items: &mut Vec<u64>, starts: &mut Vec<usize>, spare: &mut Vec<u64>) {
    if starts.len() < 2 {
        return;
    }
    let n = items.len();
    // Every key of it is written before it is read.
    spare.resize(n, 0);
    while starts.len() > 1 {
        let mut next = 0;
        let mut r = 0;
        while r < starts.len() {
            let lo = starts[r];
            let mid = starts.get(r + 1).copied().unwrap_or(n);
            let hi = starts.get(r + 2).copied().unwrap_or(n);
            merge_into(&items[lo..mid], &items[mid..hi], &mut spare[lo..hi]);
            starts[next] = lo;
            next += 1;
            r += 2;
        }
        starts.truncate(next);
        std::mem::swap(items, spare);
    }
}

/// Whether `centroids` are in ascending key order, as a digest keeps them
/// (narrowed to `f32`, two means can swap places: [`Runs::order_runs`]).
pub fn in_order(centroids: &[Packed]) -> bool {
    centroids.windows(2).all(|w| w[0].0 <= w[1].0)
}

/// Merges two ordered runs of keys into `out` (`a.len() + b.len()` long),
/// without a branch on which run is next, from both ends at once: the
/// front takes the smallest half, the back the largest rest. Each step of
/// a branch-free merge waits for the one before (its load depends on the
/// last comparison); two independent chains run side by side. Each end is
/// right by value on its own (a run that is used up reads as the key that
/// is never taken before a real one: the largest at the front, the
/// smallest at the back), and keys that compare equal are equal, so the
/// two halves join into the sorted sequence whoever took a tied key.
pub(super) fn merge_into(a: &[u64], b: &[u64], out: &mut [u64]) {
    debug_assert_eq!(a.len() + b.len(), out.len());
    if out.is_empty() {
        return;
    }
    let half = out.len() / 2;
    let (front, back) = out.split_at_mut(half);
    let (mut i, mut j) = (0, 0);
    let (mut ia, mut jb) = (a.len(), b.len());
    // Each step takes one key per end, so for fewer steps than either run
    // is long neither end can run out: both chains go unguarded.
    let both = half.min(a.len()).min(b.len());
    let last = back.len() - 1;
    for k in 0..both {
        let (x, y) = (a[i], b[j]);
        let take_a = x <= y;
        front[k] = if take_a { x } else { y };
        i += take_a as usize;
        j += (!take_a) as usize;
        let (x, y) = (a[ia - 1], b[jb - 1]);
        let take_a = x > y;
        back[last - k] = if take_a { x } else { y };
        ia -= take_a as usize;
        jb -= (!take_a) as usize;
    }
    for slot in &mut front[both..] {
        let x = a.get(i).copied().unwrap_or(u64::MAX);
        let y = b.get(j).copied().unwrap_or(u64::MAX);
        let take_a = x <= y;
        *slot = if take_a { x } else { y };
        i += take_a as usize;
        j += (!take_a) as usize;
    }
    for k in both..back.len() {
        let x = if ia > 0 { a[ia - 1] } else { 0 };
        let y = if jb > 0 { b[jb - 1] } else { 0 };
        let take_a = x > y;
        back[last - k] = if take_a { x } else { y };
        ia -= (take_a && ia > 0) as usize;
        jb -= (!take_a && jb > 0) as usize;
    }
}

/// The sort key of a centroid kept as `f32`s: the mean's bits above the
/// weight's, each mapped so that unsigned order is `f32::total_cmp`'s.
/// Widening to `f64` keeps every value and its order, so keys order
/// centroids as [`Centroid::cmp`] orders them widened; equal keys are the
/// same centroid.
pub(super) fn key(mean: f32, weight: f32) -> u64 {
    ((ordered_bits(mean) as u64) << 32) | ordered_bits(weight) as u64
}

/// A centroid as a window stores it: mean and weight narrowed to `f32`,
/// packed as its sort key (mean bits above weight bits, ordered as
/// `f32::total_cmp`; 8 bytes, what a pair of `f32` takes),
/// so gathering a view's runs ([`Runs::add`]) copies them as they are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct Packed(u64);

impl Packed {
    pub fn new(mean: f32, weight: f32) -> Packed {
        Packed(key(mean, weight))
    }

    /// A merged digest's centroid, narrowed.
    pub fn of(c: &Centroid) -> Packed {
        Packed::new(c.mean as f32, c.weight as f32)
    }
}

/// The centroid a [`key`] stands for, widened to `f64`.
pub(super) fn centroid(key: u64) -> Centroid {
    Centroid {
        mean: from_ordered_bits((key >> 32) as u32) as f64,
        weight: from_ordered_bits(key as u32) as f64,
    }
}

/// `f32` bits whose unsigned order is `f32::total_cmp`'s: negatives
/// flipped whole, positives with the sign bit set.
pub(super) fn ordered_bits(x: f32) -> u32 {
    let b = x.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

pub(super) fn from_ordered_bits(u: u32) -> f32 {
    f32::from_bits(if u & 0x8000_0000 != 0 {
        u & 0x7fff_ffff
    } else {
        !u
    })
}
