//! Soak: the service for a chosen time, with everything an operator does to
//! it, and its memory watched.
//!
//! The composition is the demo's (`hermes::demo::run`: librdkafka's mock
//! cluster, `Service::start` as `hermes run` runs it, simulated gateways
//! routing by the published weights), on a config file the service reloads
//! as `hermes run` does. While it runs:
//!
//! - **faults**: every 90 s one of five channels fails for 30 s, in turn a
//!   hard refusal and a silent one (HTTP 200, output cut short);
//! - **channel churn**: every 60 s the config is rewritten with one of two
//!   channels removed and the other back (the engine drops a removed
//!   channel's windows and starts a returning one empty);
//! - **operators**: every 150 s a pin drains a healthy channel for 40 s;
//!   every 300 s the group is frozen for 20 s;
//! - **garbage**: one undecodable record per 500 events.
//!
//! Event time is compressed: 1 s slices, 10 s and 60 s windows, a baseline
//! of three long windows, so the windows are full after four minutes and
//! the rest of the run is steady state. Hermes' heap (jemalloc's allocated
//! bytes) and the resident set are sampled every 10 s; the report gives
//! their slopes over the steady state (least squares, MB per hour; the
//! resident set also holds the mock cluster's log, which grows until it
//! reaches 5 MB a partition), every event accounted for (produced = consumed =
//! applied + dead-lettered + duplicates + too late), and alerts and pages
//! per incident. It exits non-zero when an event is unaccounted for, or
//! when the heap grows faster than `--max-slope-mb-per-hour` in steady
//! state.
//!
//! ```sh
//! cargo bench --bench soak -- --minutes 60
//! cargo bench --bench soak -- --minutes 10 --seed 7   # what CI runs
//! ```

use hermes::demo::{run, DemoOptions, DemoSummary};
use hermes::service::overrides::{Action, Request, Target};
use hermes::sim::scenario::Scenario;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CHANNELS: &[(&str, &str, f64)] = &[
    ("free-a", "free", 0.0),
    ("free-b", "free", 0.0),
    ("free-c", "free", 0.0),
    ("paid-a", "paid", 0.6),
    ("paid-b", "paid", 0.8),
    ("paid-c", "paid", 1.0),
    ("paid-d", "paid", 1.2),
    ("paid-e", "paid", 1.4),
];
/// Channels that fail, in turn.
const FAULTY: &[&str] = &["free-a", "paid-b", "free-b", "paid-c", "free-c"];
/// Channels that leave and come back (never faulty, never pinned).
const CHURN: &[&str] = &["paid-d", "paid-e"];
const FAULT_EVERY_S: u64 = 90;
const FAULT_FOR_S: u64 = 30;
const CHURN_EVERY_S: u64 = 60;
const PIN_EVERY_S: u64 = 150;
const FREEZE_EVERY_S: u64 = 300;
const SAMPLE_EVERY_S: u64 = 10;
/// The windows are full (baseline: 3 × 60 s) and the dedup horizon (60 s)
/// has turned over once by then.
const FILL_S: u64 = 240;

struct Options {
    minutes: u64,
    seed: u64,
    max_slope_mb_per_hour: f64,
}

