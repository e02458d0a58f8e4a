//! Closed-loop fault simulator (`hermes simulate`).
//!
//! A simulated clock steps by `step_ms`. Each step, simulated gateways turn
//! each traffic class's demand into requests and route every one by the
//! *current plan's* weights for its class (or shed it), so Hermes's decisions
//! change what each channel sees. Each channel answers from its profile, its
//! active fault, and its load: above capacity its latency and 503s rise (the
//! backup that fails under doubled traffic). Completed attempts become request
//! events, go through the Avro encoder and decoder exactly as they would
//! through Kafka, and are applied to the very `Engine` and `Scheduler` the
//! service runs; failed attempts may be retried by the gateway. After each
//! evaluation tick the scheduler re-plans the group.
//!
//! Everything is deterministic for a seed: one RNG, consumed in a fixed order.

pub mod report;
pub mod scenario;

use crate::alert::AlertEvent;
use crate::codec::{Decoder, Encoder, NoRegistry, WireFormat};
use crate::composition::Composition;
use crate::config::Config;
use crate::event::{Dispatch, ErrorClass, FinishReason, RequestEvent, TrafficClass};
use crate::publish::WeightSnapshot;
use crate::routing::{Pick, RoutingTable};
use crate::schedule::Scheduler;
use crate::state::StateKind;
use scenario::{Behavior, Fault, Scenario, SimChannel};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

/// SplitMix64: small, fast, and stable across Rust versions (unlike the
/// streams of general-purpose RNG crates), so seeds replay forever.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn chance(&mut self, p: f64) -> bool {
        self.f64() < p
    }
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.f64()
    }
    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.f64().max(1e-300);
        let u2 = self.f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
    /// Poisson count with mean `lambda`.
    pub fn poisson(&mut self, lambda: f64) -> u32 {
        if lambda <= 0.0 {
            return 0;
        }
        if lambda > 30.0 {
            return (lambda + lambda.sqrt() * self.normal()).round().max(0.0) as u32;
        }
        let l = (-lambda).exp();
        let mut k = 0;
        let mut p = 1.0;
        loop {
            p *= self.f64();
            if p <= l {
                return k;
            }
            k += 1;
        }
    }
}

/// Whether the simulated gateways follow Hermes or keep static weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// Closed loop: weights from the scheduler after every tick.
    Hermes,
    /// The initial trust-tier plan forever (what teams ran before Hermes).
    Static,
}

/// One sample of a channel for the timeline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub t_s: f64,
    pub state: StateKind,
    pub health_weight: f64,
    /// Share of all planned traffic routed to the channel.
    pub traffic_share: f64,
    pub score: Option<f64>,
}

/// Per-channel results of one run.
#[derive(Debug, Clone, Default)]
pub struct ChannelRun {
    pub samples: Vec<Sample>,
    /// Attempts that reached the channel (real traffic, retries included).
    pub served: u64,
    /// Of those, harmed by an active fault or by overload.
    pub bad: u64,
    /// Seconds in which this channel's 5 s mean load exceeded its capacity.
    pub overload_s: u64,
    /// Event time (s) when the consecutive hard-failure streak first reached
    /// the policy's threshold during a fault.
    pub nth_failure_s: Option<f64>,
}

/// Everything one run produced.
#[derive(Debug, Clone, Default)]
pub struct RunResult {
    pub channels: Vec<ChannelRun>,
    pub alerts: Vec<AlertEvent>,
    pub requests: u64,
    /// Attempts answered 429 (the upstream's rate limit or its quota).
    pub rate_limited: u64,
    /// Requests (not attempts) whose final outcome, after the gateway's
    /// retries, was an error or a bad answer, or that were shed.
    pub failed_requests: u64,
    /// Requests shed by the plan (on the first attempt or on a retry).
    pub shed: u64,
    /// Retry attempts dispatched.
    pub retries: u64,
    pub spend: f64,
    /// Spend per minute of the run (index: minute since the start).
    pub spend_by_minute: Vec<f64>,
    /// Seconds in which any channel took more attempts than its capacity.
    pub overload_s: u64,
    pub events: u64,
    /// Events that failed to encode or decode (the codec round trip).
    pub codec_errors: u64,
}

