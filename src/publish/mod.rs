//! Weight snapshots: what Hermes writes to Redis and gateways read (docs/decisions.md#alerts-and-pages).
//!
//! One key per route group, `hermes:{GROUP}:weights`, holds the whole
//! snapshot as JSON: every class's weights and shed share, every channel's
//! state, score and reason, the plan `version`, the writer `epoch`,
//! `computed_at_ms` (event time of the plan) and `heartbeat_ms` (refreshed
//! periodically so gateways can tell stable from stale). The braces are Redis
//! Cluster hash tags: the key and anything else of the group hash to one slot.
//! There is no TTL: stale beats empty.
//!
//! Every write goes through [`FENCED_WRITE_LUA`], which refuses a snapshot
//! older (by epoch, then version) than the stored one: a zombie writer that
//! lost its partitions cannot overwrite a newer writer. A new version is
//! followed by `PUBLISH hermes:{GROUP}:changed <version>`.
//!
//! This module is pure (encoding and the fencing rule); key names and the
//! scripts are in [`crate::redis_keys`], the Redis I/O in [`redis`].

pub mod redis;

pub use crate::redis_keys::{
    changed_channel, epoch_key, snapshot_key, FENCED_WRITE_LUA, TAKE_EPOCH_LUA,
};

use crate::schedule::Plan;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One traffic class's routing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassWeights {
    /// Channel id → weight; sums to 1 unless the class is fully shed.
    pub weights: BTreeMap<String, f64>,
    /// Share of this class's requests to shed or queue.
    pub shed: f64,
}

/// One channel as operators read it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChannelStatus {
    pub state: String,
    pub score: Option<f64>,
    /// Why it got its share (`schedule::ShareReason`).
    pub reason: String,
    pub planned_rps: f64,
    /// The score's largest contributions, largest first (for people).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signals: Vec<(String, f64)>,
}

/// The whole routing decision of one group, as stored in Redis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightSnapshot {
    pub group: String,
    /// Plan version; grows whenever the routing changes.
    pub version: u64,
    /// Writer epoch; a new group writer (after a rebalance) takes a higher one.
    pub epoch: u64,
    /// Event time the plan was computed at.
    pub computed_at_ms: i64,
    /// Wall time of the last write or refresh by the writer.
    pub heartbeat_ms: i64,
    /// The group is in manual mode (weights frozen by an operator).
    pub manual: bool,
    /// The group is in panic mode (a correlated failure: health does not
    /// route, docs/decisions.md#safety-rails) since this event time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub panic_since_ms: Option<i64>,
    pub projected_spend_per_hour: f64,
    /// Class name (`INTERACTIVE`, ...) → routing.
    pub classes: BTreeMap<String, ClassWeights>,
    /// Channel id → status.
    pub channels: BTreeMap<String, ChannelStatus>,
}

impl WeightSnapshot {
    /// The snapshot of a plan, for a writer at `epoch`.
    pub fn from_plan(plan: &Plan, epoch: u64, heartbeat_ms: i64) -> WeightSnapshot {
        WeightSnapshot {
            group: plan.group.clone(),
            version: plan.version,
            epoch,
            computed_at_ms: plan.computed_at_ms,
            heartbeat_ms,
            manual: plan.manual,
            panic_since_ms: plan.panic_since_ms,
            projected_spend_per_hour: plan.projected_spend_per_hour,
            classes: plan
                .classes
                .iter()
                .map(|c| {
                    (
                        c.class.as_str().to_string(),
                        ClassWeights {
                            weights: c.weights.iter().cloned().collect(),
                            shed: c.shed,
                        },
                    )
                })
                .collect(),
            channels: plan
                .channels
                .iter()
                .map(|c| {
                    (
                        c.id.clone(),
                        ChannelStatus {
                            state: c.state.as_str().to_string(),
                            score: c.score,
                            reason: c.reason.as_str().to_string(),
                            planned_rps: c.planned_rps,
                            signals: c.signals.clone(),
                        },
                    )
                })
                .collect(),
        }
    }

    /// Whether `self` is older than `other` by (epoch, version).
    pub fn is_older_than(&self, other: &WeightSnapshot) -> bool {
        (self.epoch, self.version) < (other.epoch, other.version)
    }

