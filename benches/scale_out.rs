//! Scale-out on a real broker: instances joining and leaving a consumer
//! group of `hermes run` processes on tansu and redis-server, at tens of
//! thousands of channels.
//!
//! ```sh
//! cargo bench --bench scale_out                       # 3-4 instances, 12 partitions, 20 000 channels, 5 000 events/s
//! cargo bench --bench scale_out -- --channels 20000 --rate 20000 --partitions 12 --step-s 60
//! ```
//!
//! A synthetic gateway produces `--rate` events/s (default 5 000: tansu on
//! SQLite takes ~14 500/s on this machine at most, and a move's replay needs
//! the broker's headroom; docs/performance.md), spread evenly over
//! `--channels` channels in route groups of ten (a group's channels on one
//! request partition, the group's index modulo the partitions; its writer
//! is wherever `writer_partition` puts it, so health crosses instances).
//! Channel `g00000-0` refuses every attempt from the start: it is drained,
//! and must stay at weight 0 through every move.
//!
//! Three instances start; then, `--step-s` apart: the third leaves by
//! SIGTERM and comes back, leaves by SIGKILL (a plain member: tansu strands
//! a SIGKILLed group *leader*, docs/operating.md) and comes back, a fourth
//! joins and leaves by SIGTERM. For each step the bench reads every health
//! report on `hermes.health` and prints:
//!
//! - `settled_s`: from the step until every channel was reported by the
//!   instance that owns its partition once the group settled (what the
//!   gateways' weights are computed from);
//! - per moved partition, `gap_s`: the longest time no instance reported
//!   its channels (decisions on them delayed);
//! - each instance's resident memory and partitions after the step.
//!
//! At the end the gateway stops, every instance drains its backlog and is
//! stopped by SIGTERM, and the records are accounted for: produced (acked
//! by the broker) against what every instance's lifetime applied,
//! dead-lettered, dropped as duplicates or as too late (from each instance's
//! `hermes stopped` log line; for the SIGKILLed one, its last `/metrics`
//! read just before the kill). The redis snapshots of a sample of groups
//! are read every 200 ms: a version that goes back, or the drained channel
//! back above weight 0, is counted as a regression. Needs `tansu` and
//! `redis-server` (`bash .ci/run` installs both); skips otherwise. Not a
//! timed test: read the numbers. The instances' logs are kept (and their
//! directory named) when a snapshot regressed, or when
//! `HERMES_BENCH_KEEP_LOGS` is set.

#[path = "../tests/support/mod.rs"]
mod support;

use hermes::codec::Encoder;
use hermes::health::HealthReport;
use hermes::publish::{snapshot_key, WeightSnapshot};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::{ClientConfig, Message};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{event, free_port, send_retrying, Hermes, RedisServer, Tansu};

const GROUP_SIZE: usize = 10;
const FAULTY: &str = "g00000-0";
/// Groups whose snapshots are watched for regressions.
const WATCHED_GROUPS: usize = 40;

struct Opts {
    channels: usize,
    partitions: u32,
    rate: u64,
    step: Duration,
}

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn group_of(channel: usize) -> usize {
    channel / GROUP_SIZE
}

fn channel_name(c: usize) -> String {
    format!("g{:05}-{}", group_of(c), c % GROUP_SIZE)
}

fn group_name(g: usize) -> String {
    format!("g{g:05}")
}

fn config(o: &Opts, brokers: &str, redis: &str) -> String {
    let per_channel = o.rate as f64 / o.channels as f64;
    let mut text = format!(
        "[kafka]\nbrokers = \"{brokers}\"\n\
         # tansu answers group heartbeats late under this load\n\
         session_timeout_ms = 30000\n\n[redis]\nurl = \"{redis}\"\n\n\
         [service]\nhttp_listen = \"127.0.0.1:HTTP_PORT\"\n"
    );
    for g in 0..o.channels.div_ceil(GROUP_SIZE) {
        text.push_str(&format!("\n[[groups]]\nid = \"{}\"\n", group_name(g)));
        for c in g * GROUP_SIZE..((g + 1) * GROUP_SIZE).min(o.channels) {
            // Room for three times a channel's traffic: a drained one's
            // share fits on the other nine.
            text.push_str(&format!(
                "[[groups.channels]]\nid = \"{}\"\ntier = \"free\"\n\
                 price_per_1k_tokens = 0.0\ncapacity_rps = {:?}\n",
                channel_name(c),
                (per_channel * 3.0).max(1.0)
            ));
        }
    }
    text
}

