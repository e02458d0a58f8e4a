//! Rebalance bookkeeping for the request loop.
//!
//! librdkafka calls `RequestContext::rebalance` between two polls of the
//! loop's thread. On assignment it decides where each new partition starts
//! reading (`plan_assignment`: the replay window by time, else the committed
//! offset, else the beginning) and whether it was ours before; on revocation
//! it flushes the outputs and commits before letting go. What happened is
//! queued as `RebalanceEvent`s in `Shared` for the loop to apply to its
//! partitions (`apply`, in `assignment`), so the loop's own state is never
//! touched from the callback. The statistics callback also lands here:
//! per-partition lag for the metrics, and the fetch high watermarks that
//! idle detection reads.

use super::kafka::OutputProducer;
use super::lock;
use super::metrics::{Dependency, GroupMember, Metrics};
use super::partition::Partition;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::producer::Producer;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::ClientContext;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
mod assignment;
pub(super) use assignment::apply;

pub(super) const BROKER_TIMEOUT: Duration = Duration::from_secs(10);

/// A partition the group gave us, as the rebalance callback prepared it.
#[derive(Debug, Clone)]
pub(super) struct Assigned {
    pub(super) partition: i32,
    /// We held it before this rebalance and resume where we were.
    pub(super) kept: bool,
    /// Offsets below this were handled by a previous owner.
    pub(super) resume_at: i64,
    /// High watermark at assignment: reporting starts once past it. `None`:
    /// the broker did not say; the first fetch report will (a partition is
    /// never taken as caught up on a guess).
    pub(super) high: Option<i64>,
    /// First offset this assignment reads.
    pub(super) start: i64,
}

#[derive(Debug)]
pub(super) enum RebalanceEvent {
    /// `incremental`: added to the current assignment (cooperative);
    /// otherwise the whole new assignment (eager).
    Assigned {
        list: Vec<Assigned>,
        incremental: bool,
    },
    /// `partitions`: `Some` these (cooperative), `None` all (eager).
    /// `lost`: taken away by the group rather than handed over; the loop
    /// keeps what it built for them until the next assignment says whether
    /// they come back (see [`Held::lost`]).
    Revoked {
        partitions: Option<Vec<i32>>,
        lost: bool,
    },
}

/// Where the loop was in a partition when it was revoked, for the next
/// assignment to resume there if the partition comes back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Held {
    pub(super) position: i64,
    /// The group took it away without a rebalance (a session timeout, the
    /// coordinator gone): another member may have owned it since, so it
    /// is resumed only if nobody committed past `position`.
    pub(super) lost: bool,
}

/// Partitions the group took from one of this instance's request loops
/// without a rebalance (a lost assignment: the broker away past the
/// session timeout), as that loop left them. Whichever of the instance's
/// loops the group gives one back to resumes it, rather than rebuilding it
/// from the saved state and applying the events since the last commit a
/// second time, if nobody committed past where it was. Kept for at most
/// the replay window: after that a rebuild is as good.
#[derive(Default)]
pub struct LostPartitions {
    held: HashMap<i32, (Partition, Instant)>,
}

impl LostPartitions {
    /// Where the engine of lost partition `p` resumes reading.
    pub(super) fn position(&self, p: i32) -> Option<i64> {
        self.held.get(&p).map(|(part, _)| part.next_offset())
    }

    fn put(&mut self, part: Partition) {
        self.held.insert(part.id, (part, Instant::now()));
    }

    fn take(&mut self, p: i32) -> Option<Partition> {
        self.held.remove(&p).map(|(part, _)| part)
    }

    /// Drops what was lost longer ago than `keep`.
    pub(super) fn expire(&mut self, keep: Duration) {
        self.held.retain(|_, (_, at)| at.elapsed() < keep);
    }
}

