//! A rebalance applied to a loop's partitions: revoked ones dropped,
//! deactivated or stashed as lost; assigned ones taken back, built or
//! resumed.

use super::{Assigned, LostPartitions, RebalanceEvent};
use crate::service::lock;
use crate::service::metrics::Metrics;
use crate::service::partition::Partition;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Applies one rebalance event to the loop's partitions. Revoked ones are
/// dropped (cooperative, handed over), deactivated (eager: the next
/// assignment says which stay) or, lost, put with the instance's
/// [`LostPartitions`]. On assignment, the kept ones are active again (a
/// lost one taken back from there), and those not held before are built by
/// `build` (which restores their saved state once for all of them).
pub(in crate::service) fn apply(
    partitions: &mut BTreeMap<i32, Partition>,
    ev: RebalanceEvent,
    metrics: &Metrics,
    lost_partitions: &Mutex<LostPartitions>,
    build: impl FnOnce(&[Assigned]) -> Vec<Partition>,
) {
    let forget = |partitions: &mut BTreeMap<i32, Partition>, p: i32| forget(partitions, metrics, p);
    match ev {
        RebalanceEvent::Revoked {
            partitions: ps,
            lost: true,
        } => {
            let ps = ps.unwrap_or_else(|| partitions.keys().copied().collect());
            let mut stash = lock(lost_partitions);
            for p in ps {
                if let Some(part) = forget(partitions, p) {
                    stash.put(part);
                }
            }
        }
        RebalanceEvent::Revoked {
            partitions: None, ..
        } => {
            for part in partitions.values_mut() {
                part.active = false;
            }
        }
        RebalanceEvent::Revoked {
            partitions: Some(ps),
            ..
        } => {
            for p in ps {
                forget(partitions, p);
            }
        }
        RebalanceEvent::Assigned { list, incremental } => assign(
            partitions,
            list,
            incremental,
            metrics,
            lost_partitions,
            build,
        ),
    }
}

pub(super) fn forget(
    partitions: &mut BTreeMap<i32, Partition>,
    metrics: &Metrics,
    p: i32,
) -> Option<Partition> {
    metrics.forget_partition(p);
    partitions.remove(&p)
}

/// An assignment (see [`apply`]): lost partitions taken back, the ones not
/// kept dropped (eager), the new ones built, the kept ones resumed.
pub(super) fn assign(
    partitions: &mut BTreeMap<i32, Partition>,
    list: Vec<Assigned>,
    incremental: bool,
    metrics: &Metrics,
    lost_partitions: &Mutex<LostPartitions>,
    build: impl FnOnce(&[Assigned]) -> Vec<Partition>,
) {
    {
        let mut stash = lock(lost_partitions);
        for a in &list {
            match stash.take(a.partition) {
                Some(part) if a.kept && !partitions.contains_key(&a.partition) => {
                    partitions.insert(a.partition, part);
                }
                // Moved on without us, or held here already.
                _ => {}
            }
        }
    }
    let keep: Vec<(i32, Option<i64>)> = list
        .iter()
        .filter(|a| a.kept)
        .map(|a| (a.partition, a.high))
        .collect();
    let kept = |p: &i32| keep.iter().any(|(k, _)| k == p);
    // Eager: the assignment is the whole of it. Cooperative: it adds
    // to the ones held.
    if !incremental {
        let gone: Vec<i32> = partitions.keys().filter(|p| !kept(p)).copied().collect();
        for p in gone {
            forget(partitions, metrics, p);
        }
    }
    let fresh: Vec<Assigned> = list
        .into_iter()
        .filter(|a| !a.kept || !partitions.contains_key(&a.partition))
        .collect();
    if !fresh.is_empty() {
        for part in build(&fresh) {
            partitions.insert(part.id, part);
        }
    }
    for (p, high) in keep {
        if let Some(part) = partitions.get_mut(&p) {
            part.resume_held(high);
        }
    }
}
