//! Exponential backoff for the adapters' retry loops (Redis, the schema
//! registry, topic checks, the weight client): one type, so every loop
//! doubles the same way, caps the same way and starts over the same way.

use std::time::Duration;

/// A retry delay that doubles per failure up to a cap; [`Backoff::reset`]
/// after a success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// A dependency the request path waits on (Redis writes and reads):
    /// 100 ms doubling to 5 s, so a blip costs little and an outage is not
    /// hammered.
    pub const SHORT: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    /// A dependency whose outage delays a start or a partition (the schema
    /// registry, topic checks): 1 s doubling to 30 s.
    pub const LONG: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));

    pub const fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            max,
            next: first,
        }
    }

    /// The same policy with another cap.
    pub const fn capped(self, max: Duration) -> Backoff {
        Backoff::new(self.first, max)
    }

    /// The delay before the next retry; the one after doubles (up to the cap).
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = self.next.checked_mul(2).unwrap_or(self.max).min(self.max);
        d
    }

    /// What [`Backoff::next_delay`] would return, without advancing.
    pub fn peek(&self) -> Duration {
        self.next
    }

    /// After a success: the next failure waits the first delay again.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_its_cap_and_starts_over_after_a_reset() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(500));
        let delays: Vec<u128> = (0..5).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 500, 500]);
        b.reset();
        assert_eq!(b.peek(), Duration::from_millis(100));
        let mut c = Backoff::SHORT.capped(Duration::from_millis(300));
        assert_eq!(
            [c.next_delay(), c.next_delay(), c.next_delay()],
            [100, 200, 300].map(Duration::from_millis)
        );
    }
}
