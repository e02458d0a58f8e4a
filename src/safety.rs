//! Group-level safety (docs/decisions.md#safety-rails): Hermes must never make an outage worse.
//!
//! Draining helps when traffic can go somewhere better: a channel is drained
//! when it is worse than its peers, or fails hard, while a healthy
//! alternative has room for what it carries. When everything that could
//! take the traffic is about as bad (the model overloaded everywhere, the
//! gateways' own egress sick, a network blip), there is nowhere better to
//! go: draining would only shed what the sick channels still serve, and
//! cool-downs and probations would keep them out long after the common
//! cause ended. That is a *correlated failure*, Envoy's panic mode.
//!
//! # The rule
//! At every evaluation tick, per route group, a channel is *bad* when its
//! score is at or above its `at_risk_enter`, or when its current incident
//! (a drain) began within `safety.correlation_window_ms`; it is *healthy*
//! otherwise. The group is in panic when all of these hold (pinned channels
//! are the operator's and left out):
//! - at least `safety.panic_min_channels` channels are bad, carrying at
//!   least `safety.panic_threshold` of the group's declared capacity: a
//!   precondition only, the share never decides alone;
//! - the healthy channels have no room for the traffic that would move: their
//!   spare capacity (`capacity × schedule.capacity_headroom` less the load
//!   they carry) is below the load the bad channels carry (or carried until
//!   drained, over the demand window). A healthy channel with room for it
//!   means draining helps, whatever share of the group looks degraded: two
//!   dead channels of three are drained when the third can take their
//!   traffic, and a second channel failing after a first was drained is
//!   judged on its own evidence.
//!
//! Panic ends after `safety.panic_exit_evaluations` consecutive ticks
//! without that.
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
    /// Requests per second the channel carries (its demand over the demand
    /// window); read only when [`may_panic`] holds.
    pub load_rps: f64,
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

/// Whether the share rule allows panic at all (the first condition of the
/// rule): enough bad channels carrying enough of the capacity. A caller
/// may skip measuring loads when it does not hold.
pub fn may_panic(peers: &[PeerHealth], cfg: &SafetyConfig) -> bool {
    let (bad_share, bad_channels) = bad_capacity(peers);
    cfg.enabled
        && bad_channels >= cfg.panic_min_channels as usize
        && bad_share >= cfg.panic_threshold
}

/// The traffic on bad channels that would move, and the room the healthy
/// ones have for it (rps, unpinned channels only).
pub fn displaced_and_room(peers: &[PeerHealth], headroom: f64) -> (f64, f64) {
    let (mut displaced, mut room) = (0.0, 0.0);
    for p in peers.iter().filter(|p| !p.pinned) {
        let load = p.load_rps.max(0.0);
        if p.bad {
            displaced += load;
        } else {
            room += (p.capacity_rps.max(0.0) * headroom - load).max(0.0);
        }
    }
    (displaced, room)
}