/// Counts the records the broker acknowledged.
struct Acks(Arc<AtomicU64>);

impl rdkafka::ClientContext for Acks {}

impl rdkafka::producer::ProducerContext for Acks {
    type DeliveryOpaque = ();
    fn delivery(&self, r: &rdkafka::message::DeliveryResult<'_>, _: ()) {
        if r.is_ok() {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The synthetic gateway: `rate` events/s round-robin over the channels.
fn gateway(
    o: &Opts,
    brokers: &str,
    acked: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    let producer: ThreadedProducer<Acks> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "50")
        .set("queue.buffering.max.messages", "2000000")
        .create_with_context(Acks(acked))
        .expect("gateway producer");
    let (channels, partitions, rate) = (o.channels, o.partitions, o.rate);
    std::thread::spawn(move || {
        let names: Vec<String> = (0..channels).map(channel_name).collect();
        let groups: Vec<String> = (0..channels.div_ceil(GROUP_SIZE)).map(group_name).collect();
        let mut enc = Encoder::default();
        let mut buf = Vec::new();
        let (mut seq, mut cursor, mut ticks) = (0u64, 0usize, 0u64);
        let tick = Duration::from_millis(10);
        let per_tick = (rate / 100).max(1);
        let started = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            for _ in 0..per_tick {
                let c = cursor;
                cursor = (cursor + 1) % channels;
                seq += 1;
                let id = format!("so-{seq}");
                let mut ev = event(&id, &names[c], names[c] == FAULTY, seq);
                ev.route_group = &groups[group_of(c)];
                buf.clear();
                enc.encode_plain(&ev, &mut buf).expect("encode");
                send_retrying(
                    &producer,
                    BaseRecord::to("hermes.requests")
                        .key(names[c].as_str())
                        .partition((group_of(c) as u32 % partitions) as i32)
                        .payload(&buf[..]),
                );
            }
            ticks += 1;
            let due = started + tick * ticks as u32;
            if let Some(rest) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(rest);
            }
        }
        let _ = producer.flush(Duration::from_secs(60));
        seq
    })
}

/// Every health report seen, per channel: (ms since the bench started,
/// reporting instance's pid).
#[derive(Default)]
struct Reports {
    by_channel: HashMap<String, Vec<(u32, u32)>>,
    /// partition → (ms, pid) of each report.
    by_partition: BTreeMap<i32, Vec<(u32, u32)>>,
}

fn pid_of(instance: &str) -> u32 {
    // `{host}-{pid}` (docs/operating.md): the pid is the last field.
    instance
        .rsplit('-')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

fn health_reader(
    brokers: &str,
    t0: Instant,
    reports: Arc<Mutex<Reports>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "scale-out-bench")
        .set("enable.auto.commit", "false")
        .create()
        .expect("health reader");
    let mut tpl = TopicPartitionList::new();
    for p in 0..2 {
        tpl.add_partition_offset("hermes.health", p, Offset::End)
            .expect("partition");
    }
    consumer.assign(&tpl).expect("assign hermes.health");
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) else {
                continue;
            };
            let Some(Ok(r)) = m.payload().map(HealthReport::from_json) else {
                continue;
            };
            let at = t0.elapsed().as_millis() as u32;
            let pid = pid_of(&r.instance);
            let mut all = reports.lock().expect("reports");
            all.by_partition
                .entry(r.partition)
                .or_default()
                .push((at, pid));
            for c in r.channels {
                all.by_channel.entry(c.id).or_default().push((at, pid));
            }
        }
    })
}

/// Reads the watched groups' snapshots: versions must not go back, the
/// faulty channel once at 0 must stay there.
struct Watch {
    regressions: Arc<AtomicU64>,
    reads: Arc<AtomicU64>,
    drained_at: Arc<Mutex<Option<Duration>>>,
}

