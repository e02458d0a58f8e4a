//! The groups this instance writes: what they plan, where they write,
//! each one's fencing position; publishing a group's weights (the fenced
//! epoch taken once per writer term, the snapshot written) and its gauges.

use super::{WeightSink, ROUND_MS};
use crate::alert::{AlertEvent, AlertRules};
use crate::board::{writer_partition, NotReady};
use crate::composition::GroupPlanner;
use crate::config::{Config, Runtime};
use crate::health::HealthReport;
use crate::publish::{WeightSnapshot, WriteOutcome};
use crate::service::metrics::{GroupGauges, Metrics};
use crate::service::overrides::Overrides;
use crate::service::ownership::Ownership;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One group this instance writes.
#[derive(Default)]
struct Writer {
    epoch: Option<u64>,
    version: u64,
    /// Scheduler plan version last written.
    plan_version: Option<u64>,
    last_write_ms: i64,
    /// Refused as stale: another writer owns the group.
    fenced: bool,
    /// Wall time a reported state change was handled, until the snapshot
    /// that carries it is written (`hermes_decision_publish_seconds`).
    change_at_ms: Option<i64>,
}

/// The groups this instance writes: what they plan ([`GroupPlanner`]),
/// where they write, and each one's fencing position.
pub(super) struct GroupWriters {
    cfg: Arc<Config>,
    pub(super) runtime: Arc<Runtime>,
    planner: GroupPlanner,
    writers: BTreeMap<String, Writer>,
    sink: WeightSink,
    pub(super) metrics: Arc<Metrics>,
    /// The OVERRIDE alerts of operator commands carried out here.
    rules: AlertRules,
    /// Redis as readiness names it (password redacted).
    redis_target: String,
    /// When each (group, channel) was last alerted as split over partitions.
    split_alerted: BTreeMap<(String, String), i64>,
    /// The split check runs on the writer's round, not on every report.
    next_split_check_ms: i64,
}

impl GroupWriters {
    /// Writing no group yet: each is taken when this instance comes to own
    /// its writer partition.
    pub(super) fn new(
        cfg: Arc<Config>,
        runtime: Arc<Runtime>,
        sink: WeightSink,
        metrics: Arc<Metrics>,
    ) -> GroupWriters {
        GroupWriters {
            planner: GroupPlanner::new(cfg.clone()),
            rules: AlertRules::new(cfg.alerts.clone()),
            split_alerted: BTreeMap::new(),
            next_split_check_ms: 0,
            redis_target: crate::publish::redact_url(&runtime.redis.url),
            cfg,
            runtime,
            writers: BTreeMap::new(),
            sink,
            metrics,
        }
    }

    /// Operator freezes: every group written here is put in (or out of)
    /// manual mode as the desired set says, each switch an OVERRIDE alert
    /// naming who and why. Already as desired: nothing happens.
    pub(super) fn reconcile_freezes(&mut self, desired: &Overrides) -> Vec<AlertEvent> {
        let now = crate::wall_clock::now_ms();
        let mut alerts = Vec::new();
        let groups: Vec<String> = self.writers.keys().cloned().collect();
        for group in groups {
            let want = desired.frozen(&group, now);
            if self.planner.is_manual(&group) == want || !self.planner.set_manual(&group, want) {
                continue;
            }
            let note = desired.groups.get(&group).map_or_else(
                || "no operator override stored: it lapsed or was removed".to_string(),
                |o| o.note(),
            );
            tracing::info!(%group, frozen = want, %note, "operator freeze reconciled");
            let at = self.planner.watermark_ms(&group).unwrap_or(now);
            alerts.push(self.rules.group_override(&group, want, at, &note));
        }
        alerts
    }

