//! The windows that are not slices of time: the last N outcomes however far
//! apart, the current failure streak, and the healthy baseline.

use crate::event::ErrorClass;

/// The last N outcomes, however far apart in time (docs/decisions.md#signals, incident 002).
/// Only outcomes that say something about the channel count: a success or a
/// hard failure. 429s, client errors and cancellations are left out. Bad
/// answers are not recorded here: `bad_outcome_rate` counts them (with the
/// hard failures) over the time views, and counting them in both would score
/// a 2 % bad-answer day twice.
#[derive(Debug, Clone)]
pub struct OutcomeWindow {
    /// A bit an outcome (set: a hard failure), a ring of `capacity`: in
    /// `inline` up to [`OutcomeWindow::INLINE`] outcomes (the default
    /// `engine.outcome_window` is 100), so recording one writes into the
    /// channel's entry, not a line of memory of its own; in `spill` beyond.
    inline: [u64; 2],
    spill: Box<[u64]>,
    capacity: u32,
    next: u32,
    len: u32,
    failures: u32,
}

impl OutcomeWindow {
    /// The most outcomes kept without an allocation.
    pub const INLINE: u32 = 128;

    pub fn new(capacity: u32) -> OutcomeWindow {
        let capacity = capacity.max(1);
        let spill = if capacity > OutcomeWindow::INLINE {
            vec![0; capacity.div_ceil(64) as usize].into_boxed_slice()
        } else {
            Box::default()
        };
        OutcomeWindow {
            inline: [0; 2],
            spill,
            capacity,
            next: 0,
            len: 0,
            failures: 0,
        }
    }

    #[cfg(test)]
    fn words(&self) -> &[u64] {
        if self.spill.is_empty() {
            &self.inline
        } else {
            &self.spill
        }
    }

    /// Hints the word [`OutcomeWindow::record`] writes next, when it is not
    /// in the window itself.
    pub fn prefetch(&self) {
        if let Some(w) = self.spill.get(self.next as usize / 64) {
            crate::prefetch::value(w);
        }
    }

    pub fn record(&mut self, failed: bool) {
        let (word, bit) = (self.next as usize / 64, self.next % 64);
        let words: &mut [u64] = if self.spill.is_empty() {
            &mut self.inline
        } else {
            &mut self.spill
        };
        if self.len == self.capacity {
            self.failures -= ((words[word] >> bit) & 1) as u32;
        } else {
            self.len += 1;
        }
        words[word] = words[word] & !(1 << bit) | (failed as u64) << bit;
        self.failures += failed as u32;
        self.next = if self.next + 1 == self.capacity {
            0
        } else {
            self.next + 1
        };
    }

    /// Whether the outcome `back` places before the newest was a failure
    /// (`back` < `len`).
    #[cfg(test)]
    fn failed(&self, back: u32) -> bool {
        let i = (self.next + self.capacity - 1 - back) % self.capacity;
        (self.words()[i as usize / 64] >> (i % 64)) & 1 == 1
    }

    pub fn len(&self) -> u32 {
        self.len
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
    use super::OutcomeWindow;
    use std::collections::VecDeque;

    /// Against a plain queue of the last N outcomes: inline, at the edges
    /// of a word and of the inline words, and spilled.
    #[test]
    fn the_bits_are_the_last_n_outcomes_at_any_capacity() {
        for capacity in [1, 2, 63, 64, 65, 100, 127, 128, 129, 200, 1_000] {
            let mut w = OutcomeWindow::new(capacity);
            assert_eq!(w.spill.is_empty(), capacity <= OutcomeWindow::INLINE);
            let mut model = VecDeque::new();
            let mut x = 0x9e37_79b9_7f4a_7c15_u64 ^ capacity as u64;
            for _ in 0..3 * capacity + 17 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let failed = x.is_multiple_of(3);
                w.record(failed);
                model.push_back(failed);
                if model.len() > capacity as usize {
                    model.pop_front();
                }
                assert_eq!(w.len() as usize, model.len());
                let failures = model.iter().filter(|f| **f).count() as u32;
                assert_eq!(w.failures(), failures, "capacity {capacity}");
            }
            for (back, &failed) in model.iter().rev().enumerate() {
                assert_eq!(
                    w.failed(back as u32),
                    failed,
                    "capacity {capacity}, {back} back"
                );
            }
        }
    }
}
