//! One simulation in progress: the gateways' queue of completions and
//! retries, their routing by the current plan's weights, the upstreams'
//! load, Hermes when it routes, and the tally.

use super::scenario::{Behavior, Scenario};
use super::{
    answer, quota_refused, ChannelRun, Completed, Request, Rng, Routing, RunResult, Sample,
};
use crate::codec::{Decoder, Encoder, NoRegistry, WireFormat};
use crate::composition::Composition;
use crate::config::Config;
use crate::event::{Dispatch, ErrorClass, RequestEvent, TrafficClass};
use crate::publish::WeightSnapshot;
use crate::routing::{Pick, RoutingTable};
use crate::schedule::Scheduler;
use crate::state::StateKind;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

#[derive(Debug, Clone, Copy)]
pub(super) enum Pending {
    Done(Completed),
    Retry(Request),
}

pub(super) struct Queued {
    pub(super) at_ms: i64,
    pub(super) seq: u64,
    pub(super) what: Pending,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        (self.at_ms, self.seq) == (o.at_ms, o.seq)
    }
}

impl Eq for Queued {}

impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Queued {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at_ms, self.seq).cmp(&(o.at_ms, o.seq))
    }
}

/// Seconds over which a channel's load is averaged (model and `overload_s`).
pub const LOAD_WINDOW_S: usize = 5;

/// Mean attempts per second over the last `LOAD_WINDOW_S` seconds, where the
/// current second is `frac` done with `current` attempts so far.
pub(super) fn load_rps(history: &[u32; LOAD_WINDOW_S], current: u32, frac: f64) -> f64 {
    let full: u32 = history[..LOAD_WINDOW_S - 1].iter().sum();
    let oldest = history[LOAD_WINDOW_S - 1] as f64 * (1.0 - frac);
    (full as f64 + oldest + current as f64) / LOAD_WINDOW_S as f64
}

/// The plan's choice for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Routed {
    /// Send it to this channel (scenario index).
    To(usize),
    /// Do not send it; report it as unsent (`dispatch`), keyed by the
    /// channel it would have gone to (the schema's rule for unsent events).
    Unsent(Dispatch, usize),
}

/// Routes one request as a gateway does ([`RoutingTable::pick`]): shed by
/// the class's shed share, else a weighted pick. A request not sent names
/// the channel [`RoutingTable::unsent_channel`] gives (the schema's rule
/// for unsent events). `ids`: the scenario's channels, by index.
pub(super) fn route(
    table: &RoutingTable,
    class: TrafficClass,
    ids: &[String],
    rng: &mut Rng,
) -> Routed {
    let index = |id: &str| ids.iter().position(|c| c == id);
    let (u_shed, u1, u2) = (rng.f64(), rng.f64(), rng.f64());
    let how = match table.pick(class, u_shed, u1, u2) {
        Pick::Channel(id) => match index(id) {
            Some(j) => return Routed::To(j),
            None => Dispatch::NoChannel,
        },
        Pick::Shed => Dispatch::Shed,
        Pick::NoRoute => Dispatch::NoChannel,
    };
    let named = table
        .unsent_channel(class, rng.f64(), rng.f64())
        .and_then(index)
        .unwrap_or(0);
    Routed::Unsent(how, named)
}

/// Where a simulated gateway's events go: encoded and decoded through the
/// wire codec (so the drills exercise it), recorded if asked, and applied to
/// the composition when Hermes routes.
pub(super) struct Emitter<'r> {
    pub(super) encoder: Encoder,
    pub(super) decoder: Decoder,
    pub(super) buf: Vec<u8>,
    pub(super) record: Option<&'r mut Vec<Vec<u8>>>,
    pub(super) routing: Routing,
}