/// What changed at one tick.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SafetyChange {
    Entered {
        bad_share: f64,
        bad_channels: usize,
        /// The load on the bad channels (rps) and the healthy channels'
        /// room for it.
        displaced_rps: f64,
        room_rps: f64,
    },
    Ended {
        lasted_ms: i64,
    },
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

    /// Updates the group's state from its channels at tick `now_ms`;
    /// `headroom` is `schedule.capacity_headroom`.
    pub fn update(
        &mut self,
        now_ms: i64,
        peers: &[PeerHealth],
        cfg: &SafetyConfig,
        headroom: f64,
    ) -> Option<SafetyChange> {
        let (bad_share, bad_channels) = bad_capacity(peers);
        let (displaced_rps, room_rps) = displaced_and_room(peers, headroom);
        let correlated = may_panic(peers, cfg) && room_rps < displaced_rps;
        match self.panic_since_ms {
            None if correlated => {
                self.panic_since_ms = Some(now_ms);
                self.clear_ticks = 0;
                Some(SafetyChange::Entered {
                    bad_share,
                    bad_channels,
                    displaced_rps,
                    room_rps,
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

    const HEADROOM: f64 = 0.8;

    /// A channel carrying a tenth of its capacity.
    fn peer(cap: f64, bad: bool) -> PeerHealth {
        loaded(cap, cap / 10.0, bad)
    }

    fn loaded(cap: f64, load: f64, bad: bool) -> PeerHealth {
        PeerHealth {
            capacity_rps: cap,
            load_rps: load,
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
        assert_eq!(g.update(0, &peers, &cfg, HEADROOM), None);
        assert!(!g.in_panic());
    }

    #[test]
    fn most_of_the_capacity_bad_with_no_room_elsewhere_is_correlated_and_ends_with_hysteresis() {
        let cfg = SafetyConfig::default();
        let mut g = GroupSafety::default();
        // The healthy channel has room for 5 rps; the bad ones carry 30.
        let sick = [
            loaded(40.0, 12.0, true),
            loaded(60.0, 18.0, true),
            loaded(50.0, 35.0, false),
        ];
        assert_eq!(
            g.update(0, &sick, &cfg, HEADROOM),
            Some(SafetyChange::Entered {
                bad_share: 100.0 / 150.0,
                bad_channels: 2,
                displaced_rps: 30.0,
                room_rps: 5.0,
            })
        );
        let well = [peer(40.0, false), peer(60.0, false), peer(50.0, false)];
        for i in 1..cfg.panic_exit_evaluations {
            assert_eq!(
                g.update(i as i64 * 5_000, &well, &cfg, HEADROOM),
                None,
                "tick {i}"
            );
            assert!(g.in_panic());
        }
        // A bad tick in between restarts the exit count.
        assert_eq!(g.update(99_000, &sick, &cfg, HEADROOM), None);
        let mut ended = None;
        for i in 0..cfg.panic_exit_evaluations {
            ended = g.update(100_000 + i as i64 * 5_000, &well, &cfg, HEADROOM);
        }
        assert!(matches!(ended, Some(SafetyChange::Ended { .. })));
        assert!(!g.in_panic());
    }

    #[test]
    fn most_of_a_group_down_is_a_channel_fault_when_a_healthy_channel_has_room() {
        let cfg = SafetyConfig::default();
        let mut g = GroupSafety::default();
        // Two of three dead, 57 % of the capacity: the third can carry the
        // 20 rps they held (75 × 0.8 − 10 = 50 rps of room).
        let peers = [
            loaded(40.0, 8.0, true),
            loaded(60.0, 12.0, true),
            loaded(75.0, 10.0, false),
        ];
        assert!(may_panic(&peers, &cfg), "the share alone would say panic");
        assert_eq!(g.update(0, &peers, &cfg, HEADROOM), None);
        assert!(!g.in_panic());
    }

    #[test]
    fn everything_bad_is_correlated_whatever_the_capacity() {
        let cfg = SafetyConfig::default();
        let mut g = GroupSafety::default();
        let peers = [peer(40.0, true), peer(60.0, true), peer(400.0, true)];
        assert!(matches!(
            g.update(0, &peers, &cfg, HEADROOM),
            Some(SafetyChange::Entered { room_rps, .. }) if room_rps == 0.0
        ));
    }

    #[test]
    fn pinned_channels_do_not_count_and_disabled_means_never() {
        let mut cfg = SafetyConfig::default();
        let mut g = GroupSafety::default();
        let mut pinned = peer(100.0, true);
        pinned.pinned = true;
        let peers = [pinned, peer(10.0, true), peer(90.0, false)];
        assert_eq!(bad_capacity(&peers), (0.1, 1));
        assert_eq!(g.update(0, &peers, &cfg, HEADROOM), None);
        cfg.enabled = false;
        assert_eq!(
            g.update(0, &[peer(1.0, true), peer(1.0, true)], &cfg, HEADROOM),
            None
        );
    }
}
