//! `hermes bench`: what the request path costs at steady state, for
//! capacity planning.
//!
//! It runs what `hermes run` runs per record, minus Kafka: decode (plain
//! Avro), then one partition's request path
//! ([`RequestPath`]: dedup, engine, outputs),
//! one partition holding every channel, on one thread; its outputs are
//! emitted as the service emits them (alerts encoded, gauges into a
//! metrics registry, health reports as JSON) and dropped where the service
//! hands them to Kafka.
//! Traffic is `rate` events per second per channel on average (uniform, or
//! skewed so that a few channels carry most of it), stamped in event time,
//! by one gateway or by several whose clocks disagree (`clock_spread_ms`):
//! then a channel's events arrive out of event-time order by up to that
//! much, as they do from a real fleet.
//!
//! Steady state means windows full: the run first warms up for the long
//! window (default 300 s of event time, not timed, events applied without
//! the Avro round trip), then measures `seconds` of event time. Each second
//! of events is encoded untimed, decoded alone (timed: the decode-only
//! figure), then decoded and applied (timed: the request path). The longest
//! pause is the slowest batch of [`PAUSE_BATCH`] records (an evaluation
//! tick lands inside one). Memory is the resident set size that the
//! partition and the registry's gauges added, from `/proc/self/statm`
//! (Linux; `None` elsewhere), so freed-but-kept allocator memory counts, as
//! it does for a capacity plan; beside it, the live heap it added, in all
//! and by allocation size (`heap`), says which structures hold it.
//!
//! The rooms: this file warms up and measures; `traffic` generates and
//! encodes the events, `clocks` reads CPU time and memory, `heap` takes
//! the allocator's census, `scaling` splits the run over partitions and
//! threads.

use crate::codec::{Decoder, Encoder, NoRegistry, WireFormat};
use crate::config::{Config, Tier};
use crate::service::RequestPath;
use std::sync::Arc;
use std::time::{Duration, Instant};
mod scaling;
pub use scaling::*;
mod clocks;
pub use clocks::*;
mod traffic;
pub use traffic::*;
mod heap;
pub use heap::*;

/// Allocation sizes adding fewer bytes a channel are left out of
/// [`BenchReport::heap_by_size`].
pub const HEAP_CLASS_SHOWN: f64 = 16.0;

/// Records per timed batch when looking for the longest pause.
pub const PAUSE_BATCH: usize = 64;
/// Channels per route group.
const GROUP_SIZE: usize = 10;
/// First event time of a run.
const T0: i64 = 1_764_000_000_000;

/// How a run's traffic is spread over its channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mix {
    /// Every channel the same rate.
    Uniform,
    /// Zipf (s = 1) over the channels: the busiest 1 % carry about half.
    Skewed,
}

#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub channels: usize,
    /// Mean events per second per channel.
    pub rate: f64,
    /// Event-time seconds measured after the warm-up.
    pub seconds: u64,
    /// Event-time seconds of warm-up; `None`: the long window.
    pub warmup_seconds: Option<u64>,
    pub mix: Mix,
    /// Gateways sending the traffic (each event from one of them at
    /// random), their clocks spread evenly over `clock_spread_ms`: gateway
    /// `g` of `G` stamps events `g * spread / (G - 1) - spread / 2` ms off
    /// the time they arrive.
    pub gateways: usize,
    pub clock_spread_ms: u64,
    pub seed: u64,
    /// A config file's text whose policy (`[engine]`, `[policy]`, ...) the
    /// run uses instead of the defaults; its groups are replaced.
    pub base_config: Option<String>,
}

