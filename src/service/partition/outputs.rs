//! What a partition's steps produced, handed out as values: alerts,
//! reports and gauge rows, and the one place they are emitted to an
//! `OutputSink`.

use super::Partition;
use crate::alert::AlertEvent;
use crate::composition::group_reports;
use crate::engine::ChannelIdx;
use crate::health::HealthReport;
use crate::service::metrics::{ChannelGauges, Metrics};
use crate::service::state_store::{SavedState, StateWrite};
use crate::short_str::ShortStr;
use crate::signals::SignalKind;

/// What a step of the engine produced, for the loop to emit.
#[derive(Debug, Default)]
pub struct Outputs {
    /// Alerts to produce (none while replaying: the previous owner did).
    pub alerts: Vec<AlertEvent>,
    /// State machines that changed since they were last saved.
    pub saves: Vec<StateWrite>,
    /// Per channel evaluated: its index in the partition's engine, its id
    /// and its gauges.
    pub gauges: Vec<(ChannelIdx, ShortStr, ChannelGauges)>,
    /// The partition they come from.
    pub partition: i32,
    /// Health per group, once caught up and warm.
    pub reports: Vec<HealthReport>,
}

/// Where a step's outputs go once the request thread has encoded them:
/// Kafka and the state store in the service (`requests`), nowhere in
/// `hermes bench`, which measures the request thread's own work on them
/// ([`Outputs::emit`]) but not the producer's.
pub trait OutputSink {
    /// An alert's record key and encoded record. An error stops the loop
    /// before it commits past the record that raised the alert.
    fn alert(&mut self, key: &str, record: &[u8]) -> anyhow::Result<()>;
    fn save(&mut self, write: StateWrite);
    /// A health report and its JSON (the `hermes.health` payload).
    fn report(&mut self, report: HealthReport, json: &[u8]);
}

impl Outputs {
    /// What the request thread does with a step's outputs: alerts encoded
    /// (Confluent-framed with `alert_schema_id` when set) and counted,
    /// gauges into `metrics`, reports as JSON, each handed to `sink`.
    pub fn emit(
        self,
        metrics: &Metrics,
        alert_schema_id: Option<u32>,
        sink: &mut impl OutputSink,
    ) -> anyhow::Result<()> {
        for a in self.alerts {
            let key = a.channel_id.as_deref().unwrap_or(&a.route_group);
            let record = a
                .to_record(alert_schema_id)
                .map_err(|e| anyhow::anyhow!("alert encoding: {e}"))?;
            sink.alert(key, &record)?;
            metrics.alert_produced(&a);
        }
        for w in self.saves {
            sink.save(w);
        }
        for (idx, id, g) in self.gauges {
            metrics.set_channel(self.partition, idx, id.as_str(), g);
        }
        for report in self.reports {
            let json = report.to_json();
            sink.report(report, &json);
        }
        Ok(())
    }
}

impl Partition {
    /// An alert raised for this partition's records by a rule of the loop
    /// (DECODE_ERROR_SPIKE); emitted with the next outputs.
    pub fn raise(&mut self, alert: AlertEvent) {
        self.alerts.push(alert);
    }

    /// What the engine produced since the last call. Alerts always; for the
    /// channels evaluated (a phase of the interval) or changed between
    /// phases (a drain must reach gateways in well under a second) since
    /// then, also state saves, gauges and, once caught up, health reports.
    /// `wall_ms` reads the wall clock for a report that carries a state
    /// change.
    pub fn outputs(&mut self, instance: &str, wall_ms: impl FnOnce() -> i64) -> Outputs {
        let replaying = self.replaying();
        self.replayed_last = false;
        // Only what was evaluated or changed since the last call: a phase
        // of the interval evaluates a few groups, and a change between
        // phases one channel (the board keeps the rest).
        let touched = self.engine.take_touched();
        let due = self.gate.due(&self.engine, &self.alerts);
        let mut out = Outputs {
            partition: self.id,
            ..Outputs::default()
        };
        if replaying {
            self.alerts.clear();
        } else {
            out.alerts = std::mem::take(&mut self.alerts);
        }
        let (Some(changed), Some(watermark)) = (due, self.engine.watermark_ms()) else {
            return out;
        };
        let mut healths = Vec::new();
        for idx in touched {
            let Some(reading) = self.engine.reading(idx) else {
                continue;
            };
            let (h, machine) = (reading.health, reading.machine);
            if self.saved.get(&h.id) != Some(machine) {
                self.saved.insert(h.id.clone(), machine.clone());
                out.saves.push(StateWrite {
                    group: h.group.clone(),
                    channel: h.id.clone(),
                    state: SavedState {
                        saved_at_ms: watermark,
                        machine: machine.clone(),
                    },
                });
            }
            // The report's top contributions (`h.signals`), by kind.
            let mut signals = [None; crate::health::TOP_SIGNALS];
            let breakdown = reading.score.map(|s| s.breakdown());
            for (slot, top) in signals.iter_mut().zip(breakdown.into_iter().flatten()) {
                *slot = Some(top);
            }
            let g = ChannelGauges {
                group: ShortStr::new(&h.group),
                state: h.state.as_str(),
                score: h.score,
                signals,
                health_weight: h.weight,
                pinned: h.pinned,
                failure_rate: h.failure_rate,
                p50_ms: reading.latency_median_ms,
                p99_ms: h.p99_ms,
                error_rate: h.error_rate,
                signal_values: SignalKind::ALL
                    .map(|k| reading.signals.get(k).map_or(f64::NAN, |m| m.value)),
            };
            out.gauges.push((idx, ShortStr::new(&h.id), g));
            healths.push(h);
        }
        if self.caught_up() && self.engine.is_warm() {
            let changed_at = changed.then(wall_ms);
            out.reports = group_reports(healths, watermark, instance, self.id, changed_at);
        }
        out
    }
}