#[derive(Default)]
pub(super) struct Shared {
    /// The partitions held when they were last revoked (eager), or lost
    /// (either protocol), until the next assignment.
    pub(super) positions: HashMap<i32, Held>,
    /// Per partition: the high watermark of the last fetch response, from
    /// librdkafka's statistics, and when it was reported.
    pub(super) high_watermarks: HashMap<i32, (i64, Instant)>,
    /// The last statistics report with no broker connection up: gateways
    /// may hold events queued since then (see `service.outage_grace_ms`).
    pub(super) broker_down_at: Option<Instant>,
    pub(super) events: Vec<RebalanceEvent>,
}

impl Shared {
    /// Whether a pending revocation names partition `p` (or all): records
    /// of it that were polled but not handled before it are no longer this
    /// instance's. Their offsets were not stored, so the revocation's
    /// commit left them to the next owner.
    pub(super) fn revokes(&self, p: i32) -> bool {
        self.events.iter().any(|e| match e {
            RebalanceEvent::Revoked {
                partitions: None, ..
            } => true,
            RebalanceEvent::Revoked {
                partitions: Some(list),
                ..
            } => list.contains(&p),
            RebalanceEvent::Assigned { .. } => false,
        })
    }

    pub(super) fn rebalance_pending(&self) -> bool {
        !self.events.is_empty()
    }
}

/// Prepares offsets on assignment (replay start) and commits on revocation.
pub(super) struct RequestContext {
    /// Which of the instance's request loops (each its own consumer).
    pub(super) lane: usize,
    /// `kafka.brokers`, for readiness reports.
    pub(super) brokers: String,
    pub(super) topic: String,
    pub(super) replay_ms: i64,
    pub(super) shared: Arc<Mutex<Shared>>,
    /// The instance's lost partitions (shared by its request loops).
    pub(super) lost: Arc<Mutex<LostPartitions>>,
    pub(super) producer: Arc<OutputProducer>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) quiet: super::kafka::QuietLog,
}

impl ClientContext for RequestContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, msg: &str) {
        self.quiet.log("requests", level, fac, msg)
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        self.quiet.error("requests", &error, reason)
    }

    /// Consumer lag per partition from librdkafka's statistics (no broker
    /// round trip on the loop).
    fn stats(&self, stats: rdkafka::Statistics) {
        // Reachable while any broker connection is up (bootstrap entries
        // included): librdkafka reconnects on its own, this only says so.
        let up = stats.brokers.values().any(|b| b.state == "UP");
        let problem = (!up).then(|| "no broker connection up".to_string());
        self.metrics
            .readiness
            .set_lane(self.lane, Dependency::Kafka, &self.brokers, problem);
        if !up {
            lock(&self.shared).broker_down_at = Some(Instant::now());
        }
        if let Some(g) = &stats.cgrp {
            self.metrics.set_member(
                self.lane,
                GroupMember {
                    rebalances: g.rebalance_cnt.max(0) as u64,
                    steady: g.state == "up" && g.join_state == "steady",
                },
            );
        }
        if let Some(t) = stats.topics.get(&self.topic) {
            let now = Instant::now();
            let mut shared = lock(&self.shared);
            // A high watermark is news only while its leader is connected:
            // librdkafka keeps reporting the last one it heard through an
            // outage, and taking that as "nothing past what was read" would
            // let the idle advance run on a partition whose gateways are
            // queueing events for the broker's return (they would then be
            // too late and dropped).
            let leader_up = |leader: i32| {
                stats
                    .brokers
                    .values()
                    .any(|b| b.nodeid == leader && b.state == "UP")
            };
            for (p, part) in &t.partitions {
                // Only a partition this consumer still wants: librdkafka keeps
                // reporting a revoked one's last lag, which would otherwise
                // sit in `hermes_consumer_lag_records` for good.
                if *p >= 0 && part.consumer_lag >= 0 && part.desired {
                    self.metrics.set_lag(*p, part.consumer_lag);
                }
                if *p >= 0 && part.hi_offset >= 0 && leader_up(part.leader) {
                    shared.high_watermarks.insert(*p, (part.hi_offset, now));
                }
            }
        }
    }
}

