//! What a partition's steps produced, handed out as values: alerts,
//! reports and gauge rows, and the one place they are emitted to an
//! `OutputSink`.

use crate::alert::AlertEvent;
use crate::engine::ChannelIdx;
use crate::health::HealthReport;
use crate::service::metrics::{ChannelGauges, Metrics};
use crate::service::state_store::StateWrite;
use crate::short_str::ShortStr;

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
