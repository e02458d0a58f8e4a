//! The `Emitter`: the one place a loop's outputs (alerts, dead letters,
//! health reports) leave for Kafka, with one failure policy.

use crate::config::Runtime;
use crate::health::HealthReport;
use crate::service::kafka;
use crate::service::kafka::OutputProducer;
use crate::service::metrics::Metrics;
use crate::service::partition::{OutputSink, Outputs, Refused};
use crate::service::state_store::{StateStore, StateWrite};
use rdkafka::message::BorrowedMessage;
use rdkafka::producer::BaseRecord;
use rdkafka::Message;
use std::sync::Arc;

/// Every output of the request loop leaves through here, with one policy by
/// what the output is:
/// - alerts and dead letters are the record of what happened: one that
///   Kafka will not take stops the loop with an error, and the offsets past
///   it are never committed (the instance that takes over handles the
///   records again);
/// - health reports, gauges and state saves describe the present, and the
///   next step replaces them: a report Kafka will not take is counted
///   (`hermes_health_reports_undelivered_total`) and logged, and the loop
///   goes on. State saves queue on the store's writer, which retries.
///
/// A health report goes two ways: to the health topic, for the writers of
/// other instances, and straight to this process's group writers, which
/// skip their own reports on the topic. A drain decided here reaches a
/// group written here without a round trip through the broker (on tansu
/// that round trip was most of Hermes' own share of a drain's latency), and
/// the writers still see this process's reports in the order they were
/// made. A hand-off the writers are too far behind to take is counted as
/// undelivered, like a report Kafka refused: the next report carries the
/// same states.
pub(super) struct Emitter {
    pub(super) runtime: Arc<Runtime>,
    pub(super) producer: Arc<OutputProducer>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) store: Option<StateStore>,
    /// `Some`: alerts are Confluent-framed with this schema id.
    pub(super) alert_schema_id: Option<u32>,
    pub(super) local_reports: tokio::sync::mpsc::Sender<HealthReport>,
}

impl Emitter {
    pub(super) fn dead_letter(
        &self,
        m: &BorrowedMessage<'_>,
        refused: &Refused,
    ) -> anyhow::Result<()> {
        let payload = m.payload().unwrap_or(&[]);
        let headers =
            kafka::dead_letter_headers(refused.kind, &refused.reason, m.partition(), m.offset());
        let mut rec: BaseRecord<'_, [u8], [u8]> =
            BaseRecord::to(&self.runtime.kafka.dead_letter_topic)
                .payload(payload)
                .headers(headers);
        if let Some(k) = m.key() {
            rec = rec.key(k);
        }
        if !kafka::send(&self.producer, rec) {
            anyhow::bail!(
                "dead-letter produce failed at partition {} offset {}; not committing past it",
                m.partition(),
                m.offset()
            );
        }
        self.metrics.dead_letter(refused.kind);
        Ok(())
    }

    pub(super) fn outputs(&self, out: Outputs) -> anyhow::Result<()> {
        let mut sink = self;
        out.emit(&self.metrics, self.alert_schema_id, &mut sink)
    }
}

/// The service's outputs: alerts and health reports to Kafka, reports to
/// this process's group writers too, state machines to the state store.
impl OutputSink for &Emitter {
    fn alert(&mut self, key: &str, record: &[u8]) -> anyhow::Result<()> {
        let rec = BaseRecord::to(&self.runtime.kafka.alert_topic)
            .key(key.as_bytes())
            .payload(record);
        if !kafka::send(&self.producer, rec) {
            anyhow::bail!("alert produce failed; not committing past it");
        }
        Ok(())
    }

    fn save(&mut self, write: StateWrite) {
        if let Some(store) = &self.store {
            store.save(write);
        }
    }

    fn report(&mut self, report: HealthReport, json: &[u8]) {
        let rec = BaseRecord::to(&self.runtime.kafka.health_topic)
            .key(report.group.as_bytes())
            .payload(json);
        if kafka::send(&self.producer, rec) {
            Metrics::inc(&self.metrics.health_reports);
        } else {
            Metrics::inc(&self.metrics.health_reports_undelivered);
            tracing::warn!(group = %report.group, "health report not enqueued; the next one replaces it");
        }
        match self.local_reports.try_send(report) {
            Ok(()) => {}
            Err(tokio::sync::mpsc::error::TrySendError::Full(report)) => {
                Metrics::inc(&self.metrics.health_reports_undelivered);
                tracing::warn!(group = %report.group, "this process's group writers are behind; the next health report replaces this one");
            }
            // The writers stopped: the service is stopping.
            Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => {}
        }
    }
}
