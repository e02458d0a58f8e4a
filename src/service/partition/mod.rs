//! One owned request partition: its engine, its dedup memory and its replay
//! position.
//!
//! A partition talks to no broker and no store. It takes decoded records
//! and clock readings from the request loop and returns what they produced
//! as values: a verdict per record ([`Applied`] or a [`Refused`] record for
//! the dead-letter topic) and, after the engine moved, [`Outputs`] (alerts,
//! state saves, gauges, health reports). The loop emits them in one place
//! ([`Outputs::emit`], into `requests::Emitter`'s Kafka sink), with one
//! failure policy; `hermes bench` runs the same emit into a sink that drops.
//!
//! `outputs` holds what a step produced and the one place it is emitted.

use super::metrics::ChannelGauges;
use super::overrides::Overrides;
use super::state_store::{SavedState, StateWrite};
use crate::alert::AlertEvent;
use crate::backoff::Backoff;
use crate::composition::{group_reports, ReportGate};
use crate::config::Config;
use crate::dedup::Dedup;
use crate::engine::{Admitted, ApplyError, ChannelHint, ChannelIdx, Engine};
use crate::event::RequestEvent;
use crate::short_str::ShortStr;
use crate::signals::SignalKind;
use crate::state::{Pin, StateMachine};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;
mod outputs;
pub use outputs::*;

/// Where a new partition starts, from the rebalance callback.
#[derive(Debug, Clone, Copy)]
pub struct Position {
    /// Offsets below this were handled by a previous owner: replayed, they
    /// only rebuild windows (no dead letters, no alerts again).
    pub resume_at: i64,
    /// High watermark at assignment: the partition reports once past it
    /// (`None`: not known yet, see [`Partition::learn_high_watermark`]).
    pub caught_up_at: Option<i64>,
    /// First offset this assignment reads.
    pub start: i64,
    /// Replayed events older than this are outside every window (a broker
    /// that answers offsets-for-times too early costs time, not results).
    pub replay_floor_ms: i64,
}

/// What became of a record that was not refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Applied live (`replayed`: below `resume_at`, windows only).
    Recorded { replayed: bool },
    /// Replayed, and older than every window: skipped.
    BelowReplayFloor,
    /// The same event (gateway, event id, event time) was seen within the
    /// dedup horizon.
    Duplicate,
    /// Later than the allowed lateness: counted, not applied.
    TooLate,
}

/// A record the engine refused: it goes to the dead-letter topic with this
/// kind and reason (unless replayed: its owner dead-lettered it then).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub kind: &'static str,
    pub reason: String,
}

/// How far ahead of the record being applied a loop over a batch of
/// decoded records hints memory (see `crate::prefetch`): the entry first,
/// the windows it points to once the entry had time to arrive.
pub struct Lookahead;

/// Which memory a look-ahead step hints (see [`Lookahead::ahead`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// [`Partition::prefetch_lookup`], which also hashes the record's ids.
    Lookup,
    /// [`Partition::prefetch_entry`], which also looks the record up.
    Entry,
    /// [`Partition::prefetch_windows`].
    Windows,
}

impl Lookahead {
    pub const LOOKUP: usize = 12;
    pub const ENTRY: usize = 8;
    pub const WINDOWS: usize = 4;

    /// Calls `hint` with the records of a batch (of `len`) that are that
    /// far ahead of record `i`, the one about to be applied. At `i == 0`
    /// the first records are hinted too: every record's steps come in
    /// order (lookup, entry, windows), and all before it is applied.
    pub fn ahead(i: usize, len: usize, mut hint: impl FnMut(Step, usize)) {
        let steps = [
            (Step::Lookup, Self::LOOKUP),
            (Step::Entry, Self::ENTRY),
            (Step::Windows, Self::WINDOWS),
        ];
        if i == 0 {
            for (step, distance) in steps {
                for j in 0..distance.min(len) {
                    hint(step, j);
                }
            }
        }
        for (step, distance) in steps {
            if i + distance < len {
                hint(step, i + distance);
            }
        }
    }
}

