//! How fast a drain reaches the gateways, end to end on a real broker
//! (tansu) and Redis, with Hermes' *default* config (windows of minutes).
//!
//! ```sh
//! cargo bench --bench decision_latency                  # 8 trials, 10 000 events/s
//! cargo bench --bench decision_latency -- --rate 2000 --trials 8 --json
//! ```
//! A synthetic gateway produces `--rate` events/s (default 10 000) over ten
//! channels. Once the first snapshot is in Redis, trial k makes channel
//! `free-k` fail every request (HTTP 503) and times its first failing event
//! produced → a snapshot in Redis with `free-k` at weight 0 in every class
//! (what a gateway's next `GET` would see). Trials are 5 s apart; drained
//! channels stay drained. Capacities follow the rate (see `FREE_CAPACITY`):
//! the healthy channels can take the load, and the drained share stays under
//! the panic threshold (docs/decisions.md#safety-rails). Hermes' own share, record handled → Redis write
//! acknowledged, comes from its `hermes_decision_publish_seconds`
//! histogram. Needs `tansu` and `redis-server` (`bash .ci/run` installs
//! both); skips with a message otherwise. Not a timed test: the machine is
//! shared, so read the numbers, do not assert them.

#[path = "../tests/support/mod.rs"]
mod support;

use hermes::codec::Encoder;

use hermes::publish::{snapshot_key, WeightSnapshot};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::ClientConfig;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{event, free_port, send_retrying, Hermes, RedisServer, Tansu};

const TRIAL_CHANNELS: usize = 8;
const PARTITIONS: u32 = 4;

fn channels() -> Vec<String> {
    (0..TRIAL_CHANNELS)
        .map(|k| format!("free-{k}"))
        .chain(["paid-a".to_string(), "paid-b".to_string()])
        .collect()
}

/// Declared capacity per channel, in multiples of the traffic each channel
/// gets: the free ones with headroom over it, the paid ones far more. Both
/// matter. Capacity under the offered load (not a fixed figure per channel)
/// makes the scheduler send the overflow to the
/// least-bad unhealthy channels (docs/decisions.md#safety-rails: never shed what static routing
/// would serve), and a channel that went hard down moments ago still reads
/// a one-minute failure rate under `schedule.overflow_max_failure_rate`:
/// at 10 000 events/s every trial's channel was DRAINED yet kept ~0.06 of
/// CORE. And eight free channels beside two paid ones keep the drained
/// share (at most 8 × 1.5 of 8 × 1.5 + 2 × 20) under the panic threshold.
const FREE_CAPACITY: f64 = 1.5;
const PAID_CAPACITY: f64 = 20.0;

fn config(brokers: &str, redis: &str, port: u16, per_channel_rps: f64) -> String {
    let mut text = format!(
        "[kafka]\nbrokers = \"{brokers}\"\n# tansu answers group heartbeats late under this load\n\
         session_timeout_ms = 30000\n\n[redis]\nurl = \"{redis}\"\n\n\
         [service]\nhttp_listen = \"127.0.0.1:{port}\"\n\n[[groups]]\nid = \"chat\"\n"
    );
    for c in channels() {
        let (tier, price, cap) = if c.starts_with("free") {
            ("free", 0.0, FREE_CAPACITY * per_channel_rps)
        } else {
            ("paid", 0.5, PAID_CAPACITY * per_channel_rps)
        };
        text.push_str(&format!(
            "\n[[groups.channels]]\nid = \"{c}\"\ntier = \"{tier}\"\n\
             price_per_1k_tokens = {price:?}\ncapacity_rps = {cap:?}\n"
        ));
    }
    text
}

/// Times the broker's acknowledgement of each channel's first failing event
/// (the delivery opaque is that channel's index).
struct Acks {
    first_bad_acked: Arc<Mutex<Vec<Option<Instant>>>>,
}

impl rdkafka::ClientContext for Acks {}

impl rdkafka::producer::ProducerContext for Acks {
    /// The channel index of a first-bad candidate; `usize::MAX` otherwise.
    type DeliveryOpaque = usize;

    fn delivery(
        &self,
        result: &rdkafka::message::DeliveryResult<'_>,
        opaque: Self::DeliveryOpaque,
    ) {
        if result.is_ok() && opaque != usize::MAX {
            let mut acked = self.first_bad_acked.lock().expect("acks");
            acked[opaque].get_or_insert_with(Instant::now);
        }
    }
}