/// One run's figures (`hermes bench --json` prints this object).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct BenchReport {
    pub channels: usize,
    pub mix: Mix,
    pub rate_per_channel: f64,
    pub gateways: usize,
    pub clock_spread_ms: u64,
    pub warmup_seconds: u64,
    pub seconds: u64,
    /// Events decoded and applied in the measured part.
    pub events: u64,
    /// Decode + dedup + engine + outputs, per wall second.
    pub events_per_s: f64,
    pub ns_per_event: f64,
    /// Decode alone, same events, same run.
    pub decode_only_events_per_s: f64,
    /// Hermes' own time per event: `ns_per_event` less decode-only's ns
    /// per event. Compare two builds by this rather than by the ratio: a
    /// change in one module can move where the decoder's code lands and
    /// how it is inlined (~14 % seen), which moves the ratio's yardstick.
    #[serde(default)]
    pub own_ns_per_event: f64,
    /// `events_per_s / decode_only_events_per_s`.
    pub ratio_to_decode: f64,
    /// The same ratio by the thread's CPU time (decode's CPU time over the
    /// request path's): unmoved by time another process takes from this
    /// one, so two builds compare on a shared machine in fewer runs. The
    /// capacity figure is the wall-time one. `None` where the clock is not
    /// available.
    #[serde(default)]
    pub cpu_ratio_to_decode: Option<f64>,
    /// Resident memory the partition added, per channel, at the end.
    pub bytes_per_channel: Option<u64>,
    /// Resident memory per configured channel of a partition that never
    /// sees its events.
    pub idle_bytes_per_channel: Option<u64>,
    /// Live heap bytes the partition added, per channel (jemalloc's
    /// allocated bytes): what its structures hold. `bytes_per_channel`
    /// less this is what the resident set adds (allocator slack, huge-page
    /// rounding) or, when negative, capacity reserved and never touched.
    #[serde(default)]
    pub heap_bytes_per_channel: Option<u64>,
    /// The same by allocation size, the largest share first (sizes adding
    /// under [`HEAP_CLASS_SHOWN`] bytes a channel left out): each
    /// structure of a channel is an allocation of its own size, so this
    /// says where its memory goes.
    #[serde(default)]
    pub heap_by_size: Vec<HeapClass>,
    /// The slowest batch of `PAUSE_BATCH` records, in ms of wall time
    /// (what a caller waits, a descheduled thread included).
    pub max_pause_ms: f64,
    /// The slowest batch by the thread's own CPU time, in ms: the request
    /// path's work alone (`None` where the clock is not available).
    pub max_pause_cpu_ms: Option<f64>,
    /// Evaluation ticks run in the measured part.
    pub evaluations: u64,
    /// The process's resident memory in transparent huge pages at the end
    /// (`AnonHugePages`, Linux): whether the allocator's advice
    /// (`crate::allocator`) took effect on this machine.
    #[serde(default)]
    pub huge_page_bytes: Option<u64>,
}

/// A config of `channels` channels in groups of ten (a third free), with
/// the policy of `base` (a config file's text: its `groups` are replaced),
/// or the defaults.
pub fn config(channels: usize, base: Option<&str>) -> anyhow::Result<Config> {
    Ok(Config::from_toml(&config_text(channels, base)?)?)
}

/// The text of [`config`] (what a service that reads a file is given).
pub fn config_text(channels: usize, base: Option<&str>) -> anyhow::Result<String> {
    let mut text = match base {
        Some(b) => {
            let mut table: toml::Table = toml::from_str(b)?;
            table.remove("groups");
            toml::to_string(&table)?
        }
        None => String::new(),
    };
    text.push('\n');
    for g in 0..channels.div_ceil(GROUP_SIZE) {
        text.push_str(&format!("[[groups]]\nid = \"g{g}\"\n"));
        for c in 0..GROUP_SIZE.min(channels - g * GROUP_SIZE) {
            let tier = if c % 3 == 0 { Tier::Free } else { Tier::Paid };
            text.push_str(&format!(
                "[[groups.channels]]\nid = \"ch-{g}-{c}\"\ntier = \"{}\"\nprice_per_1k_tokens = {}\ncapacity_rps = 1000.0\n",
                tier.as_str(),
                if tier == Tier::Free { 0.0 } else { 0.5 }
            ));
        }
    }
    Ok(text)
}

