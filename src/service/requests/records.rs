//! The record path: a batch polled, each record decoded (its writer schema
//! fetched once), deduplicated and applied to its partition's engine, and
//! the offsets stored once the batch was handled. Functions of the loop's
//! state (`LoopState`, in mod.rs with its own methods).

use super::{LoopState, RequestConsumer, POLL_BATCH};
use crate::codec::{Decoder, NoRegistry, SchemaLookup};
use crate::event::RequestEvent;
use crate::service::lock;
use crate::service::metrics::{Dependency, Metrics};
use crate::service::partition::{Applied, Hint, Lookahead, Refused, Step};
use anyhow::Context as _;
use rdkafka::consumer::Consumer;
use rdkafka::message::BorrowedMessage;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::Message;
use std::time::{Duration, Instant};

/// A record read off the wire.
pub(super) enum Decoded<'m> {
    Event(RequestEvent<'m>),
    /// Not an event: dead-lettered with this kind and reason.
    Refused(Refused),
    /// Undecidable now (the schema registry could not be asked): the
    /// partition waits at this record.
    Wait(String),
}

/// Takes whatever else is ready (up to [`POLL_BATCH`] records, without
/// waiting) after the record in `batch`, and handles them all in order.
/// A rebalance served by one of these polls is applied where it fell:
/// the records polled before it are handled first (those of a revoked
/// partition are left to its next owner, see `Shared::revokes`), then
/// the rebalance, then the records after it.
pub(super) fn poll_batch<'c>(
    lp: &mut LoopState,
    consumer: &'c RequestConsumer,
    decoder: &Decoder,
    batch: &mut Vec<BorrowedMessage<'c>>,
) -> anyhow::Result<()> {
    loop {
        let polled = (batch.len() < POLL_BATCH).then(|| consumer.poll(Duration::ZERO));
        let rebalanced = lock(&lp.shared).rebalance_pending();
        if rebalanced || !matches!(polled, Some(Some(Ok(_)))) {
            handle_batch(lp, consumer, decoder, batch)?;
            batch.clear();
            lp.handle_rebalances(consumer);
        }
        match polled {
            Some(Some(Ok(m))) => batch.push(m),
            Some(Some(Err(e))) => {
                lp.consumer_error(e);
                return Ok(());
            }
            Some(None) => return Ok(()),
            None => {
                if batch.is_empty() {
                    return Ok(());
                }
            }
        }
    }
}