    /// The ranges `schemas/weight_snapshot.schema.json` sets that JSON
    /// parsing alone does not check: a reader refuses a snapshot that fails
    /// here rather than route by it.
    pub fn check(&self) -> Result<(), String> {
        let unit = |x: f64| (0.0..=1.0).contains(&x);
        let non_negative = |x: f64| (0.0..=f64::MAX).contains(&x);
        if self.group.is_empty() {
            return Err("group: empty".into());
        }
        if self.epoch < 1 {
            return Err("epoch: below 1".into());
        }
        if !non_negative(self.projected_spend_per_hour) {
            return Err("projected_spend_per_hour: not a non-negative number".into());
        }
        for (class, c) in &self.classes {
            if !crate::event::TrafficClass::ALL
                .iter()
                .any(|k| k.as_str() == class)
            {
                return Err(format!("classes/{class}: not a traffic class"));
            }
            if !unit(c.shed) {
                return Err(format!("classes/{class}/shed: {} not in [0, 1]", c.shed));
            }
            if let Some((ch, w)) = c.weights.iter().find(|(_, w)| !unit(**w)) {
                return Err(format!("classes/{class}/weights/{ch}: {w} not in [0, 1]"));
            }
        }
        for (id, c) in &self.channels {
            if c.score.is_some_and(|s| !unit(s)) || !non_negative(c.planned_rps) {
                return Err(format!("channels/{id}: score or planned_rps out of range"));
            }
        }
        Ok(())
    }
}

/// What a fenced write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// A new version was stored and announced.
    Written,
    /// The same version's heartbeat was refreshed.
    Heartbeat,
    /// Nothing to do: same version, heartbeat not newer.
    Unchanged,
    /// Refused: the stored snapshot is newer (a zombie writer).
    Stale {
        stored_epoch: u64,
        stored_version: u64,
    },
}

impl WriteOutcome {
    /// Interprets the script's reply.
    pub fn from_reply(
        outcome: &str,
        stored_epoch: u64,
        stored_version: u64,
    ) -> Option<WriteOutcome> {
        Some(match outcome {
            "written" => WriteOutcome::Written,
            "heartbeat" => WriteOutcome::Heartbeat,
            "unchanged" => WriteOutcome::Unchanged,
            "stale" => WriteOutcome::Stale {
                stored_epoch,
                stored_version,
            },
            _ => return None,
        })
    }
}

/// What the fenced write does with `new` given the epoch last taken and the
/// `stored` snapshot: the
/// same decision [`FENCED_WRITE_LUA`] makes in Redis, for the in-process
/// store (the embedded demo) and as its executable specification.
pub fn fenced_outcome(
    taken_epoch: u64,
    stored: Option<&WeightSnapshot>,
    new: &WeightSnapshot,
) -> WriteOutcome {
    if new.epoch < taken_epoch {
        return WriteOutcome::Stale {
            stored_epoch: taken_epoch,
            stored_version: 0,
        };
    }
    let Some(cur) = stored else {
        return WriteOutcome::Written;
    };
    if new.is_older_than(cur) {
        return WriteOutcome::Stale {
            stored_epoch: cur.epoch,
            stored_version: cur.version,
        };
    }
    if (new.epoch, new.version) == (cur.epoch, cur.version) {
        return if new.heartbeat_ms > cur.heartbeat_ms {
            WriteOutcome::Heartbeat
        } else {
            WriteOutcome::Unchanged
        };
    }
    WriteOutcome::Written
}

/// Weight snapshots kept in process, with the same fencing and epochs as
/// Redis: the embedded demo's store when no Redis is given.
#[derive(Default)]
pub struct InProcessStore {
    groups: std::sync::Mutex<BTreeMap<String, (u64, Option<WeightSnapshot>)>>,
}

impl InProcessStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (u64, Option<WeightSnapshot>)>> {
        self.groups.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next writer epoch of a group and the stored snapshot.
    pub fn take_epoch(&self, group: &str) -> (u64, Option<WeightSnapshot>) {
        let mut g = self.lock();
        let e = g.entry(group.to_string()).or_default();
        e.0 += 1;
        (e.0, e.1.clone())
    }

    /// The fenced write.
    pub fn write(&self, snap: &WeightSnapshot) -> WriteOutcome {
        let mut g = self.lock();
        let e = g.entry(snap.group.clone()).or_default();
        let outcome = fenced_outcome(e.0, e.1.as_ref(), snap);
        if matches!(outcome, WriteOutcome::Written | WriteOutcome::Heartbeat) {
            e.1 = Some(snap.clone());
        }
        outcome
    }

    /// The stored snapshot of a group (one read, like the gateway's GET).
    pub fn get(&self, group: &str) -> Option<WeightSnapshot> {
        self.lock().get(group).and_then(|e| e.1.clone())
    }
}