impl RequestContext {
    /// Where each assigned partition starts, and what the loop needs to
    /// rebuild it (see [`start_of`]).
    fn plan_assignment(
        &self,
        c: &BaseConsumer<RequestContext>,
        tpl: &mut TopicPartitionList,
    ) -> Vec<Assigned> {
        let asked_at = Instant::now();
        let partitions: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
        let positions = self.held(&partitions);
        let mut fresh = TopicPartitionList::new();
        let mut unsure = TopicPartitionList::new();
        for p in &partitions {
            match positions.get(p) {
                None => {
                    fresh.add_partition(&self.topic, *p);
                }
                Some(h) if h.lost => {
                    unsure.add_partition(&self.topic, *p);
                }
                Some(_) => {}
            }
        }
        let mut committed = self.committed(c, &fresh);
        let committed_unsure = self.committed(c, &unsure);
        // A lost partition nobody committed past is ours as we left it;
        // otherwise (or if the broker cannot say) it is built afresh.
        let positions: HashMap<i32, i64> = positions
            .into_iter()
            .filter(|(p, h)| !h.lost || committed_unsure.get(p).is_some_and(|&c| c <= h.position))
            .map(|(p, h)| (p, h.position))
            .collect();
        for e in unsure.elements() {
            let p = e.partition();
            if !positions.contains_key(&p) {
                fresh.add_partition(&self.topic, p);
                if let Some(&o) = committed_unsure.get(&p) {
                    committed.insert(p, o);
                }
            }
        }
        let replay_from = self.replay_from(c, &fresh);
        let mut out = Vec::new();
        for &p in &partitions {
            let high = self.high_watermark(c, p);
            let known = Known {
                position: positions.get(&p).copied(),
                committed: committed.get(&p).copied(),
                replay_from: replay_from.get(&p).copied(),
                high,
            };
            let (start, assigned) = start_of(p, known);
            let _ = tpl.set_partition_offset(&self.topic, p, start);
            tracing::info!(
                partition = p,
                ?start,
                resume_at = assigned.resume_at,
                high,
                kept = assigned.kept,
                "partition assigned"
            );
            out.push(assigned);
        }
        // The broker's answers (committed offsets, the window by time, high
        // watermarks) hold the rebalance up for this long. A rebalance that
        // gives this loop nothing (a broker's storm of them after a join
        // sends a member dozens a minute) is logged at debug.
        let took_ms = asked_at.elapsed().as_millis() as u64;
        if partitions.is_empty() {
            tracing::debug!(took_ms, "assignment planned: nothing new for this loop");
        } else {
            tracing::info!(?partitions, took_ms, "assignment planned");
        }
        out
    }

    /// Where this loop was in each of `partitions` it held: revoked by this
    /// loop, or lost by another of the instance's loops (or by this one, its
    /// revocation already applied).
    fn held(&self, partitions: &[i32]) -> HashMap<i32, Held> {
        let mut positions = std::mem::take(&mut lock(&self.shared).positions);
        let lost = lock(&self.lost);
        for p in partitions {
            if let (false, Some(position)) = (positions.contains_key(p), lost.position(*p)) {
                positions.insert(
                    *p,
                    Held {
                        position,
                        lost: true,
                    },
                );
            }
        }
        positions
    }

    fn high_watermark(&self, c: &BaseConsumer<RequestContext>, p: i32) -> Option<i64> {
        match c.fetch_watermarks(&self.topic, p, BROKER_TIMEOUT) {
            Ok((_, h)) => Some(h),
            Err(e) => {
                tracing::warn!(partition = p, error = %e, "high watermark unavailable; the first fetch report gives it");
                None
            }
        }
    }