/// What hinting a record looked up, for its later steps and its apply:
/// the duplicate table's fingerprint of its id, its channel id's hash and
/// its channel. `Hint::default()` (not hinted) has everything looked up at
/// apply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hint {
    /// 0: not computed.
    fingerprint: u64,
    /// The engine's hash of the channel id.
    id_hash: Option<u64>,
    channel: Option<ChannelHint>,
}

pub struct Partition {
    pub id: i32,
    engine: Engine,
    dedup: Dedup,
    /// Alerts raised since the last [`Partition::outputs`].
    alerts: Vec<AlertEvent>,
    resume_at: i64,
    caught_up_at: Option<i64>,
    next_offset: i64,
    /// The record handled last was a replay (below `resume_at`): the
    /// alerts it raised were the previous owner's to produce. Taken by the
    /// next [`Partition::outputs`]. Needed for the record at
    /// `resume_at - 1`, after which `next_offset` alone reads as live.
    replayed_last: bool,
    replay_floor_ms: i64,
    pub last_record: Instant,
    /// When the loop last asked whether this partition is really idle.
    pub last_idle_check: Instant,
    /// When the engine's steps are reported (`composition::ReportGate`).
    gate: ReportGate,
    /// The machines as last saved (restored ones count as saved), by the
    /// engine's channel index: read for every channel evaluated, where a
    /// map keyed by id cost a hash and two cold lines (bucket, key).
    saved: Vec<Option<StateMachine>>,
    /// Held by this instance (an eager revocation deactivates every
    /// partition until the next assignment says which stay).
    pub active: bool,
    /// Waiting at a record the schema registry must decode.
    registry_wait: Option<RegistryWait>,
    /// When it was rebuilt and from which offset, until its first report
    /// (logged then: how long a moved partition's channels went unreported
    /// on this side of the rebalance).
    rebuilt: Option<(Instant, i64)>,
}

/// A partition paused at `offset` until `until`; `resumed` once reading
/// again (then only `offset` itself is taken: anything fetched past it
/// before the pause comes again after it).
#[derive(Debug, Clone, Copy)]
struct RegistryWait {
    offset: i64,
    until: Instant,
    backoff: Backoff,
    resumed: bool,
}

impl Partition {
    /// A partition rebuilt on assignment: the saved state machines are
    /// restored (as of `saved_at_ms`, clamped to `latest_ok_ms` so a state
    /// stamped in the future by a bad clock cannot freeze its channel), then
    /// the loop replays from `pos.start`. Event ids are remembered for
    /// `dedup_horizon_ms` of event time.
    pub fn rebuild(
        id: i32,
        cfg: Arc<Config>,
        pos: Position,
        saved: &BTreeMap<String, SavedState>,
        latest_ok_ms: i64,
        dedup_horizon_ms: i64,
    ) -> Partition {
        let mut engine = Engine::for_partition(cfg.clone());
        let mut restored = vec![None; engine.channel_count()];
        let mut count = 0;
        for (channel, s) in saved {
            if s.saved_at_ms > latest_ok_ms {
                tracing::warn!(
                    channel = %channel,
                    saved_at_ms = s.saved_at_ms,
                    "saved state is stamped in the future; restoring it as of now"
                );
            }
            let saved_at = s.saved_at_ms.min(latest_ok_ms);
            if let Some(idx) = engine.restore(channel, s.machine.clone(), saved_at) {
                restored[idx as usize] = Some(s.machine.clone());
                count += 1;
            }
        }
        tracing::info!(partition = id, restored = count, "partition rebuilding");
        Partition {
            id,
            engine,
            dedup: Dedup::new(dedup_horizon_ms),
            alerts: Vec::new(),
            resume_at: pos.resume_at,
            caught_up_at: pos.caught_up_at,
            next_offset: pos.start,
            replayed_last: false,
            replay_floor_ms: pos.replay_floor_ms,
            last_record: Instant::now(),
            last_idle_check: Instant::now(),
            gate: ReportGate::default(),
            saved: restored,
            active: true,
            registry_wait: None,
            rebuilt: Some((Instant::now(), pos.start)),
        }
    }

    /// Forgets what was saved: each channel is saved again at its next
    /// evaluation (Redis lost the saved state).
    pub fn forget_saved(&mut self) {
        self.saved.fill(None);
    }

