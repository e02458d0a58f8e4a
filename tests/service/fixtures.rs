//! What every test of `hermes run` shares: the topics and channels, the
//! Hermes config, a synthetic gateway, a log of every snapshot Redis held,
//! and waits on snapshots, metrics and topics.

pub(crate) use crate::support;
pub(crate) use crate::support::{
    event, free_port, FakeRegistry, Hermes, RedisServer, Scratch, Stack, Tansu,
};
use hermes::codec::Encoder;
use hermes::publish::{snapshot_key, WeightSnapshot};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) const TOPICS: &[(&str, u32)] = &[
    ("hermes.requests", 3),
    ("hermes.alerts", 1),
    ("hermes.dead-letters", 1),
    ("hermes.health", 2),
];

/// Channel → request partition (the gateway picks them explicitly so the
/// channels are spread over partitions whatever the partitioner).
pub(crate) const CHANNELS: &[(&str, i32)] = &[("free-a", 0), ("paid-a", 1), ("paid-b", 2)];

pub(crate) type Mapping = Vec<(&'static str, i32)>;

pub(crate) fn config(brokers: &str, redis: &str, http_port: u16, free_cooldown_ms: i64) -> String {
    config_with(brokers, redis, http_port, free_cooldown_ms, "")
}

/// [`config`] with more `[service]` keys.
pub(crate) fn config_with(
    brokers: &str,
    redis: &str,
    http_port: u16,
    free_cooldown_ms: i64,
    service_keys: &str,
) -> String {
    let service_extra = format!("reload_check_ms = 1000\ndedup_horizon_ms = 30000\n{service_keys}");
    support::config::TestConfig {
        free_cooldown_ms,
        kafka_extra: std::env::var("HERMES_TEST_KAFKA_DEBUG")
            .map(|d| format!("[kafka.properties]\ndebug = \"{d}\"\n"))
            .unwrap_or_default(),
        service_extra: &service_extra,
        engine_extra: "silent_after_ms = 10000",
        ..support::config::TestConfig::new(brokers, redis, http_port)
    }
    .text()
}

pub(crate) fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

pub(crate) const HEALTHY: u8 = 0;

pub(crate) const FAILING: u8 = 1;

/// No events at all: the gateways route around the channel.
pub(crate) const SILENT: u8 = 2;

/// A synthetic gateway: `rps` events per second per channel, each channel
/// healthy or failing (HTTP 503) as the test says.
pub(crate) struct Gateway {
    pub(crate) behavior: Arc<BTreeMap<&'static str, AtomicU8>>,
    /// Events produced so far.
    pub(crate) sent: Arc<AtomicU64>,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) thread: Option<std::thread::JoinHandle<()>>,
}

impl Gateway {
    pub(crate) fn start(brokers: &str, rps: u32) -> Gateway {
        Gateway::start_with(brokers, rps, CHANNELS.to_vec())
    }

    pub(crate) fn start_with(brokers: &str, rps: u32, mapping: Mapping) -> Gateway {
        let behavior: Arc<BTreeMap<&'static str, AtomicU8>> = Arc::new(
            mapping
                .iter()
                .map(|(c, _)| (*c, AtomicU8::new(HEALTHY)))
                .collect(),
        );
        let sent = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("linger.ms", "5")
            .create()
            .expect("gateway producer");
        let (b, s, st) = (behavior.clone(), sent.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut enc = Encoder::default();
            let mut buf = Vec::new();
            let mut seq = 0u64;
            let tick = Duration::from_millis(50);
            let per_tick = (rps as f64 * 0.05).max(1.0) as u32;
            while !st.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                for (channel, partition) in &mapping {
                    let behavior = b[channel].load(Ordering::Relaxed);
                    if behavior == SILENT {
                        continue;
                    }
                    let failing = behavior == FAILING;
                    for _ in 0..per_tick {
                        seq += 1;
                        let id = format!("gw-{}-{seq}", std::process::id());
                        let ev = event(&id, channel, failing, seq);
                        buf.clear();
                        enc.encode_plain(&ev, &mut buf).unwrap();
                        let rec = BaseRecord::to("hermes.requests")
                            .key(*channel)
                            .partition(*partition)
                            .timestamp(ev.event_time_ms)
                            .payload(&buf[..]);
                        if producer.send(rec).is_ok() {
                            s.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                if let Some(rest) = tick.checked_sub(t0.elapsed()) {
                    std::thread::sleep(rest);
                }
            }
            let _ = producer.flush(Duration::from_secs(30));
        });
        Gateway {
            behavior,
            sent,
            stop,
            thread: Some(thread),
        }
    }

    pub(crate) fn set(&self, channel: &str, b: u8) {
        self.behavior[channel].store(b, Ordering::Relaxed);
    }
}

