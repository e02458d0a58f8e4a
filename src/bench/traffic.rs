//! The generated traffic: channels in route groups of ten, each second's
//! events by channel (even or Zipf-skewed, from one or several gateways
//! with spread clocks), encoded as the gateways would send them.

use super::{BenchOptions, Mix, GROUP_SIZE, T0};
use crate::codec::Encoder;
use crate::event::{Dispatch, ErrorClass, FinishReason, RequestEvent, TrafficClass};
use crate::sim::Rng;

/// Picks the channel of each event.
pub(super) struct Channels {
    pub(super) ids: Vec<(String, String)>,
    /// Skewed mix: cumulative Zipf weights.
    pub(super) cumulative: Option<Vec<f64>>,
}

impl Channels {
    pub(super) fn new(n: usize, mix: Mix) -> Channels {
        let ids = (0..n)
            .map(|i| {
                let g = i / GROUP_SIZE;
                (format!("ch-{g}-{}", i % GROUP_SIZE), format!("g{g}"))
            })
            .collect();
        let cumulative = (mix == Mix::Skewed).then(|| {
            let mut acc = 0.0;
            (0..n)
                .map(|i| {
                    acc += 1.0 / (i as f64 + 1.0);
                    acc
                })
                .collect()
        });
        Channels { ids, cumulative }
    }

    pub(super) fn pick(&self, i: usize, r: u64) -> &(String, String) {
        match &self.cumulative {
            // Every channel in turn: each gets exactly its share.
            None => &self.ids[i % self.ids.len()],
            Some(c) => {
                let total = c[c.len() - 1];
                let x = (r >> 11) as f64 / (1u64 << 53) as f64 * total;
                &self.ids[c.partition_point(|v| *v < x).min(c.len() - 1)]
            }
        }
    }
}

/// One second of traffic, built from owned strings the events borrow.
pub(super) struct Second {
    pub(super) ids: Vec<String>,
    pub(super) draws: Vec<u64>,
    pub(super) start_ms: i64,
}

impl Second {
    /// When the `i`-th of `n` events arrives (wall time; a gateway stamps
    /// it with its own clock).
    pub(super) fn arrival_ms(&self, i: usize, n: usize) -> i64 {
        self.start_ms + (i * 1000 / n) as i64
    }
}

pub(super) struct Traffic {
    pub(super) channels: Channels,
    pub(super) rng: Rng,
    pub(super) per_second: usize,
    pub(super) next_id: u64,
    /// Each gateway's id and clock offset (ms).
    pub(super) gateways: Vec<(String, i64)>,
}

impl Traffic {
    pub(super) fn new(opts: &BenchOptions) -> Traffic {
        let n = opts.gateways.max(1);
        let spread = opts.clock_spread_ms.min(i64::MAX as u64 / 2) as i64;
        let gateways = (0..n)
            .map(|g| {
                let offset = match n {
                    1 => 0,
                    _ => g as i64 * spread / (n as i64 - 1) - spread / 2,
                };
                (format!("gw-{}", g + 1), offset)
            })
            .collect();
        Traffic {
            channels: Channels::new(opts.channels, opts.mix),
            rng: Rng::new(opts.seed),
            per_second: ((opts.channels as f64 * opts.rate).round() as usize).max(1),
            next_id: 0,
            gateways,
        }
    }

    pub(super) fn second(&mut self, s: u64) -> Second {
        let n = self.per_second;
        let mut out = Second {
            ids: Vec::with_capacity(n),
            draws: Vec::with_capacity(n),
            start_ms: T0 + s as i64 * 1000,
        };
        for _ in 0..n {
            out.ids.push(format!("e{}", self.next_id));
            self.next_id += 1;
            out.draws.push(self.rng.next_u64());
        }
        out
    }

    /// The `i`-th event of `sec`: mostly healthy, 2 % server errors, 1 %
    /// probes, some retries, long inputs and truncations.
    pub(super) fn event<'a>(&'a self, sec: &'a Second, i: usize) -> RequestEvent<'a> {
        let r = sec.draws[i];
        let (channel, group) = self.channels.pick(i, r);
        let failed = r % 50 == 7;
        // Mixed, so the gateway is independent of the fields below.
        let g = (r.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 33) as usize % self.gateways.len();
        let (gateway, offset) = &self.gateways[g];
        RequestEvent {
            event_id: &sec.ids[i],
            event_time_ms: sec.arrival_ms(i, self.per_second) + offset,
            gateway_id: gateway,
            channel_id: channel,
            route_group: group,
            model: "m",
            traffic_class: TrafficClass::ALL[(r >> 8) as usize % 4],
            attempt: r.is_multiple_of(40) as i32,
            http_status: if failed { 503 } else { 200 },
            error_class: if failed {
                ErrorClass::ServerError
            } else {
                ErrorClass::None
            },
            latency_ms: 200 + ((r >> 16) % 1800) as i32,
            ttfb_ms: Some(80 + ((r >> 24) % 300) as i32),
            input_tokens: ((r >> 32) % 6000) as i32,
            output_tokens: 300 + ((r >> 40) % 400) as i32,
            finish_reason: FinishReason::Stop,
            truncated: r.is_multiple_of(97),
            schema_valid: None,
            replacement_chars: 0,
            is_probe: r % 100 == 3,
            cost: 0.001,
            quota_remaining: None,
            trace_id: None,
            dispatch: Dispatch::Sent,
        }
    }
}

/// The traffic of a run, second by second, as encoded records: calls
/// `each(channel_id, record)` for every event of `seconds` seconds of event
/// time from the run's start (what the end-to-end benchmark produces to a
/// topic, keyed by channel as gateways do).
pub fn encoded_traffic(
    opts: &BenchOptions,
    seconds: u64,
    mut each: impl FnMut(&str, &[u8]),
) -> anyhow::Result<()> {
    let mut traffic = Traffic::new(opts);
    let per_second = traffic.per_second;
    let mut encoder = Encoder::default();
    let mut buf = Vec::with_capacity(256);
    for s in 0..seconds {
        let sec = traffic.second(s);
        for i in 0..per_second {
            let ev = traffic.event(&sec, i);
            buf.clear();
            encoder.encode_plain(&ev, &mut buf)?;
            each(ev.channel_id, &buf);
        }
    }
    Ok(())
}

/// The encoded records of one second, back to back.
pub(super) struct Encoded {
    pub(super) bytes: Vec<u8>,
    pub(super) ends: Vec<usize>,
}

impl Encoded {
    pub(super) fn records(&self) -> impl Iterator<Item = &[u8]> {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let r = &self.bytes[start..end];
            start = end;
            r
        })
    }
}
