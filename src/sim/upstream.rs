//! The simulated upstream: a request, the attempt's answer drawn from the
//! channel's profile, its active fault and its load, and the verdicts on it
//! (harmed by the fault, failed for the user).

use super::scenario::{Behavior, Fault, SimChannel};
use super::Rng;
use crate::event::{ErrorClass, FinishReason, RequestEvent, TrafficClass};

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
    pub(super) fn ok(req: &Request, input_tokens: i32) -> Completed {
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

/// The behavior of a channel for one request at one instant, and whether a
/// fault (rather than the normal profile) is shaping it.
pub(super) fn behavior_at<'c>(
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
pub(super) fn draw_error(
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
pub(super) fn draw_body(
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
pub(super) fn judge(
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
pub(super) fn quota_refused(req: &Request, rng: &mut Rng) -> Completed {
    Completed {
        error: ErrorClass::RateLimited,
        http_status: 429,
        latency_ms: rng.range(30.0, 120.0) as i32,
        harmed: true,
        failed: true,
        ..Completed::ok(req, 0)
    }
}