impl Emitter<'_> {
    pub(super) fn emit(
        &mut self,
        ev: &RequestEvent<'_>,
        composition: &mut Composition,
        result: &mut RunResult,
    ) {
        self.buf.clear();
        if self.encoder.encode_plain(ev, &mut self.buf).is_err() {
            result.codec_errors += 1;
            return;
        }
        if let Some(r) = self.record.as_deref_mut() {
            r.push(self.buf.clone());
        }
        result.events += 1;
        if self.routing == Routing::Hermes {
            match self.decoder.decode(&self.buf, &NoRegistry) {
                Ok(decoded) => {
                    let _ = composition.apply(&decoded);
                }
                Err(_) => result.codec_errors += 1,
            }
        }
    }
}

/// Attempts started per channel in each of the last `LOAD_WINDOW_S`
/// seconds: an upstream's load is their mean (its queue absorbs one-second
/// blips).
pub(super) struct Load {
    pub(super) second_counts: Vec<u32>,
    pub(super) history: Vec<[u32; LOAD_WINDOW_S]>,
    pub(super) current_second: i64,
}

/// One simulation in progress: the gateways (their queue of completions and
/// retries, their routing table, probes), the upstreams' load and quotas,
/// Hermes when it routes, and the tally.
pub(super) struct SimRun<'a> {
    pub(super) sc: &'a Scenario,
    pub(super) faults_on: bool,
    pub(super) group: String,
    pub(super) bases: Vec<Behavior>,
    /// Per channel: the consecutive-failure threshold (report bookkeeping).
    pub(super) policies: Vec<u32>,
    pub(super) streaks: Vec<crate::window::FailureStreak>,
    pub(super) composition: Composition,
    pub(super) rng: Rng,
    pub(super) queue: BinaryHeap<Reverse<Queued>>,
    pub(super) seq: u64,
    pub(super) result: RunResult,
    /// What the gateways route by: static weights until Hermes publishes.
    pub(super) table: RoutingTable,
    pub(super) ids: Vec<String>,
    pub(super) plans: u64,
    pub(super) published: u64,
    pub(super) emitter: Emitter<'a>,
    pub(super) id_buf: String,
    pub(super) load: Load,
    pub(super) next_probe_s: Vec<f64>,
    /// Per channel: (quota period number, attempts used in it).
    pub(super) quota_use: Vec<(i64, u64)>,
    /// Since when (scenario seconds) the plan has left a class without a
    /// healthy channel while one had room (`Plan::classes_without_retry_path`).
    pub(super) retry_gap_since: Option<f64>,
}