/// Refuses options the bench cannot run.
fn check(opts: &BenchOptions) -> anyhow::Result<()> {
    anyhow::ensure!(opts.channels > 0, "--channels must be at least 1");
    anyhow::ensure!(
        opts.rate > 0.0 && opts.rate.is_finite(),
        "--rate must be positive"
    );
    anyhow::ensure!(opts.seconds > 0, "--seconds must be at least 1");
    anyhow::ensure!(opts.gateways > 0, "--gateways must be at least 1");
    anyhow::ensure!(
        opts.gateways > 1 || opts.clock_spread_ms == 0,
        "--clock-spread-ms needs two gateways or more"
    );
    Ok(())
}

/// What the measured seconds took: the request path and decoding alone,
/// by the wall clock and the thread's CPU clock, and the slowest batch.
struct Timings {
    apply: Duration,
    decode: Duration,
    apply_cpu: Option<Duration>,
    decode_cpu: Option<Duration>,
    max_pause: Duration,
    max_pause_cpu: Option<Duration>,
    events: u64,
}

/// Event-time seconds `seconds` through the partition, not timed: the
/// windows fill.
fn warm_up(path: &mut RequestPath, traffic: &mut Traffic, seconds: std::ops::Range<u64>) {
    let per_second = traffic.per_second;
    for s in seconds {
        let sec = traffic.second(s);
        let mut batch = Vec::with_capacity(PAUSE_BATCH);
        // A batch at a time: a second's events held at once would stay in
        // the allocator and count as the partition's memory.
        for start in (0..per_second).step_by(PAUSE_BATCH) {
            let end = per_second.min(start + PAUSE_BATCH);
            batch.clear();
            batch.extend((start..end).map(|i| traffic.event(&sec, i)));
            let wall = sec.arrival_ms(end - 1, per_second);
            path.apply(&batch, wall);
        }
    }
}

/// Event-time seconds `seconds`, encoded, then decoded alone and through
/// the request path, each timed.
fn measure(
    path: &mut RequestPath,
    traffic: &mut Traffic,
    seconds: std::ops::Range<u64>,
) -> anyhow::Result<Timings> {
    let per_second = traffic.per_second;
    let mut encoder = Encoder::default();
    let mut encoded = Encoded {
        bytes: Vec::with_capacity(per_second * 160),
        ends: Vec::with_capacity(per_second),
    };
    let decoder = Decoder::new(WireFormat::Plain);
    let mut t = Timings {
        apply: Duration::ZERO,
        decode: Duration::ZERO,
        apply_cpu: Some(Duration::ZERO),
        decode_cpu: Some(Duration::ZERO),
        max_pause: Duration::ZERO,
        max_pause_cpu: None,
        events: 0,
    };
    for s in seconds {
        let sec = traffic.second(s);
        encoded.bytes.clear();
        encoded.ends.clear();
        for i in 0..per_second {
            encoder.encode_plain(&traffic.event(&sec, i), &mut encoded.bytes)?;
            encoded.ends.push(encoded.bytes.len());
        }
        let cpu_started = thread_cpu_time();
        let started = Instant::now();
        let mut decoded = 0usize;
        for rec in encoded.records() {
            decoded += decoder.decode(rec, &NoRegistry).is_ok() as usize;
        }
        t.decode += started.elapsed();
        t.decode_cpu = t
            .decode_cpu
            .zip(cpu_between(cpu_started, thread_cpu_time()))
            .map(|(a, c)| a + c);
        anyhow::ensure!(decoded == per_second, "the bench's own records must decode");
        let records: Vec<&[u8]> = encoded.records().collect();
        let mut events_of_batch = Vec::with_capacity(PAUSE_BATCH);
        for (b, batch) in records.chunks(PAUSE_BATCH).enumerate() {
            let wall = sec.arrival_ms(b * PAUSE_BATCH + batch.len() - 1, per_second);
            // Read outside the timed span, so the clock's cost is not timed.
            let cpu_started = thread_cpu_time();
            let started = Instant::now();
            // As the request loop does: decode what was polled, then apply
            // it in order, hinting the memory of the records ahead.
            events_of_batch.clear();
            events_of_batch.extend(
                batch
                    .iter()
                    .filter_map(|rec| decoder.decode(rec, &NoRegistry).ok()),
            );
            path.apply(&events_of_batch, wall);
            let took = started.elapsed();
            let cpu = cpu_between(cpu_started, thread_cpu_time());
            if let Some(cpu) = cpu {
                t.max_pause_cpu = Some(t.max_pause_cpu.map_or(cpu, |m| m.max(cpu)));
            }
            t.apply_cpu = t.apply_cpu.zip(cpu).map(|(a, c)| a + c);
            t.apply += took;
            t.max_pause = t.max_pause.max(took);
        }
        t.events += per_second as u64;
    }
    Ok(t)
}

