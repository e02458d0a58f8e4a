//! Publishing a group's weights: the fenced epoch taken once per writer
//! term, the snapshot written, and the group's gauges.

use super::GroupWriters;
use crate::board::NotReady;
use crate::publish::{WeightSnapshot, WriteOutcome};
use crate::service::metrics::{GroupGauges, Metrics};
use std::collections::BTreeMap;

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