/// A connection URL with any password replaced, for logs.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://***@{}", &url[..scheme_end], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(epoch: u64, version: u64, heartbeat_ms: i64) -> WeightSnapshot {
        WeightSnapshot {
            group: "chat".into(),
            version,
            epoch,
            computed_at_ms: 0,
            heartbeat_ms,
            manual: false,
            panic_since_ms: None,
            projected_spend_per_hour: 0.0,
            classes: BTreeMap::new(),
            channels: BTreeMap::new(),
        }
    }

    #[test]
    fn the_in_process_store_fences_like_the_lua_script() {
        let st = InProcessStore::default();
        let (e1, none) = st.take_epoch("chat");
        assert_eq!((e1, none), (1, None));
        assert_eq!(st.write(&snap(1, 1, 10)), WriteOutcome::Written);
        assert_eq!(st.write(&snap(1, 1, 20)), WriteOutcome::Heartbeat);
        assert_eq!(st.write(&snap(1, 1, 20)), WriteOutcome::Unchanged);
        let (e2, stored) = st.take_epoch("chat");
        assert_eq!((e2, stored.map(|s| s.version)), (2, Some(1)));
        // Fenced as soon as the epoch is taken, before the new writer writes.
        let fenced = WriteOutcome::Stale {
            stored_epoch: 2,
            stored_version: 0,
        };
        assert_eq!(st.write(&snap(1, 2, 25)), fenced);
        assert_eq!(st.write(&snap(2, 2, 30)), WriteOutcome::Written);
        // The old writer is refused, whatever its version.
        assert_eq!(st.write(&snap(1, 9, 40)), fenced);
        assert_eq!(st.get("chat").map(|s| (s.epoch, s.version)), Some((2, 2)));
    }
    use crate::config::Tier;
    use crate::schedule::{plan, ChannelInput, GroupInput};
    use crate::state::StateKind;

    fn a_plan() -> Plan {
        let cfg = crate::config::Config::single_group("chat", &[("free-a", Tier::Free, 0.0, 50.0)]);
        let ch = |id: &str, w: f64| ChannelInput {
            id: id.into(),
            state: StateKind::Healthy,
            health_weight: 1.0,
            pinned: false,
            score: Some(0.1),
            signals: Vec::new(),
            price_per_1k_tokens: 0.0,
            capacity_rps: 50.0,
            initial_weight: w,
            quota_remaining: None,
            quota_exhausted_in_ms: None,
            tokens_per_request: None,
            failure_rate: None,
            failure_streak: 0,
            half_open_share: 0.05,
        };
        let input = GroupInput {
            group: "chat".into(),
            now_ms: 42,
            channels: vec![ch("free-a", 0.3), ch("paid-a", 0.7)],
            demand_rps: [1.0; 4],
            budget_per_hour: None,
            horizon_ms: 3_600_000,
            warm: true,
            panic_since_ms: None,
            spend_calibration: 1.0,
        };
        plan(&input, &cfg.classes, &cfg.schedule, None, false)
    }

    #[test]
    fn keys_carry_the_cluster_hash_tag() {
        assert_eq!(snapshot_key("chat"), "hermes:{chat}:weights");
        assert_eq!(changed_channel("chat"), "hermes:{chat}:changed");
    }

    #[test]
    fn snapshot_of_a_plan_round_trips_as_json() {
        let s = WeightSnapshot::from_plan(&a_plan(), 3, 1000);
        assert_eq!((s.epoch, s.version, s.computed_at_ms), (3, 1, 42));
        let w = &s.classes["INTERACTIVE"].weights;
        assert!((w["free-a"] - 0.3).abs() < 1e-9 && (w["paid-a"] - 0.7).abs() < 1e-9);
        assert_eq!(s.channels["free-a"].state, "HEALTHY");
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<WeightSnapshot>(&json).unwrap(), s);
    }

    #[test]
    fn ordering_is_by_epoch_then_version() {
        let mut a = WeightSnapshot::from_plan(&a_plan(), 2, 0);
        let mut b = a.clone();
        b.version = 9;
        assert!(a.is_older_than(&b));
        a.epoch = 3;
        assert!(b.is_older_than(&a));
    }

    #[test]
    fn passwords_never_reach_logs() {
        assert_eq!(
            redact_url("redis://user:s3cret@127.0.0.1:6379/0"),
            "redis://***@127.0.0.1:6379/0"
        );
        assert_eq!(
            redact_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
    }
}