    /// Held again after a rebalance that kept it: reading resumes where it
    /// was, but it reports, and moves event time while idle, only once past
    /// `high` (the high watermark at this assignment). After a lost
    /// assignment (the broker away past the session timeout) the gateways'
    /// queued events are behind that mark, and what was known of the
    /// partition before says nothing of them.
    pub fn resume_held(&mut self, high: Option<i64>) {
        self.active = true;
        self.caught_up_at = high;
        self.last_record = Instant::now();
    }

    /// Whether the record at `offset` is for this partition's engine: held,
    /// and not behind what it already read (a seek in flight).
    pub fn wants(&self, offset: i64) -> bool {
        let waiting = self
            .registry_wait
            .is_some_and(|w| !w.resumed || offset != w.offset);
        self.active && offset >= self.next_offset && !waiting
    }

    /// Pauses at `offset` for the schema registry; the delay
    /// (`Backoff::LONG`: 1 s, doubling to 30 s while it stays down) is
    /// returned.
    pub fn pause_at(&mut self, offset: i64) -> std::time::Duration {
        let mut backoff = self.registry_wait.map_or(Backoff::LONG, |w| w.backoff);
        let delay = backoff.next_delay();
        self.registry_wait = Some(RegistryWait {
            offset,
            until: Instant::now() + delay,
            backoff,
            resumed: false,
        });
        delay
    }

    /// Whether a registry pause is over (then it is marked resumed: the
    /// caller resumes the partition).
    pub fn resume_due(&mut self) -> bool {
        match &mut self.registry_wait {
            Some(w) if !w.resumed && Instant::now() >= w.until => {
                w.resumed = true;
                true
            }
            _ => false,
        }
    }

    /// Below `resume_at`: handled by the previous owner.
    pub fn replays(&self, offset: i64) -> bool {
        offset < self.resume_at
    }

    fn replaying(&self) -> bool {
        self.replayed_last || self.replays(self.next_offset)
    }

    /// Past the high watermark seen at assignment (never while it is not
    /// known).
    pub fn caught_up(&self) -> bool {
        self.caught_up_at.is_some_and(|h| self.next_offset >= h)
    }

    /// The high watermark from a fetch report, when the broker did not give
    /// one at assignment.
    pub fn learn_high_watermark(&mut self, high: i64) {
        if self.caught_up_at.is_none() {
            tracing::info!(
                partition = self.id,
                high,
                "high watermark known from a fetch report"
            );
            self.caught_up_at = Some(high);
        }
    }

    pub fn next_offset(&self) -> i64 {
        self.next_offset
    }

    /// A reloaded config (see `Engine::reconfigure` for what it refuses).
    /// What was saved follows each surviving channel to its new index.
    pub fn reconfigure(&mut self, cfg: Arc<Config>) -> Result<(), String> {
        let moved = self.engine.reconfigure(cfg)?;
        let mut saved = vec![None; self.engine.channel_count()];
        for (machine, to) in std::mem::take(&mut self.saved).into_iter().zip(moved) {
            if let Some(to) = to {
                saved[to as usize] = machine;
            }
        }
        self.saved = saved;
        Ok(())
    }

    /// Applies one decoded record read at `offset`, at wall time `wall_ms`.
    /// A record the engine's clock check refuses (stamped too far ahead of
    /// the wall clock) is refused before dedup: a far-future time would
    /// expire every remembered id.
    #[cfg(test)]
    pub fn apply(
        &mut self,
        ev: &RequestEvent,
        offset: i64,
        wall_ms: i64,
    ) -> Result<Applied, Refused> {
        self.apply_hinted(ev, Hint::default(), offset, wall_ms)
    }