/// Runs one benchmark.
pub fn run(opts: &BenchOptions) -> anyhow::Result<BenchReport> {
    check(opts)?;
    let cfg = Arc::new(config(opts.channels, opts.base_config.as_deref())?);
    let warmup = opts
        .warmup_seconds
        .unwrap_or((cfg.engine.long_window_ms / 1000) as u64);
    let mut traffic = Traffic::new(opts);
    // What a partition costs for configured channels whose events go to
    // other partitions (it never sees them).
    let before = rss_bytes();
    let idle = RequestPath::new(cfg.clone(), 1, "bench");
    let idle_bytes = rss_bytes()
        .zip(before)
        .map(|(a, b)| a.saturating_sub(b) / opts.channels as u64);
    drop(idle);
    // The partition and its metrics registry: the gauges of every channel
    // evaluated live there, and count as the channels' memory.
    let before = rss_bytes();
    let heap_before = HeapCensus::take();
    let mut path = RequestPath::new(cfg, 0, "bench");
    warm_up(&mut path, &mut traffic, 0..warmup);
    let evaluations_before = path.evaluations();
    let t = measure(&mut path, &mut traffic, warmup..warmup + opts.seconds)?;
    let after = rss_bytes();
    let heap = heap_before
        .zip(HeapCensus::take())
        .map(|(b, a)| a.since(&b, opts.channels));
    let events = t.events;
    let per_s = |d: Duration| events as f64 / d.as_secs_f64().max(1e-9);
    let events_per_s = per_s(t.apply);
    let decode_only = per_s(t.decode);
    Ok(BenchReport {
        channels: opts.channels,
        mix: opts.mix,
        rate_per_channel: opts.rate,
        gateways: opts.gateways,
        clock_spread_ms: opts.clock_spread_ms,
        warmup_seconds: warmup,
        seconds: opts.seconds,
        events,
        events_per_s,
        ns_per_event: t.apply.as_nanos() as f64 / events.max(1) as f64,
        decode_only_events_per_s: decode_only,
        own_ns_per_event: (t.apply.as_nanos() as f64 - t.decode.as_nanos() as f64)
            / events.max(1) as f64,
        ratio_to_decode: events_per_s / decode_only,
        cpu_ratio_to_decode: t
            .decode_cpu
            .zip(t.apply_cpu)
            .filter(|(_, a)| !a.is_zero())
            .map(|(d, a)| d.as_secs_f64() / a.as_secs_f64()),
        bytes_per_channel: before
            .zip(after)
            .map(|(b, a)| a.saturating_sub(b) / opts.channels as u64),
        idle_bytes_per_channel: idle_bytes,
        heap_bytes_per_channel: heap.as_ref().map(|h| h.0),
        heap_by_size: heap.map_or_else(Vec::new, |h| {
            h.1.into_iter()
                .filter(|c| c.bytes_per_channel >= HEAP_CLASS_SHOWN)
                .collect()
        }),
        max_pause_ms: t.max_pause.as_secs_f64() * 1000.0,
        max_pause_cpu_ms: t.max_pause_cpu.map(|d| d.as_secs_f64() * 1000.0),
        evaluations: path.evaluations() - evaluations_before,
        huge_page_bytes: crate::allocator::resident_huge_page_bytes(),
    })
}

