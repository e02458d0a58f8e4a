//! Event time that one bad clock cannot move (architecture rule 2).
//!
//! An engine's watermark is the latest event time it accepted; evaluation
//! ticks, cool-downs and windows all run on it. Gateways stamp events with
//! their own clocks, so one wrong clock could drag it anywhere: ten years
//! ahead (every tick up to there evaluated, every other event too late), or
//! an hour ahead (every other gateway's events too late). An event stamped
//! more than `engine.max_clock_skew_ms` ahead is judged against a reference:
//!
//! - **Live** (the service): the wall clock. Further ahead of it than the
//!   skew, the event is refused as `future_timestamp` (the service
//!   dead-letters it with its bytes) and moves nothing.
//! - **Recorded** (replay, the simulator: no wall clock): the watermark
//!   itself. A jump past it is taken only when it is corroborated: an event
//!   of a *second* gateway, or `engine.clock_jump_events` events in a row,
//!   land beyond it too. A real gap in the traffic looks like that; one
//!   gateway with a fast clock, interleaved with the others, does not.
//!   Events refused before the jump is corroborated are `future_timestamp`.
//!
//! The skew may not exceed `engine.allowed_lateness_ms` (validated), so a
//! gateway ahead by less than the skew moves the watermark by less than the
//! lateness, and no other gateway's events become too late.
//!
//! Known limit: with no reference at all (the first event of a replay), the
//! first event sets the watermark, whatever its clock.

/// What a far-ahead event is judged against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reference {
    /// Wall-clock milliseconds (the live service).
    Wall(i64),
    /// The watermark, with jumps corroborated (replay, the simulator).
    Watermark,
}

/// Whether `t_ms` is further ahead of `reference_ms` than `skew_ms`.
pub fn is_ahead(t_ms: i64, reference_ms: i64, skew_ms: i64) -> bool {
    t_ms > reference_ms.saturating_add(skew_ms)
}

/// Corroboration of a jump past the watermark: the gateway of the first
/// event beyond it and how many came in a row.
#[derive(Debug, Clone, Default)]
pub struct JumpGuard {
    first_gateway: Option<Box<str>>,
    in_a_row: u32,
}

impl JumpGuard {
    /// Called for an event beyond the watermark + skew; true once the jump is
    /// corroborated (a second gateway, or `needed` events in a row), which
    /// also clears the guard.
    pub fn corroborated(&mut self, gateway_id: &str, needed: u32) -> bool {
        self.in_a_row += 1;
        let other_gateway = match &self.first_gateway {
            None => {
                self.first_gateway = Some(gateway_id.into());
                false
            }
            Some(g) => &**g != gateway_id,
        };
        if other_gateway || self.in_a_row >= needed {
            self.clear();
            return true;
        }
        false
    }

    /// An event within reach of the watermark ends any candidate jump.
    pub fn clear(&mut self) {
        if self.in_a_row > 0 {
            self.first_gateway = None;
            self.in_a_row = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_gateway_or_a_run_corroborates_a_jump() {
        let mut g = JumpGuard::default();
        assert!(!g.corroborated("gw-fast", 3));
        assert!(!g.corroborated("gw-fast", 3));
        assert!(g.corroborated("gw-b", 3), "another gateway agrees");
        assert!(!g.corroborated("gw-fast", 3), "the guard starts over");
        g.clear();
        assert!(!g.corroborated("gw-a", 3));
        assert!(!g.corroborated("gw-a", 3));
        assert!(g.corroborated("gw-a", 3), "three in a row");
    }

    #[test]
    fn near_the_end_of_time_nothing_overflows() {
        assert!(!is_ahead(i64::MAX, i64::MAX, 10_000));
        assert!(is_ahead(i64::MAX, 0, 10_000));
        assert!(!is_ahead(5, 0, 10));
    }
}
