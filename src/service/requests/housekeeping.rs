//! Between batches: commits, the rebalances the callbacks queued, config
//! reloads, the operator's overrides, idle partitions' event time, and the
//! request topic's partition count. Functions of the loop's state
//! (`LoopState`, in mod.rs with its own methods).

use super::{advance_idle, partition_count, records, LoopState, RequestConsumer};
use crate::service::lock;
use crate::service::metrics::Metrics;
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::producer::Producer;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Commits the stored offsets once every output produced so far is
/// acknowledged. A slow broker only delays the commit (the stored
/// offsets wait for the next round); an output that failed for good
/// (after librdkafka's own retries) stops the loop without committing
/// past it.
pub(super) fn commit(lp: &mut LoopState, consumer: &RequestConsumer) -> anyhow::Result<()> {
    commit_with(lp, consumer, CommitMode::Async)
}

/// [`commit`](Self::commit), synchronously or not.
pub(super) fn commit_with(
    lp: &mut LoopState,
    consumer: &RequestConsumer,
    mode: CommitMode,
) -> anyhow::Result<()> {
    if let Err(e) = lp.emitter.producer.flush(Duration::from_secs(2)) {
        tracing::debug!(error = %e, "outputs still in flight; commit waits for the next round");
        return Ok(());
    }
    let failed = lp.metrics.outputs_undelivered.load(Ordering::Relaxed);
    if failed > 0 {
        anyhow::bail!(
            "{failed} output record(s) were not delivered; exiting without committing past them"
        );
    }
    if lp.partitions.values().any(|p| p.active) {
        match consumer.commit_consumer_state(mode) {
            Ok(()) => Metrics::inc(&lp.metrics.commits),
            // Nothing stored since the last commit.
            Err(rdkafka::error::KafkaError::ConsumerCommit(
                rdkafka::error::RDKafkaErrorCode::NoOffset,
            )) => {}
            Err(e) => tracing::warn!(error = %e, "offset commit failed; retrying next round"),
        }
    }
    Ok(())
}

/// Every 500 ms: a reloaded policy, high watermarks the broker did not
/// give at assignment, the topic's partition count if it is still
/// unknown (no group is written until it is), and idle partitions:
/// each judged on its own fetch report, however busy the others are (a
/// partition whose channels were all drained gets no events while its
/// neighbours on the same consumer do, and its cool-downs must run).
pub(super) fn housekeeping(lp: &mut LoopState, consumer: &RequestConsumer) -> anyhow::Result<()> {
    reload_config(lp);
    resave_if_redis_lost_state(lp);
    // One copy of librdkafka's fetch reports per round, for both uses.
    let (known, broker_down_at) = {
        let shared = lock(&lp.shared);
        (shared.high_watermarks.clone(), shared.broker_down_at)
    };
    for (p, part) in lp.partitions.iter_mut() {
        if let Some((high, _)) = known.get(p) {
            part.learn_high_watermark(*high);
        }
    }
    if lp.ownership.request_partitions.load(Ordering::Relaxed) == 0 {
        refresh_partition_count(lp, consumer);
    }
    let catching_up = lp
        .partitions
        .values()
        .filter(|p| p.active && !p.caught_up())
        .count();
    lp.metrics
        .readiness
        .set_catching_up(lp.lane, catching_up as u32);
    records::resume_paused(lp, consumer)?;
    let e = &lp.cfg.engine;
    let replay_ms = e.long_window_ms.max(e.short_window_ms) + e.allowed_lateness_ms;
    lock(&lp.lost).expire(Duration::from_millis(replay_ms as u64));
    let grace = Duration::from_millis(lp.runtime.service.outage_grace_ms as u64);
    if broker_down_at.is_none_or(|t| t.elapsed() >= grace) {
        advance_idle_partitions(lp, &known)?;
    }
    Ok(())
}

/// The request topic's partition count, which decides each group's
/// writer. A failed metadata fetch keeps the last known count (zero:
/// nobody writes yet) and is retried at the next housekeeping round.
/// Redis came back without Hermes' state (`state_store`): every
/// partition saves each of its channels again at its next evaluation,
/// so a takeover after it still restores the incident history.
pub(super) fn resave_if_redis_lost_state(lp: &mut LoopState) {
    let Some(store) = &lp.store else { return };
    let generation = store.generation();
    if generation == lp.saved_generation {
        return;
    }
    lp.saved_generation = generation;
    for part in lp.partitions.values_mut() {
        part.forget_saved();
    }
}

pub(super) fn refresh_partition_count(lp: &LoopState, consumer: &RequestConsumer) {
    let topic = &lp.runtime.kafka.request_topic;
    match partition_count(consumer, topic) {
        Ok(n) => lp.ownership.request_partitions.store(n, Ordering::Relaxed),
        Err(why) => {
            tracing::warn!(%topic, %why, "request topic partition count unknown; retrying")
        }
    }
}

pub(super) fn reload_config(lp: &mut LoopState) {
    if !lp.cfg_rx.has_changed().unwrap_or(false) {
        return;
    }
    let cfg = lp.cfg_rx.borrow_and_update().clone();
    for (p, part) in lp.partitions.iter_mut() {
        if let Err(e) = part.reconfigure(cfg.clone()) {
            tracing::error!(partition = p, error = %e, "config reload not applied");
            return;
        }
    }
    let configured: ahash::AHashSet<&str> = cfg.channels().map(|c| c.id.as_str()).collect();
    lp.metrics.keep_channels(|id| configured.contains(id));
    lp.cfg = cfg;
}

/// Operator pins: each partition brings the channels it carries in
/// line with the desired set; a change is an OVERRIDE alert out.
pub(super) fn reconcile_overrides(lp: &mut LoopState) -> anyhow::Result<()> {
    let desired = lp.overrides.borrow_and_update().clone();
    for part in lp.partitions.values_mut().filter(|p| p.active) {
        let changed = part.reconcile_pins(&desired);
        if changed > 0 {
            tracing::info!(partition = part.id, changed, "operator pins reconciled");
            let out = part.outputs(&lp.instance, crate::wall_clock::now_ms);
            lp.emitter.outputs(out)?;
        }
    }
    Ok(())
}

/// Idle partitions move event time with the wall clock (minus the allowed
/// lateness), so cool-downs and silence alarms still run.
/// Event time moves on for partitions that are really idle: nothing came
/// for `idle_advance_ms` *and* librdkafka's latest fetch report, made
/// after the last record, shows nothing past what was read. A poll that
/// returns nothing only says the fetch is slow (a loaded broker):
/// advancing then would make the backlog, stamped earlier, arrive too
/// late and be dropped. No report (a broker that does not answer) is no
/// proof of idleness either: the partition waits. The report comes from
/// the statistics callback (`statistics.interval.ms`), so the check asks
/// the broker nothing. Within `service.outage_grace_ms` of the broker
/// being unreachable nothing advances: the gateways' producers are still
/// reconnecting with what they queued meanwhile (the caller checks).
pub(super) fn advance_idle_partitions(
    lp: &mut LoopState,
    known: &HashMap<i32, (i64, Instant)>,
) -> anyhow::Result<()> {
    let idle = Duration::from_millis(lp.runtime.service.idle_advance_ms as u64);
    let to = crate::wall_clock::now_ms() - lp.cfg.engine.allowed_lateness_ms;
    let emitter = &lp.emitter;
    advance_idle(&mut lp.partitions, known, idle, to, &lp.instance, |out| {
        emitter.outputs(out)
    })
}