    /// Channels of the groups written here whose events reach more than
    /// one request partition: the metric every round, a PARTITION_SPLIT
    /// alert at most once per `alerts.partition_split_every_ms` each.
    pub(super) fn split_alerts(&mut self) -> Vec<AlertEvent> {
        let now = crate::wall_clock::now_ms();
        if now < self.next_split_check_ms {
            return Vec::new();
        }
        self.next_split_check_ms = now + ROUND_MS;
        let every = self.cfg.alerts.partition_split_every_ms;
        let mut alerts = Vec::new();
        let groups: Vec<String> = self.writers.keys().cloned().collect();
        for group in groups {
            let splits = self.planner.split_channels(&group, now);
            for (channel, partitions) in &splits {
                let key = (group.clone(), channel.clone());
                if self
                    .split_alerted
                    .get(&key)
                    .is_some_and(|at| now - at < every)
                {
                    continue;
                }
                tracing::warn!(%group, %channel, ?partitions, "a channel's events arrive on more than one request partition");
                let at = self.planner.watermark_ms(&group).unwrap_or(now);
                alerts.push(self.rules.partition_split(&group, channel, partitions, at));
                self.split_alerted.insert(key, now);
            }
            self.metrics.set_splits(&group, splits);
        }
        alerts
    }

    /// Takes a health report; true when it carries a state change of a
    /// group written here, to be planned and published now rather than at
    /// the next round.
    pub(super) fn on_report(&mut self, r: HealthReport) -> bool {
        let group = r.group.clone();
        if !self.planner.on_report(r, crate::wall_clock::now_ms()) {
            tracing::debug!(%group, "health report for a group not in the config");
        }
        self.writers.contains_key(&group) && self.planner.state_change_pending(&group)
    }

    /// A new policy: plans restart from the current health.
    pub(super) fn reconfigure(&mut self, cfg: Arc<Config>) {
        self.planner.reconfigure(cfg.clone());
        for w in self.writers.values_mut() {
            w.plan_version = None;
        }
        self.writers
            .retain(|g, _| cfg.groups.iter().any(|x| &x.id == g));
        self.cfg = cfg;
    }

    /// Takes the groups whose writer partition this instance now owns, and
    /// lets go of the others.
    pub(super) fn sync_ownership(&mut self, ownership: &Ownership) {
        let n = ownership.request_partitions.load(Ordering::Relaxed);
        let owned = ownership.owned();
        for g in &self.cfg.groups {
            let mine = n > 0 && owned.contains(&writer_partition(&g.id, n));
            match (mine, self.writers.contains_key(&g.id)) {
                (true, false) => {
                    self.writers.insert(g.id.clone(), Writer::default());
                }
                (false, true) => {
                    self.writers.remove(&g.id);
                    self.planner.release(&g.id);
                    self.metrics.forget_group(&g.id);
                    tracing::info!(group = %g.id, "no longer this group's writer");
                }
                _ => {}
            }
        }
    }

    /// One round: every group written here that is not fenced takes its
    /// epoch if it has none, plans if due, and publishes a changed plan or a
    /// due heartbeat.
    pub(super) async fn on_tick(&mut self) {
        let groups: Vec<String> = self.writers.keys().cloned().collect();
        for group in groups {
            if self.writers[&group].fenced || !self.ensure_epoch(&group).await {
                continue;
            }
            self.publish(&group).await;
        }
    }
}

impl GroupWriters {
    /// Redis readiness from the last write or epoch take.
    pub(super) fn redis_state(&self, problem: Option<String>) {
        self.metrics.readiness.set(
            crate::service::metrics::Dependency::Redis,
            &self.redis_target,
            problem,
        );
    }

    /// Takes the group's writer epoch (above every stored one) and learns
    /// the stored snapshot's channel states. False while the sink is down.
    pub(super) async fn ensure_epoch(&mut self, group: &str) -> bool {
        if self.writers[group].epoch.is_some() {
            return true;
        }
        let taken = self.sink.take_epoch(group).await;
        self.redis_state(taken.as_ref().err().map(|e| e.to_string()));
        match taken {
            Ok((epoch, stored)) => {
                let epoch = stored.as_ref().map_or(epoch, |s| epoch.max(s.epoch + 1));
                let w = self.writers.get_mut(group).expect("listed by the caller");
                w.epoch = Some(epoch);
                w.version = stored.as_ref().map_or(0, |s| s.version);
                let previous = stored
                    .map(|s| {
                        s.channels
                            .into_iter()
                            .map(|(c, st)| (c, st.state))
                            .collect()
                    })
                    .unwrap_or_default();
                self.planner.take_over(group, previous);
                tracing::info!(%group, epoch, from_version = w.version, "writing this group");
                true
            }
            Err(e) => {
                tracing::warn!(%group, error = %e, "cannot take the writer epoch yet");
                false
            }
        }
    }