/// The synthetic gateway: which channels fail, and when each one's first
/// failing event was handed to the producer and acknowledged by the broker.
struct Gateway {
    failing: Arc<Vec<AtomicBool>>,
    first_bad: Arc<Mutex<Vec<Option<Instant>>>>,
    first_bad_acked: Arc<Mutex<Vec<Option<Instant>>>>,
    sent: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Gateway {
    fn start(brokers: &str, rate_per_channel: u32) -> Gateway {
        let names = channels();
        let failing: Arc<Vec<AtomicBool>> =
            Arc::new(names.iter().map(|_| AtomicBool::new(false)).collect());
        let first_bad = Arc::new(Mutex::new(vec![None; names.len()]));
        let first_bad_acked = Arc::new(Mutex::new(vec![None; names.len()]));
        let sent = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let producer: ThreadedProducer<Acks> = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("linger.ms", "20")
            .set("queue.buffering.max.messages", "1000000")
            .create_with_context(Acks {
                first_bad_acked: first_bad_acked.clone(),
            })
            .expect("gateway producer");
        let (f, fb, s, st) = (
            failing.clone(),
            first_bad.clone(),
            sent.clone(),
            stop.clone(),
        );
        let thread = std::thread::spawn(move || {
            let mut enc = Encoder::default();
            let mut buf = Vec::new();
            let mut seq = 0u64;
            let tick = Duration::from_millis(10);
            let per_tick = (rate_per_channel / 100).max(1);
            let started = Instant::now();
            let mut ticks = 0u64;
            while !st.load(Ordering::Relaxed) {
                for (j, channel) in names.iter().enumerate() {
                    let bad = f[j].load(Ordering::Relaxed);
                    for _ in 0..per_tick {
                        seq += 1;
                        let id = format!("bench-{seq}");
                        let ev = event(&id, channel, bad, seq);
                        buf.clear();
                        enc.encode_plain(&ev, &mut buf).expect("encode");
                        send_retrying(
                            &producer,
                            BaseRecord::with_opaque_to(
                                "hermes.requests",
                                if bad { j } else { usize::MAX },
                            )
                            .key(channel.as_str())
                            .partition((j as u32 % PARTITIONS) as i32)
                            .payload(&buf[..]),
                        );
                        s.fetch_add(1, Ordering::Relaxed);
                        if bad {
                            let mut fb = fb.lock().expect("first_bad");
                            fb[j].get_or_insert_with(Instant::now);
                        }
                    }
                }
                ticks += 1;
                // Paced against the start, so a slow tick is caught up.
                let due = started + tick * ticks as u32;
                if let Some(rest) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(rest);
                }
            }
            let _ = producer.flush(Duration::from_secs(5));
        });
        Gateway {
            failing,
            first_bad,
            first_bad_acked,
            sent,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn snapshot(conn: &mut redis::Connection) -> Option<WeightSnapshot> {
    let text: Option<String> = redis::cmd("GET")
        .arg(snapshot_key("chat"))
        .query(conn)
        .ok()?;
    serde_json::from_str(&text?).ok()
}

fn drained(s: &WeightSnapshot, channel: &str) -> bool {
    s.classes
        .values()
        .all(|c| c.weights.get(channel).copied().unwrap_or(0.0) <= 0.0)
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let trials: usize = args
        .iter()
        .position(|a| a == "--trials")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(TRIAL_CHANNELS)
        .min(TRIAL_CHANNELS);
    let json = args.iter().any(|a| a == "--json");
    // Events per second over all ten channels.
    let rate: u32 = args
        .iter()
        .position(|a| a == "--rate")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    if !support::have_tansu_and_redis() {
        eprintln!(
            "decision_latency: needs tansu and redis-server (bash .ci/run installs them); skipped"
        );
        return;
    }
    let kafka = Tansu::start(&[
        ("hermes.requests", PARTITIONS),
        ("hermes.alerts", 1),
        ("hermes.dead-letters", 1),
        ("hermes.health", 2),
    ]);
    let redis = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("hermes-decision-latency-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let port = free_port();
    let hermes = Hermes::start(
        &dir,
        "bench",
        &config(
            &kafka.bootstrap(),
            &redis.url(),
            port,
            rate as f64 / channels().len() as f64,
        ),
        port,
    );
    let gw = Gateway::start(&kafka.bootstrap(), rate / channels().len() as u32);
    let mut conn = redis::Client::open(redis.url())
        .and_then(|c| c.get_connection())
        .expect("redis connection");

    eprintln!("warming up (default windows: about a minute of data before the first snapshot)");
    let started = Instant::now();
    while snapshot(&mut conn).is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "no snapshot after 5 min:\n{}",
            hermes.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("first snapshot after {:?}", started.elapsed());
    std::thread::sleep(Duration::from_secs(5));

    let names = channels();
    let mut latencies = Vec::new();
    let mut from_acks = Vec::new();
    for (k, channel) in names.iter().enumerate().take(trials) {
        gw.failing[k].store(true, Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(30);
        let seen = loop {
            if snapshot(&mut conn).is_some_and(|s| drained(&s, channel)) {
                break Some(Instant::now());
            }
            if Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        let first = gw.first_bad.lock().expect("first_bad")[k];
        // Records behind, summed over the request partitions: a broker that
        // slows down shows here, not in Hermes' own time.
        let lag = hermes.metric_sum("hermes_consumer_lag_records");
        eprintln!("  consumer lag now {lag:.0} records");
        let acked = gw.first_bad_acked.lock().expect("acks")[k];
        match (first, seen) {
            (Some(f), Some(s)) => {
                let ms = s.duration_since(f).as_secs_f64() * 1000.0;
                let from_ack = acked.map(|a| s.saturating_duration_since(a).as_secs_f64() * 1000.0);
                eprintln!(
                    "trial {k}: {channel} at weight 0 in Redis {ms:.0} ms after its first bad event was produced, {:.0} ms after the broker acknowledged it",
                    from_ack.unwrap_or(f64::NAN)
                );
                latencies.push(ms);
                from_acks.push(from_ack.unwrap_or(f64::NAN));
            }
            _ => {
                // Why not: what the gateways would read for this channel,
                // how old that plan is, and the state Hermes holds.
                let now_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64);
                let seen = snapshot(&mut conn).map_or("no snapshot".to_string(), |s| {
                    let weights: Vec<String> = s
                        .classes
                        .iter()
                        .map(|(class, c)| {
                            format!("{class} {:.2}", c.weights.get(channel).copied().unwrap_or(0.0))
                        })
                        .collect();
                    format!(
                        "snapshot v{} epoch {} computed {} ms ago (event time), heartbeat {} ms ago; {channel}: {:?}; weights {}",
                        s.version,
                        s.epoch,
                        now_ms - s.computed_at_ms,
                        now_ms - s.heartbeat_ms,
                        s.channels.get(channel.as_str()),
                        weights.join(", ")
                    )
                });
                let state: Vec<String> = hermes
                    .get("/metrics")
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| {
                        l.starts_with("hermes_channel_state{")
                            && l.contains(&format!("channel=\"{channel}\""))
                            && !l.ends_with(" 0")
                            && !l.ends_with(" 0.0")
                    })
                    .map(str::to_string)
                    .collect();
                eprintln!(
                    "trial {k}: {channel} not drained within 30 s\n  {seen}\n  Hermes: {}\n{}",
                    state.join("; "),
                    hermes.log_tail()
                )
            }
        }
        std::thread::sleep(Duration::from_secs(5));
    }
    let metrics = hermes.get("/metrics").unwrap_or_default();
    let bucket = |le: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with(&format!(
                    "hermes_decision_publish_seconds_bucket{{le=\"{le}\"}}"
                ))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let count = hermes
        .metric("hermes_decision_publish_seconds_count")
        .unwrap_or(0.0);
    let sum = hermes
        .metric("hermes_decision_publish_seconds_sum")
        .unwrap_or(0.0);
    let events = gw.sent.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    drop(gw);
    latencies.sort_by(f64::total_cmp);
    from_acks.sort_by(f64::total_cmp);
    let acked_median = if from_acks.is_empty() {
        f64::NAN
    } else {
        percentile(&from_acks, 0.5)
    };
    let (median, p99, max) = if latencies.is_empty() {
        (f64::NAN, f64::NAN, f64::NAN)
    } else {
        (
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99),
            *latencies.last().expect("non-empty"),
        )
    };
    if json {
        println!(
            "{}",
            serde_json::json!({
                "trials": trials,
                "drained": latencies.len(),
                "events_per_s": events.round(),
                "first_bad_event_to_redis_ms": { "median": median, "p99": p99, "max": max, "all": latencies },
                "broker_ack_to_redis_ms": { "median": acked_median, "all": from_acks },
                "hermes_own": {
                    "decisions": count,
                    "mean_ms": if count > 0.0 { sum / count * 1000.0 } else { f64::NAN },
                    "within_100_ms": bucket("0.1"),
                    "within_250_ms": bucket("0.25"),
                },
            })
        );
    } else {
        println!(
            "decision latency, tansu + redis-server, default config, {events:.0} events/s produced"
        );
        println!(
            "  first bad event produced -> weight 0 in Redis: median {median:.0} ms, p99 {p99:.0} ms, max {max:.0} ms ({} of {trials} drained)",
            latencies.len()
        );
        println!("  broker acknowledged the first bad event -> weight 0 in Redis: median {acked_median:.0} ms");
        println!(
            "  Hermes' own (record handled -> Redis write acknowledged): {count} decisions, mean {:.1} ms, {} within 100 ms, {} within 250 ms",
            if count > 0.0 { sum / count * 1000.0 } else { f64::NAN },
            bucket("0.1"),
            bucket("0.25")
        );
    }
    drop(hermes);
    if latencies.len() == trials {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!("Hermes' log kept in {}", dir.display());
    }
}