fn watch_redis(
    url: &str,
    groups: usize,
    t0: Instant,
    stop: Arc<AtomicBool>,
) -> (Watch, std::thread::JoinHandle<Vec<String>>) {
    let w = Watch {
        regressions: Arc::new(AtomicU64::new(0)),
        reads: Arc::new(AtomicU64::new(0)),
        drained_at: Arc::new(Mutex::new(None)),
    };
    let (reg, reads, drained_at) = (w.regressions.clone(), w.reads.clone(), w.drained_at.clone());
    let mut conn = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("redis");
    let thread = std::thread::spawn(move || {
        let mut versions: HashMap<usize, (u64, u64)> = HashMap::new();
        let mut faulty_drained = false;
        let mut faulty_states: Vec<String> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            for g in (0..groups).step_by((groups / WATCHED_GROUPS).max(1)) {
                let text: Option<String> = redis::cmd("GET")
                    .arg(snapshot_key(&group_name(g)))
                    .query(&mut conn)
                    .unwrap_or(None);
                let Some(s) = text.and_then(|t| serde_json::from_str::<WeightSnapshot>(&t).ok())
                else {
                    continue;
                };
                reads.fetch_add(1, Ordering::Relaxed);
                let seen = (s.epoch, s.version);
                if let Some(before) = versions.insert(g, seen) {
                    if seen.1 < before.1 {
                        eprintln!(
                            "  regression: {} version {:?} after {:?}",
                            group_name(g),
                            seen,
                            before
                        );
                        reg.fetch_add(1, Ordering::Relaxed);
                    }
                }
                if g == 0 {
                    // Once drained, the failing channel may be probed again
                    // (PROBATION, a small weight) but never judged healthy:
                    // a new owner that lost its state would start it afresh.
                    let state = s.channels.get(FAULTY).map(|c| c.state.clone());
                    let zero = s
                        .classes
                        .values()
                        .all(|c| c.weights.get(FAULTY).copied().unwrap_or(0.0) <= 0.0);
                    if zero && !faulty_drained {
                        faulty_drained = true;
                        *drained_at.lock().expect("drained") = Some(t0.elapsed());
                    } else if faulty_drained && state.as_deref() == Some("HEALTHY") {
                        eprintln!(
                            "  regression: {FAULTY} HEALTHY again (version {}, epoch {})",
                            s.version, s.epoch
                        );
                        reg.fetch_add(1, Ordering::Relaxed);
                    }
                    if let Some(st) = state {
                        if faulty_states.last() != Some(&st) {
                            faulty_states.push(st);
                        }
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        faulty_states
    });
    (w, thread)
}

fn rss_mb(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// Lifetime counters of one instance.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    applied: u64,
    duplicates: u64,
    too_late: u64,
    dead_lettered: u64,
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.applied += o.applied;
        self.duplicates += o.duplicates;
        self.too_late += o.too_late;
        self.dead_lettered += o.dead_lettered;
    }
}

/// An instance's counts from one `/metrics` read (retried for a few
/// seconds: on a loaded machine one read may time out); `None` if it never
/// answered.
fn counts_from_metrics(h: &Hermes) -> Option<Counts> {
    for _ in 0..20 {
        let Some(text) = h.get("/metrics") else {
            std::thread::sleep(Duration::from_millis(250));
            continue;
        };
        let sum = |series: &str| -> u64 {
            text.lines()
                .filter(|l| l.starts_with(series) && l[series.len()..].starts_with([' ', '{']))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>() as u64
        };
        return Some(Counts {
            applied: sum("hermes_events_applied_total"),
            duplicates: sum("hermes_events_duplicate_total"),
            too_late: sum("hermes_events_too_late_total"),
            dead_lettered: sum("hermes_dead_letters_total"),
        });
    }
    None
}

/// The `hermes stopped` line of an instance's log.
fn counts_from_log(h: &Hermes) -> Option<Counts> {
    let log = std::fs::read_to_string(&h.log).ok()?;
    let line = log.lines().rev().find(|l| l.contains("hermes stopped"))?;
    let field = |k: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.trim_matches(|c: char| !c.is_ascii_digit()).parse().ok())
            .unwrap_or(0)
    };
    Some(Counts {
        applied: field("applied"),
        duplicates: field("duplicates"),
        too_late: field("too_late"),
        dead_lettered: field("dead_lettered"),
    })
}

struct Fleet {
    dir: std::path::PathBuf,
    config: String,
    live: BTreeMap<&'static str, Hermes>,
    /// Lifetime counts of instances that stopped.
    gone: Counts,
    started: usize,
}

impl Fleet {
    fn start(&mut self, name: &'static str) {
        let port = free_port();
        let cfg = self.config.replace("HTTP_PORT", &port.to_string());
        self.started += 1;
        let h = Hermes::start(&self.dir, &format!("{name}-{}", self.started), &cfg, port);
        eprintln!("  {name} started (pid {})", h.child.id());
        self.live.insert(name, h);
    }

