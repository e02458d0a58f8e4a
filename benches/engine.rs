//! Hot-path benchmarks (one thread).
//!
//! - `decode/*`: one request event from bytes, serde_avro_fast (what Hermes
//!   uses) next to apache-avro's Value + from_value path (the reason for the
//!   choice; see README).
//! - `pipeline/decode_apply_1000_channels`: decode + `Engine::apply` for a
//!   stream over 1 000 channels in 100 groups, at 20 000 events/s of event
//!   time, so the per-tick evaluation of all channels is included in the
//!   per-event cost. Target (issue 2): ≥ 2 M events/s.
//!
//! `cargo bench --bench engine`; criterion prints time per batch and
//! throughput in elements (events) per second.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use hermes::codec::{Decoder, Encoder, NoRegistry, WireFormat, REQUEST_EVENT_SCHEMA_JSON};
use hermes::config::Config;
use hermes::engine::Engine;
use hermes::event::{ErrorClass, FinishReason, RequestEvent, TrafficClass};
use std::hint::black_box;
use std::sync::Arc;

const CHANNELS: usize = 1_000;
const GROUP_SIZE: usize = 10;
const EVENTS: usize = 200_000;
const T0: i64 = 1_764_000_000_000;

fn config() -> Config {
    let mut text = String::new();
    for g in 0..CHANNELS / GROUP_SIZE {
        text.push_str(&format!("[[groups]]\nid = \"g{g}\"\n"));
        for c in 0..GROUP_SIZE {
            let tier = if c % 3 == 0 { "free" } else { "paid" };
            text.push_str(&format!(
                "[[groups.channels]]\nid = \"ch-{g}-{c}\"\ntier = \"{tier}\"\nprice_per_1k_tokens = 0.5\ncapacity_rps = 100.0\n"
            ));
        }
    }
    Config::from_toml(&text).expect("bench config")
}

/// Pre-encoded records: mostly healthy, 2 % errors, 1 % probes, some long.
fn records() -> Vec<Vec<u8>> {
    let ids: Vec<(String, String)> = (0..CHANNELS)
        .map(|i| {
            (
                format!("ch-{}-{}", i / GROUP_SIZE, i % GROUP_SIZE),
                format!("g{}", i / GROUP_SIZE),
            )
        })
        .collect();
    let mut enc = Encoder::default();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..EVENTS)
        .map(|i| {
            let r = next();
            let (channel, group) = &ids[(r % CHANNELS as u64) as usize];
            let event_id = format!("e{i}");
            let failed = r % 50 == 7;
            let ev = RequestEvent {
                event_id: &event_id,
                event_time_ms: T0 + (i as i64) / 20,
                gateway_id: "gw-1",
                channel_id: channel,
                route_group: group,
                model: "m",
                traffic_class: TrafficClass::ALL[(r >> 8) as usize % 4],
                attempt: (r % 40 == 0) as i32,
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
                truncated: r % 97 == 0,
                schema_valid: None,
                replacement_chars: 0,
                is_probe: r % 100 == 3,
                cost: 0.001,
                quota_remaining: None,
                trace_id: Some("t"),
                dispatch: hermes::event::Dispatch::Sent,
            };
            let mut out = Vec::new();
            enc.encode_plain(&ev, &mut out).expect("encode");
            out
        })
        .collect()
}

/// What a user of apache-avro's serde path decodes into: owned strings, and
/// derived enums (its deserializer hands symbols out only through
/// `deserialize_enum`).
#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct OwnedEvent {
    event_id: String,
    event_time_ms: i64,
    gateway_id: String,
    channel_id: String,
    route_group: String,
    model: String,
    traffic_class: Sym,
    attempt: i32,
    http_status: i32,
    error_class: Sym,
    latency_ms: i32,
    ttfb_ms: Option<i32>,
    input_tokens: i32,
    output_tokens: i32,
    finish_reason: Sym,
    truncated: bool,
    schema_valid: Option<bool>,
    replacement_chars: i32,
    is_probe: bool,
    cost: f64,
    quota_remaining: Option<i64>,
    trace_id: Option<String>,
    dispatch: Sym,
}