    /// Plans the group if due and writes a changed plan, or the same one
    /// when its heartbeat is due.
    pub(super) async fn publish(&mut self, group: &str) {
        let now = crate::wall_clock::now_ms();
        let planned = match self.planner.plan(group, now) {
            Ok(p) => {
                self.metrics.set_group_waiting(group, Vec::new());
                p
            }
            Err(NotReady::NoReports) => return,
            Err(NotReady::Waiting(ch)) => {
                self.metrics.set_group_waiting(group, ch);
                return;
            }
        };
        let w = self.writers.get_mut(group).expect("listed by the caller");
        let Some(planned) = planned else {
            return;
        };
        if let Some(at) = planned.change_at_wall_ms {
            w.change_at_ms = Some(w.change_at_ms.map_or(at, |t| t.min(at)));
        }
        let plan = planned.plan;
        let changed = w.plan_version != Some(plan.version);
        if !changed {
            // The change moved no weight: there is no decision to time.
            w.change_at_ms = None;
        }
        let heartbeat_due = now - w.last_write_ms >= self.runtime.service.heartbeat_ms;
        if !changed && !heartbeat_due {
            return;
        }
        let epoch = w.epoch.unwrap_or(1);
        let version = if changed { w.version + 1 } else { w.version };
        let mut snap = WeightSnapshot::from_plan(plan, epoch, now);
        snap.version = version;
        let plan_version = plan.version;
        let budget = plan.budget_per_hour;
        let outcome = self.sink.write(&snap).await;
        self.redis_state(outcome.as_ref().err().map(|e| e.to_string()));
        let w = self.writers.get_mut(group).expect("listed by the caller");
        match outcome {
            Ok(WriteOutcome::Stale { stored_epoch, .. }) => {
                Metrics::inc(&self.metrics.snapshots_refused_stale);
                tracing::warn!(%group, epoch, stored_epoch, "fenced: another writer owns this group");
                w.fenced = true;
            }
            Ok(outcome) => {
                if outcome == WriteOutcome::Written {
                    Metrics::inc(&self.metrics.snapshots_written);
                    if let Some(at) = w.change_at_ms.take() {
                        self.metrics
                            .decision_publish
                            .observe_ms(crate::wall_clock::now_ms() - at);
                    }
                } else {
                    Metrics::inc(&self.metrics.snapshot_heartbeats);
                }
                w.version = version;
                w.plan_version = Some(plan_version);
                w.last_write_ms = now;
                self.metrics.set_group(group, gauges(&snap, now, budget));
            }
            Err(e) => {
                // Retried next round with the then-current plan; gateways
                // keep the last snapshot meanwhile.
                Metrics::inc(&self.metrics.snapshot_failures);
                tracing::debug!(%group, error = %e, "snapshot not written yet");
            }
        }
    }
}
/// The gauges of a written snapshot.
pub(super) fn gauges(snap: &WeightSnapshot, now: i64, budget_per_hour: Option<f64>) -> GroupGauges {
    let mut weights = BTreeMap::new();
    let mut shed = BTreeMap::new();
    for (class, cw) in &snap.classes {
        shed.insert(class.clone(), cw.shed);
        for (ch, x) in &cw.weights {
            weights.insert((class.clone(), ch.clone()), *x);
        }
    }
    GroupGauges {
        epoch: snap.epoch,
        version: snap.version,
        heartbeat_ms: now,
        manual: snap.manual,
        panic_since_ms: snap.panic_since_ms,
        reasons: snap
            .channels
            .iter()
            .map(|(ch, st)| (ch.clone(), st.reason.clone()))
            .collect(),
        projected_spend_per_hour: snap.projected_spend_per_hour,
        budget_per_hour,
        weights,
        shed,
        waiting_for: Vec::new(),
    }
}
