//! Hot-path benchmarks (one thread).
//!
//! - `decode/*`: one request event from bytes, serde_avro_fast (what Hermes
//!   uses) next to apache-avro's Value + from_value path (the reason for the
//!   choice; see docs/architecture.md).
//! - `pipeline/decode_apply_1000_channels`: decode + `Engine::apply` for a
//!   stream over 1 000 channels in 100 groups, at 20 000 events/s of event
//!   time from a fresh engine: a cold start (10 s, the windows never full);
//!   the steady state is `benches/steady_state.rs`.
//!
//! `cargo bench --bench engine`; criterion prints time per batch and
//! throughput in elements (events) per second.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use hermes::codec::{Decoder, NoRegistry, WireFormat, REQUEST_EVENT_SCHEMA_JSON};
use hermes::config::Config;
use hermes::engine::Engine;
use std::hint::black_box;
use std::sync::Arc;

const CHANNELS: usize = 1_000;
const EVENTS: usize = 200_000;
const T0: i64 = 1_764_000_000_000;

fn config() -> Config {
    hermes::bench::config(CHANNELS, None).expect("bench config")
}

/// Pre-encoded records: `hermes bench`'s traffic (mostly healthy, 2 %
/// errors, 1 % probes, some long), 1 000 channels at 20 events/s each for
/// 10 s of event time.
fn records() -> Vec<Vec<u8>> {
    let opts = hermes::bench::BenchOptions {
        channels: CHANNELS,
        rate: 20.0,
        seconds: 10,
        warmup_seconds: Some(0),
        mix: hermes::bench::Mix::Uniform,
        gateways: 1,
        clock_spread_ms: 0,
        seed: 1,
        base_config: None,
    };
    let mut out = Vec::with_capacity(EVENTS);
    hermes::bench::encoded_traffic(&opts, 10, |_, bytes| out.push(bytes.to_vec()))
        .expect("encoding");
    assert_eq!(out.len(), EVENTS);
    out
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
    SENT,
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
            signals: Vec::new(),
            price_per_1k_tokens: (i % 7) as f64 * 0.3,
            capacity_rps: 20.0 + (i % 11) as f64 * 10.0,
            initial_weight: if i % 7 == 0 { 0.3 } else { 0.7 },
            quota_remaining: None,
            quota_exhausted_in_ms: None,
            tokens_per_request: Some(900.0),
            failure_rate: Some([0.0, 0.01, 0.05, 0.02, 0.3][i % 5]),
            failure_streak: 0,
            half_open_share: 0.05,
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
        panic_since_ms: None,
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
