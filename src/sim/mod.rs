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
//!
//! The rooms: `closed_loop` runs one simulation (gateways, load, Hermes),
//! `upstream` draws each attempt's answer and judges it, `scenario` is the
//! file format, `report` turns a run into the drill report and its timeline.

pub mod report;
pub mod scenario;

use crate::alert::AlertEvent;
use crate::config::Config;
use crate::state::StateKind;
use scenario::Scenario;
use std::sync::Arc;
mod upstream;
pub(crate) use upstream::*;
mod closed_loop;
pub use closed_loop::*;

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
    /// Why the plan gave it that share (panic mode shows here).
    pub reason: crate::schedule::ShareReason,
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
    /// Seconds in which the plan left a class with demand without a
    /// healthy channel while one had room (docs/decisions.md#safety-rails).
    pub no_retry_path_s: f64,
    pub events: u64,
    /// Events that failed to encode or decode (the codec round trip).
    pub codec_errors: u64,
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