/// Handles polled records in order. They are decoded first, so that
/// the memory each one's partition reads can be hinted a few records
/// ahead of applying it (`partition::Lookahead`); what the registry
/// must decide is decoded in turn, as before.
pub(super) fn handle_batch(
    lp: &mut LoopState,
    consumer: &RequestConsumer,
    decoder: &Decoder,
    batch: &[BorrowedMessage<'_>],
) -> anyhow::Result<()> {
    let revoked: Vec<bool> = {
        let shared = lock(&lp.shared);
        batch
            .iter()
            .map(|m| shared.revokes(m.partition()))
            .collect()
    };
    // Decoded ahead if wanted now; not after a record of the same
    // partition that must wait for the registry (it pauses there). A
    // record left undecoded here is decoded in turn if it is wanted
    // then (a paused partition's record once the one before it ran).
    let mut waiting: Vec<i32> = Vec::new();
    // One clock reading for the batch: its records were polled together
    // and are handled within a fraction of a millisecond.
    let (wall, at) = (crate::wall_clock::now_ms(), Instant::now());
    let mut decoded: Vec<Option<Decoded<'_>>> = batch
        .iter()
        .zip(&revoked)
        .map(|(m, &revoked)| {
            let p = m.partition();
            let wanted = lp
                .partitions
                .get(&p)
                .is_some_and(|part| part.wants(m.offset()));
            if revoked || !wanted || waiting.contains(&p) {
                return None;
            }
            let d = decode(lp, decoder, m.payload().unwrap_or(&[]));
            if matches!(d, Decoded::Wait(_)) {
                waiting.push(p);
            }
            Some(d)
        })
        .collect();
    debug_assert!(batch.len() <= POLL_BATCH);
    let mut hints = [Hint::default(); POLL_BATCH];
    for i in 0..batch.len() {
        Lookahead::ahead(i, batch.len(), |step, j| {
            prefetch(lp, &batch[j], &decoded[j], step, &mut hints[j])
        });
        if revoked[i] {
            continue;
        }
        let pre = decoded[i].take();
        handle_record(lp, consumer, decoder, &batch[i], pre, hints[i], (wall, at))?;
    }
    store_offsets(lp, consumer)
}

/// Stores the offsets the batch's live records reached (one call per
/// batch, not per record): committed with the next commit, or by a
/// revocation's, and only ever after their records were handled.
pub(super) fn store_offsets(lp: &mut LoopState, consumer: &RequestConsumer) -> anyhow::Result<()> {
    if lp.to_store.is_empty() {
        return Ok(());
    }
    let topic = &lp.runtime.kafka.request_topic;
    let mut tpl = TopicPartitionList::new();
    for (p, next) in std::mem::take(&mut lp.to_store) {
        tpl.add_partition_offset(topic, p, Offset::Offset(next))
            .context("listing an offset to store")?;
    }
    consumer.store_offsets(&tpl).context("storing the offsets")
}

/// Hints the memory that applying a decoded record reads.
/// The entry step keeps what it looked up in `hint`, for the windows
/// step and the record's apply.
pub(super) fn prefetch(
    lp: &LoopState,
    m: &BorrowedMessage<'_>,
    d: &Option<Decoded<'_>>,
    step: Step,
    hint: &mut Hint,
) {
    if let (Some(Decoded::Event(ev)), Some(part)) = (d, lp.partitions.get(&m.partition())) {
        match step {
            Step::Lookup => *hint = part.prefetch_lookup(ev),
            Step::Entry => part.prefetch_entry(ev, hint),
            Step::Windows => part.prefetch_windows(ev, hint),
        }
    }
}

/// Handles one record; `pre` is its decoding, if done already, and
/// `hint` what was looked up for it ahead (`Hint::default()`: nothing);
/// `wall` and `at` are the batch's clock readings (wall ms, instant).
pub(super) fn handle_record(
    lp: &mut LoopState,
    consumer: &RequestConsumer,
    decoder: &Decoder,
    m: &BorrowedMessage<'_>,
    pre: Option<Decoded<'_>>,
    hint: Hint,
    (wall, at): (i64, Instant),
) -> anyhow::Result<()> {
    Metrics::inc(&lp.metrics.events_consumed);
    let (p, offset) = (m.partition(), m.offset());
    let Some(part) = lp.partitions.get(&p) else {
        return Ok(());
    };
    if !part.wants(offset) {
        return Ok(());
    }
    let replaying = part.replays(offset);
    let decoded = match pre {
        Some(d) => d,
        None => decode(lp, decoder, m.payload().unwrap_or(&[])),
    };
    let verdict = match decoded {
        Decoded::Wait(why) => return wait_for_registry(lp, consumer, p, offset, &why),
        Decoded::Refused(r) => Err(r),
        Decoded::Event(ev) => {
            let part = lp.partitions.get_mut(&p).expect("checked above");
            part.apply_hinted(&ev, hint, offset, wall)
        }
    };
    match &verdict {
        Ok(Applied::Recorded { replayed: false }) => Metrics::inc(&lp.metrics.events_applied),
        Ok(Applied::Recorded { replayed: true }) => Metrics::inc(&lp.metrics.events_replayed),
        Ok(Applied::Duplicate) => Metrics::inc(&lp.metrics.duplicates),
        Ok(Applied::TooLate) => Metrics::inc(&lp.metrics.too_late),
        Ok(Applied::BelowReplayFloor) => {}
        Err(refused) if !replaying => lp.emitter.dead_letter(m, refused)?,
        Err(_) => {}
    }
    let part = lp.partitions.get_mut(&p).expect("checked above");
    if !replaying {
        let dead = verdict.as_ref().err().map(|r| r.kind);
        let spike = lock(&lp.dead_letters).record(wall, dead);
        if let Some(spike) = spike {
            tracing::warn!(
                reason = spike.reason,
                share = spike.share,
                records = spike.records,
                "a share of the input is dead-lettered (DECODE_ERROR_SPIKE)"
            );
            part.raise(spike.alert);
        }
        lp.to_store.insert(p, offset + 1);
    }
    part.handled(offset, at);
    match part.outputs_if_any(&lp.instance, crate::wall_clock::now_ms) {
        Some(out) => lp.emitter.outputs(out),
        None => Ok(()),
    }
}

/// Decodes a record, fetching an unknown writer schema from the registry
/// once (three tries) before decoding. A record over
/// `service.max_record_bytes` is refused without decoding.
pub(super) fn decode<'m>(lp: &mut LoopState, decoder: &Decoder, payload: &'m [u8]) -> Decoded<'m> {
    let max = lp.runtime.service.max_record_bytes as usize;
    if payload.len() > max {
        return Decoded::Refused(Refused {
            kind: "oversize",
            reason: format!(
                "{} bytes, over service.max_record_bytes ({max})",
                payload.len()
            ),
        });
    }
    if let (Some(reg), [0, a, b, c, d, ..]) = (lp.registry.as_mut(), payload) {
        let id = u32::from_be_bytes([*a, *b, *c, *d]);
        if reg.cache.writer_schema(id).is_none() {
            let target = reg.url().to_string();
            let answer = reg.fetch(id);
            let problem = answer.as_ref().err().cloned();
            lp.metrics
                .readiness
                .set(Dependency::SchemaRegistry, &target, problem);
            if let Err(e) = answer {
                return Decoded::Wait(format!("schema id {id}: {e}"));
            }
        }
    }
    let lookup: &dyn SchemaLookup = match &lp.registry {
        Some(r) => &r.cache,
        None => &NoRegistry,
    };
    match decoder.decode(payload, lookup) {
        Ok(ev) => Decoded::Event(ev),
        Err(e) => Decoded::Refused(Refused {
            kind: e.kind(),
            reason: e.to_string(),
        }),
    }
}

