//! One request partition's path without Kafka around it: what a request
//! thread does to the records it polled, for programs that measure it
//! (`hermes bench`) or drive it from their own source.
//!
//! The records are applied as the request loop applies them: in order,
//! the memory each one reads hinted a few records ahead
//! ([`Lookahead`]), each one's outputs emitted as the service emits them
//! (alerts encoded, gauges into the metrics registry, health reports as
//! JSON) to a sink that drops them where the service hands them to Kafka
//! and the state store.

use crate::config::{Config, ServiceConfig};
use crate::event::RequestEvent;
use crate::health::HealthReport;
use crate::service::metrics::Metrics;
use crate::service::partition::{Applied, Hint, Lookahead, OutputSink, Partition, Position, Step};
use crate::service::state_store::StateWrite;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// A partition holding every channel of a config, live from its first
/// record (nothing to replay, no saved state), with its own metrics
/// registry.
pub struct RequestPath {
    part: Partition,
    metrics: Metrics,
    /// The next record's offset.
    offset: i64,
    /// What the look-ahead found for the batch's records.
    hints: Vec<Hint>,
    /// The instance name alerts carry.
    instance: String,
}

impl RequestPath {
    /// Partition `id` of `cfg`'s channels, with the service's default
    /// duplicate horizon (`service.dedup_horizon_ms`).
    pub fn new(cfg: Arc<Config>, id: i32, instance: &str) -> RequestPath {
        let pos = Position {
            resume_at: 0,
            caught_up_at: Some(0),
            start: 0,
            replay_floor_ms: 0,
        };
        let dedup_ms = ServiceConfig::default().dedup_horizon_ms;
        RequestPath {
            part: Partition::rebuild(id, cfg, pos, &BTreeMap::new(), i64::MAX, dedup_ms),
            metrics: Metrics::default(),
            offset: 0,
            hints: Vec::new(),
            instance: instance.to_string(),
        }
    }

    /// Applies `batch` in order, handled at wall time `wall_ms` (one clock
    /// reading per batch, as the request loop takes it), and emits each
    /// record's outputs. Refused records are counted and dropped (there is
    /// no dead-letter topic here).
    pub fn apply(&mut self, batch: &[RequestEvent<'_>], wall_ms: i64) -> Verdicts {
        let mut verdicts = Verdicts::default();
        let at = Instant::now();
        self.hints.clear();
        self.hints.resize(batch.len(), Hint::default());
        let part = &mut self.part;
        let hints = &mut self.hints;
        for (i, ev) in batch.iter().enumerate() {
            Lookahead::ahead(i, batch.len(), |step, j| match step {
                Step::Lookup => hints[j] = part.prefetch_lookup(&batch[j]),
                Step::Entry => part.prefetch_entry(&batch[j], &mut hints[j]),
                Step::Windows => part.prefetch_windows(&batch[j], &hints[j]),
            });
            match part.apply_hinted(ev, hints[i], self.offset, wall_ms) {
                Ok(Applied::Recorded { .. }) => verdicts.applied += 1,
                Ok(Applied::Duplicate) => verdicts.duplicates += 1,
                Ok(Applied::TooLate | Applied::BelowReplayFloor) => verdicts.too_late += 1,
                Err(_) => verdicts.refused += 1,
            }
            part.handled(self.offset, at);
            if let Some(out) = part.outputs_if_any(&self.instance, || wall_ms) {
                // No schema registry here: alerts are encoded as plain Avro.
                let _ = out.emit(&self.metrics, None, &mut Discard);
            }
            self.offset += 1;
        }
        verdicts
    }

    /// Evaluation ticks run so far.
    pub fn evaluations(&self) -> u64 {
        self.part.evaluations()
    }
}

/// What became of a batch's records.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Verdicts {
    /// Recorded in their channels' windows.
    pub applied: u64,
    /// Seen before within the duplicate horizon.
    pub duplicates: u64,
    /// Older than every window.
    pub too_late: u64,
    /// Refused (unknown channel, implausible values, a clock far ahead):
    /// what the service sends to the dead-letter topic.
    pub refused: u64,
}

/// The service's outputs without Kafka and the state store: what the
/// request thread does to them (encoding, gauges) is done, what the
/// producer and the group writers would do is not.
struct Discard;

impl OutputSink for Discard {
    fn alert(&mut self, _: &str, record: &[u8]) -> anyhow::Result<()> {
        std::hint::black_box(record);
        Ok(())
    }

    fn save(&mut self, write: StateWrite) {
        std::hint::black_box(write);
    }

    fn report(&mut self, report: HealthReport, json: &[u8]) {
        std::hint::black_box((report, json));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Arc<Config> {
        use crate::config::Tier;
        Arc::new(Config::single_group(
            "chat",
            &[("a", Tier::Free, 0.0, 50.0), ("b", Tier::Paid, 1.0, 100.0)],
        ))
    }

    fn event<'a>(channel: &'a str, t: i64, id: &'a str) -> RequestEvent<'a> {
        let mut e = crate::codec::tests::sample_event();
        e.channel_id = channel;
        e.event_time_ms = t;
        e.event_id = id;
        e
    }

    /// A batch goes through the partition's engine: every record counts,
    /// a duplicate and an unknown channel are told apart, and evaluation
    /// ticks run on event time.
    #[test]
    fn a_batch_is_applied_in_order_and_evaluated_on_event_time() {
        let mut path = RequestPath::new(cfg(), 0, "test");
        let t = 1_764_000_000_000;
        let ids: Vec<String> = (0..40).map(|i| format!("r{i}")).collect();
        let mut batch: Vec<RequestEvent> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| event(["a", "b"][i % 2], t + i as i64 * 1_000, id))
            .collect();
        batch.push(event("nope", t + 40_000, "x"));
        let first = path.apply(&batch, t + 40_000);
        assert_eq!(
            first,
            Verdicts {
                applied: 40,
                refused: 1,
                ..Verdicts::default()
            }
        );
        assert!(path.evaluations() > 0, "40 s of event time ran ticks");
        // The same records again: nothing recorded twice. Those within the
        // duplicate horizon are caught as duplicates, the older ones are
        // too late for the engine anyway.
        let again = path.apply(&batch[..40], t + 41_000);
        assert_eq!(again.applied, 0);
        assert_eq!(again.duplicates + again.too_late, 40);
        assert!(again.duplicates >= 10, "{again:?}");
        assert_eq!(path.offset, 81);
    }
}