impl<'a> SimRun<'a> {
    pub(super) fn new(
        sc: &'a Scenario,
        cfg: Arc<Config>,
        routing: Routing,
        faults_on: bool,
        seed: u64,
        record: Option<&'a mut Vec<Vec<u8>>>,
    ) -> Option<SimRun<'a>> {
        let n = sc.channels.len();
        // Static weights: the scheduler's plan before any health (trust-tier
        // shares). The static run routes by them throughout; Hermes's
        // gateways route by them until the first snapshot is published, as a
        // gateway with no snapshot yet falls back to its configured weights.
        let group = cfg.groups[0].id.clone();
        let mut initial = Scheduler::new(cfg.clone());
        initial.plan_group(0, 0, &[], false);
        let static_plan = initial.plan(&group)?;
        let table = RoutingTable::new(WeightSnapshot::from_plan(static_plan, 0, sc.start_ms));
        let policies = sc
            .channels
            .iter()
            .map(|c| {
                cfg.channels()
                    .find(|x| x.id == c.id)
                    .map_or(u32::MAX, |x| x.policy.states.consecutive_failures)
            })
            .collect();
        let next_probe_s = (0..n)
            .map(|j| sc.gateway.probe_interval_s * (j as f64 + 1.0) / (n as f64 + 1.0))
            .collect();
        Some(SimRun {
            sc,
            faults_on,
            group,
            bases: sc
                .channels
                .iter()
                .map(|c| Behavior::base().with(&c.normal))
                .collect(),
            policies,
            streaks: vec![crate::window::FailureStreak::default(); n],
            composition: Composition::new(cfg),
            rng: Rng::new(seed),
            queue: BinaryHeap::new(),
            seq: 0,
            result: RunResult {
                channels: vec![ChannelRun::default(); n],
                ..RunResult::default()
            },
            table,
            ids: sc.channels.iter().map(|c| c.id.clone()).collect(),
            plans: 0,
            published: 0,
            emitter: Emitter {
                encoder: Encoder::default(),
                decoder: Decoder::new(WireFormat::Plain),
                buf: Vec::with_capacity(256),
                record,
                routing,
            },
            id_buf: String::new(),
            load: Load {
                second_counts: vec![0; n],
                history: vec![[0; LOAD_WINDOW_S]; n],
                current_second: 0,
            },
            next_probe_s,
            quota_use: vec![(i64::MIN, 0); n],
            retry_gap_since: None,
        })
    }

    /// Steps the scenario's clock: per step, completions and retries due,
    /// Hermes's clock, a new snapshot, probes, then new requests.
    pub(super) fn run(mut self) -> RunResult {
        let step = self.sc.step_ms;
        let steps = (self.sc.duration_s * 1000.0 / step as f64).ceil() as i64;
        for s in 0..=steps {
            let t_ms = self.sc.start_ms + s * step;
            let t_s = (s * step) as f64 / 1000.0;
            self.roll_second((s * step) / 1000);
            self.completions(t_ms);
            if self.emitter.routing == Routing::Hermes {
                self.composition.advance_to(t_ms);
            }
            self.pick_up_snapshot(t_s);
            self.probes(t_ms, t_s);
            self.new_requests(t_ms, t_s);
        }
        if let Some(since) = self.retry_gap_since.take() {
            self.result.no_retry_path_s += self.sc.duration_s - since;
        }
        self.result.alerts = std::mem::take(&mut self.composition.alerts);
        self.result
    }

    /// At a new second: the load history moves on and overload is counted.
    pub(super) fn roll_second(&mut self, second: i64) {
        let load = &mut self.load;
        if second == load.current_second {
            return;
        }
        for (h, c) in load.history.iter_mut().zip(&load.second_counts) {
            h.rotate_right(1);
            h[0] = *c;
        }
        let mut any = false;
        for ((h, c), run) in load
            .history
            .iter()
            .zip(&self.sc.channels)
            .zip(self.result.channels.iter_mut())
        {
            if load_rps(h, 0, 0.0) > c.capacity_rps {
                run.overload_s += 1;
                any = true;
            }
        }
        self.result.overload_s += any as u64;
        load.second_counts.iter_mut().for_each(|c| *c = 0);
        load.current_second = second;
    }

    /// Completions and due retries, in time order.
    pub(super) fn completions(&mut self, t_ms: i64) {
        while let Some(Reverse(q)) = self.queue.peek() {
            if q.at_ms > t_ms {
                break;
            }
            let Some(Reverse(q)) = self.queue.pop() else {
                break;
            };
            match q.what {
                Pending::Retry(mut req) => match self.route(req.class) {
                    Routed::To(j) => {
                        req.channel = j;
                        self.result.retries += 1;
                        self.dispatch(req, q.at_ms);
                    }
                    Routed::Unsent(how, j) => self.unsent(how, j, req.class, req.attempt, q.at_ms),
                },
                Pending::Done(d) => self.complete(d, q.seq, q.at_ms),
            }
        }
    }

    /// An attempt finished: its event goes out, the report's fast-path
    /// bookkeeping, and the gateway retries it or settles the request.
    pub(super) fn complete(&mut self, d: Completed, seq: u64, at_ms: i64) {
        let sc = self.sc;
        let c = &sc.channels[d.req.channel];
        self.id_buf.clear();
        use std::fmt::Write;
        let _ = write!(self.id_buf, "sim-{seq}");
        let ev = d.event(&self.id_buf, at_ms, &c.id, &sc.gateway.group, "sim-gw");
        self.emitter
            .emit(&ev, &mut self.composition, &mut self.result);
        let j = d.req.channel;
        let before = self.streaks[j].count;
        if self.streaks[j].record(d.error) > before {
            let at_s = (at_ms - sc.start_ms) as f64 / 1000.0;
            let in_fault = c.faults.iter().any(|f| at_s >= f.start_s && at_s < f.end_s);
            if self.streaks[j].count >= self.policies[j]
                && in_fault
                && self.result.channels[j].nth_failure_s.is_none()
            {
                self.result.channels[j].nth_failure_s = Some(at_s);
            }
        }
        let retryable = matches!(
            d.error,
            ErrorClass::RateLimited
                | ErrorClass::ServerError
                | ErrorClass::ReadTimeout
                | ErrorClass::ConnectionReset
                | ErrorClass::ConnectError
        );
        let retry = retryable && !d.req.probe && (d.req.attempt as u32) < sc.gateway.max_retries;
        if !retry && !d.req.probe && d.failed {
            self.result.failed_requests += 1;
        }
        if retry {
            self.seq += 1;
            let mut req = d.req;
            req.attempt += 1;
            self.queue.push(Reverse(Queued {
                at_ms: at_ms + sc.gateway.retry_delay_ms,
                seq: self.seq,
                what: Pending::Retry(req),
            }));
        }
    }

    /// Gateways pick up each new snapshot; the timeline samples every
    /// planning round.
    pub(super) fn pick_up_snapshot(&mut self, t_s: f64) {
        let composition = &self.composition;
        if composition.plans() == self.plans {
            return;
        }
        self.plans = composition.plans();
        if composition.published() != self.published {
            self.published = composition.published();
            if let Some(snap) = composition.snapshot(&self.group) {
                self.table = RoutingTable::new(snap.clone());
            }
        }
        let Some(plan) = composition.plan(&self.group) else {
            return;
        };
        let gap = !plan.classes_without_retry_path().is_empty();
        match (gap, self.retry_gap_since) {
            (true, None) => self.retry_gap_since = Some(t_s),
            (false, Some(since)) => {
                self.result.no_retry_path_s += t_s - since;
                self.retry_gap_since = None;
            }
            _ => {}
        }
        let total: f64 = plan.classes.iter().map(|c| c.demand_rps).sum();
        for cp in &plan.channels {
            let Some(j) = self.ids.iter().position(|id| *id == cp.id) else {
                continue;
            };
            let (state, health_weight, score) = composition.engine.channel_index(&cp.id).map_or(
                (StateKind::Healthy, 1.0, None),
                |i| {
                    let h = composition.engine.health(i);
                    (composition.engine.machine(i).kind(), h.weight, h.score)
                },
            );
            let traffic_share = if total > 0.0 {
                cp.planned_rps / total
            } else {
                0.0
            };
            self.result.channels[j].samples.push(Sample {
                t_s,
                state,
                health_weight,
                traffic_share,
                score,
                reason: cp.reason,
            });
        }
    }

    /// Each gateway's probes that are due.
    pub(super) fn probes(&mut self, t_ms: i64, t_s: f64) {
        let every = self.sc.gateway.probe_interval_s;
        if every <= 0.0 {
            return;
        }
        for j in 0..self.next_probe_s.len() {
            while self.next_probe_s[j] <= t_s {
                self.next_probe_s[j] += every;
                self.dispatch(Request::probe(j), t_ms);
            }
        }
    }

    /// This step's new requests, per traffic line, routed as gateways do.
    pub(super) fn new_requests(&mut self, t_ms: i64, t_s: f64) {
        let sc = self.sc;
        let step = sc.step_ms;
        for tr in &sc.traffic {
            let mut rate = tr.rps
                * (1.0 + tr.diurnal_amplitude * (std::f64::consts::TAU * t_s / 86_400.0).sin());
            for b in &tr.bursts {
                if t_s >= b.start_s && t_s < b.end_s {
                    rate *= b.factor;
                }
            }
            let count = self.rng.poisson(rate * step as f64 / 1000.0);
            for _ in 0..count {
                self.result.requests += 1;
                let class = tr.class.class();
                let long = self.rng.chance(tr.long_share);
                let structured = self.rng.chance(tr.structured_share);
                let at = t_ms + (self.rng.f64() * step as f64) as i64;
                match self.route(class) {
                    Routed::To(j) => {
                        let req = Request {
                            class,
                            long,
                            structured,
                            probe: false,
                            attempt: 0,
                            channel: j,
                        };
                        self.dispatch(req, at);
                    }
                    Routed::Unsent(how, j) => self.unsent(how, j, class, 0, at),
                }
            }
        }
    }

    pub(super) fn route(&mut self, class: TrafficClass) -> Routed {
        route(&self.table, class, &self.ids, &mut self.rng)
    }

    /// Sends an attempt to its channel: the upstream answers (or its quota
    /// refuses), and the completion is queued at its latency.
    pub(super) fn dispatch(&mut self, req: Request, t_ms: i64) {
        let sc = self.sc;
        let j = req.channel;
        let load = &mut self.load;
        load.second_counts[j] += 1;
        let frac =
            (((t_ms - sc.start_ms) as f64 / 1000.0) - load.current_second as f64).clamp(0.0, 1.0);
        let load = load_rps(&load.history[j], load.second_counts[j], frac);
        let t_s = (t_ms - sc.start_ms) as f64 / 1000.0;
        let c = &sc.channels[j];
        let rng = &mut self.rng;
        let done = match c.quota {
            Some(quota) => {
                let period = (t_ms as f64 / 1000.0 / c.quota_period_s).floor() as i64;
                let used = &mut self.quota_use[j];
                if used.0 != period {
                    *used = (period, 0);
                }
                let mut done = if used.1 >= quota {
                    quota_refused(&req, rng)
                } else {
                    used.1 += 1;
                    answer(c, &self.bases[j], &req, t_s, load, self.faults_on, rng)
                };
                if c.report_quota {
                    done.quota_remaining = Some(quota.saturating_sub(used.1) as i64);
                }
                done
            }
            None => answer(c, &self.bases[j], &req, t_s, load, self.faults_on, rng),
        };
        let result = &mut self.result;
        result.rate_limited += (done.error == ErrorClass::RateLimited) as u64;
        if !req.probe {
            result.channels[j].served += 1;
            result.channels[j].bad += done.harmed as u64;
            result.spend += done.cost;
            let minute = ((t_ms - sc.start_ms).max(0) / 60_000) as usize;
            if result.spend_by_minute.len() <= minute {
                result.spend_by_minute.resize(minute + 1, 0.0);
            }
            result.spend_by_minute[minute] += done.cost;
        }
        self.seq += 1;
        self.queue.push(Reverse(Queued {
            at_ms: t_ms + done.latency_ms as i64,
            seq: self.seq,
            what: Pending::Done(done),
        }));
    }

    /// A request the plan did not send: counted as failed (the user got
    /// nothing) and, if the gateways report it, emitted as demand.
    pub(super) fn unsent(
        &mut self,
        how: Dispatch,
        j: usize,
        class: TrafficClass,
        attempt: i32,
        t_ms: i64,
    ) {
        let sc = self.sc;
        self.result.shed += 1;
        self.result.failed_requests += 1;
        if !sc.gateway.report_unsent {
            return;
        }
        self.seq += 1;
        let id = format!("sim-unsent-{}", self.seq);
        let ev = RequestEvent::unsent(crate::event::Unsent {
            event_id: &id,
            event_time_ms: t_ms,
            gateway_id: "sim-gw",
            channel_id: &sc.channels[j].id,
            route_group: &sc.gateway.group,
            traffic_class: class,
            attempt,
            dispatch: how,
        });
        self.emitter
            .emit(&ev, &mut self.composition, &mut self.result);
    }
}
