//! The engine's vocabulary: why an event was not applied, what became of
//! one, a channel looked up ahead, one channel's reading, the counters the
//! shell exports.

use super::ChannelIdx;
use crate::health::ChannelHealth;
use crate::score::Score;
use crate::signals::Signals;
use crate::state::StateMachine;

/// Why an event was not applied. Each is counted in [`EngineStats`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApplyError {
    #[error("unknown channel `{channel}`")]
    UnknownChannel { channel: String },
    #[error("channel `{channel}` belongs to group `{expected}`, event says `{got}`")]
    GroupMismatch {
        channel: String,
        expected: String,
        got: String,
    },
    #[error("event is {lag_ms} ms behind the watermark, past the allowed lateness")]
    TooLate { lag_ms: i64 },
    #[error(
        "event is stamped {ahead_ms} ms ahead of {reference}, past the allowed clock skew \
         (engine.max_clock_skew_ms)"
    )]
    FutureTimestamp {
        ahead_ms: i64,
        reference: &'static str,
    },
    #[error("{field} is {value}, over the plausible {limit} (engine.{key})")]
    Implausible {
        field: &'static str,
        value: i64,
        limit: i64,
        key: &'static str,
    },
}

impl ApplyError {
    /// Bounded metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            ApplyError::UnknownChannel { .. } => "unknown_channel",
            ApplyError::GroupMismatch { .. } => "group_mismatch",
            ApplyError::TooLate { .. } => "too_late",
            ApplyError::FutureTimestamp { .. } => "future_timestamp",
            ApplyError::Implausible { .. } => "implausible",
        }
    }
}

/// An event's channel looked up ahead of its apply
/// ([`Engine::prefetch_entry`](super::Engine::prefetch_entry)), so a batch looks each channel up once.
/// Taken only by the engine it came from, with its channels unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelHint {
    pub(super) generation: u64,
    pub(super) idx: ChannelIdx,
}

/// One channel as of the last evaluation ([`Engine::reading`](super::Engine::reading)).
#[derive(Debug)]
pub struct ChannelReading<'a> {
    pub health: ChannelHealth,
    pub machine: &'a StateMachine,
    pub signals: &'a Signals,
    /// The windows' score and its breakdown (`None` before the first).
    pub score: Option<&'a Score>,
    /// See [`Engine::latency_median`](super::Engine::latency_median).
    pub latency_median_ms: Option<f64>,
}

/// What became of a live event ([`Engine::apply_live_once`](super::Engine::apply_live_once)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    /// Recorded in its channel's windows.
    Applied,
    /// Already seen, by the caller's memory: not applied again.
    Duplicate,
}

/// Counters the shell exports as metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub applied: u64,
    pub too_late: u64,
    pub unknown_channel: u64,
    pub group_mismatch: u64,
    pub evaluations: u64,
    /// Events refused as stamped too far ahead (`clock`).
    pub future_timestamp: u64,
    /// Applied events that reported an unsent request (demand only).
    pub unsent: u64,
}

/// A channel's consecutive-failure counts after an event.
#[derive(Debug, Clone, Copy)]
pub(super) struct Streaks {
    /// The hard-failure streak grew with this event.
    pub(super) grew: bool,
    pub(super) failures: u32,
    /// Consecutive hard-failed probes.
    pub(super) probes: u32,
}