    fn terminate(&mut self, name: &str) {
        let mut h = self.live.remove(name).expect("live instance");
        h.terminate();
        match counts_from_log(&h) {
            Some(c) => self.gone += c,
            None => eprintln!("  {name}: no `hermes stopped` line\n{}", h.log_tail()),
        }
    }

    fn kill(&mut self, name: &str) -> Counts {
        let mut h = self.live.remove(name).expect("live instance");
        let c = counts_from_metrics(&h);
        h.kill();
        match c {
            Some(c) => self.gone += c,
            None => {
                eprintln!("  {name}: /metrics never answered before the kill; its records are missing from the accounting");
            }
        }
        c.unwrap_or_default()
    }

    fn pids(&self) -> HashMap<u32, &'static str> {
        self.live.iter().map(|(n, h)| (h.child.id(), *n)).collect()
    }
}

/// What one step did, from the health reports and the processes.
fn report_step(
    what: &str,
    at: Duration,
    fleet: &Fleet,
    reports: &Reports,
    o: &Opts,
    now: Duration,
) {
    let at_ms = at.as_millis() as u32;
    let end_ms = now.as_millis() as u32;
    let live = fleet.pids();
    // Each partition's owner once settled: the last live instance to
    // report it.
    let owner: BTreeMap<i32, u32> = reports
        .by_partition
        .iter()
        .filter_map(|(p, r)| {
            r.iter()
                .rev()
                .find(|(_, pid)| live.contains_key(pid))
                .map(|&(_, pid)| (*p, pid))
        })
        .collect();
    let before: BTreeMap<i32, u32> = reports
        .by_partition
        .iter()
        .filter_map(|(p, r)| {
            r.iter()
                .rev()
                .find(|(t, _)| *t < at_ms)
                .map(|&(_, pid)| (*p, pid))
        })
        .collect();
    let mut settled_ms = 0u32;
    let mut unsettled = 0usize;
    for c in 0..o.channels {
        let p = (group_of(c) as u32 % o.partitions) as i32;
        let name = channel_name(c);
        let first = reports.by_channel.get(&name).and_then(|r| {
            r.iter()
                .find(|(t, pid)| {
                    *t >= at_ms && Some(pid) == owner.get(&p) && live.contains_key(pid)
                })
                .map(|&(t, _)| t)
        });
        match first {
            Some(t) => settled_ms = settled_ms.max(t - at_ms),
            None => unsettled += 1,
        }
    }
    let mut moved = Vec::new();
    for (p, pid) in &owner {
        if before.get(p) != Some(pid) {
            let r = &reports.by_partition[p];
            // The longest silence around the move.
            let mut gap = 0u32;
            let mut last = r
                .iter()
                .rev()
                .find(|(t, _)| *t < at_ms)
                .map_or(at_ms, |x| x.0);
            for &(t, _) in r.iter().filter(|(t, _)| *t >= at_ms && *t <= end_ms) {
                gap = gap.max(t - last);
                last = t;
            }
            moved.push(format!("p{p} {:.1}", gap as f64 / 1000.0));
        }
    }
    let mut held: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (p, pid) in &owner {
        if let Some(n) = live.get(pid) {
            held.entry(n).or_default().push(*p);
        }
    }
    println!(
        "{what}: settled_s {} ({} channels not yet reported by their owner), moved partitions (gap_s): [{}]",
        if unsettled == 0 { format!("{:.1}", settled_ms as f64 / 1000.0) } else { "-".into() },
        unsettled,
        moved.join(", ")
    );
    for (n, h) in &fleet.live {
        println!(
            "    {n}: rss {:.0} MB, partitions {:?}",
            rss_mb(h.child.id()),
            held.get(n).cloned().unwrap_or_default()
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let o = Opts {
        channels: arg(&args, "--channels", 20_000),
        partitions: arg(&args, "--partitions", 12),
        rate: arg(&args, "--rate", 5_000),
        step: Duration::from_secs(arg(&args, "--step-s", 60)),
    };
    if !support::have_tansu_and_redis() {
        eprintln!("scale_out: needs tansu and redis-server (bash .ci/run installs them); skipped");
        return;
    }
    let kafka = Tansu::start(&[
        ("hermes.requests", o.partitions),
        ("hermes.alerts", 1),
        ("hermes.dead-letters", 1),
        ("hermes.health", 2),
    ]);
    let redis = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("hermes-scale-out-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let reports = Arc::new(Mutex::new(Reports::default()));
    let reader = health_reader(&kafka.bootstrap(), t0, reports.clone(), stop.clone());
    let groups = o.channels.div_ceil(GROUP_SIZE);
    let (watch, watcher) = watch_redis(&redis.url(), groups, t0, stop.clone());
    let mut fleet = Fleet {
        dir: dir.clone(),
        config: config(&o, &kafka.bootstrap(), &redis.url()),
        started: 0,
        live: BTreeMap::new(),
        gone: Counts::default(),
    };
    println!(
        "scale-out on tansu: {} channels in {groups} groups, {} partitions, {} events/s offered",
        o.channels, o.partitions, o.rate
    );
    let acked = Arc::new(AtomicU64::new(0));
    let gw_stop = Arc::new(AtomicBool::new(false));
    let gw = gateway(&o, &kafka.bootstrap(), acked.clone(), gw_stop.clone());
    for n in ["a", "b", "c"] {
        fleet.start(n);
    }
    // Warm: every channel reported once.
    let warm_deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let n = reports.lock().expect("reports").by_channel.len();
        if n >= o.channels {
            break;
        }
        if Instant::now() > warm_deadline {
            eprintln!("only {n} of {} channels reported after 10 min", o.channels);
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    println!(
        "every channel reported {:.1} s after start",
        t0.elapsed().as_secs_f64()
    );
    let step = |what: &str, fleet: &mut Fleet, act: &dyn Fn(&mut Fleet)| {
        let at = t0.elapsed();
        act(fleet);
        std::thread::sleep(o.step);
        let r = reports.lock().expect("reports");
        report_step(what, at, fleet, &r, &o, t0.elapsed());
    };
    step("3 instances, steady", &mut fleet, &|_| {});
    step("c leaves (SIGTERM)", &mut fleet, &|f| f.terminate("c"));
    step("c joins", &mut fleet, &|f| f.start("c"));
    step("c leaves (SIGKILL)", &mut fleet, &|f| {
        let c = f.kill("c");
        eprintln!("  c applied {} before the kill", c.applied);
    });
    step("c joins", &mut fleet, &|f| f.start("c"));
    step("d joins (4 instances)", &mut fleet, &|f| f.start("d"));
    step("d leaves (SIGTERM)", &mut fleet, &|f| f.terminate("d"));

    // Accounting: stop the gateway, let every instance catch up, stop them.
    gw_stop.store(true, Ordering::Relaxed);
    let sent = gw.join().expect("gateway");
    let produced = acked.load(Ordering::Relaxed);
    let rate = produced as f64 / t0.elapsed().as_secs_f64();
    let caught_up = Instant::now() + Duration::from_secs(300);
    while Instant::now() < caught_up {
        let lag: f64 = fleet
            .live
            .values()
            .map(|h| h.metric_sum("hermes_consumer_lag_records"))
            .sum();
        if lag == 0.0 {
            break;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    std::thread::sleep(Duration::from_secs(5));
    let regressions = watch.regressions.load(Ordering::Relaxed);
    let reads = watch.reads.load(Ordering::Relaxed);
    let drained = *watch.drained_at.lock().expect("drained");
    for n in fleet.live.keys().copied().collect::<Vec<_>>() {
        fleet.terminate(n);
    }
    stop.store(true, Ordering::Relaxed);
    let _ = reader.join();
    let states = watcher.join().unwrap_or_default();
    let c = fleet.gone;
    let accounted = c.applied + c.duplicates + c.too_late + c.dead_lettered;
    println!(
        "records: {produced} produced and acked of {sent} sent ({rate:.0}/s over the run); every lifetime together: {} applied + {} duplicates + {} too late + {} dead-lettered = {accounted}; {} lost, {} applied by two lifetimes",
        c.applied,
        c.duplicates,
        c.too_late,
        c.dead_lettered,
        produced.saturating_sub(accounted),
        accounted.saturating_sub(produced)
    );
    println!(
        "snapshots: {reads} reads of {} watched groups, {regressions} regressions; {FAULTY} at weight 0 from {} on",
        WATCHED_GROUPS.min(groups),
        drained.map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64()))
    );
    println!(
        "{FAULTY}'s states as the snapshots showed them: {}",
        states.join(" -> ")
    );
    drop(kafka);
    if regressions == 0 && std::env::var_os("HERMES_BENCH_KEEP_LOGS").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!("logs kept in {}", dir.display());
    }
}