    /// [`Partition::apply`] with what hinting this record looked up
    /// ([`Partition::prefetch_lookup`] and the steps after it).
    pub fn apply_hinted(
        &mut self,
        ev: &RequestEvent,
        hint: Hint,
        offset: i64,
        wall_ms: i64,
    ) -> Result<Applied, Refused> {
        let replayed = self.replays(offset);
        if replayed && ev.event_time_ms < self.replay_floor_ms {
            return Ok(Applied::BelowReplayFloor);
        }
        let dedup = &mut self.dedup;
        let first_seen = || {
            let fingerprint = match hint.fingerprint {
                0 => dedup.fingerprint(ev.gateway_id, ev.event_id, ev.event_time_ms),
                f => f,
            };
            dedup.first_seen_fingerprint(fingerprint, ev.event_time_ms)
        };
        match self
            .engine
            .apply_live_once(ev, wall_ms, hint.channel, first_seen, &mut self.alerts)
        {
            Ok(Admitted::Applied) => Ok(Applied::Recorded { replayed }),
            Ok(Admitted::Duplicate) => Ok(Applied::Duplicate),
            Err(ApplyError::TooLate { .. }) => Ok(Applied::TooLate),
            Err(e) => Err(Refused {
                kind: e.kind(),
                reason: e.to_string(),
            }),
        }
    }

    /// Hints the memory [`Partition::apply`] reads first for `ev`: its
    /// duplicate-table slot and where its channel is looked up. A loop over
    /// a batch calls this [`Lookahead::LOOKUP`] records ahead of the one it
    /// applies. What it computed is for this record's later steps and its
    /// [`Partition::apply_hinted`], on this partition only.
    pub fn prefetch_lookup(&self, ev: &RequestEvent) -> Hint {
        let fingerprint = self
            .dedup
            .fingerprint(ev.gateway_id, ev.event_id, ev.event_time_ms);
        self.dedup.prefetch(fingerprint, ev.event_time_ms);
        Hint {
            fingerprint,
            id_hash: Some(self.engine.prefetch_lookup(ev)),
            channel: None,
        }
    }

    /// Looks `ev`'s channel up and hints its entry; called
    /// [`Lookahead::ENTRY`] records ahead, on the `hint` its
    /// [`Partition::prefetch_lookup`] returned (or a default one).
    pub fn prefetch_entry(&self, ev: &RequestEvent, hint: &mut Hint) {
        if hint.id_hash.is_none() {
            *hint = self.prefetch_lookup(ev);
        }
        hint.channel = hint.id_hash.and_then(|h| self.engine.prefetch_entry(ev, h));
    }

    /// Hints what applying `ev` reads through its channel's entry; called
    /// [`Lookahead::WINDOWS`] records ahead.
    pub fn prefetch_windows(&self, ev: &RequestEvent, hint: &Hint) {
        self.engine.prefetch_windows(ev, hint.channel);
    }

    /// The record at `offset` was handled (whatever became of it), at `at`
    /// (the loop reads the clock once per batch of records).
    pub fn handled(&mut self, offset: i64, at: Instant) {
        if self.registry_wait.is_some_and(|w| w.offset == offset) {
            self.registry_wait = None;
        }
        self.next_offset = offset + 1;
        self.replayed_last = self.replays(offset);
        self.last_record = at;
    }

    /// Evaluation ticks the engine has run (per channel evaluated).
    pub fn evaluations(&self) -> u64 {
        self.engine.stats().evaluations
    }

    /// Moves event time to `to_ms` (an idle partition). Nothing before the
    /// first event: there is no clock to move yet.
    pub fn advance_to(&mut self, to_ms: i64) {
        if self.engine.watermark_ms().is_some() {
            self.engine.advance_to(to_ms, &mut self.alerts);
        }
    }

    /// Pins or unpins `channel` at the current watermark, if this partition
    /// carries it (it has seen its events). Returns whether it did.
    pub fn pin(&mut self, channel: &str, pin: Option<Pin>, note: &str) -> bool {
        let carried = self
            .engine
            .channel_index(channel)
            .is_some_and(|idx| self.engine.has_events(idx));
        let Some(now) = self.engine.watermark_ms().filter(|_| carried) else {
            return false;
        };
        self.engine.pin(channel, pin, now, note, &mut self.alerts)
    }