/// An attempt in flight or waiting to be retried.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request {
    pub(crate) class: TrafficClass,
    pub(crate) long: bool,
    pub(crate) structured: bool,
    pub(crate) probe: bool,
    pub(crate) attempt: i32,
    /// Channel index (fixed for probes; chosen at dispatch otherwise).
    pub(crate) channel: usize,
}

impl Request {
    /// A gateway's health probe to channel `channel`: a small structured
    /// request with a fixed answer shape (incident 000's "fixed questions").
    pub(crate) fn probe(channel: usize) -> Request {
        Request {
            class: TrafficClass::Core,
            long: false,
            structured: true,
            probe: true,
            attempt: 0,
            channel,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Completed {
    pub(crate) req: Request,
    pub(crate) error: ErrorClass,
    pub(crate) http_status: i32,
    pub(crate) latency_ms: i32,
    pub(crate) ttfb_ms: Option<i32>,
    pub(crate) input_tokens: i32,
    pub(crate) output_tokens: i32,
    pub(crate) truncated: bool,
    pub(crate) schema_valid: Option<bool>,
    pub(crate) replacement_chars: i32,
    pub(crate) cost: f64,
    /// What the gateway reports of the upstream's remaining quota.
    pub(crate) quota_remaining: Option<i64>,
    /// Harmed by an active fault or by overload (attribution, per attempt).
    pub(crate) harmed: bool,
    /// What the user got was bad, whatever the cause: an error, or an answer
    /// that is truncated, garbled, schema-invalid, short or too slow.
    pub(crate) failed: bool,
}

impl Completed {
    /// An HTTP 200 with nothing measured yet; `answer` fills it in.
    fn ok(req: &Request, input_tokens: i32) -> Completed {
        Completed {
            req: *req,
            error: ErrorClass::None,
            http_status: 200,
            latency_ms: 0,
            ttfb_ms: None,
            input_tokens,
            output_tokens: 0,
            truncated: false,
            schema_valid: None,
            replacement_chars: 0,
            cost: 0.0,
            quota_remaining: None,
            harmed: false,
            failed: false,
        }
    }

    /// The request event a gateway emits for this attempt.
    pub(crate) fn event<'a>(
        &self,
        event_id: &'a str,
        event_time_ms: i64,
        channel_id: &'a str,
        route_group: &'a str,
        gateway_id: &'a str,
    ) -> RequestEvent<'a> {
        RequestEvent {
            event_id,
            event_time_ms,
            gateway_id,
            channel_id,
            route_group,
            model: "sim-model",
            traffic_class: self.req.class,
            attempt: self.req.attempt,
            http_status: self.http_status,
            error_class: self.error,
            latency_ms: self.latency_ms,
            ttfb_ms: self.ttfb_ms,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            finish_reason: if self.error != ErrorClass::None {
                FinishReason::Error
            } else if self.truncated {
                FinishReason::Length
            } else {
                FinishReason::Stop
            },
            truncated: self.truncated,
            schema_valid: self.schema_valid,
            replacement_chars: self.replacement_chars,
            is_probe: self.req.probe,
            cost: self.cost,
            quota_remaining: self.quota_remaining,
            trace_id: None,
            dispatch: crate::event::Dispatch::Sent,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Pending {
    Done(Completed),
    Retry(Request),
}

struct Queued {
    at_ms: i64,
    seq: u64,
    what: Pending,
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

/// The behavior of a channel for one request at one instant, and whether a
/// fault (rather than the normal profile) is shaping it.
fn behavior_at<'c>(
    c: &'c SimChannel,
    base: &Behavior,
    t_s: f64,
    long: bool,
    faults_on: bool,
) -> (Behavior, Option<&'c Fault>, bool) {
    if !faults_on {
        return (*base, None, false);
    }
    for f in &c.faults {
        if t_s < f.start_s || t_s >= f.end_s || (f.only_long && !long) {
            continue;
        }
        let x = if f.ramp_s > 0.0 {
            ((t_s - f.start_s) / f.ramp_s).min(1.0)
        } else {
            1.0
        };
        let mut b = Behavior::lerp(base, &base.with(&f.profile), x);
        let mut pulsing = false;
        if let Some(p) = f.pulse {
            let n = ((t_s - f.start_s) / p.period_s).floor();
            let into = t_s - f.start_s - n * p.period_s;
            // Per-pulse length, deterministic from the pulse number.
            let len = match p.max_duration_s {
                Some(max) => {
                    let h = Rng::new(n as u64 ^ 0xabcd).f64();
                    p.duration_s + (max - p.duration_s) * h
                }
                None => p.duration_s,
            };
            if into >= p.period_s - len {
                pulsing = true;
                b.latency_p50_ms = p.latency_ms;
                b.latency_p99_ms = p.latency_ms * 1.1;
            }
        }
        return (b, Some(f), pulsing);
    }
    (*base, None, false)
}

/// How one channel answers one attempt.
#[allow(clippy::too_many_arguments)]
pub(crate) fn answer(
    c: &SimChannel,
    base: &Behavior,
    req: &Request,
    t_s: f64,
    load_rps: f64,
    faults_on: bool,
    rng: &mut Rng,
) -> Completed {
    let (b, fault, pulsing) = behavior_at(c, base, t_s, req.long, faults_on);
    let input_tokens = if req.probe {
        40
    } else if req.long {
        rng.range(4_000.0, 12_000.0) as i32
    } else {
        rng.range(200.0, 2_000.0) as i32
    };
    let mut out = Completed::ok(req, input_tokens);
    let overload = (load_rps / c.capacity_rps).max(1.0);
    let error = if fault.is_some_and(|f| f.refuse_all) {
        Some((ErrorClass::ConnectError, 0, rng.range(20.0, 60.0)))
    } else {
        draw_error(&b, load_rps, overload, rng)
    };
    if let Some((e, status, latency)) = error {
        out.error = e;
        out.http_status = status;
        out.latency_ms = latency.max(1.0) as i32;
        out.harmed = fault.is_some() || overload > 1.0;
        out.failed = true;
        return out;
    }
    let latency = draw_body(&mut out, c, &b, req, input_tokens, overload, rng);
    judge(
        &mut out,
        base,
        req,
        latency,
        overload,
        fault.is_some(),
        pulsing,
    );
    out
}

/// Whether the attempt fails, and how (class, HTTP status, latency): the
/// upstream's own rate limiter sheds the excess over its limit, overload
/// (queueing) fails a share with 503, then the profile's error rates. One
/// uniform draw picks among them.
fn draw_error(
    b: &Behavior,
    load_rps: f64,
    overload: f64,
    rng: &mut Rng,
) -> Option<(ErrorClass, i32, f64)> {
    let p429 = b.rate_limited_rate
        + if load_rps > b.rate_limit_rps {
            1.0 - b.rate_limit_rps / load_rps
        } else {
            0.0
        };
    let p_overload = ((overload - 1.0) * 0.8).min(0.6);
    let u = rng.f64();
    let mut acc = 0.0;
    let mut pick = |p: f64| {
        acc += p;
        u < acc
    };
    let typical = b.latency_p50_ms;
    if pick(p429) {
        Some((ErrorClass::RateLimited, 429, rng.range(30.0, 120.0)))
    } else if pick(b.server_error_rate + p_overload) {
        Some((ErrorClass::ServerError, 503, typical * rng.range(0.1, 0.5)))
    } else if pick(b.read_timeout_rate) {
        Some((ErrorClass::ReadTimeout, 0, 10_000.0))
    } else if pick(b.connection_reset_rate) {
        Some((
            ErrorClass::ConnectionReset,
            0,
            typical * rng.range(0.1, 1.0),
        ))
    } else {
        None
    }
}

/// A successful attempt's latency and answer: lognormal latency through the
/// profile's P50/P99 (inflated by overload), output tokens, and the
/// profile's truncation, empty, garbled and schema-invalid rates. Returns
/// the latency drawn (ms, unclamped).
fn draw_body(
    out: &mut Completed,
    c: &SimChannel,
    b: &Behavior,
    req: &Request,
    input_tokens: i32,
    overload: f64,
    rng: &mut Rng,
) -> f64 {
    let sigma =
        ((b.latency_p99_ms.max(b.latency_p50_ms * 1.01) / b.latency_p50_ms).ln() / 2.326).max(0.01);
    let mut latency = (b.latency_p50_ms.ln() + sigma * rng.normal()).exp();
    if req.long {
        latency *= 1.6;
    }
    if req.probe {
        latency *= 0.5;
    }
    latency *= overload * overload;
    out.latency_ms = latency.clamp(1.0, 600_000.0) as i32;
    out.ttfb_ms = Some((latency * b.ttfb_share).max(1.0) as i32);
    let median = if req.probe {
        60.0
    } else {
        b.output_tokens_median
    };
    let mut tokens = (median.max(1.0).ln() + 0.35 * rng.normal()).exp();
    if rng.chance(b.truncation_rate) {
        out.truncated = true;
        tokens *= 0.4;
    }
    // Drawn only when the profile has empty answers, so scenarios without
    // them keep their random streams (and reports) unchanged.
    if b.empty_rate > 0.0 && rng.chance(b.empty_rate) {
        tokens = rng.range(0.0, 10.0);
    }
    out.output_tokens = tokens.max(1.0) as i32;
    if rng.chance(b.garbled_rate) {
        out.replacement_chars = 1 + (rng.f64() * 5.0) as i32;
    }
    if req.structured {
        out.schema_valid = Some(!rng.chance(b.schema_invalid_rate));
    }
    out.cost = c.price_per_1k_tokens * (input_tokens + out.output_tokens) as f64 / 1000.0;
    latency
}

/// The verdicts on a successful attempt: `harmed` (by an active fault or by
/// overload: the diagnostic) and `failed` (what the user saw, judged
/// against the channel's normal profile `base`).
fn judge(
    out: &mut Completed,
    base: &Behavior,
    req: &Request,
    latency: f64,
    overload: f64,
    faulty: bool,
    pulsing: bool,
) {
    let normal_p99 =
        base.latency_p99_ms * if req.long { 1.6 } else { 1.0 } * if req.probe { 0.5 } else { 1.0 };
    let quality_bad = out.truncated || out.replacement_chars > 0 || out.schema_valid == Some(false);
    let short = |share: f64| (out.output_tokens as f64) < base.output_tokens_median * share;
    let too_slow = pulsing || latency > normal_p99 * 1.2;
    out.harmed = overload > 1.0 && latency > normal_p99
        || faulty && (quality_bad || too_slow || short(0.5) && !req.probe);
    // The user's verdict: a short answer is one under 30 % of the channel's
    // normal median (a healthy answer is that short about once in 3 000; at
    // half the median it would be once in 40, which is noise, not harm).
    out.failed = quality_bad || too_slow || short(0.3) && !req.probe;
}

/// The upstream's answer once its quota is used up: 429, at once.
fn quota_refused(req: &Request, rng: &mut Rng) -> Completed {
    Completed {
        error: ErrorClass::RateLimited,
        http_status: 429,
        latency_ms: rng.range(30.0, 120.0) as i32,
        harmed: true,
        failed: true,
        ..Completed::ok(req, 0)
    }
}

/// Seconds over which a channel's load is averaged (model and `overload_s`).
pub const LOAD_WINDOW_S: usize = 5;

/// Mean attempts per second over the last `LOAD_WINDOW_S` seconds, where the
/// current second is `frac` done with `current` attempts so far.
fn load_rps(history: &[u32; LOAD_WINDOW_S], current: u32, frac: f64) -> f64 {
    let full: u32 = history[..LOAD_WINDOW_S - 1].iter().sum();
    let oldest = history[LOAD_WINDOW_S - 1] as f64 * (1.0 - frac);
    (full as f64 + oldest + current as f64) / LOAD_WINDOW_S as f64
}

/// The plan's choice for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Routed {
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
fn route(table: &RoutingTable, class: TrafficClass, ids: &[String], rng: &mut Rng) -> Routed {
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
struct Emitter<'r> {
    encoder: Encoder,
    decoder: Decoder,
    buf: Vec<u8>,
    record: Option<&'r mut Vec<Vec<u8>>>,
    routing: Routing,
}

impl Emitter<'_> {
    fn emit(
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

/// Runs one scenario once. `record` collects every encoded event.
pub fn run<'a>(
    sc: &'a Scenario,
    cfg: Arc<Config>,
    routing: Routing,
    faults_on: bool,
    seed: u64,
    record: Option<&'a mut Vec<Vec<u8>>>,
) -> RunResult {
    match SimRun::new(sc, cfg, routing, faults_on, seed, record) {
        Some(run) => run.run(),
        None => RunResult {
            channels: vec![ChannelRun::default(); sc.channels.len()],
            ..RunResult::default()
        },
    }
}

/// Attempts started per channel in each of the last `LOAD_WINDOW_S`
/// seconds: an upstream's load is their mean (its queue absorbs one-second
/// blips).
struct Load {
    second_counts: Vec<u32>,
    history: Vec<[u32; LOAD_WINDOW_S]>,
    current_second: i64,
}

/// One simulation in progress: the gateways (their queue of completions and
/// retries, their routing table, probes), the upstreams' load and quotas,
/// Hermes when it routes, and the tally.
struct SimRun<'a> {
    sc: &'a Scenario,
    faults_on: bool,
    group: String,
    bases: Vec<Behavior>,
    /// Per channel: the consecutive-failure threshold (report bookkeeping).
    policies: Vec<u32>,
    streaks: Vec<crate::window::FailureStreak>,
    composition: Composition,
    rng: Rng,
    queue: BinaryHeap<Reverse<Queued>>,
    seq: u64,
    result: RunResult,
    /// What the gateways route by: static weights until Hermes publishes.
    table: RoutingTable,
    ids: Vec<String>,
    plans: u64,
    published: u64,
    emitter: Emitter<'a>,
    id_buf: String,
    load: Load,
    next_probe_s: Vec<f64>,
    /// Per channel: (quota period number, attempts used in it).
    quota_use: Vec<(i64, u64)>,
}

impl<'a> SimRun<'a> {
    fn new(
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
        })
    }

    /// Steps the scenario's clock: per step, completions and retries due,
    /// Hermes's clock, a new snapshot, probes, then new requests.
    fn run(mut self) -> RunResult {
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
        self.result.alerts = std::mem::take(&mut self.composition.alerts);
        self.result
    }

    /// At a new second: the load history moves on and overload is counted.
    fn roll_second(&mut self, second: i64) {
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
    fn completions(&mut self, t_ms: i64) {
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
    fn complete(&mut self, d: Completed, seq: u64, at_ms: i64) {
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
    fn pick_up_snapshot(&mut self, t_s: f64) {
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
            });
        }
    }

    /// Each gateway's probes that are due.
    fn probes(&mut self, t_ms: i64, t_s: f64) {
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
    fn new_requests(&mut self, t_ms: i64, t_s: f64) {
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

    fn route(&mut self, class: TrafficClass) -> Routed {
        route(&self.table, class, &self.ids, &mut self.rng)
    }

    /// Sends an attempt to its channel: the upstream answers (or its quota
    /// refuses), and the completion is queued at its latency.
    fn dispatch(&mut self, req: Request, t_ms: i64) {
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
    fn unsent(&mut self, how: Dispatch, j: usize, class: TrafficClass, attempt: i32, t_ms: i64) {
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

/// The three runs behind a drill report: Hermes closed loop, static
/// weights, and Hermes without faults (the spend baseline).
pub fn drill(
    sc: &Scenario,
    cfg: Arc<Config>,
    seed: u64,
    record: Option<&mut Vec<Vec<u8>>>,
) -> (report::Report, RunResult) {
    let hermes = run(sc, cfg.clone(), Routing::Hermes, true, seed, record);
    let static_run = run(sc, cfg.clone(), Routing::Static, true, seed, None);
    let baseline = run(sc, cfg, Routing::Hermes, false, seed, None);
    (
        report::build(sc, seed, &hermes, &static_run, &baseline),
        hermes,
    )
}
