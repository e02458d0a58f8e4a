//! Readiness: which dependency each request loop last found down, and the
//! one answer `/readyz` gives for the instance.

use crate::service::lock;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

/// A dependency `/readyz` reports on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Dependency {
    /// The request consumer's brokers (librdkafka's statistics: a broker up).
    Kafka,
    /// The health topic the group writers read.
    HealthTopic,
    /// Redis, for snapshots and saved state.
    Redis,
    /// The Schema Registry (a partition waits at a record it cannot decode
    /// without it).
    SchemaRegistry,
    /// Hermes' four topics exist.
    Topics,
}

impl Dependency {
    pub fn as_str(self) -> &'static str {
        match self {
            Dependency::Kafka => "kafka",
            Dependency::HealthTopic => "health_topic",
            Dependency::Redis => "redis",
            Dependency::SchemaRegistry => "schema_registry",
            Dependency::Topics => "topics",
        }
    }
}

/// Each dependency's last known problem, and the request loop's progress.
/// A dependency never seen failing counts as fine: readiness says what is
/// known to be wrong, with the reason.
#[derive(Default)]
pub struct Readiness {
    pub(super) problems: Mutex<BTreeMap<Dependency, String>>,
    /// Every dependency checked at least once (`hermes_up` lists these).
    pub(super) seen: Mutex<std::collections::BTreeSet<Dependency>>,
    /// The request loop received an assignment (possibly empty).
    pub(super) assigned: std::sync::atomic::AtomicBool,
    /// Owned partitions still replaying or catching up, per request loop.
    pub(super) catching_up: Mutex<BTreeMap<usize, u32>>,
    /// A dependency each request loop checks for itself (its consumer's
    /// brokers): the problem each loop last saw.
    pub(super) per_lane: Mutex<BTreeMap<(Dependency, usize), String>>,
}

impl Readiness {
    /// Records a dependency's state: `Some(problem)` or fine. Logs once
    /// per change (a dependency that stays down is not a log line per
    /// retry). `target` names the address tried.
    pub fn set(&self, dep: Dependency, target: &str, problem: Option<String>) {
        lock(&self.seen).insert(dep);
        let mut problems = lock(&self.problems);
        match problem {
            Some(p) => {
                if problems.get(&dep) != Some(&p) {
                    tracing::warn!(dependency = dep.as_str(), %target, problem = %p, "dependency unavailable; retrying");
                    problems.insert(dep, p);
                }
            }
            None => {
                if problems.remove(&dep).is_some() {
                    tracing::info!(dependency = dep.as_str(), %target, "dependency available again");
                }
            }
        }
    }

    /// [`Readiness::set`] for a dependency every request loop checks on
    /// its own: it is down while any loop sees it down (one loop's
    /// consumer reconnected says nothing of another's), with the first
    /// problem, named by its loop but for the first.
    pub fn set_lane(&self, lane: usize, dep: Dependency, target: &str, problem: Option<String>) {
        let combined = {
            let mut lanes = lock(&self.per_lane);
            match problem {
                Some(p) => lanes.insert((dep, lane), p),
                None => lanes.remove(&(dep, lane)),
            };
            let mut down = lanes.iter().filter(|((d, _), _)| *d == dep);
            down.next().map(|((_, l), p)| match l {
                0 => p.clone(),
                l => format!("request loop {l}: {p}"),
            })
        };
        self.set(dep, target, combined);
    }

    pub fn set_assigned(&self) {
        self.assigned.store(true, Ordering::Relaxed);
    }

    /// Request loop `lane`'s partitions still replaying or catching up.
    pub fn set_catching_up(&self, lane: usize, partitions: u32) {
        lock(&self.catching_up).insert(lane, partitions);
    }

    /// Every dependency checked so far, and whether it was up at its last
    /// check.
    pub fn up(&self) -> Vec<(Dependency, bool)> {
        let problems = lock(&self.problems);
        lock(&self.seen)
            .iter()
            .map(|d| (*d, !problems.contains_key(d)))
            .collect()
    }

    pub fn catching_up(&self) -> u32 {
        lock(&self.catching_up).values().sum()
    }

    /// `Ok` when ready; otherwise every reason it is not.
    pub fn check(&self) -> Result<(), Vec<String>> {
        let mut reasons: Vec<String> = lock(&self.problems)
            .iter()
            .map(|(d, p)| format!("{}: {p}", d.as_str()))
            .collect();
        if !self.assigned.load(Ordering::Relaxed) {
            reasons.push("no partition assignment received yet".into());
        }
        let n = self.catching_up();
        if n > 0 {
            reasons.push(format!("{n} partition(s) still replaying or catching up"));
        }
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(reasons)
        }
    }
}