    /// The group's committed offsets of `fresh` (none if the broker cannot
    /// say: the window is replayed).
    fn committed(
        &self,
        c: &BaseConsumer<RequestContext>,
        fresh: &TopicPartitionList,
    ) -> HashMap<i32, i64> {
        if fresh.count() == 0 {
            return HashMap::new();
        }
        match c.committed_offsets(fresh.clone(), BROKER_TIMEOUT) {
            Ok(t) => t
                .elements()
                .iter()
                .filter_map(|e| match e.offset() {
                    Offset::Offset(o) => Some((e.partition(), o)),
                    _ => None,
                })
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "committed offsets unavailable; replaying the window only");
                HashMap::new()
            }
        }
    }

    /// The first offset of the replay window (now minus the longest window
    /// and the allowed lateness) of `fresh`, by time.
    fn replay_from(
        &self,
        c: &BaseConsumer<RequestContext>,
        fresh: &TopicPartitionList,
    ) -> HashMap<i32, Offset> {
        let since = crate::wall_clock::now_ms() - self.replay_ms;
        let mut by_time = TopicPartitionList::new();
        for e in fresh.elements() {
            let _ = by_time.add_partition_offset(&self.topic, e.partition(), Offset::Offset(since));
        }
        if by_time.count() == 0 {
            return HashMap::new();
        }
        match c.offsets_for_times(by_time, BROKER_TIMEOUT) {
            Ok(t) => t
                .elements()
                .iter()
                .map(|e| (e.partition(), e.offset()))
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "offsets-for-times failed; replaying from the committed offsets");
                HashMap::new()
            }
        }
    }
}

/// What the broker and the loop know of a partition at assignment.
#[derive(Debug, Clone, Copy)]
struct Known {
    /// Our own position, if we held it until the last (eager) revocation.
    position: Option<i64>,
    committed: Option<i64>,
    /// The replay window's first offset, by time.
    replay_from: Option<Offset>,
    high: Option<i64>,
}

/// Where partition `p` starts reading, and its bookkeeping. A partition we
/// held resumes at our position. A new one replays the window (by time) when
/// the broker can say where it starts; without that, from the committed
/// offset, or for a group that never committed, from the beginning (records
/// older than every window are then skipped cheaply, and bad ones still
/// reach the dead-letter topic: nothing is lost).
fn start_of(p: i32, k: Known) -> (Offset, Assigned) {
    if let Some(pos) = k.position {
        let a = Assigned {
            partition: p,
            kept: true,
            resume_at: pos,
            high: k.high,
            start: pos,
        };
        return (Offset::Offset(pos), a);
    }
    let start = match (k.replay_from, k.committed) {
        (Some(Offset::Offset(o)), Some(c)) => Offset::Offset(o.min(c)),
        (Some(Offset::Offset(o)), None) => Offset::Offset(o),
        (_, Some(c)) => Offset::Offset(c),
        (_, None) => Offset::Beginning,
    };
    let start_num = match start {
        Offset::Offset(o) => o,
        Offset::End => k.high.unwrap_or(0),
        _ => 0,
    };
    let a = Assigned {
        partition: p,
        kept: false,
        // A brand-new group: what we replay is new to everyone.
        resume_at: k.committed.unwrap_or(start_num),
        high: k.high,
        start: start_num,
    };
    (start, a)
}

