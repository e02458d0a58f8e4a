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
