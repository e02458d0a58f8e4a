//! Duplicate events: the same `event_id` seen again within a short horizon
//! of event time is ignored (at-least-once producers retry; a rebalance
//! replays). Pure and deterministic, driven by event time.
//!
//! Ids are kept as 64-bit hashes (ahash with fixed keys, so a replay decides
//! the same): at a million ids in the horizon the chance of any false
//! duplicate is about 3e-8.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};

/// Remembers event ids for `horizon_ms` of event time.
pub struct Dedup {
    horizon_ms: i64,
    hasher: ahash::RandomState,
    seen: ahash::AHashSet<u64>,
    /// Insertion order with event times, for expiry.
    order: VecDeque<(i64, u64)>,
    latest_ms: i64,
    duplicates: u64,
}

impl Dedup {
    pub fn new(horizon_ms: i64) -> Dedup {
        Dedup {
            horizon_ms,
            hasher: ahash::RandomState::with_seeds(
                0x6865_726d,
                0x6573_6475,
                0x7075_6c69,
                0x6361_7465,
            ),
            seen: ahash::AHashSet::new(),
            order: VecDeque::new(),
            latest_ms: i64::MIN,
            duplicates: 0,
        }
    }

    /// True the first time an id is seen within the horizon; false for a
    /// duplicate (counted).
    pub fn first_seen(&mut self, event_id: &str, event_time_ms: i64) -> bool {
        if event_time_ms > self.latest_ms {
            self.latest_ms = event_time_ms;
            let cutoff = event_time_ms - self.horizon_ms;
            while let Some(&(t, h)) = self.order.front() {
                if t >= cutoff {
                    break;
                }
                self.order.pop_front();
                self.seen.remove(&h);
            }
        }
        let mut hasher = self.hasher.build_hasher();
        hasher.write(event_id.as_bytes());
        let h = hasher.finish();
        if !self.seen.insert(h) {
            self.duplicates += 1;
            return false;
        }
        self.order.push_back((event_time_ms, h));
        true
    }

    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// Ids currently remembered.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeat_within_the_horizon_is_a_duplicate() {
        let mut d = Dedup::new(60_000);
        assert!(d.first_seen("a", 1_000));
        assert!(d.first_seen("b", 2_000));
        assert!(!d.first_seen("a", 3_000));
        assert_eq!(d.duplicates(), 1);
    }

    #[test]
    fn ids_expire_after_the_horizon_of_event_time() {
        let mut d = Dedup::new(60_000);
        assert!(d.first_seen("a", 0));
        assert!(d.first_seen("b", 61_000));
        assert_eq!(d.len(), 1, "`a` expired");
        assert!(
            d.first_seen("a", 61_001),
            "an id older than the horizon counts again"
        );
    }

    #[test]
    fn the_same_input_decides_the_same_way() {
        let run = || {
            let mut d = Dedup::new(10);
            (0..1000)
                .map(|i| d.first_seen(&format!("id-{}", i % 37), i))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
    }
}