impl ConsumerContext for RequestContext {
    fn rebalance(
        &self,
        c: &BaseConsumer<RequestContext>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let incremental = matches!(c.rebalance_protocol(), RebalanceProtocol::Cooperative);
                let list = self.plan_assignment(c, tpl);
                let r = if incremental {
                    c.incremental_assign(tpl)
                } else {
                    c.assign(tpl)
                };
                if let Err(e) = r {
                    tracing::error!(error = %e, "assign failed");
                }
                lock(&self.shared)
                    .events
                    .push(RebalanceEvent::Assigned { list, incremental });
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let incremental = matches!(c.rebalance_protocol(), RebalanceProtocol::Cooperative);
                let lost = c.assignment_lost();
                let mut positions = HashMap::new();
                if let Ok(pos) = c.position() {
                    for e in pos.elements() {
                        if let Offset::Offset(o) = e.offset() {
                            let held = Held { position: o, lost };
                            positions.insert(e.partition(), held);
                        }
                    }
                }
                if !lost {
                    // Outputs first, then the offsets that cover them.
                    if self.producer.flush(BROKER_TIMEOUT).is_ok() {
                        if let Err(e) = c.commit_consumer_state(CommitMode::Sync) {
                            tracing::debug!(error = %e, "commit on revocation");
                        }
                    }
                }
                let revoked: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                tracing::info!(?revoked, lost, "partitions revoked");
                let r = if incremental {
                    c.incremental_unassign(tpl)
                } else {
                    c.unassign()
                };
                if let Err(e) = r {
                    tracing::error!(error = %e, "unassign failed");
                }
                let mut sh = lock(&self.shared);
                if incremental {
                    if lost {
                        positions.retain(|p, _| revoked.contains(p));
                        sh.positions.extend(positions);
                    }
                    sh.events.push(RebalanceEvent::Revoked {
                        partitions: Some(revoked),
                        lost,
                    });
                } else {
                    sh.positions = positions;
                    sh.events.push(RebalanceEvent::Revoked {
                        partitions: None,
                        lost,
                    });
                }
            }
            other => tracing::error!(error = ?other, "rebalance error"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn known(position: Option<i64>, committed: Option<i64>, by_time: Option<i64>) -> Known {
        Known {
            position,
            committed,
            replay_from: by_time.map(Offset::Offset),
            high: Some(500),
        }
    }

    #[test]
    fn records_polled_before_a_revocation_are_left_only_for_the_partitions_it_names() {
        let mut shared = Shared::default();
        assert!(!shared.rebalance_pending() && !shared.revokes(1));
        shared.events.push(RebalanceEvent::Assigned {
            list: Vec::new(),
            incremental: true,
        });
        assert!(shared.rebalance_pending());
        assert!(!shared.revokes(1), "an assignment takes nothing away");
        shared.events.push(RebalanceEvent::Revoked {
            partitions: Some(vec![2, 5]),
            lost: false,
        });
        assert!(shared.revokes(2) && shared.revokes(5));
        assert!(
            !shared.revokes(1),
            "a cooperative revocation names its partitions"
        );
        shared.events.push(RebalanceEvent::Revoked {
            partitions: None,
            lost: false,
        });
        assert!(
            shared.revokes(1),
            "an eager revocation takes every partition"
        );
    }

    fn held(ids: &[i32]) -> BTreeMap<i32, Partition> {
        use super::super::partition::Position;
        let cfg = Arc::new(crate::config::Config::single_group(
            "chat",
            &[("free-a", crate::config::Tier::Free, 0.0, 50.0)],
        ));
        let pos = Position {
            resume_at: 0,
            caught_up_at: Some(0),
            start: 0,
            replay_floor_ms: 0,
        };
        ids.iter()
            .map(|&id| {
                let part = Partition::rebuild(id, cfg.clone(), pos, &BTreeMap::new(), 0, 60_000);
                (id, part)
            })
            .collect()
    }

    fn assigned(partition: i32, kept: bool) -> Assigned {
        Assigned {
            partition,
            kept,
            resume_at: 0,
            high: None,
            start: 0,
        }
    }

    /// The broker restart drill: the session timed out while the broker was
    /// away, the group took every partition from one request loop and gave
    /// two back, one of them to the instance's other loop. What the first
    /// loop built for them is resumed, not rebuilt from the saved state
    /// (which would apply the events since the last commit a second time);
    /// the third is another member's.
    #[test]
    fn a_lost_partition_that_comes_back_to_any_loop_is_resumed() {
        let metrics = Metrics::default();
        let stash = Mutex::new(LostPartitions::default());
        let mut lane0 = held(&[0, 1, 2]);
        let mut lane1 = BTreeMap::new();
        let lost = RebalanceEvent::Revoked {
            partitions: Some(vec![0, 1, 2]),
            lost: true,
        };
        apply(&mut lane0, lost, &metrics, &stash, |_| {
            panic!("nothing to build")
        });
        assert!(lane0.is_empty());
        assert_eq!(lock(&stash).position(1), Some(0));
        let back = |ps: &[i32]| RebalanceEvent::Assigned {
            list: ps.iter().map(|&p| assigned(p, true)).collect(),
            incremental: true,
        };
        let nothing = |fresh: &[Assigned]| {
            assert!(fresh.is_empty(), "kept partitions are not rebuilt");
            Vec::new()
        };
        apply(&mut lane0, back(&[0]), &metrics, &stash, nothing);
        apply(&mut lane1, back(&[1]), &metrics, &stash, nothing);
        assert_eq!(lane0.keys().copied().collect::<Vec<_>>(), vec![0]);
        assert_eq!(lane1.keys().copied().collect::<Vec<_>>(), vec![1]);
        // The queued events behind the new high watermark come first: no
        // report and no idle advance of event time before them.
        assert!(lane0
            .values()
            .chain(lane1.values())
            .all(|p| p.active && !p.caught_up()));
        // Partition 2 went elsewhere; its stash entry goes with the replay
        // window.
        lock(&stash).expire(Duration::ZERO);
        assert_eq!(lock(&stash).position(2), None);
        // Handed over (not lost): dropped at once.
        let handed = RebalanceEvent::Revoked {
            partitions: Some(vec![1]),
            lost: false,
        };
        apply(&mut lane1, handed, &metrics, &stash, |_| Vec::new());
        assert!(lane1.is_empty() && lock(&stash).position(1).is_none());
        // A lost one whose position someone committed past comes back
        // unkept (see `plan_assignment`): it is built afresh.
        let lost = RebalanceEvent::Revoked {
            partitions: Some(vec![0]),
            lost: true,
        };
        apply(&mut lane0, lost, &metrics, &stash, |_| Vec::new());
        let moved_on = RebalanceEvent::Assigned {
            list: vec![assigned(0, false)],
            incremental: true,
        };
        let mut built = Vec::new();
        apply(&mut lane0, moved_on, &metrics, &stash, |fresh| {
            built.extend(fresh.iter().map(|a| a.partition));
            held(&[0]).into_values().collect()
        });
        assert_eq!(built, vec![0]);
        assert!(lane0[&0].active && lock(&stash).position(0).is_none());
    }

    #[test]
    fn a_kept_partition_resumes_where_it_was() {
        let (start, a) = start_of(3, known(Some(120), Some(100), Some(10)));
        assert_eq!(start, Offset::Offset(120));
        assert!(a.kept);
        assert_eq!((a.resume_at, a.start, a.high), (120, 120, Some(500)));
    }

    #[test]
    fn a_new_partition_replays_the_window_and_resumes_after_the_commit() {
        // The window starts before the committed offset: replay from it,
        // alerts and dead letters only past the commit.
        let (start, a) = start_of(0, known(None, Some(100), Some(40)));
        assert_eq!(start, Offset::Offset(40));
        assert_eq!((a.kept, a.resume_at, a.start), (false, 100, 40));
        // The commit is older than the window: nothing uncommitted is
        // skipped.
        let (start, a) = start_of(0, known(None, Some(30), Some(40)));
        assert_eq!(start, Offset::Offset(30));
        assert_eq!(a.resume_at, 30);
    }

    #[test]
    fn without_offsets_by_time_the_commit_or_the_beginning() {
        let (start, a) = start_of(0, known(None, Some(100), None));
        assert_eq!((start, a.resume_at), (Offset::Offset(100), 100));
        // A group that never committed: everything is new to everyone.
        let (start, a) = start_of(0, known(None, None, None));
        assert_eq!((start, a.resume_at, a.start), (Offset::Beginning, 0, 0));
    }
}