impl Gateway {
    /// Stops sending and flushes what the producer still holds.
    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Every snapshot Redis held, read every 50 ms (what any gateway could have
/// read), in order of observation.
pub(crate) struct SnapshotLog {
    pub(crate) seen: Arc<Mutex<Vec<WeightSnapshot>>>,
    pub(crate) stop: Arc<AtomicBool>,
}

impl SnapshotLog {
    pub(crate) fn start(redis_url: &str) -> SnapshotLog {
        let seen = Arc::new(Mutex::new(Vec::<WeightSnapshot>::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st, url) = (seen.clone(), stop.clone(), redis_url.to_string());
        std::thread::spawn(move || {
            let client = redis::Client::open(url.as_str()).unwrap();
            while !st.load(Ordering::Relaxed) {
                if let Ok(mut c) = client.get_connection_with_timeout(Duration::from_millis(500)) {
                    let r: redis::RedisResult<Option<String>> =
                        redis::cmd("GET").arg(snapshot_key("chat")).query(&mut c);
                    if let Ok(Some(json)) = r {
                        if let Ok(snap) = serde_json::from_str::<WeightSnapshot>(&json) {
                            let mut v = s.lock().unwrap();
                            if v.last() != Some(&snap) {
                                v.push(snap);
                            }
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        SnapshotLog { seen, stop }
    }

    pub(crate) fn latest(&self) -> Option<WeightSnapshot> {
        self.seen.lock().unwrap().last().cloned()
    }

    pub(crate) fn all(&self) -> Vec<WeightSnapshot> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for SnapshotLog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// (epoch, version) never goes back across everything Redis held.
pub(crate) fn assert_no_regression(all: &[WeightSnapshot]) {
    for w in all.windows(2) {
        assert!(
            (w[1].epoch, w[1].version) >= (w[0].epoch, w[0].version),
            "regression {:?} -> {:?}",
            (w[0].epoch, w[0].version),
            (w[1].epoch, w[1].version)
        );
    }
}

pub(crate) fn free_weight(s: &WeightSnapshot) -> f64 {
    s.classes
        .values()
        .map(|c| c.weights.get("free-a").copied().unwrap_or(0.0))
        .fold(0.0, f64::max)
}

pub(crate) fn free_state(s: &WeightSnapshot) -> String {
    s.channels
        .get("free-a")
        .map(|c| c.state.clone())
        .unwrap_or_default()
}

/// The first snapshot that gives free-a weight, waited for at most 90 s
/// (a window of warm-up first); how long it took.
pub(crate) fn first_snapshot(log: &SnapshotLog, hermes: &[&Hermes]) -> Duration {
    wait_for(
        log,
        hermes,
        Duration::from_secs(90),
        "a first snapshot",
        |s| free_weight(s) > 0.0,
    )
}

/// Waits for `check` on the latest snapshot; panics with context after
/// `limit`.
pub(crate) fn wait_for(
    log: &SnapshotLog,
    hermes: &[&Hermes],
    limit: Duration,
    what: &str,
    check: impl Fn(&WeightSnapshot) -> bool,
) -> Duration {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if log.latest().is_some_and(|s| check(&s)) {
            return t0.elapsed();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let logs: Vec<String> = hermes
        .iter()
        .map(|h| format!("{}\n{}", h.get("/status").unwrap_or_default(), h.log_tail()))
        .collect();
    panic!(
        "timed out after {limit:?} waiting for {what}; latest snapshot {:?}\n{}",
        log.latest(),
        logs.join("\n-----\n")
    );
}

/// Reads a whole topic from the start.
pub(crate) fn read_topic(
    brokers: &str,
    topic: &str,
    expect_at_least: usize,
) -> Vec<rdkafka::message::OwnedMessage> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("test-reader-{topic}-{}", wall_ms()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    // Assigned, not subscribed: a fresh consumer group's join on tansu can
    // take longer than the whole read while Hermes keeps the broker busy
    // (seen: 0 of 10 000 dead letters read back). Every partition from the
    // beginning needs no group at all.
    // A broker loaded by the test may miss one metadata deadline (seen in
    // CI); three tries before the test gives up on it.
    let meta = (0..3)
        .find_map(
            |attempt| match c.fetch_metadata(Some(topic), Duration::from_secs(30)) {
                Ok(m) => Some(m),
                Err(e) => {
                    eprintln!("metadata for {topic}, attempt {}: {e}", attempt + 1);
                    None
                }
            },
        )
        .unwrap_or_else(|| panic!("no metadata for {topic} in three tries"));
    let mut tpl = rdkafka::TopicPartitionList::new();
    for t in meta.topics() {
        for p in t.partitions() {
            tpl.add_partition_offset(topic, p.id(), rdkafka::Offset::Beginning)
                .unwrap();
        }
    }
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut quiet_since = Instant::now();
    while Instant::now() < deadline {
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                out.push(m.detach());
                quiet_since = Instant::now();
            }
            _ => {
                if out.len() >= expect_at_least && quiet_since.elapsed() > Duration::from_secs(2) {
                    break;
                }
            }
        }
    }
    out
}

/// A bare producer for hand-made records.
pub(crate) fn producer(brokers: &str) -> ThreadedProducer<DefaultProducerContext> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "5")
        .create()
        .unwrap()
}

pub(crate) fn wait_metric(h: &Hermes, series: &str, want: f64, limit: Duration) {
    wait_metric_by(h, series, want, limit, |v| v == want)
}

pub(crate) fn wait_metric_by(
    h: &Hermes,
    series: &str,
    want: f64,
    limit: Duration,
    ok: impl Fn(f64) -> bool,
) {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if h.metric(series).is_some_and(&ok) {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!(
        "{series} = {:?}, want {want}\n{}\n{}",
        h.metric(series),
        h.get("/metrics").unwrap_or_default(),
        h.log_tail()
    );
}

/// The request partitions an instance holds (from its `/metrics`).
pub(crate) fn assigned(h: &Hermes) -> Vec<i32> {
    h.get("/metrics")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("hermes_partition_assigned{partition=\""))
        .filter_map(|rest| rest.split('"').next()?.parse().ok())
        .collect()
}

/// Waits until `h` (all its request loops together) holds the three
/// request partitions.
pub(crate) fn wait_assigned_all(h: &Hermes, limit: Duration) {
    let t0 = Instant::now();
    while assigned(h).len() < 3 {
        assert!(
            t0.elapsed() < limit,
            "{} never held all three partitions: {:?}\n{}",
            h.log.display(),
            assigned(h),
            h.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The counters an event ends in, once each: applied, too late, duplicate
/// (an id seen before) or dead-lettered.
pub(crate) fn accounted(h: &Hermes) -> (f64, f64, f64, f64) {
    let m = |s: &str| h.metric(s).unwrap_or(0.0);
    (
        m("hermes_events_applied_total"),
        m("hermes_events_too_late_total"),
        m("hermes_events_duplicate_total"),
        m("hermes_dead_letters_total"),
    )
}

/// Waits until every event the gateway sent is applied (nothing lost, none
/// too late) and returns the counters; fails naming them if not within
/// `limit`.
pub(crate) fn wait_all_applied(h: &Hermes, sent: u64, limit: Duration) -> (f64, f64, f64, f64) {
    let t0 = Instant::now();
    loop {
        let c = accounted(h);
        if c.0 >= sent as f64 || t0.elapsed() > limit {
            assert_eq!(
                (c.0, c.1, c.3),
                (sent as f64, 0.0, 0.0),
                "sent {sent}: (applied, too late, dead-lettered); duplicates {}\n{}",
                c.2,
                h.log_tail()
            );
            return c;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The cool-down of a DRAINED machine (until − since), if it is drained.
pub(crate) fn cooldown_ms(s: &hermes::service::state_store::SavedState) -> Option<i64> {
    match s.machine.state() {
        hermes::state::ChannelState::Drained {
            since_ms, until_ms, ..
        } => Some(until_ms - since_ms),
        _ => None,
    }
}

/// free-a through one incident with the gateways routing as the weights
/// say: failing until drained, nothing while drained, healthy once on
/// probation, then `then` once it is RECOVERING (its probation passed).
pub(crate) fn through_a_probation(gw: &Gateway, log: &SnapshotLog, hermes: &[&Hermes], then: u8) {
    gw.set("free-a", FAILING);
    wait_for(
        log,
        hermes,
        Duration::from_secs(60),
        "free-a drained",
        |s| free_state(s) == "DRAINED",
    );
    // The gateways route around a drained channel.
    gw.set("free-a", SILENT);
    wait_for(
        log,
        hermes,
        Duration::from_secs(120),
        "free-a on probation",
        |s| free_state(s) == "OBSERVING",
    );
    gw.set("free-a", HEALTHY);
    wait_for(
        log,
        hermes,
        Duration::from_secs(60),
        "free-a recovering",
        |s| free_state(s) == "RECOVERING",
    );
    gw.set("free-a", then);
}

/// `hermes run` named `name` in `stack`, with the test config (free-tier
/// cool-down `cooldown_ms`).
pub(crate) fn start_hermes(stack: &Stack, name: &str, cooldown_ms: i64) -> Hermes {
    stack.hermes(name, |brokers, redis, port| {
        config(brokers, redis, port, cooldown_ms)
    })
}

/// Runs the `hermes` binary with `args`; returns (success, stdout, stderr).
pub(crate) fn hermes_cli(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hermes"))
        .args(args)
        .env_remove("HERMES_CONTROL_TOKEN")
        .output()
        .expect("running hermes");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// An environment variable of this process set until the guard drops (a
/// failing test included), then put back as it was.
pub(crate) struct EnvVar {
    name: &'static str,
    before: Option<std::ffi::OsString>,
}

impl EnvVar {
    pub(crate) fn set(name: &'static str, value: &str) -> EnvVar {
        let before = std::env::var_os(name);
        std::env::set_var(name, value);
        EnvVar { name, before }
    }
}

impl Drop for EnvVar {
    fn drop(&mut self) {
        match &self.before {
            Some(v) => std::env::set_var(self.name, v),
            None => std::env::remove_var(self.name),
        }
    }
}