#[derive(serde::Deserialize)]
#[allow(clippy::upper_case_acronyms, non_camel_case_types)]
enum Sym {
    INTERACTIVE,
    CORE,
    BATCH,
    EXPERIMENTAL,
    NONE,
    SERVER_ERROR,
    STOP,
}

fn bench(c: &mut Criterion) {
    let records = records();
    let decoder = Decoder::new(WireFormat::Plain);

    let mut g = c.benchmark_group("decode");
    g.throughput(Throughput::Elements(10_000));
    g.bench_function("serde_avro_fast_borrowed", |b| {
        b.iter(|| {
            for r in &records[..10_000] {
                black_box(decoder.decode(r, &NoRegistry).expect("decode"));
            }
        })
    });
    let schema = apache_avro::Schema::parse_str(REQUEST_EVENT_SCHEMA_JSON).expect("schema");
    g.bench_function("apache_avro_value_from_value", |b| {
        b.iter(|| {
            for r in &records[..10_000] {
                let v =
                    apache_avro::from_avro_datum(&schema, &mut r.as_slice(), None).expect("datum");
                let ev: OwnedEvent = apache_avro::from_value(&v).expect("from_value");
                black_box(ev.latency_ms);
            }
        })
    });
    g.finish();

    let cfg = Arc::new(config());
    let mut g = c.benchmark_group("pipeline");
    g.sample_size(10);
    g.measurement_time(std::time::Duration::from_secs(15));
    g.throughput(Throughput::Elements(EVENTS as u64));
    g.bench_function("decode_apply_1000_channels", |b| {
        b.iter_batched(
            || (Engine::new(cfg.clone()), Vec::with_capacity(1024)),
            |(mut engine, mut alerts)| {
                for r in &records {
                    let ev = decoder.decode(r, &NoRegistry).expect("decode");
                    let _ = engine.apply(&ev, &mut alerts);
                }
                black_box((engine.stats(), alerts.len()));
                engine
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

/// One scheduling pass: 50 channels × 4 classes, mixed states, a budget.
fn bench_schedule(c: &mut Criterion) {
    use hermes::config::{ClassPolicies, ScheduleConfig};
    use hermes::schedule::{plan, ChannelInput, GroupInput};
    use hermes::state::StateKind;
    let states = [
        StateKind::Healthy,
        StateKind::Healthy,
        StateKind::AtRisk,
        StateKind::Recovering,
        StateKind::Drained,
    ];
    let channels: Vec<ChannelInput> = (0..50)
        .map(|i| ChannelInput {
            id: format!("ch-{i:02}"),
            state: states[i % 5],
            health_weight: [1.0, 1.0, 0.3, 0.4, 0.0][i % 5],
            pinned: false,
            score: Some([0.1, 0.2, 0.5, 0.3, 0.9][i % 5]),
            price_per_1k_tokens: (i % 7) as f64 * 0.3,
            capacity_rps: 20.0 + (i % 11) as f64 * 10.0,
            initial_weight: if i % 7 == 0 { 0.3 } else { 0.7 },
            quota_remaining: None,
            quota_exhausted_in_ms: None,
            tokens_per_request: Some(900.0),
            failure_rate: Some([0.0, 0.01, 0.05, 0.02, 0.3][i % 5]),
        })
        .collect();
    let input = GroupInput {
        group: "g".into(),
        now_ms: T0,
        channels,
        demand_rps: [300.0, 600.0, 900.0, 200.0],
        budget_per_hour: Some(2_000_000.0),
        horizon_ms: 3_600_000,
        warm: true,
        correlated: false,
        spend_calibration: 1.0,
    };
    let classes = ClassPolicies::default();
    let cfg = ScheduleConfig::default();
    let previous = plan(&input, &classes, &cfg, None, false);
    c.bench_function("schedule/plan_50_channels_4_classes", |b| {
        b.iter(|| {
            black_box(plan(
                black_box(&input),
                &classes,
                &cfg,
                Some(&previous),
                false,
            ))
        })
    });
}

criterion_group!(benches, bench, bench_schedule);
criterion_main!(benches);