fn options() -> Options {
    let mut o = Options {
        minutes: 60,
        seed: 42,
        max_slope_mb_per_hour: 16.0,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = |i: usize| -> String {
            args.get(i + 1)
                .cloned()
                .unwrap_or_else(|| panic!("{} needs a value", args[i]))
        };
        match args[i].as_str() {
            "--minutes" => o.minutes = value(i).parse().expect("--minutes N"),
            "--seed" => o.seed = value(i).parse().expect("--seed N"),
            "--max-slope-mb-per-hour" => {
                o.max_slope_mb_per_hour = value(i).parse().expect("--max-slope-mb-per-hour X")
            }
            // cargo bench passes --bench to every harness.
            "--bench" => {
                i += 1;
                continue;
            }
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    assert!(
        o.minutes * 60 > FILL_S + 4 * SAMPLE_EVERY_S,
        "a soak needs more than {} minutes (windows fill in {FILL_S} s)",
        FILL_S / 60 + 1
    );
    o
}

/// The scenario: every channel, the faults in turn, the compressed windows.
fn scenario(seconds: u64, seed: u64) -> String {
    let mut s = format!(
        r#"name = "soak"
description = "faults in turn, channel churn, pins and freezes, garbage"
duration_s = {seconds}
seed = {seed}

[gateway]
probe_interval_s = 5

[config.engine]
slice_ms = 1000
short_window_ms = 10000
long_window_ms = 60000
evaluation_interval_ms = 1000
allowed_lateness_ms = 2000
baseline_windows = 3
baseline_min_windows = 2

[config.service]
reload_check_ms = 1000
dedup_horizon_ms = 60000

[config.tiers.free.policy.states]
cooldown_ms = 20000

[config.tiers.paid.policy.states]
cooldown_ms = 20000
"#
    );
    for (id, tier, price) in CHANNELS {
        s += &format!(
            "\n[[channels]]\nid = \"{id}\"\ntier = \"{tier}\"\nprice_per_1k_tokens = {price:?}\ncapacity_rps = 30\n"
        );
        let mut k = 0;
        while 60 + k * FAULT_EVERY_S < seconds {
            if FAULTY[k as usize % FAULTY.len()] == *id {
                let start = 60 + k * FAULT_EVERY_S;
                let end = start + FAULT_FOR_S;
                s += &format!("\n[[channels.faults]]\nstart_s = {start}\nend_s = {end}\n");
                if (k / FAULTY.len() as u64).is_multiple_of(2) {
                    s += "refuse_all = true\n";
                } else {
                    s += "output_tokens_median = 20\ntruncation_rate = 0.6\n";
                }
            }
            k += 1;
        }
    }
    s += r#"
[[traffic]]
class = "interactive"
rps = 10

[[traffic]]
class = "core"
rps = 20

[[traffic]]
class = "batch"
rps = 20
structured_share = 0.3

[[traffic]]
class = "experimental"
rps = 5
"#;
    s
}

/// The Hermes config with `absent` left out of the group.
fn config_without(sc: &Scenario, absent: &str) -> String {
    let mut sc = sc.clone();
    sc.channels.retain(|c| c.id != absent);
    sc.hermes_config_text(None).expect("the soak's config")
}

fn request(action: Action, reason: &str, for_s: u64) -> Request {
    Request {
        action,
        reason: reason.into(),
        actor: "soak".into(),
        for_s: Some(for_s),
    }
}

/// Bytes allocated through jemalloc (the Rust heap: Hermes, not librdkafka's
/// C allocations).
fn heap_bytes() -> f64 {
    let _ = tikv_jemalloc_ctl::epoch::advance();
    tikv_jemalloc_ctl::stats::allocated::read().unwrap_or(0) as f64
}

/// Least-squares slope of `(t_s, bytes)`, in MB per hour.
fn slope_mb_per_hour(samples: &[(f64, f64)]) -> f64 {
    let n = samples.len() as f64;
    let (mt, mb) = samples
        .iter()
        .fold((0.0, 0.0), |(a, b), (t, x)| (a + t / n, b + x / n));
    let (cov, var) = samples.iter().fold((0.0, 0.0), |(c, v), (t, x)| {
        (c + (t - mt) * (x - mb), v + (t - mt) * (t - mt))
    });
    if var == 0.0 {
        0.0
    } else {
        cov / var * 3600.0 / 1e6
    }
}

fn main() {
    let o = options();
    let seconds = o.minutes * 60;
    let sc = Scenario::from_toml(&scenario(seconds, o.seed)).expect("the soak scenario");
    let dir = std::env::temp_dir().join(format!("hermes-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let path = dir.join("hermes.toml");
    std::fs::write(&path, config_without(&sc, CHURN[1])).expect("writing the config");

    let mut commands = Vec::new();
    let mut pins = 0;
    let mut freezes = 0;
    let mut t = PIN_EVERY_S;
    while t + 40 < seconds {
        commands.push((
            t,
            Target::Channel("paid-a".into()),
            request(Action::Drain, "soak: scheduled maintenance", 40),
        ));
        pins += 1;
        t += PIN_EVERY_S;
    }
    let mut t = FREEZE_EVERY_S;
    while t + 20 < seconds {
        commands.push((
            t,
            Target::Group(sc.gateway.group.clone()),
            request(Action::Freeze, "soak: change freeze", 20),
        ));
        freezes += 1;
        t += FREEZE_EVERY_S;
    }
    let faults = (0..)
        .take_while(|k| 60 + k * FAULT_EVERY_S + FAULT_FOR_S <= seconds)
        .count() as u64;

    let stop = Arc::new(AtomicBool::new(false));
    let samples: Arc<Mutex<Vec<(f64, f64, f64)>>> = Arc::default();
    let started = Instant::now();
    let watcher = {
        let (stop, samples, sc, path) = (stop.clone(), samples.clone(), sc.clone(), path.clone());
        std::thread::spawn(move || {
            let mut next_sample = 0;
            let mut next_churn = CHURN_EVERY_S;
            let mut reloads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let now = started.elapsed().as_secs();
                if now >= next_sample {
                    let rss = hermes::bench::rss_bytes().unwrap_or(0) as f64;
                    let heap = heap_bytes();
                    samples.lock().unwrap().push((now as f64, rss, heap));
                    eprintln!(
                        "soak t={now:>5}s heap={:.1} MB rss={:.1} MB",
                        heap / 1e6,
                        rss / 1e6
                    );
                    next_sample += SAMPLE_EVERY_S;
                }
                if now >= next_churn {
                    reloads += 1;
                    let absent = CHURN[(reloads % 2) as usize];
                    std::fs::write(&path, config_without(&sc, absent)).expect("the config");
                    next_churn += CHURN_EVERY_S;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            reloads
        })
    };

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let summary: DemoSummary = runtime
        .block_on(run(DemoOptions {
            scenario: sc,
            seconds,
            redis_url: None,
            redraw: false,
            show_status: false,
            garbage_every: 500,
            http_listen: None,
            http_bound: None,
            commands,
            config_path: Some(path),
        }))
        .expect("the soak run");
    stop.store(true, Ordering::Relaxed);
    let reloads = watcher.join().expect("the watcher");
    let _ = std::fs::remove_dir_all(&dir);

    let samples = samples.lock().unwrap().clone();
    let steady: Vec<&(f64, f64, f64)> = samples.iter().filter(|s| s.0 >= FILL_S as f64).collect();
    let heap: Vec<(f64, f64)> = steady.iter().map(|s| (s.0, s.2)).collect();
    let rss: Vec<(f64, f64)> = steady.iter().map(|s| (s.0, s.1)).collect();
    let slope = slope_mb_per_hour(&heap);
    let rss_slope = slope_mb_per_hour(&rss);
    let mb = |x: f64| x / 1e6;
    let first = steady.first().map_or((0.0, 0.0, 0.0), |s| **s);
    let last = samples.last().copied().unwrap_or_default();
    let peak_heap = samples.iter().map(|s| s.2).fold(0.0, f64::max);
    let s = &summary;
    let sent = s.produced + s.garbage_sent;
    let accounted = s.applied + s.dead_lettered + s.duplicates + s.too_late;
    let incidents = faults + pins + freezes;
    println!("\nsoak: {} min, seed {}", o.minutes, o.seed);
    println!(
        "heap (Hermes' own allocations): {:.1} MB when the windows were full ({FILL_S} s), {:.1} MB at the end, peak {:.1} MB; \
         steady-state slope {slope:+.2} MB/h over {} samples (bound {:.1})",
        mb(first.2),
        mb(last.2),
        mb(peak_heap),
        heap.len(),
        o.max_slope_mb_per_hour
    );
    println!(
        "resident set (with the mock cluster's log, capped at 5 MB a partition): {:.1} MB at fill, {:.1} MB at the end, slope {rss_slope:+.2} MB/h",
        mb(first.1),
        mb(last.1)
    );
    println!(
        "events: {} produced + {} garbage = {sent} in; {} consumed; {} applied + {} dead-lettered + {} duplicates + {} too late = {accounted}",
        s.produced, s.garbage_sent, s.consumed, s.applied, s.dead_lettered, s.duplicates, s.too_late
    );
    println!(
        "operations: {faults} faults, {pins} pins, {freezes} freezes, {reloads} config rewrites (channel churn)"
    );
    println!(
        "alerts: {} read back ({:.2} per incident), {} pages ({:.2} per incident); by kind {:?}",
        s.alerts_read_back,
        s.alerts_read_back as f64 / incidents.max(1) as f64,
        s.pages_read_back,
        s.pages_read_back as f64 / incidents.max(1) as f64,
        s.alert_kinds_read_back
    );
    let mut failed = Vec::new();
    if s.consumed != sent {
        failed.push(format!("{sent} in, {} consumed", s.consumed));
    }
    if accounted != s.consumed {
        failed.push(format!(
            "{} consumed, {accounted} accounted for",
            s.consumed
        ));
    }
    if s.dead_letters_read_back != s.dead_lettered {
        failed.push(format!(
            "{} dead-lettered, {} on the topic with a reason",
            s.dead_lettered, s.dead_letters_read_back
        ));
    }
    if slope > o.max_slope_mb_per_hour {
        failed.push(format!(
            "memory grows {slope:.2} MB/h in steady state (bound {:.1})",
            o.max_slope_mb_per_hour
        ));
    }
    if failed.is_empty() {
        println!("soak passed");
    } else {
        println!("soak FAILED: {}", failed.join("; "));
        std::process::exit(1);
    }
}
