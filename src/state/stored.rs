//! A saved machine, in Redis. Two layouts: the *flat* one, every state's
//! data in fields beside a bare state, and the *variant* one, each state's
//! data inside its variant (the machine's shape in memory).
//!
//! The flat layout is what the release before this one reads, and during a
//! rolling upgrade a partition may move from a new instance to an old one:
//! so this release still writes the flat layout, and reads both. A later
//! release can write the variant layout once no release that reads only
//! the flat one runs.

use super::{ChannelState, Incident, Pin, StateMachine};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// A saved machine: the fields both layouts share, and the flat fields
/// only the flat one has (absent in the variant one). Read in either
/// layout; written in the flat one (see [`StoredMachine::from`]).
/// `incident_cooldown_ms` is a field the release before reads as required
/// (and uses for nothing): written as the cool-down while DRAINED, else 0.
#[derive(Serialize, Deserialize)]
pub(super) struct StoredMachine {
    state: StoredState,
    penalty: f64,
    penalty_at_ms: i64,
    #[serde(default)]
    incident_cooldown_ms: i64,
    pin: Option<Pin>,
    #[serde(default)]
    readmitted_at_ms: Option<i64>,
    #[serde(default)]
    relapses: VecDeque<i64>,
    #[serde(default)]
    relapse_penalty: f64,
    #[serde(default)]
    relapse_decay_from_ms: Option<i64>,
    #[serde(default)]
    oscillation_raised: bool,
    #[serde(default)]
    oscillation_due: Option<u32>,
    #[serde(flatten)]
    flat: FlatFields,
}

/// The flat layout's per-state data, kept beside the state.
#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct FlatFields {
    over_at_risk: u32,
    over_drain: u32,
    under_exit: u32,
    incident_since_ms: i64,
    penalty_before_incident: f64,
    probation_since_ms: i64,
    intermittent_relapses: u32,
    intermittent_clean_ms: i64,
    sustained_relapse: bool,
    intermittent_drain: bool,
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum StoredState {
    Current(ChannelState),
    Flat(FlatState),
}

/// The flat layout's state: the variants without their data.
#[derive(Serialize, Deserialize)]
enum FlatState {
    Healthy,
    AtRisk {
        since_ms: i64,
    },
    Drained {
        since_ms: i64,
        until_ms: i64,
    },
    Observing {
        since_ms: i64,
        passes: u32,
    },
    Recovering {
        since_ms: i64,
        weight: f64,
        next_step_ms: i64,
    },
}

impl FlatFields {
    fn incident(&self) -> Incident {
        Incident {
            since_ms: self.incident_since_ms,
            penalty_before: self.penalty_before_incident,
            intermittent_relapses: self.intermittent_relapses,
            intermittent_clean_ms: self.intermittent_clean_ms,
            sustained_relapse: self.sustained_relapse,
            intermittent_drain: self.intermittent_drain,
        }
    }

    /// The state with its data moved into the variant.
    fn into_state(self, state: FlatState) -> ChannelState {
        let incident = self.incident();
        match state {
            FlatState::Healthy => ChannelState::Healthy {
                over_at_risk: self.over_at_risk,
                over_drain: self.over_drain,
            },
            FlatState::AtRisk { since_ms } => ChannelState::AtRisk {
                since_ms,
                over_drain: self.over_drain,
                under_exit: self.under_exit,
            },
            FlatState::Drained { since_ms, until_ms } => ChannelState::Drained {
                since_ms,
                until_ms,
                incident,
            },
            FlatState::Observing { since_ms, passes } => ChannelState::Observing {
                since_ms,
                passes,
                incident,
            },
            FlatState::Recovering {
                since_ms,
                weight,
                next_step_ms,
            } => ChannelState::Recovering {
                since_ms,
                weight,
                next_step_ms,
                probation_since_ms: self.probation_since_ms,
                incident,
            },
        }
    }
}

impl From<StoredMachine> for StateMachine {
    fn from(s: StoredMachine) -> StateMachine {
        let state = match s.state {
            StoredState::Current(state) => state,
            StoredState::Flat(state) => s.flat.into_state(state),
        };
        StateMachine {
            state,
            penalty: s.penalty,
            penalty_at_ms: s.penalty_at_ms,
            pin: s.pin,
            readmitted_at_ms: s.readmitted_at_ms,
            relapses: s.relapses,
            relapse_penalty: s.relapse_penalty,
            relapse_decay_from_ms: s.relapse_decay_from_ms,
            oscillation_raised: s.oscillation_raised,
            oscillation_due: s.oscillation_due,
        }
    }
}

impl From<StateMachine> for StoredMachine {
    /// The flat layout.
    fn from(m: StateMachine) -> StoredMachine {
        let mut flat = FlatFields::default();
        if let Some(i) = m.incident() {
            flat.incident_since_ms = i.since_ms;
            flat.penalty_before_incident = i.penalty_before;
            flat.intermittent_relapses = i.intermittent_relapses;
            flat.intermittent_clean_ms = i.intermittent_clean_ms;
            flat.sustained_relapse = i.sustained_relapse;
            flat.intermittent_drain = i.intermittent_drain;
        }
        let mut incident_cooldown_ms = 0;
        let state = match m.state {
            ChannelState::Healthy {
                over_at_risk,
                over_drain,
            } => {
                flat.over_at_risk = over_at_risk;
                flat.over_drain = over_drain;
                FlatState::Healthy
            }
            ChannelState::AtRisk {
                since_ms,
                over_drain,
                under_exit,
            } => {
                flat.over_drain = over_drain;
                flat.under_exit = under_exit;
                FlatState::AtRisk { since_ms }
            }
            ChannelState::Drained {
                since_ms, until_ms, ..
            } => {
                incident_cooldown_ms = until_ms - since_ms;
                FlatState::Drained { since_ms, until_ms }
            }
            ChannelState::Observing {
                since_ms, passes, ..
            } => {
                flat.probation_since_ms = since_ms;
                FlatState::Observing { since_ms, passes }
            }
            ChannelState::Recovering {
                since_ms,
                weight,
                next_step_ms,
                probation_since_ms,
                ..
            } => {
                flat.probation_since_ms = probation_since_ms;
                FlatState::Recovering {
                    since_ms,
                    weight,
                    next_step_ms,
                }
            }
        };
        StoredMachine {
            state: StoredState::Flat(state),
            flat,
            penalty: m.penalty,
            penalty_at_ms: m.penalty_at_ms,
            incident_cooldown_ms,
            pin: m.pin,
            readmitted_at_ms: m.readmitted_at_ms,
            relapses: m.relapses,
            relapse_penalty: m.relapse_penalty,
            relapse_decay_from_ms: m.relapse_decay_from_ms,
            oscillation_raised: m.oscillation_raised,
            oscillation_due: m.oscillation_due,
        }
    }
}