impl BenchReport {
    /// One line for a table.
    pub fn line(&self) -> String {
        format!(
            "{:>7} {:<7} {:>9} {:>6.1} {:>11.0} {:>8.0} {:>13.0} {:>6.0} {:>6.2} {:>10} {:>9.1} {:>7} {:>7}",
            self.channels,
            format!("{:?}", self.mix).to_lowercase(),
            format!("{}/{}", self.gateways, self.clock_spread_ms),
            self.rate_per_channel,
            self.events_per_s,
            self.ns_per_event,
            self.decode_only_events_per_s,
            self.own_ns_per_event,
            self.ratio_to_decode,
            self.bytes_per_channel
                .map_or("-".to_string(), |b| b.to_string()),
            self.max_pause_ms,
            self.max_pause_cpu_ms
                .map_or("-".to_string(), |c| format!("{c:.1}")),
            self.huge_page_bytes
                .map_or("-".to_string(), |b| (b >> 20).to_string()),
        )
    }

    /// The live heap a channel added, in all and by allocation size, one
    /// size a line; `None` without the allocator's statistics.
    pub fn heap_lines(&self) -> Option<String> {
        let total = self.heap_bytes_per_channel?;
        let mut out = format!("live heap per channel: {total} B, by allocation size:");
        for c in &self.heap_by_size {
            out.push_str(&format!(
                "\n{:>9} B x {:>6.2} = {:>7.0} B",
                c.size, c.per_channel, c.bytes_per_channel
            ));
        }
        Some(out)
    }

    pub const HEADER: &'static str =
        "channels mix     gw/spread rate/ch    events/s    ns/ev  decode-only/s own ns  ratio  B/channel  pause ms  cpu ms huge MB";
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of `channels` channels, 1 s of warm-up, 2 s measured.
    fn tiny(channels: usize) -> BenchOptions {
        BenchOptions {
            channels,
            rate: 20.0,
            seconds: 2,
            warmup_seconds: Some(1),
            mix: Mix::Uniform,
            gateways: 1,
            clock_spread_ms: 0,
            seed: 1,
            base_config: None,
        }
    }

    #[test]
    fn a_short_run_reports_wall_and_cpu_pauses_and_round_trips_as_json() {
        let opts = tiny(20);
        let r = run(&opts).expect("a short run");
        assert_eq!(r.events, 20 * 20 * 2);
        assert!(r.max_pause_ms > 0.0);
        // The request path decodes too: its own share is what is left.
        let decode_ns = 1e9 / r.decode_only_events_per_s;
        assert!(
            (r.own_ns_per_event - (r.ns_per_event - decode_ns)).abs() < 1e-6 * r.ns_per_event,
            "{} vs {} - {decode_ns}",
            r.own_ns_per_event,
            r.ns_per_event
        );
        if cfg!(target_os = "linux") {
            // The thread's CPU time within a batch never exceeds its wall
            // time (one thread; the clocks' granularity aside).
            let cpu = r.max_pause_cpu_ms.expect("Linux has a thread CPU clock");
            let ratio = r.cpu_ratio_to_decode.expect("and so a CPU-time ratio");
            assert!(ratio > 0.0 && ratio.is_finite(), "{ratio}");
            assert!(
                cpu > 0.0 && cpu <= r.max_pause_ms + 0.05,
                "{cpu} vs {}",
                r.max_pause_ms
            );
        }
        // `cargo bench --bench steady_state` reads the JSON back.
        let back: BenchReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back.line(), r.line());
    }

    #[test]
    fn scaling_runs_every_partition_in_both_phases_and_compares_them() {
        let opts = tiny(40);
        let r = scaling(&opts, 4, 2).expect("a short scaling run");
        // Four partitions of ten channels, 20 events/s each, two seconds.
        assert_eq!((r.channels, r.events), (40, 4 * 10 * 20 * 2));
        assert!(r.one_thread_events_per_s > 0.0 && r.events_per_s > 0.0);
        assert!((r.speedup - r.events_per_s / r.one_thread_events_per_s).abs() < 1e-9);
        assert!((r.efficiency - r.speedup / 2.0).abs() < 1e-9);
        assert!(r.table().contains("efficiency"));
        assert!(scaling(&opts, 0, 2).is_err());
        assert!(scaling(&opts, 41, 2).is_err());
    }
}
