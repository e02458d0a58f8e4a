//! Group-level safety (SPEC §5a): Hermes must never make an outage worse.
//!
//! Draining helps when one channel is worse than its peers: its traffic moves
//! to channels that serve it. When a large share of a group's capacity
//! degrades *at once* (the model overloaded everywhere, the gateways' own
//! egress sick, a network blip), there is nowhere better to go: draining
//! would only shed what the sick channels still serve, and cool-downs and
//! probations would keep them out long after the common cause ended. That is
//! a *correlated failure*, Envoy's panic threshold.
//!
//! # The rule
//! At every evaluation tick, per route group, a channel is *bad* when its
//! score is at or above its `at_risk_enter`, or when its current incident
//! (a drain) began within `safety.correlation_window_ms`. The group is in
//! panic when at least `safety.panic_min_channels` channels are bad and they
//! carry at least `safety.panic_threshold` of the group's declared capacity
//! (pinned channels are the operator's and left out). Panic ends after
//! `safety.panic_exit_evaluations` consecutive ticks without that.
//!
//! # What panic changes
//! - The state machines move nothing down (no score drain, no AT_RISK, no
//!   fast path) and channels drained within the correlation window are let
//!   back at once, their penalty taken back: the common cause, not them.
//! - The scheduler plans as if every unpinned channel were healthy: the
//!   trust-tier shares within capacity, what static routing would do.
//! - One P1 `CORRELATED_FAILURE` alert for the group when it starts, an INFO
//!   when it ends.
//!
//! When panic ends, every channel is judged on its own again: one that is
//! still sick after the common cause ended is drained as usual.

use crate::config::SafetyConfig;

/// One channel as the group rule sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PeerHealth {
    pub capacity_rps: f64,
    pub bad: bool,
    pub pinned: bool,
}

/// Whether one channel counts as bad for the group rule at tick `now_ms`:
/// its score at or above its `at_risk_enter`, or an incident (a drain) that
/// began within `window_ms`. The engine (from its channels) and the group
/// writer (from health reports) both judge with this.
pub fn is_bad(
    score: Option<f64>,
    at_risk_enter: f64,
    incident_since_ms: Option<i64>,
    now_ms: i64,
    window_ms: i64,
) -> bool {
    score.is_some_and(|s| s >= at_risk_enter)
        || incident_since_ms.is_some_and(|t| t >= now_ms - window_ms)
}

/// The share of unpinned capacity that is bad, and how many channels are.
pub fn bad_capacity(peers: &[PeerHealth]) -> (f64, usize) {
    let (mut total, mut bad, mut n) = (0.0, 0.0, 0);
    for p in peers.iter().filter(|p| !p.pinned) {
        let cap = p.capacity_rps.max(0.0);
        total += cap;
        if p.bad {
            bad += cap;
            n += 1;
        }
    }
    let share = if total > 0.0 { bad / total } else { 0.0 };
    (share, n)
}

/// What changed at one tick.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SafetyChange {
    Entered { bad_share: f64, bad_channels: usize },
    Ended { lasted_ms: i64 },
}

/// One group's panic memory (hysteresis on the way out).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GroupSafety {
    /// `Some(since_ms)` while in panic.
    panic_since_ms: Option<i64>,
    clear_ticks: u32,
}

impl GroupSafety {
    pub fn in_panic(&self) -> bool {
        self.panic_since_ms.is_some()
    }

    /// Updates the group's state from its channels at tick `now_ms`.
    pub fn update(
        &mut self,
        now_ms: i64,
        peers: &[PeerHealth],
        cfg: &SafetyConfig,
    ) -> Option<SafetyChange> {
        let (bad_share, bad_channels) = bad_capacity(peers);
        let correlated = cfg.enabled
            && bad_channels >= cfg.panic_min_channels as usize
            && bad_share >= cfg.panic_threshold;
        match self.panic_since_ms {
            None if correlated => {
                self.panic_since_ms = Some(now_ms);
                self.clear_ticks = 0;
                Some(SafetyChange::Entered {
                    bad_share,
                    bad_channels,
                })
            }
            Some(since) if !correlated => {
                self.clear_ticks += 1;
                if self.clear_ticks >= cfg.panic_exit_evaluations {
                    self.panic_since_ms = None;
                    self.clear_ticks = 0;
                    Some(SafetyChange::Ended {
                        lasted_ms: now_ms - since,
                    })
                } else {
                    None
                }
            }
            Some(_) => {
                self.clear_ticks = 0;
                None
            }
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(cap: f64, bad: bool) -> PeerHealth {
        PeerHealth {
            capacity_rps: cap,
            bad,
            pinned: false,
        }
    }

    #[test]
    fn one_sick_channel_is_a_channel_fault_whatever_its_share() {
        let cfg = SafetyConfig::default();
        let mut g = GroupSafety::default();
        // free-a carries 70 % of the capacity and is alone in being bad.
        let peers = [peer(70.0, true), peer(30.0, false)];
        assert_eq!(g.update(0, &peers, &cfg), None);
        assert!(!g.in_panic());
    }

    #[test]
    fn most_of_the_capacity_bad_at_once_is_correlated_and_ends_with_hysteresis() {
        let cfg = SafetyConfig::default();
        let mut g = GroupSafety::default();
        let sick = [peer(40.0, true), peer(60.0, true), peer(50.0, false)];
        assert_eq!(
            g.update(0, &sick, &cfg),
            Some(SafetyChange::Entered {
                bad_share: 100.0 / 150.0,
                bad_channels: 2
            })
        );
        let well = [peer(40.0, false), peer(60.0, false), peer(50.0, false)];
        for i in 1..cfg.panic_exit_evaluations {
            assert_eq!(g.update(i as i64 * 5_000, &well, &cfg), None, "tick {i}");
            assert!(g.in_panic());
        }
        // A bad tick in between restarts the exit count.
        assert_eq!(g.update(99_000, &sick, &cfg), None);
        let mut ended = None;
        for i in 0..cfg.panic_exit_evaluations {
            ended = g.update(100_000 + i as i64 * 5_000, &well, &cfg);
        }
        assert!(matches!(ended, Some(SafetyChange::Ended { .. })));
        assert!(!g.in_panic());
    }

    #[test]
    fn pinned_channels_do_not_count_and_disabled_means_never() {
        let mut cfg = SafetyConfig::default();
        let mut g = GroupSafety::default();
        let mut pinned = peer(100.0, true);
        pinned.pinned = true;
        let peers = [pinned, peer(10.0, true), peer(90.0, false)];
        assert_eq!(bad_capacity(&peers), (0.1, 1));
        assert_eq!(g.update(0, &peers, &cfg), None);
        cfg.enabled = false;
        assert_eq!(g.update(0, &[peer(1.0, true), peer(1.0, true)], &cfg), None);
    }
}