    /// Brings the pins of the channels this partition carries in line with
    /// the operators' desired set: a pin in force and not desired (cleared,
    /// lapsed) is released, a desired pin not in force is applied. Pins
    /// already as desired are left alone, so calling this again raises
    /// nothing. Returns how many pins changed.
    pub fn reconcile_pins(&mut self, desired: &Overrides) -> usize {
        let Some(now) = self.engine.watermark_ms() else {
            return 0;
        };
        let want = |channel: &str| {
            desired
                .channels
                .get(channel)
                .filter(|o| o.live_at(now))
                .and_then(|o| o.pin())
        };
        let mut changed = 0;
        for (channel, _) in self.engine.pinned() {
            if want(&channel).is_none() {
                let note = desired.channels.get(&channel).map_or_else(
                    || "no operator override stored: it lapsed or was removed".to_string(),
                    |o| o.note(),
                );
                changed += usize::from(self.pin(&channel, None, &note));
            }
        }
        for (channel, o) in &desired.channels {
            let Some(pin) = want(channel) else {
                continue;
            };
            let held = self
                .engine
                .channel_index(channel)
                .map(|idx| self.engine.machine(idx).pin());
            if held.is_some_and(|h| h != Some(pin)) {
                changed += usize::from(self.pin(channel, Some(pin), &o.note()));
            }
        }
        changed
    }

    /// An alert raised for this partition's records by a rule of the loop
    /// (DECODE_ERROR_SPIKE); emitted with the next outputs.
    pub fn raise(&mut self, alert: AlertEvent) {
        self.alerts.push(alert);
    }

