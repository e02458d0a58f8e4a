//! `hermes run` end to end: a real Kafka-protocol broker (tansu, SQLite
//! storage), a real redis-server, Hermes as separate processes, and a
//! synthetic gateway producing Avro request events.

mod support;

use hermes::alert::{AlertEvent, AlertKind};
use hermes::codec::Encoder;
use hermes::publish::{snapshot_key, WeightSnapshot};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{event, free_port, FakeRegistry, Hermes, RedisServer, Tansu};

const TOPICS: &[(&str, u32)] = &[
    ("hermes.requests", 3),
    ("hermes.alerts", 1),
    ("hermes.dead-letters", 1),
    ("hermes.health", 2),
];

/// Channel → request partition (the gateway picks them explicitly so the
/// channels are spread over partitions whatever the partitioner).
const CHANNELS: &[(&str, i32)] = &[("free-a", 0), ("paid-a", 1), ("paid-b", 2)];
type Mapping = Vec<(&'static str, i32)>;

fn config(brokers: &str, redis: &str, http_port: u16, free_cooldown_ms: i64) -> String {
    support::config::TestConfig {
        free_cooldown_ms,
        kafka_extra: std::env::var("HERMES_TEST_KAFKA_DEBUG")
            .map(|d| format!("[kafka.properties]\ndebug = \"{d}\"\n"))
            .unwrap_or_default(),
        service_extra: "reload_check_ms = 1000\ndedup_horizon_ms = 30000",
        engine_extra: "silent_after_ms = 10000",
        ..support::config::TestConfig::new(brokers, redis, http_port)
    }
    .text()
}

fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

const HEALTHY: u8 = 0;
const FAILING: u8 = 1;
/// No events at all: the gateways route around the channel.
const SILENT: u8 = 2;

/// A synthetic gateway: `rps` events per second per channel, each channel
/// healthy or failing (HTTP 503) as the test says.
struct Gateway {
    behavior: Arc<BTreeMap<&'static str, AtomicU8>>,
    /// Events produced so far.
    sent: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Gateway {
    fn start(brokers: &str, rps: u32) -> Gateway {
        Gateway::start_with(brokers, rps, CHANNELS.to_vec())
    }

    fn start_with(brokers: &str, rps: u32, mapping: Mapping) -> Gateway {
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

    fn set(&self, channel: &str, b: u8) {
        self.behavior[channel].store(b, Ordering::Relaxed);
    }
}

impl Gateway {
    /// Stops sending and flushes what the producer still holds.
    fn stop(&mut self) {
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
struct SnapshotLog {
    seen: Arc<Mutex<Vec<WeightSnapshot>>>,
    stop: Arc<AtomicBool>,
}

impl SnapshotLog {
    fn start(redis_url: &str) -> SnapshotLog {
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

    fn latest(&self) -> Option<WeightSnapshot> {
        self.seen.lock().unwrap().last().cloned()
    }

    fn all(&self) -> Vec<WeightSnapshot> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for SnapshotLog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// (epoch, version) never goes back across everything Redis held.
fn assert_no_regression(all: &[WeightSnapshot]) {
    for w in all.windows(2) {
        assert!(
            (w[1].epoch, w[1].version) >= (w[0].epoch, w[0].version),
            "regression {:?} -> {:?}",
            (w[0].epoch, w[0].version),
            (w[1].epoch, w[1].version)
        );
    }
}

fn free_weight(s: &WeightSnapshot) -> f64 {
    s.classes
        .values()
        .map(|c| c.weights.get("free-a").copied().unwrap_or(0.0))
        .fold(0.0, f64::max)
}

fn free_state(s: &WeightSnapshot) -> String {
    s.channels
        .get("free-a")
        .map(|c| c.state.clone())
        .unwrap_or_default()
}

/// Waits for `check` on the latest snapshot; panics with context after
/// `limit`.
fn wait_for(
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
fn read_topic(
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

/// The service tests run one at a time: each starts a broker, Redis and
/// Hermes processes, and two cores shared by four of those would blur every
/// bounded delay.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// `hermes run` named `name` against this broker and Redis, with the test
/// config (free-tier cool-down `cooldown_ms`).
fn start_hermes(
    kafka: &Tansu,
    redis: &RedisServer,
    dir: &std::path::Path,
    name: &str,
    cooldown_ms: i64,
) -> Hermes {
    let port = free_port();
    let cfg = config(&kafka.bootstrap(), &redis.url(), port, cooldown_ms);
    Hermes::start(dir, name, &cfg, port)
}

fn dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "hermes-service-{}-{}",
        std::process::id(),
        wall_ms()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn events_in_weights_out_drain_and_recover_with_an_alert_per_transition() {
    let _serial = serial();
    let kafka = Tansu::start(TOPICS);
    let redis = RedisServer::start();
    let dir = dir();
    let hermes = start_hermes(&kafka, &redis, &dir, "a", 5000);
    let log = SnapshotLog::start(&redis.url());
    let gw = Gateway::start(&kafka.bootstrap(), 40);

    // Warm-up: a window of data, then the first snapshot.
    let first = wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(90),
        "a first snapshot",
        |s| free_weight(s) > 0.0,
    );
    eprintln!("first snapshot {first:?} after start");
    assert!(
        log.all().iter().all(|s| s.computed_at_ms > 0),
        "nothing published before warm-up"
    );

    gw.set("free-a", FAILING);
    let t_bad = Instant::now();
    let drained = wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(30),
        "free-a drained",
        |s| free_state(s) == "DRAINED" && free_weight(s) == 0.0,
    );
    eprintln!("drained in Redis {drained:?} after the fault began");
    // Hermes' own share of it is measured: the record that drained free-a
    // handled → the snapshot carrying it acknowledged by Redis.
    let decisions = hermes
        .metric("hermes_decision_publish_seconds_count")
        .unwrap_or(0.0);
    assert!(decisions >= 1.0, "the drain is timed");
    eprintln!(
        "hermes_decision_publish_seconds: {} decisions, {:.3} s in all",
        decisions,
        hermes
            .metric("hermes_decision_publish_seconds_sum")
            .unwrap_or(f64::NAN)
    );

    std::thread::sleep(Duration::from_secs(3));
    gw.set("free-a", HEALTHY);
    let recovered = wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(120),
        "free-a recovered",
        |s| free_state(s) == "HEALTHY" && free_weight(s) > 0.0,
    );
    eprintln!(
        "recovered in Redis {recovered:?} after the fault ended ({:?} after it began)",
        t_bad.elapsed()
    );

    // Versions never go back, whatever a gateway read.
    let all = log.all();
    assert_no_regression(&all);

    // Every alert decodes; free-a's transitions form one chain through
    // DRAINED and back to HEALTHY.
    drop(gw);
    let alerts = read_topic(&kafka.bootstrap(), "hermes.alerts", 4);
    let decoded: Vec<AlertEvent> = alerts
        .iter()
        .map(|m| AlertEvent::from_avro(m.payload().unwrap()).expect("alert decodes"))
        .collect();
    let chain: Vec<(String, String)> = decoded
        .iter()
        .filter(|a| a.kind == AlertKind::Transition && a.channel_id.as_deref() == Some("free-a"))
        .map(|a| (a.from_state.clone().unwrap(), a.to_state.clone().unwrap()))
        .collect();
    eprintln!("free-a transitions: {chain:?}");
    assert_eq!(chain.first().map(|c| c.0.as_str()), Some("HEALTHY"));
    assert!(chain.iter().any(|c| c.1 == "DRAINED"));
    assert_eq!(chain.last().map(|c| c.1.as_str()), Some("HEALTHY"));
    for w in chain.windows(2) {
        assert_eq!(w[0].1, w[1].0, "transitions chain: {chain:?}");
    }
    for (m, a) in alerts.iter().zip(&decoded) {
        let want = a.channel_id.as_deref().unwrap_or(&a.route_group);
        assert_eq!(
            m.key(),
            Some(want.as_bytes()),
            "alerts are keyed by channel"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Produces one hand-made record to the request topic, waiting while the
/// producer's local queue is full.
fn send_request(
    p: &ThreadedProducer<DefaultProducerContext>,
    channel: &str,
    partition: i32,
    payload: &[u8],
) {
    support::send_retrying(
        p,
        BaseRecord::to("hermes.requests")
            .key(channel)
            .partition(partition)
            .payload(payload),
    );
}

/// A bare producer for hand-made records.
fn producer(brokers: &str) -> ThreadedProducer<DefaultProducerContext> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "5")
        .create()
        .unwrap()
}

fn wait_metric(h: &Hermes, series: &str, want: f64, limit: Duration) {
    wait_metric_by(h, series, want, limit, |v| v == want)
}

fn wait_metric_at_least(h: &Hermes, series: &str, want: f64, limit: Duration) {
    wait_metric_by(h, series, want, limit, |v| v >= want)
}

fn wait_metric_by(h: &Hermes, series: &str, want: f64, limit: Duration, ok: impl Fn(f64) -> bool) {
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

/// Good events in the garbage test, each followed by one garbage record of
/// a rotating kind (a multiple of 20, so every kind's share is whole).
/// 10 000 stranded tansu's consumer group on these machines (twice, the
/// second time with paced production): under that load its
/// SQLite storage answered a heartbeat after the 6 s session, the
/// assignment was revoked and the rejoin never completed, at 6-19 k of
/// 21 100 records. Hermes' handling of each record does not depend on the
/// count; every kind still comes hundreds of times.
const GOOD: u64 = 4_000;

#[test]
fn thousands_of_garbage_records_are_dead_lettered_and_every_good_event_applied() {
    let _serial = serial();
    let kafka = Tansu::start(TOPICS);
    let redis = RedisServer::start();
    let registry = FakeRegistry::start();
    let dir = dir();
    let port = free_port();
    // No idle advance while the records are produced: tansu can hold a
    // producer's batches for seconds (seen: 1 713 good events, stamped
    // when built, arrived after a 3 s quiet fetch had moved event time to
    // wall - 2 s, and were too late). This test is about bad input; idle
    // partitions are the drain test's business.
    let cfg = config(&kafka.bootstrap(), &redis.url(), port, 5000)
        .replace(
            "session_timeout_ms = 6000",
            &format!(
                "session_timeout_ms = 6000\nschema_registry_url = \"{}\"\nschema_registry_missing_ttl_ms = 600000",
                registry.url
            ),
        )
        .replace(
            "idle_advance_ms = 3000",
            "idle_advance_ms = 600000\nmax_record_bytes = 16384",
        );
    let hermes = Hermes::start(&dir, "a", &cfg, port);
    let p = producer(&kafka.bootstrap());
    let mut enc = Encoder::default();
    let mut garbage: Vec<Vec<u8>> = Vec::new();
    let (good, bad, dups) = (GOOD, GOOD, 100u64);
    let mut good_sent = Vec::new();
    for i in 0..good {
        let (channel, partition) = CHANNELS[(i % 3) as usize];
        let id = format!("good-{i}");
        let mut ev = event(&id, channel, false, i);
        ev.event_time_ms = wall_ms();
        let mut buf = Vec::new();
        enc.encode_plain(&ev, &mut buf).unwrap();
        // One garbage record of a rotating kind after every good one.
        let g: Vec<u8> = match i % 5 {
            // Oversize: dead-lettered undecoded.
            0 if (i / 5) % 4 == 0 => vec![(i & 0xff) as u8; 20_000],
            // Not Avro at all.
            0 => vec![0x7f, 0xff, (i & 0xff) as u8, 0x13, 0x37],
            // A good datum cut short.
            1 => buf[..buf.len() / 2].to_vec(),
            // Valid Avro, semantically wrong: no such channel, an empty
            // channel id, a NaN cost, a billion output tokens. (Not an
            // empty event id: a datum that starts with an empty string
            // starts with byte 0, which is Confluent framing to a reader
            // that accepts both.)
            2 => {
                let id = format!("ghost-{i}");
                let mut ev = event(&id, channel, false, i);
                match (i / 5) % 4 {
                    0 => ev.channel_id = "no-such-channel",
                    1 => ev.channel_id = "",
                    2 => ev.cost = f64::NAN,
                    _ => ev.output_tokens = 1_000_000_000,
                }
                let mut b = Vec::new();
                enc.encode_plain(&ev, &mut b).unwrap();
                b
            }
            // Decodes, but invalid (negative latency).
            3 if i % 10 == 3 => {
                let id = format!("neg-{i}");
                let mut ev = event(&id, channel, false, i);
                ev.latency_ms = -5;
                let mut b = Vec::new();
                enc.encode_plain(&ev, &mut b).unwrap();
                b
            }
            // Valid, but stamped ten years ahead: refused without moving
            // event time, so every good event after it is still applied.
            3 => {
                let id = format!("future-{i}");
                let mut ev = event(&id, channel, false, i);
                ev.event_time_ms = wall_ms() + 10 * 365 * 86_400_000;
                let mut b = Vec::new();
                enc.encode_plain(&ev, &mut b).unwrap();
                b
            }
            // Confluent framing with a schema id nobody registered.
            _ => {
                let mut b = vec![0u8, 0, 0, 0x30, 0x39];
                b.extend_from_slice(&buf);
                b
            }
        };
        for payload in [&buf, &g] {
            send_request(&p, channel, partition, payload);
        }
        garbage.push(g);
        good_sent.push(buf);
        // Paced: at most a thousand pairs in flight, so tansu's SQLite
        // storage is never handed every produce request at once (it then
        // answers group-coordinator requests late; see `GOOD`).
        if i % 1_000 == 999 {
            p.flush(Duration::from_secs(60)).unwrap();
        }
    }
    assert_eq!(garbage.len() as u64, bad);
    // Confluent-framed good events: their writer schema comes from the
    // registry (fetched once, cached).
    let framed = 1_000u64;
    for i in 0..framed {
        let (channel, partition) = CHANNELS[(i % 3) as usize];
        let id = format!("framed-{i}");
        let mut buf = Vec::new();
        enc.encode_confluent(
            &event(&id, channel, false, i),
            FakeRegistry::KNOWN_ID,
            &mut buf,
        )
        .unwrap();
        send_request(&p, channel, partition, &buf);
    }
    // The same records again: ignored as duplicates, neither applied nor
    // dead-lettered.
    for (i, buf) in good_sent.iter().take(dups as usize).enumerate() {
        let (channel, partition) = CHANNELS[i % 3];
        send_request(&p, channel, partition, buf);
    }
    p.flush(Duration::from_secs(30)).unwrap();

    let limit = Duration::from_secs(120);
    // At least once: a rebalance under load may hand records out again, so
    // "consumed" can exceed what was sent; nothing may be missing.
    wait_metric_at_least(
        &hermes,
        "hermes_events_consumed_total",
        (good + bad + dups + framed) as f64,
        limit,
    );
    // Redelivered good events are caught as duplicates, so "applied"
    // is exact.
    wait_metric(
        &hermes,
        "hermes_events_applied_total",
        (good + framed) as f64,
        limit,
    );
    assert_eq!(
        registry.requests(),
        vec![FakeRegistry::KNOWN_ID, 12345],
        "each schema id asked once (a 404 is remembered too)"
    );
    wait_metric_at_least(&hermes, "hermes_events_duplicate_total", dups as f64, limit);

    let all_dead = read_topic(&kafka.bootstrap(), "hermes.dead-letters", bad as usize);
    // A redelivered garbage record is dead-lettered again (at least once):
    // count each source record once.
    let mut dead: BTreeMap<(String, String), &rdkafka::message::OwnedMessage> = BTreeMap::new();
    for m in &all_dead {
        let h = m.headers().expect("dead letters carry headers");
        let header = |k: &str| {
            h.iter()
                .find(|x| x.key == k)
                .and_then(|x| x.value)
                .map(|v| String::from_utf8_lossy(v).to_string())
                .unwrap_or_default()
        };
        dead.insert((header("source.partition"), header("source.offset")), m);
    }
    eprintln!(
        "dead letters: {} records for {} garbage records",
        all_dead.len(),
        dead.len()
    );
    assert_eq!(dead.len() as u64, bad, "every garbage record dead-lettered");
    let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
    let mut payloads: Vec<Vec<u8>> = Vec::new();
    for m in dead.values() {
        let h = m.headers().expect("dead letters carry headers");
        let header = |k: &str| {
            h.iter()
                .find(|x| x.key == k)
                .and_then(|x| x.value)
                .map(|v| String::from_utf8_lossy(v).to_string())
        };
        let reason = header("reason").expect("a reason header");
        assert!(!reason.is_empty());
        assert!(header("source.offset").is_some());
        *kinds
            .entry(header("kind").expect("a kind header"))
            .or_default() += 1;
        payloads.push(m.payload().unwrap_or(&[]).to_vec());
    }
    eprintln!("dead letters by kind: {kinds:?}");
    payloads.sort();
    garbage.sort();
    assert!(
        payloads == garbage,
        "the original bytes of every garbage record"
    );
    assert_eq!(kinds.get("unknown_channel"), Some(&(GOOD / 20)));
    assert_eq!(kinds.get("implausible"), Some(&(GOOD / 20)));
    assert_eq!(kinds.get("oversize"), Some(&(GOOD / 20)));
    // Negative latency, empty channel ids, NaN costs.
    assert_eq!(kinds.get("invalid"), Some(&(GOOD / 5)));
    assert_eq!(kinds.get("future_timestamp"), Some(&(GOOD / 10)));
    assert_eq!(
        hermes.metric("hermes_events_too_late_total"),
        Some(0.0),
        "a future stamp never made a good event late"
    );
    // Half of the input is garbage: each reason crossed the dead-letter
    // share and raised one DECODE_ERROR_SPIKE (deduplicated per reason).
    let spikes: BTreeMap<String, u64> = read_topic(&kafka.bootstrap(), "hermes.alerts", 8)
        .iter()
        .filter_map(|m| hermes::alert::AlertEvent::from_record(m.payload()?).ok())
        .filter(|a| a.kind == hermes::alert::AlertKind::DecodeErrorSpike)
        .fold(BTreeMap::new(), |mut acc, a| {
            let reason = a.reason.split(['=', ',']).nth(1).unwrap_or("").to_string();
            *acc.entry(reason).or_default() += 1;
            acc
        });
    eprintln!("decode error spikes: {spikes:?}");
    let reasons: Vec<&str> = spikes.keys().map(String::as_str).collect();
    assert_eq!(
        reasons,
        [
            "future_timestamp",
            "implausible",
            "invalid",
            "malformed",
            "oversize",
            "truncated_datum",
            "unknown_channel",
            "unknown_schema_id"
        ]
    );
    assert_eq!(kinds.get("unknown_schema_id"), Some(&(GOOD / 5)));
    assert_eq!(kinds.get("truncated_datum"), Some(&(GOOD / 5)));
    assert_eq!(kinds.get("malformed"), Some(&(GOOD * 3 / 20)));

    // Hot reload: an invalid file is refused and the service keeps running;
    // a valid change is applied.
    let path = dir.join("a.toml");
    let good = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        good.replace("capacity_rps = 100.0", "capacity_rps = -1.0"),
    )
    .unwrap();
    wait_metric(
        &hermes,
        "hermes_config_reloads_rejected_total",
        1.0,
        Duration::from_secs(20),
    );
    std::fs::write(&path, good.replace("step = 0.5", "step = 0.25")).unwrap();
    wait_metric(
        &hermes,
        "hermes_config_reloads_total",
        1.0,
        Duration::from_secs(20),
    );
    assert!(hermes.get("/healthz").is_some_and(|b| b.starts_with("ok")));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The state of `channel` if this instance's engines evaluate it (from its
/// `/metrics`); Err if the instance did not answer.
fn owns(h: &Hermes, channel: &str) -> Result<Option<String>, ()> {
    let text = h.get("/metrics").ok_or(())?;
    let prefix = format!("hermes_channel_state{{group=\"chat\",channel=\"{channel}\",state=\"");
    // One-hot: the state whose line reads 1.
    Ok(text
        .lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .find_map(|rest| {
            let (state, value) = rest.split_once("\"} ")?;
            (value.trim().parse::<f64>().ok()? == 1.0).then(|| state.to_string())
        }))
}

/// The request partitions an instance holds (from its `/metrics`).
fn assigned(h: &Hermes) -> Vec<i32> {
    h.get("/metrics")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("hermes_partition_assigned{partition=\""))
        .filter_map(|rest| rest.split('"').next()?.parse().ok())
        .collect()
}

/// Per request partition: the offset group `group` committed, and the
/// partition's end.
fn committed_and_end_offsets(brokers: &str, group: &str) -> (Vec<i64>, Vec<i64>) {
    use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for (_, p) in CHANNELS {
        tpl.add_partition("hermes.requests", *p);
    }
    let committed = c
        .committed_offsets(tpl, Duration::from_secs(10))
        .unwrap()
        .elements()
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(o) => o,
            _ => -1,
        })
        .collect();
    let ends = CHANNELS
        .iter()
        .map(|(_, p)| {
            c.fetch_watermarks("hermes.requests", *p, Duration::from_secs(10))
                .unwrap()
                .1
        })
        .collect();
    (committed, ends)
}

/// Waits until `h` (all its request loops together) holds the three
/// request partitions.
fn wait_assigned_all(h: &Hermes, limit: Duration) {
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

/// Two instances, `a` started first (so it leads the group: tansu strands
/// the partitions of a SIGKILLed leader) and `b`, once they have split the
/// three partitions between them; with each one's partitions.
fn split_pair(
    kafka: &Tansu,
    redis: &RedisServer,
    dir: &std::path::Path,
    cooldown_ms: i64,
) -> (Hermes, Hermes, Vec<i32>, Vec<i32>) {
    let a = start_hermes(kafka, redis, dir, "a", cooldown_ms);
    let t0 = Instant::now();
    wait_assigned_all(&a, Duration::from_secs(60));
    let b = start_hermes(kafka, redis, dir, "b", cooldown_ms);
    loop {
        let (x, y) = (assigned(&a), assigned(&b));
        if !x.is_empty()
            && !y.is_empty()
            && x.len() + y.len() == 3
            && x.iter().all(|p| !y.contains(p))
        {
            return (a, b, x, y);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the partitions were not split ({x:?} / {y:?}):\n{}\n{}",
            a.log_tail(),
            b.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Two instances split the partitions; the one that owns the drained free
/// channel is SIGKILLed.
///
/// tansu 0.6's group coordinator strands the partitions of a SIGKILLed
/// group *leader* for good (the group stays in its forming state waiting for
/// the dead leader's SyncGroup; see docs/operating.md's notes on tansu), so the
/// test makes `a` the leader (it joins first and alone) and kills `b`, a
/// plain member. Apache Kafka re-elects a leader, so either would do there.
#[test]
fn a_killed_instance_is_taken_over_and_the_drained_channel_stays_drained() {
    let _serial = serial();
    let kafka = Tansu::start(TOPICS);
    let redis = RedisServer::start();
    let dir = dir();
    // A long cool-down: free-a must still be DRAINED after the takeover, and
    // only restored state can know that (its events are healthy again).
    let cooldown = 120_000;
    let t0 = Instant::now();
    let (a, mut b, pa_set, pb_set) = split_pair(&kafka, &redis, &dir, cooldown);
    eprintln!("split: a {pa_set:?}, b {pb_set:?}");
    // free-a lives on one of b's partitions, the paid channels on the rest.
    let mut others = pa_set.iter().chain(pb_set.iter().skip(1)).copied().cycle();
    let mapping: Mapping = vec![
        ("free-a", pb_set[0]),
        ("paid-a", others.next().unwrap()),
        ("paid-b", others.next().unwrap()),
    ];
    let log = SnapshotLog::start(&redis.url());
    let gw = Gateway::start_with(&kafka.bootstrap(), 40, mapping);
    wait_for(
        &log,
        &[&a, &b],
        Duration::from_secs(90),
        "a first snapshot",
        |s| free_weight(s) > 0.0,
    );

    gw.set("free-a", FAILING);
    wait_for(
        &log,
        &[&a, &b],
        Duration::from_secs(30),
        "free-a drained",
        |s| free_state(s) == "DRAINED" && free_weight(s) == 0.0,
    );
    let drained_at = log.all().len() - 1;
    gw.set("free-a", HEALTHY);
    std::thread::sleep(Duration::from_secs(3));

    while owns(&b, "free-a") != Ok(Some("DRAINED".into())) {
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "b does not evaluate free-a: {:?}",
            owns(&b, "free-a")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(owns(&a, "free-a"), Ok(None), "one owner per channel");
    let (victim, survivor) = (&mut b, &a);
    let killed_ms = wall_ms();
    victim.kill(); // SIGKILL
    let t_kill = Instant::now();
    while owns(survivor, "free-a") != Ok(Some("DRAINED".into())) {
        assert!(
            t_kill.elapsed() < Duration::from_secs(60),
            "no takeover (free-a on the survivor: {:?}):\n{}",
            owns(survivor, "free-a"),
            survivor.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // DRAINED: restored state, not re-derived from the healthy events.
    let took_over = t_kill.elapsed();
    // The survivor writes the group (a new epoch if it was the victim's).
    let fresh = wait_for(
        &log,
        &[survivor],
        Duration::from_secs(60),
        "a snapshot written after the kill",
        |s| s.heartbeat_ms > killed_ms + 1_000,
    );
    std::thread::sleep(Duration::from_secs(10));
    // The survivor is now the only instance, so it writes the group, and
    // what Redis holds is fresh.
    assert!(
        survivor
            .get("/metrics")
            .is_some_and(|m| m.contains("hermes_group_snapshot_version{group=\"chat\"")),
        "the survivor writes the group:\n{}",
        survivor.get("/status").unwrap_or_default()
    );
    let latest = log.latest().unwrap();
    assert!(
        wall_ms() - latest.heartbeat_ms < 5_000,
        "fresh heartbeat: {latest:?}"
    );
    eprintln!(
        "takeover of free-a's partition {took_over:?} after SIGKILL; fresh snapshot after {fresh:?}; {} events produced",
        gw.sent.load(Ordering::Relaxed)
    );

    let survivor_log = std::fs::read_to_string(&survivor.log).unwrap_or_default();
    for l in survivor_log.lines().filter(|l| {
        [
            "writing this group",
            "partition assigned",
            "revoked",
            "restored",
        ]
        .iter()
        .any(|k| l.contains(k))
    }) {
        eprintln!("survivor: {l}");
    }
    let all = log.all();
    assert_no_regression(&all);
    for s in &all[drained_at..] {
        assert_eq!(free_state(s), "DRAINED", "v{}.{}", s.epoch, s.version);
        assert_eq!(free_weight(s), 0.0, "v{}.{}", s.epoch, s.version);
    }
    eprintln!(
        "snapshots seen: {:?}",
        all.iter().map(|s| (s.epoch, s.version)).collect::<Vec<_>>()
    );
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn redis_down_for_ten_seconds_hermes_keeps_consuming_and_republishes() {
    let _serial = serial();
    let kafka = Tansu::start(TOPICS);
    let mut redis = RedisServer::start();
    let dir = dir();
    let hermes = start_hermes(&kafka, &redis, &dir, "a", 5000);
    let gw = Gateway::start(&kafka.bootstrap(), 40);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let client = hermes::client::WeightClient::start(
        &redis.url(),
        "chat",
        hermes::client::ClientOptions {
            refresh_interval: Duration::from_millis(500),
            ..Default::default()
        },
    )
    .unwrap();
    let t0 = Instant::now();
    while client.table().is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "no snapshot:\n{}",
            hermes.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let before = client.status();
    let consumed_before = hermes.metric("hermes_events_consumed_total").unwrap();

    redis.kill();
    let down = Instant::now();
    let mut served = 0;
    while down.elapsed() < Duration::from_secs(10) {
        // The gateway keeps routing by its last snapshot.
        assert!(client.table().is_some());
        served += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let consumed_during = hermes.metric("hermes_events_consumed_total").unwrap();
    assert!(
        consumed_during > consumed_before + 1_000.0,
        "kept consuming while Redis was down: {consumed_before} -> {consumed_during}"
    );
    let age = client.status().snapshot_age_ms.unwrap_or(0);
    assert!(
        age >= 9_000,
        "the client reports the snapshot's age ({age} ms)"
    );

    redis.restart(); // empty: no persistence
    let up = Instant::now();
    loop {
        let st = client.status();
        if st.snapshot_age_ms.is_some_and(|a| a < 5_000)
            && st.since_last_read_ms.is_some_and(|r| r < 2_000)
        {
            break;
        }
        assert!(
            up.elapsed() < Duration::from_secs(30),
            "not republished after Redis came back: {st:?}\n{}",
            hermes.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "served the last snapshot {served} times over 10 s; republished {:?} after Redis returned; before {before:?}, after {:?}",
        up.elapsed(),
        client.status()
    );
    assert!(
        hermes
            .metric("hermes_snapshot_failures_total")
            .unwrap_or(0.0)
            > 0.0
    );
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
}

/// docs/decisions.md#safety-rails: dependencies come and go. Hermes started before its
/// broker keeps running, says on `/readyz` why it is not ready, logs the
/// outage once rather than per retry, and becomes ready and consumes once
/// the broker is up.
#[test]
fn a_broker_that_comes_up_after_hermes_is_waited_for_and_readiness_says_why() {
    let _serial = serial();
    let redis = RedisServer::start();
    let dir = dir();
    let broker_port = free_port();
    let http = free_port();
    let cfg = config(
        &format!("127.0.0.1:{broker_port}"),
        &redis.url(),
        http,
        5000,
    );
    let mut hermes = Hermes::start(&dir, "early", &cfg, http);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let not_ready = |h: &Hermes| h.get("/readyz").filter(|b| b.starts_with("not ready"));
    assert!(
        rt.block_on(support::eventually(Duration::from_secs(20), || {
            not_ready(&hermes).is_some_and(|b| b.contains("kafka") || b.contains("health_topic"))
        })),
        "readiness should name the broker:\n{:?}\n{}",
        hermes.get("/readyz"),
        hermes.log_tail()
    );
    // Ten seconds without a broker: still alive, still answering.
    std::thread::sleep(Duration::from_secs(10));
    assert!(
        hermes.child.try_wait().unwrap().is_none(),
        "hermes exited without a broker:\n{}",
        hermes.log_tail()
    );
    assert_eq!(hermes.get("/healthz").as_deref(), Some("ok\n"));
    assert!(not_ready(&hermes).is_some());
    let log = std::fs::read_to_string(&hermes.log).unwrap_or_default();
    let outage_lines = log
        .lines()
        .filter(|l| l.contains("dependency unavailable"))
        .count();
    assert!(
        outage_lines <= 6,
        "the outage is logged per change, not per retry ({outage_lines} lines):\n{}",
        hermes.log_tail()
    );
    // The broker comes up where Hermes was told to look.
    let kafka = Tansu::start_on(broker_port, TOPICS);
    let gw = Gateway::start(&kafka.bootstrap(), 40);
    assert!(
        rt.block_on(support::eventually(Duration::from_secs(90), || {
            hermes.get("/readyz").as_deref() == Some("ready\n")
                && hermes.metric("hermes_events_consumed_total").unwrap_or(0.0) > 0.0
        })),
        "not ready after the broker came up:\n{:?}\n{}",
        hermes.get("/readyz"),
        hermes.log_tail()
    );
    drop(gw);
    hermes.kill();
}

/// A channel drained, then silent (its gateways route around it), alone on
/// its partition: while the instance's other partitions stay busy, that
/// partition's event time still moves on (judged on its own fetch report),
/// so the cool-down elapses and the channel gets its probation.
#[test]
fn a_drained_channel_alone_on_its_partition_gets_its_probation_while_others_are_busy() {
    let _serial = serial();
    let kafka = Tansu::start(TOPICS);
    let redis = RedisServer::start();
    let dir = dir();
    let port = free_port();
    let cfg = config(&kafka.bootstrap(), &redis.url(), port, 5000);
    let hermes = Hermes::start(&dir, "a", &cfg, port);
    let log = SnapshotLog::start(&redis.url());
    let gw = Gateway::start(&kafka.bootstrap(), 40);
    wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(90),
        "a first snapshot",
        |s| free_weight(s) > 0.0,
    );
    gw.set("free-a", FAILING);
    wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(30),
        "free-a drained",
        |s| free_state(s) == "DRAINED",
    );
    gw.set("free-a", SILENT);
    wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(60),
        "free-a on probation after its 5 s cool-down",
        |s| free_state(s) == "OBSERVING",
    );
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
}

/// docs/decisions.md#safety-rails: a Schema Registry outage delays, it never
/// discards. Confluent-framed events whose schema id Hermes has not cached
/// arrive while the registry answers 503 for 20 s: their partitions pause
/// at the first such record (readiness says why), and once the registry is
/// back every event is applied, none dead-lettered, none too late.
#[test]
fn a_schema_registry_outage_delays_framed_events_and_loses_none() {
    let _serial = serial();
    let kafka = Tansu::start(TOPICS);
    let redis = RedisServer::start();
    let registry = FakeRegistry::start();
    registry.set_down(true);
    let dir = dir();
    let port = free_port();
    let cfg = config(&kafka.bootstrap(), &redis.url(), port, 5000).replace(
        "session_timeout_ms = 6000",
        &format!(
            "session_timeout_ms = 6000\nschema_registry_url = \"{}\"\nalert_wire_format = \"plain\"",
            registry.url
        ),
    );
    let hermes = Hermes::start(&dir, "r", &cfg, port);
    let p = producer(&kafka.bootstrap());
    let mut enc = Encoder::default();
    let (framed, plain) = (600u64, 300u64);
    for i in 0..framed + plain {
        let (channel, partition) = CHANNELS[(i % 3) as usize];
        let id = format!("ev-{i}");
        let mut ev = event(&id, channel, false, i);
        ev.event_time_ms = wall_ms();
        let mut buf = Vec::new();
        if i % 3 == 0 || i >= plain {
            enc.encode_confluent(&ev, FakeRegistry::KNOWN_ID, &mut buf)
                .unwrap();
        } else {
            enc.encode_plain(&ev, &mut buf).unwrap();
        }
        send_request(&p, channel, partition, &buf);
        std::thread::sleep(Duration::from_millis(5));
    }
    p.flush(Duration::from_secs(30)).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert!(
        rt.block_on(support::eventually(Duration::from_secs(30), || {
            hermes
                .get("/readyz")
                .is_some_and(|b| b.contains("schema_registry"))
        })),
        "readiness should name the registry:\n{:?}\n{}",
        hermes.get("/readyz"),
        hermes.log_tail()
    );
    std::thread::sleep(Duration::from_secs(15));
    let applied = hermes.metric("hermes_events_applied_total").unwrap_or(0.0);
    assert!(
        applied < (framed + plain) as f64,
        "the framed events waited ({applied} applied)"
    );
    assert_eq!(
        hermes.metric("hermes_dead_letters_total"),
        None,
        "nothing dead-lettered while it was down"
    );
    registry.set_down(false);
    wait_metric(
        &hermes,
        "hermes_events_applied_total",
        (framed + plain) as f64,
        Duration::from_secs(90),
    );
    assert_eq!(
        hermes.metric("hermes_dead_letters_total"),
        None,
        "nothing dead-lettered after"
    );
    assert_eq!(hermes.metric("hermes_events_too_late_total"), Some(0.0));
    assert_eq!(
        registry.requests(),
        vec![FakeRegistry::KNOWN_ID],
        "asked once it answered, then cached"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// docs/operating.md: missing topics are a reason on `/readyz` that names
/// them, not a silent stall; with `kafka.create_topics = true` Hermes
/// creates them and runs.
#[test]
fn missing_topics_are_named_and_created_when_asked() {
    let _serial = serial();
    let kafka = Tansu::start(&[]);
    let redis = RedisServer::start();
    let dir = dir();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let port = free_port();
    let cfg = config(&kafka.bootstrap(), &redis.url(), port, 5000);
    let mut without = Hermes::start(&dir, "plain", &cfg, port);
    assert!(
        rt.block_on(support::eventually(Duration::from_secs(30), || {
            without.get("/readyz").is_some_and(|b| {
                b.contains("missing topics")
                    && [
                        "hermes.requests",
                        "hermes.alerts",
                        "hermes.dead-letters",
                        "hermes.health",
                    ]
                    .iter()
                    .all(|t| b.contains(t))
            })
        })),
        "readiness should name every missing topic:\n{:?}\n{}",
        without.get("/readyz"),
        without.log_tail()
    );
    without.kill();
    let port = free_port();
    let cfg = config(&kafka.bootstrap(), &redis.url(), port, 5000).replace(
        "session_timeout_ms = 6000",
        "session_timeout_ms = 6000\ncreate_topics = true\nrequest_partitions = 3\nreplication_factor = 1",
    );
    let creator = Hermes::start(&dir, "creator", &cfg, port);
    assert!(
        rt.block_on(support::eventually(Duration::from_secs(90), || {
            creator.get("/readyz").as_deref() == Some("ready\n")
        })),
        "not ready after creating the topics:\n{:?}\n{}",
        creator.get("/readyz"),
        creator.log_tail()
    );
    let log = std::fs::read_to_string(&creator.log).unwrap_or_default();
    assert_eq!(
        log.matches("topic created").count(),
        4,
        "the four topics created once:\n{}",
        creator.log_tail()
    );
    let gw = Gateway::start(&kafka.bootstrap(), 40);
    wait_metric_at_least(
        &creator,
        "hermes_events_consumed_total",
        50.0,
        Duration::from_secs(60),
    );
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs the `hermes` binary with `args`; returns (success, stdout, stderr).
fn hermes_cli(args: &[&str]) -> (bool, String, String) {
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

/// docs/operating.md#steering-pins-and-freezes: an operator drains a channel from the CLI, sees it in
/// `hermes status` (from Redis, no instance asked) and on the instance's
/// metrics, the OVERRIDE alert names who and why, the drain holds across a
/// restart of the only instance, and clearing it gives the channel back.
#[test]
fn an_operator_drains_a_channel_from_the_cli_and_it_survives_a_restart() {
    const TOKEN: &str = "test-control-token-0123";
    let _serial = serial();
    let kafka = Tansu::start(TOPICS);
    let redis = RedisServer::start();
    let dir = dir();
    let port = free_port();
    let cfg = config(&kafka.bootstrap(), &redis.url(), port, 5000).replace(
        "[service]\n",
        &format!("[service]\ncontrol_token = \"{TOKEN}\"\noverride_poll_ms = 500\n"),
    );
    let mut hermes = Hermes::start(&dir, "a", &cfg, port);
    let log = SnapshotLog::start(&redis.url());
    let _gw = Gateway::start(&kafka.bootstrap(), 40);
    wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(90),
        "a first snapshot",
        |s| free_weight(s) > 0.0,
    );
    let url = format!("http://{}", hermes.http);

    // Without the token the change is refused, and says how to give it.
    let (ok, _, err) = hermes_cli(&[
        "ctl", "--url", &url, "pin", "free-a", "--drain", "--reason", "x",
    ]);
    assert!(!ok && err.contains("token"), "{err}");
    let (ok, out, err) = hermes_cli(&[
        "ctl",
        "--url",
        &url,
        "--token",
        TOKEN,
        "--actor",
        "alice",
        "pin",
        "free-a",
        "--drain",
        "--for",
        "30m",
        "--reason",
        "provider incident INC-42",
    ]);
    assert!(ok, "ctl pin: {out}{err}");
    let drained = wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(15),
        "free-a pinned to 0",
        |s| free_weight(s) == 0.0,
    );
    eprintln!("pin to weight 0 in Redis: {drained:?}");
    wait_metric(
        &hermes,
        "hermes_channel_pinned{group=\"chat\",channel=\"free-a\"}",
        1.0,
        Duration::from_secs(10),
    );

    let (ok, listed, err) = hermes_cli(&["ctl", "--url", &url, "list"]);
    assert!(
        ok && listed.contains("alice") && listed.contains("INC-42"),
        "{listed}{err}"
    );
    let (ok, status, err) = hermes_cli(&["status", "--redis", &redis.url()]);
    assert!(ok, "{err}");
    let row = status
        .lines()
        .find(|l| l.starts_with("free-a"))
        .unwrap_or_else(|| panic!("no free-a row:\n{status}"));
    assert!(row.contains("alice") && row.contains("INC-42"), "{status}");
    assert!(row.contains("=0.00"), "its weights are 0: {row}");
    let (ok, json, _) = hermes_cli(&["status", "--redis", &redis.url(), "--json"]);
    let view: serde_json::Value = serde_json::from_str(&json).expect("status --json is JSON");
    assert!(ok && view["groups"][0]["group"] == "chat", "{json}");

    // A restart of the only instance: the pin is read back from Redis and
    // the channel is never given weight again before it is cleared.
    let pinned_epoch = log.latest().unwrap().epoch;
    hermes.terminate();
    let hermes = Hermes::start(&dir, "b", &cfg, port);
    wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(90),
        "a snapshot from the new instance",
        |s| s.epoch > pinned_epoch,
    );
    std::thread::sleep(Duration::from_secs(3));
    let after: Vec<WeightSnapshot> = log
        .all()
        .into_iter()
        .filter(|s| s.epoch > pinned_epoch)
        .collect();
    assert!(
        after.iter().all(|s| free_weight(s) == 0.0),
        "the pin holds across the restart: {:?}",
        after
            .iter()
            .map(|s| (s.version, free_weight(s)))
            .collect::<Vec<_>>()
    );
    wait_metric(
        &hermes,
        "hermes_channel_pinned{group=\"chat\",channel=\"free-a\"}",
        1.0,
        Duration::from_secs(20),
    );

    let (ok, out, err) = hermes_cli(&[
        "ctl",
        "--url",
        &url,
        "--token",
        TOKEN,
        "--actor",
        "bob",
        "unpin",
        "free-a",
        "--reason",
        "provider fixed",
    ]);
    assert!(ok, "ctl unpin: {out}{err}");
    wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(30),
        "free-a back",
        |s| free_weight(s) > 0.0,
    );

    let alerts: Vec<AlertEvent> = read_topic(&kafka.bootstrap(), "hermes.alerts", 2)
        .iter()
        .filter_map(|m| AlertEvent::from_avro(m.payload()?).ok())
        .filter(|a| a.kind == AlertKind::Override && a.channel_id.as_deref() == Some("free-a"))
        .collect();
    let messages: Vec<&str> = alerts.iter().map(|a| a.message.as_str()).collect();
    assert!(
        messages
            .iter()
            .any(|m| m.contains("alice") && m.contains("INC-42")),
        "the pin's OVERRIDE names who and why: {messages:?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("bob") && m.contains("provider fixed")),
        "so does the release: {messages:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// docs/integration.md: with a registry configured Hermes registers both schemas
/// under their TopicNameStrategy subjects at start and writes every alert
/// Confluent-framed with the registered id; a registry-aware consumer
/// (Python confluent-kafka's AvroDeserializer against the registry) and
/// apache-avro with the registered schema both read them, keyed by UTF-8
/// channel ids.
#[test]
fn alerts_are_registry_framed_and_a_registry_aware_consumer_reads_them() {
    let _serial = serial();
    let kafka = Tansu::start(TOPICS);
    let redis = RedisServer::start();
    let registry = FakeRegistry::start();
    let dir = dir();
    let port = free_port();
    let cfg = config(&kafka.bootstrap(), &redis.url(), port, 5000).replace(
        "session_timeout_ms = 6000",
        &format!(
            "session_timeout_ms = 6000\nschema_registry_url = \"{}\"",
            registry.url
        ),
    );
    let hermes = Hermes::start(&dir, "a", &cfg, port);
    let log = SnapshotLog::start(&redis.url());
    let gw = Gateway::start(&kafka.bootstrap(), 40);
    wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(90),
        "a first snapshot",
        |s| free_weight(s) > 0.0,
    );
    gw.set("free-a", FAILING);
    wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(30),
        "free-a drained",
        |s| free_state(s) == "DRAINED",
    );
    drop(gw);

    let reg = registry.registered.lock().unwrap().clone();
    let subjects: Vec<&str> = reg.iter().map(|r| r.0.as_str()).collect();
    assert!(
        subjects.contains(&"hermes.alerts-value") && subjects.contains(&"hermes.requests-value"),
        "TopicNameStrategy subjects: {subjects:?}"
    );
    let (_, alert_schema, alert_id) = reg
        .iter()
        .find(|r| r.0 == "hermes.alerts-value")
        .unwrap()
        .clone();
    let records = read_topic(&kafka.bootstrap(), "hermes.alerts", 2);
    assert!(records.len() >= 2, "alerts were raised");
    let schema =
        apache_avro::Schema::parse_str(&alert_schema).expect("the registered schema parses");
    for m in &records {
        let v = m.payload().unwrap();
        assert_eq!(v[0], 0, "magic byte");
        assert_eq!(
            u32::from_be_bytes([v[1], v[2], v[3], v[4]]),
            alert_id,
            "the registered id"
        );
        apache_avro::from_avro_datum(&schema, &mut &v[5..], None)
            .expect("apache-avro reads the datum");
        let a = AlertEvent::from_record(v).unwrap();
        let key = std::str::from_utf8(m.key().unwrap()).expect("keys are UTF-8");
        assert_eq!(key, a.channel_id.as_deref().unwrap_or(&a.route_group));
    }

    // A registry-aware consumer that knows nothing of Hermes.
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/interop/alerts_consumer.py"
    );
    let have_python = std::process::Command::new("python3")
        .args(["-c", "import confluent_kafka.schema_registry.avro"])
        .status()
        .is_ok_and(|s| s.success());
    if !have_python {
        assert!(
            std::env::var("CI").is_err(),
            "CI installs confluent-kafka for this test"
        );
        eprintln!("python3 with confluent-kafka not found: the Python consumer part is skipped");
    } else {
        let out = std::process::Command::new("python3")
            .args([
                script,
                &kafka.bootstrap(),
                &registry.url,
                "hermes.alerts",
                &records.len().to_string(),
            ])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let read: Vec<serde_json::Value> = stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        // Alerts go on after the read above (the stopped gateway makes the
        // channels silent): at least those, every one deserialized (the
        // consumer exits 1 on any that does not).
        assert!(read.len() >= records.len(), "every alert deserialized");
        assert!(
            read.iter().any(|r| r["key"] == "free-a"
                && r["value"]["kind"] == "TRANSITION"
                && r["value"]["to_state"] == "DRAINED"),
            "{stdout}"
        );
    }
    assert!(
        registry.requests().contains(&alert_id) || !have_python,
        "the consumer looked the id up"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The compose stack's traffic source: `hermes gateways` produces a scenario's
/// traffic to a real broker and routes by the weights Hermes publishes in
/// Redis; the scenario's fault drains its channel, and the gateways follow.
#[test]
fn hermes_gateways_drive_a_real_cluster_until_the_faulty_channel_is_drained() {
    let _serial = serial();
    let kafka = Tansu::start(TOPICS);
    let redis = RedisServer::start();
    let dir = dir();
    let hermes = start_hermes(&kafka, &redis, &dir, "a", 60_000);
    let log = SnapshotLog::start(&redis.url());
    let scenario = dir.join("gateways.toml");
    std::fs::write(
        &scenario,
        r#"
name = "gateways-test"
duration_s = 120
[gateway]
probe_interval_s = 2
[[channels]]
id = "free-a"
tier = "free"
capacity_rps = 100
[[channels.faults]]
start_s = 25
end_s = 120
refuse_all = true
[[channels]]
id = "paid-a"
tier = "paid"
price_per_1k_tokens = 0.5
capacity_rps = 100
[[channels]]
id = "paid-b"
tier = "paid"
price_per_1k_tokens = 0.6
capacity_rps = 100
[[traffic]]
class = "core"
rps = 30
"#,
    )
    .unwrap();
    let mut gw = std::process::Command::new(env!("CARGO_BIN_EXE_hermes"))
        .args([
            "gateways",
            "--bootstrap",
            &kafka.bootstrap(),
            "--redis",
            &redis.url(),
            "--scenario",
        ])
        .arg(&scenario)
        .args(["--seconds", "90"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(60),
        "a first snapshot",
        |s| free_weight(s) > 0.0,
    );
    wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(60),
        "free-a drained by the scenario's fault",
        |s| free_state(s) == "DRAINED" && free_weight(s) == 0.0,
    );
    let applied = hermes.metric("hermes_events_applied_total").unwrap_or(0.0);
    assert!(
        applied > 500.0,
        "the gateways' events were consumed: {applied}"
    );
    let _ = gw.kill();
    let _ = gw.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The counters an event ends in, once each: applied, too late, duplicate
/// (an id seen before) or dead-lettered.
fn accounted(h: &Hermes) -> (f64, f64, f64, f64) {
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
fn wait_all_applied(h: &Hermes, sent: u64, limit: Duration) -> (f64, f64, f64, f64) {
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

/// docs/operating.md#tested-against-a-real-broker-and-redis: the broker is SIGKILLed mid-stream
/// and comes back 15 s later on its data. While it is away `/readyz` says
/// so and event time does not move on (the gateways queue their events);
/// once it is back every event is applied exactly once, none too late, and
/// a drain still reaches Redis.
#[test]
fn a_broker_restarted_mid_stream_loses_nothing_and_weights_keep_flowing() {
    let _serial = serial();
    let mut kafka = Tansu::start(TOPICS);
    let redis = RedisServer::start();
    let dir = dir();
    let mut hermes = start_hermes(&kafka, &redis, &dir, "a", 5000);
    let log = SnapshotLog::start(&redis.url());
    let mut gw = Gateway::start(&kafka.bootstrap(), 40);
    wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(90),
        "a first snapshot",
        |s| free_weight(s) > 0.0,
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert!(
        rt.block_on(support::eventually(Duration::from_secs(60), || {
            hermes.get("/readyz").as_deref() == Some("ready\n")
        }))
    );

    kafka.stop();
    let down = Instant::now();
    let mut why = None;
    while why.is_none() && down.elapsed() < Duration::from_secs(15) {
        why = hermes
            .get("/readyz")
            .filter(|b| b.starts_with("not ready") && b.contains("kafka"));
        std::thread::sleep(Duration::from_millis(200));
    }
    let noticed = down.elapsed();
    let why = why.unwrap_or_else(|| {
        panic!(
            "readiness did not name the broker: {:?}\n{}",
            hermes.get("/readyz"),
            hermes.log_tail()
        )
    });
    std::thread::sleep(Duration::from_secs(15).saturating_sub(down.elapsed()));
    assert!(hermes.child.try_wait().unwrap().is_none(), "hermes exited");
    let sent_while_down = gw.sent.load(Ordering::Relaxed);

    kafka.resume();
    let up = Instant::now();
    assert!(
        rt.block_on(support::eventually(Duration::from_secs(90), || {
            hermes.get("/readyz").as_deref() == Some("ready\n")
        })),
        "not ready after the broker returned: {:?}\n{}",
        hermes.get("/readyz"),
        hermes.log_tail()
    );
    let ready_after = up.elapsed();

    gw.set("free-a", FAILING);
    let drained = wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(60),
        "free-a drained after the broker returned",
        |s| free_state(s) == "DRAINED" && free_weight(s) == 0.0,
    );
    gw.stop();
    let sent = gw.sent.load(Ordering::Relaxed);
    let (applied, late, dup, dead) = wait_all_applied(&hermes, sent, Duration::from_secs(90));
    assert_no_regression(&log.all());
    eprintln!(
        "broker down 15 s: readiness said so after {noticed:?} ({}); ready {ready_after:?} after it returned; \
         free-a drained {drained:?} after failing; sent {sent} ({sent_while_down} by the outage's end), \
         applied {applied}, too late {late}, duplicates {dup}, dead-lettered {dead}",
        why.trim().replace('\n', " | ")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// docs/operating.md#tested-against-a-real-broker-and-redis: Redis restarts twice under a
/// running Hermes: first with its append-only file (the epoch and the last
/// weights are still there), then with nothing (Hermes writes its epoch and
/// the whole snapshot again). A gateway reading throughout never sees a
/// snapshot older than one it saw, and the drained channel stays drained.
#[test]
fn redis_restarted_with_its_data_or_empty_brings_back_epoch_and_weights() {
    let _serial = serial();
    let kafka = Tansu::start(TOPICS);
    let mut redis = RedisServer::start_persistent();
    let dir = dir();
    let hermes = start_hermes(&kafka, &redis, &dir, "a", 120_000);
    let log = SnapshotLog::start(&redis.url());
    let gw = Gateway::start(&kafka.bootstrap(), 40);
    gw.set("free-a", FAILING);
    wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(90),
        "free-a drained",
        |s| free_state(s) == "DRAINED",
    );
    gw.set("free-a", HEALTHY);
    let before = log.latest().unwrap();
    let epoch_of = |r: &RedisServer| -> Option<u64> {
        let c = redis::Client::open(r.url()).ok()?;
        let mut c = c.get_connection_with_timeout(Duration::from_secs(1)).ok()?;
        redis::cmd("GET")
            .arg(hermes::publish::epoch_key("chat"))
            .query::<Option<u64>>(&mut c)
            .ok()?
    };
    let epoch = epoch_of(&redis).expect("an epoch in Redis");

    for (how, wipe) in [("with its AOF", false), ("empty", true)] {
        redis.kill();
        if wipe {
            redis.wipe();
        }
        std::thread::sleep(Duration::from_secs(5));
        let down_ms = wall_ms();
        redis.restart();
        let up = Instant::now();
        let fresh = wait_for(
            &log,
            &[&hermes],
            Duration::from_secs(30),
            "a snapshot written after Redis returned",
            |s| s.heartbeat_ms > down_ms,
        );
        let now = log.latest().unwrap();
        assert_eq!(free_state(&now), "DRAINED", "after a restart {how}");
        assert_eq!(now.epoch, before.epoch, "the same writer, the same epoch");
        assert_eq!(
            epoch_of(&redis),
            Some(epoch),
            "the epoch key is back after a restart {how}"
        );
        eprintln!(
            "Redis restarted {how}: fresh snapshot v{}.{} {fresh:?} after it returned ({:?} since restart)",
            now.epoch,
            now.version,
            up.elapsed()
        );
    }
    let all = log.all();
    assert_no_regression(&all);
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
}

/// docs/operating.md#tested-against-a-real-broker-and-redis: a member instance is SIGSTOPped
/// past the session timeout while it owns the drained channel. The other
/// takes its partitions over (and the group's writing, with a newer epoch
/// when it was the writer); when the paused one is SIGCONTed, whatever it
/// had in flight is fenced, it rejoins, and it raises no alert for channels
/// it no longer owns.
#[test]
fn a_paused_instance_is_fenced_on_resume_and_raises_no_stale_alert() {
    let _serial = serial();
    let kafka = Tansu::start(TOPICS);
    let redis = RedisServer::start();
    let dir = dir();
    let t0 = Instant::now();
    let (a, b, pa, pb) = split_pair(&kafka, &redis, &dir, 120_000);
    let mapping: Mapping = vec![
        ("free-a", pb[0]),
        ("paid-a", pa[0]),
        ("paid-b", *pb.get(1).unwrap_or(&pa[0])),
    ];
    let log = SnapshotLog::start(&redis.url());
    let gw = Gateway::start_with(&kafka.bootstrap(), 40, mapping);
    gw.set("free-a", FAILING);
    wait_for(
        &log,
        &[&a, &b],
        Duration::from_secs(90),
        "free-a drained",
        |s| free_state(s) == "DRAINED",
    );
    gw.set("free-a", HEALTHY);
    while owns(&b, "free-a") != Ok(Some("DRAINED".into())) {
        assert!(t0.elapsed() < Duration::from_secs(240), "b owns free-a");
        std::thread::sleep(Duration::from_millis(200));
    }
    let b_pid = b.child.id().to_string();
    let signal = |sig: &str| {
        assert!(std::process::Command::new("kill")
            .args([sig, &b_pid])
            .status()
            .unwrap()
            .success())
    };
    signal("-STOP");
    let paused_ms = wall_ms();
    let paused = Instant::now();
    while owns(&a, "free-a") != Ok(Some("DRAINED".into())) {
        assert!(
            paused.elapsed() < Duration::from_secs(90),
            "no takeover of the paused instance's partitions:\n{}",
            a.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let took_over = paused.elapsed();
    // Well past the 6 s session timeout, and past a heartbeat of its own.
    std::thread::sleep(Duration::from_secs(20).saturating_sub(paused.elapsed()));
    signal("-CONT");
    let resumed_ms = wall_ms();
    let resumed = Instant::now();
    let rejoined = loop {
        let (x, y) = (assigned(&a), assigned(&b));
        if !y.is_empty() && x.len() + y.len() == 3 && x.iter().all(|p| !y.contains(p)) {
            break resumed.elapsed();
        }
        assert!(
            resumed.elapsed() < Duration::from_secs(120),
            "b did not rejoin ({x:?} / {y:?}):\n{}",
            b.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    std::thread::sleep(Duration::from_secs(10));
    let all = log.all();
    assert_no_regression(&all);
    for s in all.iter().filter(|s| s.heartbeat_ms > paused_ms) {
        assert_eq!(free_state(s), "DRAINED", "v{}.{}", s.epoch, s.version);
    }
    // The alerts on the topic, in order: free-a's transitions form one
    // chain (each starts where the previous one ended; a paused owner
    // speaking again for a channel it lost would break it or repeat a
    // step), and no alert is there twice.
    let alerts: Vec<(i64, AlertEvent)> = read_topic(&kafka.bootstrap(), "hermes.alerts", 1)
        .iter()
        .filter_map(|m| {
            let at = m.timestamp().to_millis().unwrap_or(0);
            Some((at, AlertEvent::from_record(m.payload()?).ok()?))
        })
        .collect();
    let chain: Vec<(&str, &str, i64)> = alerts
        .iter()
        .filter(|(_, a)| {
            a.kind == AlertKind::Transition && a.channel_id.as_deref() == Some("free-a")
        })
        .map(|(at, a)| {
            (
                a.from_state.as_deref().unwrap_or(""),
                a.to_state.as_deref().unwrap_or(""),
                *at,
            )
        })
        .collect();
    for w in chain.windows(2) {
        assert_eq!(w[0].1, w[1].0, "free-a's transitions break: {chain:?}");
    }
    let mut ids: Vec<&str> = alerts.iter().map(|(_, a)| a.alert_id.as_str()).collect();
    let n = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), n, "an alert twice on the topic");
    let after_resume = alerts.iter().filter(|(at, _)| *at > resumed_ms).count();
    let refused = b
        .metric("hermes_snapshots_refused_stale_total")
        .unwrap_or(0.0);
    // When the paused instance wrote the group, the taker bumped the epoch:
    // every snapshot written since the pause is from a newer writer, and the
    // paused one's late writes could only be refused.
    let b_wrote = pb.contains(&hermes::board::writer_partition("chat", 3));
    if b_wrote {
        let before = all
            .iter()
            .filter(|s| s.heartbeat_ms < paused_ms)
            .map(|s| s.epoch)
            .max();
        let after = all
            .iter()
            .filter(|s| s.heartbeat_ms > paused_ms + 7_000)
            .map(|s| s.epoch)
            .min();
        assert!(
            after > before,
            "a newer epoch after the takeover: {before:?} -> {after:?}"
        );
    }
    eprintln!(
        "paused b: a took free-a over in {took_over:?}; b rejoined {rejoined:?} after SIGCONT; \
         {} snapshots seen, {} alerts on the topic ({after_resume} after the resume), \
         free-a's transitions {chain:?}; b wrote the group: {b_wrote}, its writes refused as stale: {refused}",
        all.len(),
        alerts.len()
    );
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
}

/// docs/operating.md#tested-against-a-real-broker-and-redis: Hermes and a gateway's weight client
/// reach Redis over `rediss://` as an ACL user allowed only Hermes' keys and
/// the commands it uses (the default user is off); the test makes its own
/// self-signed certificate and trusts it through `SSL_CERT_FILE`.
#[test]
fn weights_flow_over_tls_to_a_redis_acl_user() {
    let _serial = serial();
    let kafka = Tansu::start(TOPICS);
    let (redis, ca) = RedisServer::start_tls(&[
        "user default off",
        "user hermes on >hermes-secret ~hermes:* &hermes:* -@all +@read +@write +@scripting +@connection +publish +subscribe +scan",
    ]);
    let url = format!("rediss://hermes:hermes-secret@127.0.0.1:{}/", redis.port);
    let dir = dir();
    let port = free_port();
    let cfg = config(&kafka.bootstrap(), &url, port, 5000);
    let ca = ca.display().to_string();
    let hermes = Hermes::start_env(&dir, "tls", &cfg, port, &[("SSL_CERT_FILE", &ca)]);
    std::env::set_var("SSL_CERT_FILE", &ca);
    let log = SnapshotLog::start(&url);
    let gw = Gateway::start(&kafka.bootstrap(), 40);
    wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(90),
        "a first snapshot over TLS",
        |s| free_weight(s) > 0.0,
    );
    gw.set("free-a", FAILING);
    let drained = wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(60),
        "free-a drained over TLS",
        |s| free_state(s) == "DRAINED",
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let client =
        hermes::client::WeightClient::start(&url, "chat", Default::default()).expect("client");
    assert!(
        rt.block_on(support::eventually(Duration::from_secs(10), || {
            client.table().is_some()
        })),
        "the weight client reads over TLS: {:?}",
        client.status()
    );
    let plain = redis::Client::open(format!("redis://127.0.0.1:{}/", redis.port))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(2))
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
    assert!(plain.is_err(), "plain TCP must not be served: {plain:?}");
    assert_eq!(
        hermes
            .metric("hermes_snapshot_failures_total")
            .unwrap_or(0.0),
        0.0,
        "no write was refused by the ACL:\n{}",
        hermes.log_tail()
    );
    eprintln!("over rediss:// as an ACL user: free-a drained {drained:?} after failing");
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The control token given only through `HERMES_CONTROL_TOKEN` (nothing in
/// the config file): the control API accepts a change carrying it, refuses
/// one carrying another token, and the instance needs no broker for that.
#[test]
fn the_control_token_from_the_environment_guards_changes() {
    const TOKEN: &str = "env-control-token-0123456";
    let _serial = serial();
    let redis = RedisServer::start();
    let dir = dir();
    let port = free_port();
    // No broker at this address: the control API does not wait for one.
    let cfg = config(
        &format!("127.0.0.1:{}", free_port()),
        &redis.url(),
        port,
        5000,
    );
    assert!(!cfg.contains("control_token"));
    let hermes = Hermes::start_env(&dir, "env", &cfg, port, &[("HERMES_CONTROL_TOKEN", TOKEN)]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert!(
        rt.block_on(support::eventually(Duration::from_secs(20), || {
            hermes.get("/healthz").is_some()
        }))
    );
    let url = format!("http://{}", hermes.http);
    let pin = |token: &str| {
        hermes_cli(&[
            "ctl",
            "--url",
            &url,
            "--token",
            token,
            "pin",
            "free-a",
            "--drain",
            "--for",
            "5m",
            "--reason",
            "env token test",
        ])
    };
    let (ok, out, err) = pin("not-the-token-at-all-0000");
    assert!(!ok, "a wrong token is refused: {out}{err}");
    assert!(
        err.contains("401") || err.to_lowercase().contains("token"),
        "{err}"
    );
    let (ok, out, err) = pin(TOKEN);
    assert!(
        ok,
        "the environment's token is accepted: {out}{err}\n{}",
        hermes.log_tail()
    );
    let (ok, out, _) = hermes_cli(&["ctl", "--url", &url, "list"]);
    assert!(ok && out.contains("free-a"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `service.request_threads = 2`: two request loops, each a member of the
/// consumer group on its own thread, split the partitions; the instance
/// reports all of them as its own, a drain reaches Redis, and every event
/// is applied exactly once.
#[test]
fn two_request_threads_split_the_partitions_and_apply_every_event_once() {
    let _serial = serial();
    let kafka = Tansu::start(TOPICS);
    let redis = RedisServer::start();
    let dir = dir();
    let port = free_port();
    let cfg = config(&kafka.bootstrap(), &redis.url(), port, 5000)
        .replace("[service]\n", "[service]\nrequest_threads = 2\n");
    let mut hermes = Hermes::start(&dir, "threads", &cfg, port);
    wait_assigned_all(&hermes, Duration::from_secs(90));
    let log = SnapshotLog::start(&redis.url());
    let mut gw = Gateway::start(&kafka.bootstrap(), 40);
    wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(90),
        "a first snapshot",
        |s| free_weight(s) > 0.0,
    );
    gw.set("free-a", FAILING);
    let drained = wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(60),
        "free-a drained",
        |s| free_state(s) == "DRAINED" && free_weight(s) == 0.0,
    );
    gw.stop();
    let sent = gw.sent.load(Ordering::Relaxed);
    let (applied, ..) = wait_all_applied(&hermes, sent, Duration::from_secs(60));
    let log_text = std::fs::read_to_string(&hermes.log).unwrap_or_default();
    let members: std::collections::BTreeSet<&str> = log_text
        .lines()
        .filter(|l| l.contains("partition assigned"))
        .filter_map(|l| l.split("requests{lane=").nth(1)?.split('}').next())
        .collect();
    assert_eq!(
        members.len(),
        2,
        "both loops were assigned partitions: {members:?}"
    );
    eprintln!(
        "two request threads: free-a drained {drained:?} after failing; {applied} of {sent} events applied; \
         loops that logged an assignment: {members:?}"
    );
    // A stop commits both loops' offsets before either leaves the group
    // (the first to leave starts a rebalance, and the broker refuses a
    // commit during one): whoever takes the partitions over starts where
    // this instance stopped, not at its last periodic commit.
    hermes.terminate();
    let (committed, ends) = committed_and_end_offsets(&kafka.bootstrap(), "hermes");
    assert_eq!(
        committed,
        ends,
        "committed offsets after a stop = the partitions' ends\n{}",
        hermes.log_tail()
    );
    assert_no_regression(&log.all());
    let _ = std::fs::remove_dir_all(&dir);
}

/// docs/integration.md#producing-events: one gateway sends free-a's events to
/// partition 0 and another to partition 1 (different partitioners): the
/// group's writer names the channel and both partitions in a
/// PARTITION_SPLIT alert (once) and in `hermes_channel_split_partitions`.
#[test]
fn a_channel_split_over_two_partitions_is_named_in_an_alert_and_a_metric() {
    let _serial = serial();
    let kafka = Tansu::start(TOPICS);
    let redis = RedisServer::start();
    let dir = dir();
    let hermes = start_hermes(&kafka, &redis, &dir, "a", 5000);
    let mapping: Mapping = vec![("free-a", 0), ("free-a", 1), ("paid-a", 1), ("paid-b", 2)];
    let _gw = Gateway::start_with(&kafka.bootstrap(), 40, mapping);
    let series =
        "hermes_channel_split_partitions{group=\"chat\",channel=\"free-a\",partitions=\"0,1\"}";
    let t0 = Instant::now();
    while hermes.metric(series).is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "no split metric:\n{}\n{}",
            hermes
                .get("/metrics")
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("split"))
                .collect::<Vec<_>>()
                .join("\n"),
            hermes.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let noticed = t0.elapsed();
    assert_eq!(hermes.metric(series), Some(2.0));
    // Only free-a is split.
    let metrics = hermes.get("/metrics").unwrap_or_default();
    assert_eq!(
        metrics
            .lines()
            .filter(|l| l.starts_with("hermes_channel_split_partitions{"))
            .count(),
        1,
        "{metrics}"
    );
    std::thread::sleep(Duration::from_secs(3));
    let splits: Vec<AlertEvent> = read_topic(&kafka.bootstrap(), "hermes.alerts", 1)
        .iter()
        .filter_map(|m| AlertEvent::from_record(m.payload()?).ok())
        .filter(|a| a.kind == AlertKind::PartitionSplit)
        .collect();
    assert_eq!(splits.len(), 1, "one alert per period: {splits:?}");
    assert_eq!(splits[0].channel_id.as_deref(), Some("free-a"));
    assert_eq!(splits[0].reason, "partitions=0,1");
    eprintln!(
        "split channel named {noticed:?} after the gateways started: {}",
        splits[0].message
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// SIGTERM while no broker is reachable: the instance stops at once rather
/// than when the broker is back. Its last commit is synchronous, and the
/// loops wait for each other before leaving the group; with the coordinator
/// gone the commit fails at once (0.2–0.3 s from SIGTERM to exit here). The
/// 25 s bound only catches a hang.
#[test]
fn a_stop_while_the_broker_is_away_does_not_wait_for_it() {
    let _serial = serial();
    let mut kafka = Tansu::start(TOPICS);
    let redis = RedisServer::start();
    let dir = dir();
    let mut hermes = start_hermes(&kafka, &redis, &dir, "a", 5000);
    wait_assigned_all(&hermes, Duration::from_secs(90));
    let mut gw = Gateway::start(&kafka.bootstrap(), 20);
    std::thread::sleep(Duration::from_secs(5));
    gw.stop();
    std::thread::sleep(Duration::from_secs(2));
    kafka.stop();
    // Longer than two statistics reports: the instance knows the broker is
    // gone.
    std::thread::sleep(Duration::from_secs(4));
    let t = Instant::now();
    hermes.terminate();
    let took = t.elapsed();
    eprintln!("stopped {took:?} after SIGTERM with the broker away");
    assert!(
        took < Duration::from_secs(25),
        "the stop waited {took:?} for the broker\n{}",
        hermes.log_tail()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The saved machine of a channel of group `chat`, straight from Redis.
fn saved_machine(
    redis: &RedisServer,
    channel: &str,
) -> Option<hermes::service::state_store::SavedState> {
    let c = redis::Client::open(redis.url()).ok()?;
    let mut c = c.get_connection_with_timeout(Duration::from_secs(1)).ok()?;
    let json: Option<String> = redis::cmd("HGET")
        .arg(hermes::service::state_store::state_key("chat"))
        .arg(channel)
        .query(&mut c)
        .ok()?;
    serde_json::from_str(&json?).ok()
}

/// The cool-down of a DRAINED machine (until − since), if it is drained.
fn cooldown_ms(s: &hermes::service::state_store::SavedState) -> Option<i64> {
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
fn through_a_probation(gw: &Gateway, log: &SnapshotLog, hermes: &[&Hermes], then: u8) {
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

/// docs/decisions.md#alerts-and-pages: nobody is paged for what Hermes did
/// itself. free-a is drained, gets nothing through its cool-down (the
/// gateways route around it), and traffic again when its weight comes
/// back: no SILENT_CHANNEL. Then its gateway stops sending while it has
/// full weight: one SILENT_CHANNEL, within the silence threshold.
#[test]
fn a_drain_and_its_re_admission_are_not_silence_and_a_gateway_that_stops_is() {
    let _serial = serial();
    let kafka = Tansu::start(TOPICS);
    let redis = RedisServer::start();
    let dir = dir();
    let hermes = start_hermes(&kafka, &redis, &dir, "a", 5000);
    let log = SnapshotLog::start(&redis.url());
    let gw = Gateway::start(&kafka.bootstrap(), 40);
    wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(90),
        "a first snapshot",
        |s| free_weight(s) > 0.0,
    );
    through_a_probation(&gw, &log, &[&hermes], HEALTHY);
    wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(60),
        "free-a back at full weight",
        |s| free_state(s) == "HEALTHY",
    );
    let readmitted_ms = wall_ms();
    // Its traffic fills the long view (30 s) at full weight.
    std::thread::sleep(Duration::from_secs(20));
    let stopped_ms = wall_ms();
    gw.set("free-a", SILENT);
    std::thread::sleep(Duration::from_secs(20));
    let silences: Vec<AlertEvent> = read_topic(&kafka.bootstrap(), "hermes.alerts", 1)
        .iter()
        .filter_map(|m| AlertEvent::from_record(m.payload()?).ok())
        .filter(|a| a.kind == AlertKind::SilentChannel)
        .collect();
    for a in &silences {
        eprintln!("{} {:?} {}", a.event_time_ms, a.channel_id, a.message);
    }
    assert!(
        silences.iter().all(|a| a.event_time_ms >= stopped_ms),
        "a silence alarm before the gateway stopped (re-admitted at {readmitted_ms}): {silences:?}"
    );
    assert_eq!(silences.len(), 1, "{silences:?}");
    let a = &silences[0];
    assert_eq!(a.channel_id.as_deref(), Some("free-a"));
    let after = a.event_time_ms - stopped_ms;
    assert!(
        (10_000..=15_000).contains(&after),
        "noticed {after} ms after the stop"
    );
    eprintln!(
        "silence noticed {after} ms after the gateway stopped; none for the drain and re-admission"
    );
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
}

/// docs/operating.md: Redis comes back empty. Within an evaluation or two
/// every channel's state is saved again, so a Hermes restart after it
/// restores the incident history: free-a relapsed after its re-admission,
/// and its next cool-down keeps the relapse multiplier (a forgotten
/// history would give the base 5 s).
#[test]
fn state_redis_lost_is_saved_again_and_a_restart_keeps_the_relapse_multiplier() {
    let _serial = serial();
    let kafka = Tansu::start(TOPICS);
    let mut redis = RedisServer::start();
    let dir = dir();
    let base = 5_000;
    let mut a = start_hermes(&kafka, &redis, &dir, "a", base);
    let log = SnapshotLog::start(&redis.url());
    let gw = Gateway::start(&kafka.bootstrap(), 40);
    wait_for(
        &log,
        &[&a],
        Duration::from_secs(90),
        "a first snapshot",
        |s| free_weight(s) > 0.0,
    );
    // A relapse after re-admission: failing again while recovering.
    through_a_probation(&gw, &log, &[&a], FAILING);
    wait_for(
        &log,
        &[&a],
        Duration::from_secs(60),
        "free-a relapsed",
        |s| free_state(s) == "DRAINED",
    );
    gw.set("free-a", SILENT);
    let relapsed = (0..100)
        .find_map(|_| {
            let s = saved_machine(&redis, "free-a").filter(|s| cooldown_ms(s).is_some());
            if s.is_none() {
                std::thread::sleep(Duration::from_millis(100));
            }
            s
        })
        .expect("the relapsed machine saved");
    let first = cooldown_ms(&relapsed).unwrap();
    eprintln!("relapse cool-down before Redis was emptied: {first} ms");

    redis.kill();
    redis.restart();
    let back = Instant::now();
    let resaved = loop {
        if let Some(s) = saved_machine(&redis, "free-a") {
            break s;
        }
        assert!(
            back.elapsed() < Duration::from_secs(15),
            "state not saved again 15 s after Redis came back empty:\n{}",
            a.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let resave_took = back.elapsed();
    assert_eq!(cooldown_ms(&resaved), Some(first), "the same machine");

    // A restart now: the new instance restores every channel.
    a.terminate();
    let b = start_hermes(&kafka, &redis, &dir, "b", base);
    let restored = Instant::now();
    loop {
        let text = std::fs::read_to_string(&b.log).unwrap_or_default();
        let rebuilt: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("partition rebuilding"))
            .collect();
        if rebuilt.len() >= 3 {
            // Every partition restores every saved channel of the group.
            for l in &rebuilt {
                assert!(l.contains("restored=3"), "{l}");
            }
            break;
        }
        assert!(
            restored.elapsed() < Duration::from_secs(60),
            "free-a not restored:\n{}",
            b.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // free-a serves its cool-down, passes its probation and relapses
    // again: the next cool-down carries both relapses.
    wait_for(
        &log,
        &[&b],
        Duration::from_secs(120),
        "free-a on probation",
        |s| free_state(s) == "OBSERVING",
    );
    gw.set("free-a", HEALTHY);
    wait_for(
        &log,
        &[&b],
        Duration::from_secs(60),
        "free-a recovering",
        |s| free_state(s) == "RECOVERING",
    );
    gw.set("free-a", FAILING);
    wait_for(
        &log,
        &[&b],
        Duration::from_secs(60),
        "free-a relapsed again",
        |s| free_state(s) == "DRAINED",
    );
    let second = (0..100)
        .find_map(|_| {
            let s = saved_machine(&redis, "free-a").and_then(|s| cooldown_ms(&s));
            if s.is_none_or(|c| c <= first) {
                std::thread::sleep(Duration::from_millis(100));
                return None;
            }
            s
        })
        .expect("a longer cool-down after the second relapse");
    eprintln!(
        "state saved again {resave_took:?} after Redis came back empty; cool-downs {first} ms, \
         then {second} ms after the restart (base {base} ms)"
    );
    assert!(second >= 4 * base, "{second} ms");
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
}