/// The registry could not be asked about record `offset` of `p`: the
/// partition pauses there (seeking back to it) and asks again after a
/// backoff. Nothing is dead-lettered and no offset is stored past it.
pub(super) fn wait_for_registry(
    lp: &mut LoopState,
    consumer: &RequestConsumer,
    p: i32,
    offset: i64,
    why: &str,
) -> anyhow::Result<()> {
    let topic = &lp.runtime.kafka.request_topic;
    let Some(part) = lp.partitions.get_mut(&p) else {
        return Ok(());
    };
    let backoff = part.pause_at(offset);
    tracing::warn!(partition = p, offset, backoff_ms = backoff.as_millis() as u64, %why, "schema registry unavailable: partition paused at this record");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, p);
    consumer
        .pause(&tpl)
        .context("pausing a partition for the schema registry")?;
    consumer
        .seek(topic, p, Offset::Offset(offset), Duration::from_secs(5))
        .context("seeking back to the record the registry must decode")?;
    Ok(())
}

/// Partitions paused for the registry whose backoff is over read on.
pub(super) fn resume_paused(lp: &mut LoopState, consumer: &RequestConsumer) -> anyhow::Result<()> {
    let topic = &lp.runtime.kafka.request_topic;
    for (p, part) in lp.partitions.iter_mut() {
        if part.resume_due() {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(topic, *p);
            consumer
                .resume(&tpl)
                .context("resuming a partition after a registry pause")?;
        }
    }
    Ok(())
}