    /// [`Partition::outputs`], or `None` when they would be empty: no
    /// alert, nothing evaluated or changed since the last call. A record
    /// that changes nothing (most of them: a phase of the interval comes
    /// every few thousand) then skips building and emitting them.
    pub fn outputs_if_any(
        &mut self,
        instance: &str,
        wall_ms: impl FnOnce() -> i64,
    ) -> Option<Outputs> {
        if self.alerts.is_empty() && !self.engine.has_touched() && !self.gate.pending(&self.engine)
        {
            self.replayed_last = false;
            return None;
        }
        Some(self.outputs(instance, wall_ms))
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
        let reporting = self.caught_up() && self.engine.is_warm();
        // The first report after a rebuild names every channel with events,
        // each as its last evaluation (in the replay) left it: waiting for
        // each channel's phase would keep a moved partition's channels
        // unreported for up to another interval.
        let touched = if reporting && self.rebuilt.is_some() {
            (0..self.engine.channel_count() as ChannelIdx)
                .filter(|&idx| self.engine.has_events(idx))
                .collect()
        } else {
            touched
        };
        let mut healths = Vec::new();
        for idx in touched {
            let Some(reading) = self.engine.reading(idx) else {
                continue;
            };
            let (h, machine) = (reading.health, reading.machine);
            let saved = &mut self.saved[idx as usize];
            if saved.as_ref() != Some(machine) {
                *saved = Some(machine.clone());
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
        if reporting {
            if let Some((at, start)) = self.rebuilt.take() {
                tracing::info!(
                    partition = self.id,
                    records = self.next_offset - start,
                    took_ms = at.elapsed().as_millis() as u64,
                    "partition reporting after its rebuild"
                );
            }
            let changed_at = changed.then(wall_ms);
            out.reports = group_reports(healths, watermark, instance, self.id, changed_at);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alert::AlertKind;
    use crate::state::PinKind;

    fn cfg() -> Arc<Config> {
        use crate::config::Tier;
        Arc::new(Config::single_group(
            "chat",
            &[
                ("free-a", Tier::Free, 0.0, 50.0),
                ("paid-a", Tier::Paid, 1.0, 100.0),
            ],
        ))
    }

    fn event(channel: &'static str, t: i64, id: &'static str) -> RequestEvent<'static> {
        let mut e = crate::codec::tests::sample_event();
        e.channel_id = channel;
        e.event_time_ms = t;
        e.event_id = id;
        e
    }

    fn partition(resume_at: i64) -> Partition {
        let pos = Position {
            resume_at,
            caught_up_at: Some(0),
            start: 0,
            replay_floor_ms: 0,
        };
        Partition::rebuild(0, cfg(), pos, &BTreeMap::new(), i64::MAX, 60_000)
    }

    #[test]
    fn records_come_back_as_verdicts_and_refusals_as_values() {
        let mut p = partition(0);
        let t = 1_764_000_000_000;
        let e = event("free-a", t, "e1");
        assert_eq!(p.apply(&e, 0, t), Ok(Applied::Recorded { replayed: false }));
        p.handled(0, Instant::now());
        assert_eq!(p.apply(&e, 1, t), Ok(Applied::Duplicate));
        let ahead = event("free-a", t + 3_600_000, "e2");
        let r = p.apply(&ahead, 2, t).unwrap_err();
        assert_eq!(r.kind, "future_timestamp");
        let unknown = event("nope", t, "e3");
        assert!(p.apply(&unknown, 3, t).is_err());
    }

    /// A batch applied with what its look-ahead found gets the verdicts it
    /// gets without: duplicates within the batch (hinted before their
    /// first copy was applied), unknown channels and refusals included.
    #[test]
    fn hinted_records_get_the_verdicts_unhinted_ones_get() {
        let t = 1_764_000_000_000;
        let batch = [
            event("free-a", t, "a"),
            event("paid-a", t + 1, "b"),
            // Sent again: the same record (id, gateway and time).
            event("free-a", t, "a"),
            event("nope", t + 3, "c"),
            event("paid-a", t + 3_600_000, "d"),
            event("paid-a", t + 1, "b"),
            // The same id at another time is another event.
            event("free-a", t + 5, "a"),
        ];
        let (mut plain, mut hinted) = (partition(0), partition(0));
        let hints: Vec<Hint> = batch
            .iter()
            .map(|e| {
                let mut h = hinted.prefetch_lookup(e);
                hinted.prefetch_entry(e, &mut h);
                h
            })
            .collect();
        assert!(hints.iter().all(|h| h.fingerprint != 0));
        assert_eq!(hints[3].channel, None, "an unknown channel has no entry");
        for (i, (e, h)) in batch.iter().zip(&hints).enumerate() {
            hinted.prefetch_windows(e, h);
            let offset = i as i64;
            let want = plain.apply(e, offset, t);
            assert_eq!(hinted.apply_hinted(e, *h, offset, t), want, "record {i}");
            plain.handled(offset, Instant::now());
            hinted.handled(offset, Instant::now());
        }
        assert_eq!(hinted.engine.stats().applied, 3);
        assert_eq!(hinted.dedup.duplicates(), 2);
    }

    /// A record after which `outputs` would be empty gets no outputs from
    /// `outputs_if_any`, and every other gets the same outputs: two
    /// partitions fed the same records (a replayed stretch, evaluations,
    /// an alert raised by the loop) hand out the same.
    #[test]
    fn outputs_if_any_skips_exactly_the_empty_ones() {
        let (mut plain, mut skipping) = (partition(40), partition(40));
        let t0 = 1_764_000_000_000;
        let ids: Vec<String> = (0..6_000).map(|i| format!("e{i}")).collect();
        let (mut skipped, mut handed) = (0, 0);
        let spike = {
            let mut r = crate::alert::DeadLetterRule::new(crate::config::AlertConfig::default());
            (0..3_000)
                .find_map(|i| r.record(i * 10, (i % 3 == 0).then_some("invalid")))
                .expect("a third of the records dead")
                .alert
        };
        for (i, id) in ids.iter().enumerate() {
            let offset = i as i64;
            let t = t0 + offset * 25;
            let channel = ["free-a", "paid-a"][i % 2];
            let mut e = event(channel, t, "x");
            e.event_id = id;
            for p in [&mut plain, &mut skipping] {
                let _ = p.apply(&e, offset, t);
                p.handled(offset, Instant::now());
                if i == 3_001 {
                    p.raise(spike.clone());
                }
            }
            let want = plain.outputs("i", || 7);
            match skipping.outputs_if_any("i", || 7) {
                Some(got) => {
                    handed += 1;
                    assert_eq!(format!("{got:?}"), format!("{want:?}"), "record {i}");
                }
                None => {
                    skipped += 1;
                    assert!(
                        want.alerts.is_empty()
                            && want.saves.is_empty()
                            && want.gauges.is_empty()
                            && want.reports.is_empty(),
                        "record {i}: {want:?}"
                    );
                }
            }
        }
        assert!(
            skipped > 5_000 && handed > 10,
            "{skipped} skipped, {handed} handed"
        );
    }

    /// Once caught up after a rebuild, the first report names every
    /// channel with events, not only those whose phase of the interval
    /// came first (two groups: evaluated 20 ms apart).
    #[test]
    fn the_first_report_after_a_rebuild_names_every_channel() {
        let cfg = Arc::new(
            Config::from_toml(
                "[[groups]]\nid = \"a\"\n[[groups.channels]]\nid = \"a1\"\ntier = \"paid\"\n\
                 price_per_1k_tokens = 1.0\ncapacity_rps = 100.0\n\
                 [[groups]]\nid = \"b\"\n[[groups.channels]]\nid = \"b1\"\ntier = \"paid\"\n\
                 price_per_1k_tokens = 1.0\ncapacity_rps = 100.0\n",
            )
            .unwrap(),
        );
        let caught_up_at = 2_000;
        let pos = Position {
            resume_at: 0,
            caught_up_at: Some(caught_up_at),
            start: 0,
            replay_floor_ms: 0,
        };
        let mut p = Partition::rebuild(0, cfg, pos, &BTreeMap::new(), i64::MAX, 60_000);
        let t0 = 1_764_000_000_000;
        let mut offset = 0;
        let mut t = t0;
        // One id: an event is its gateway, id and time, and times differ.
        let send = |p: &mut Partition, channel: &'static str, t: i64, offset: i64| {
            let mut e = event(channel, t, "e");
            e.route_group = &channel[..1];
            p.apply(&e, offset, t).unwrap();
            p.handled(offset, Instant::now());
            p.outputs("i", || 0)
        };
        // 70 s of both channels (warm), not yet caught up: no reports.
        while offset < caught_up_at {
            let channel = if offset % 2 == 0 { "a1" } else { "b1" };
            assert!(send(&mut p, channel, t, offset).reports.is_empty());
            t += 36;
            offset += 1;
        }
        // Caught up: the first report, whichever phase comes first, names
        // both groups.
        let first = loop {
            let out = send(&mut p, "a1", t, offset);
            if !out.reports.is_empty() {
                break out.reports;
            }
            t += 1;
            offset += 1;
        };
        let groups: Vec<&str> = first.iter().map(|r| r.group.as_str()).collect();
        assert_eq!(groups, ["a", "b"]);
    }

    /// A channel's state is saved when it changed since it was last saved:
    /// once at its first evaluation, not again while it holds, again after
    /// the store was lost; a reload that moves the channel to another index
    /// keeps what was saved with it.
    #[test]
    fn a_state_is_saved_once_until_it_changes_and_a_reload_keeps_what_was_saved() {
        use crate::config::Tier;
        let mut p = partition(0);
        let t0 = 1_764_000_000_000;
        let ids: Vec<String> = (0..4_000).map(|i| format!("e{i}")).collect();
        let mut next = 0;
        // 20 s of paid-a's events, 10 a second; the channels it saved.
        let mut run = |p: &mut Partition| {
            let (mut saved, mut evaluated) = (Vec::new(), 0);
            for _ in 0..200 {
                let t = t0 + next as i64 * 100;
                let mut e: RequestEvent<'_> = event("paid-a", t, "");
                e.event_id = &ids[next];
                p.apply(&e, next as i64, t).unwrap();
                p.handled(next as i64, Instant::now());
                let out = p.outputs("i", || 0);
                evaluated += out.gauges.len();
                saved.extend(out.saves.into_iter().map(|w| w.channel));
                next += 1;
            }
            // Every 5 s interval evaluated it (the reload too).
            assert!(evaluated >= 3, "evaluated {evaluated} times");
            saved
        };
        assert_eq!(run(&mut p), ["paid-a"], "saved at its first evaluation");
        assert!(run(&mut p).is_empty(), "unchanged: not saved again");
        let idx = p.engine.channel_index("paid-a");
        let moved = Arc::new(Config::single_group(
            "chat",
            &[
                ("new-0", Tier::Paid, 1.0, 100.0),
                ("free-a", Tier::Free, 0.0, 50.0),
                ("paid-a", Tier::Paid, 1.0, 100.0),
            ],
        ));
        p.reconfigure(moved).unwrap();
        assert_ne!(p.engine.channel_index("paid-a"), idx, "the reload moved it");
        assert!(run(&mut p).is_empty(), "what was saved moved with it");
        p.forget_saved();
        assert_eq!(
            run(&mut p),
            ["paid-a"],
            "saved again once the store lost it"
        );
    }

    #[test]
    fn replayed_records_raise_no_alerts() {
        let t = 1_764_000_000_000;
        let pin = Pin {
            kind: PinKind::Drain,
            until_ms: None,
        };
        // Replaying (below resume_at): the alert the pin raised is the
        // previous owner's to have produced.
        let mut p = partition(10);
        p.apply(&event("free-a", t, "e1"), 0, t).unwrap();
        p.handled(0, Instant::now());
        assert!(p.pin("free-a", Some(pin), ""));
        assert!(p.outputs("i", || 0).alerts.is_empty());
        // Live: the same pin is an OVERRIDE alert out.
        let mut p = partition(0);
        p.apply(&event("free-a", t, "e1"), 0, t).unwrap();
        p.handled(0, Instant::now());
        assert!(p.pin("free-a", Some(pin), ""));
        assert!(!p.pin("paid-a", Some(pin), ""), "not carried here");
        let out = p.outputs("i", || 0);
        assert_eq!(out.alerts.len(), 1);
        assert_eq!(out.alerts[0].kind, AlertKind::Override);
    }

    /// Healthy paid-a traffic at offsets 0..20, then failures of free-a
    /// from offset 20: the fast path drains it at offset 23 (four in a row,
    /// `single_group`'s policy). Returns the alerts produced when the
    /// partition resumes live at `resume_at`.
    fn drain_alerts(resume_at: i64) -> Vec<AlertEvent> {
        let mut p = partition(resume_at);
        let t = 1_764_000_000_000;
        let ids: Vec<String> = (0..25).map(|i| format!("e{i}")).collect();
        let mut alerts = Vec::new();
        for (o, id) in ids.iter().enumerate() {
            let mut e = event("paid-a", t + o as i64 * 10, "");
            e.event_id = id;
            if o >= 20 {
                e.channel_id = "free-a";
                e.error_class = crate::event::ErrorClass::ServerError;
                e.http_status = 503;
            }
            p.apply(&e, o as i64, t).unwrap();
            p.handled(o as i64, Instant::now());
            alerts.extend(p.outputs("i", || 0).alerts);
        }
        alerts
    }

    #[test]
    fn the_last_record_the_previous_owner_handled_raises_no_alert_again() {
        let drained = |a: &[AlertEvent]| a.iter().any(|a| a.kind == AlertKind::Transition);
        let live = drain_alerts(23);
        assert!(
            drained(&live),
            "offset 23 is live: the drain is produced: {live:?}"
        );
        assert!(
            !drained(&drain_alerts(24)),
            "offset 23 = resume_at - 1 was the previous owner's: its drain was produced there"
        );
    }

    #[test]
    fn an_unknown_high_watermark_is_never_taken_as_caught_up() {
        let pos = Position {
            resume_at: 0,
            caught_up_at: None,
            start: 0,
            replay_floor_ms: 0,
        };
        let mut p = Partition::rebuild(0, cfg(), pos, &BTreeMap::new(), i64::MAX, 60_000);
        assert!(!p.caught_up(), "a failed watermark fetch is not offset 0");
        p.learn_high_watermark(3);
        assert!(!p.caught_up());
        for (o, id) in ["e1", "e2", "e3"].into_iter().enumerate() {
            let t = 1_764_000_000_000 + o as i64;
            p.apply(&event("free-a", t, id), o as i64, t).unwrap();
            p.handled(o as i64, Instant::now());
        }
        assert!(p.caught_up());
        p.learn_high_watermark(100);
        assert!(p.caught_up(), "learned once, at assignment's place");
    }
}
