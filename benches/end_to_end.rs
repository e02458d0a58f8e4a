//! Hermes' own ceiling end to end: a topic of librdkafka's in-process mock
//! cluster is filled first, then read to the end three times in the same
//! run, by a bare `BaseConsumer` (poll, touch the payload, nothing else),
//! by the same consumer decoding every record as the service does, and by
//! the whole service (`Service::start`, as `hermes run` and the demo run
//! it: the request loop decoding, deduplicating and applying every record,
//! committing, emitting health reports; the group writer planning and
//! publishing to an in-process store). Reports the rates and the ratios
//! (service / bare: the end-to-end figure of docs/performance.md; service / decoding consumer: what
//! Hermes adds beyond decoding), for each of `--rounds` rounds (the three
//! readers in turn, each in a consumer group of its own) and their medians:
//! the bare consumer alone varies by 1.2-2.1 M records/s from one read to
//! the next on this VM. Each read also reports the CPU time the whole
//! process used per record (all threads, librdkafka's and the mock
//! broker's included), and the ratio of those: the comparison per core,
//! which does not depend on how many cores the machine has to spare.
//!
//! ```sh
//! cargo bench --bench end_to_end                  # 200 channels x 20/s x 360 s, 3 rounds
//! cargo bench --bench end_to_end -- --channels 1000 --seconds 360 --rounds 5
//! cargo bench --bench end_to_end -- --threads 2   # two request loops
//! ```
//! The traffic is `hermes bench`'s (same generator); 360 s of event time
//! fill the 5-minute windows, so most of the read is at steady state. The
//! service runs `--threads` request loops (default one, like the bare
//! consumer), each a member of its consumer group. Each is timed from
//! its first record to its last. `HERMES_E2E_PROGRESS=1` prints the
//! service's count every 250 ms (how the stall below was found).
//!
//! Found with it: librdkafka's `fetch.queue.backoff.ms` (1 s by default)
//! stalled the request loop for 0.5-0.7 s of every second once its fetch
//! queue was fuller than the loop could drain (the loop is slower than a
//! bare consumer, so it always is when behind): 115 k records/s. The request
//! consumer sets it to 10 ms: 470 k records/s on the same run.

use hermes::bench::{config_text, encoded_traffic, BenchOptions, Mix};
use hermes::codec::{Decoder, NoRegistry, WireFormat};
use hermes::config::ConfigFile;
use hermes::service::{Service, Store};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Message};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The mock cluster keeps about 60 000 records a partition: enough
/// partitions that nothing produced is trimmed before it is read.
const PARTITIONS: i32 = 32;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> anyhow::Result<()> {
    if !std::env::args().any(|a| a == "--bench") {
        return Ok(()); // `cargo test --benches`
    }
    let channels = arg("--channels", 200) as usize;
    // Request loops of the service (`service.request_threads`).
    let threads = arg("--threads", 1) as u32;
    let seconds = arg("--seconds", 360);
    let opts = BenchOptions {
        channels,
        rate: 20.0,
        seconds,
        warmup_seconds: Some(0),
        mix: Mix::Uniform,
        gateways: 1,
        clock_spread_ms: 0,
        seed: 1,
        base_config: None,
    };
    let mock = MockCluster::new(1)?;
    let cfg_text = config_text(channels, None)?;
    let requests = "hermes.requests";
    mock.create_topic(requests, PARTITIONS, 1)?;
    for t in ["hermes.alerts", "hermes.dead-letters", "hermes.health"] {
        mock.create_topic(t, 1, 1)?;
    }
    let bootstrap = mock.bootstrap_servers();

    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("linger.ms", "20")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let started = Instant::now();
    let mut produced = 0u64;
    encoded_traffic(&opts, seconds, |key, bytes| {
        let mut rec = BaseRecord::to(requests).key(key).payload(bytes);
        loop {
            match producer.send(rec) {
                Ok(()) => break,
                Err((_, r)) => {
                    rec = r;
                    producer.poll(Duration::from_millis(5));
                }
            }
        }
        produced += 1;
    })?;
    producer.flush(Duration::from_secs(60))?;
    drop(producer);
    let probe: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()?;
    let mut stored = 0;
    for p in 0..PARTITIONS {
        let (low, high) = probe.fetch_watermarks(requests, p, Duration::from_secs(10))?;
        stored += high - low;
    }
    anyhow::ensure!(
        stored as u64 == produced,
        "the mock cluster holds {stored} of {produced} records"
    );
    println!(
        "filled {requests}: {produced} events ({channels} channels x 20/s x {seconds} s) in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let rounds = arg("--rounds", 3).max(1);
    let rt = tokio::runtime::Runtime::new()?;
    let mut figures: [Vec<f64>; 7] = Default::default();
    for round in 1..=rounds {
        // Alternating, each reader in a consumer group of its own: the
        // machine's speed drifts, and readers read back to back share it.
        let bare = read(|| bare_consumer(&bootstrap, requests, produced, round, false))?;
        let decoding = read(|| bare_consumer(&bootstrap, requests, produced, round, true))?;
        let mut applied = 0;
        let service = read(|| {
            let (took, n) = service_read(&rt, threads, &cfg_text, &bootstrap, produced, round)?;
            applied = n;
            Ok(took)
        })?;
        let ratio = bare.wall.as_secs_f64() / service.wall.as_secs_f64();
        let of_decoding = decoding.wall.as_secs_f64() / service.wall.as_secs_f64();
        let per_cpu = bare.cpu_per_record(produced) / service.cpu_per_record(produced);
        println!(
            "round {round}: bare consumer {}, decoding consumer {}, hermes service {} \
             ({applied} of {produced} applied); ratio {ratio:.2}, of the decoding consumer \
             {of_decoding:.2}, per CPU second {per_cpu:.2}",
            bare.describe(produced),
            decoding.describe(produced),
            service.describe(produced),
        );
        for (v, x) in figures.iter_mut().zip([
            bare.rate(produced),
            decoding.rate(produced),
            service.rate(produced),
            ratio,
            of_decoding,
            per_cpu,
            service.cpu_per_record(produced),
        ]) {
            v.push(x);
        }
    }
    let [bares, decodings, services, ratios, of_decodings, per_cpus, service_cpus] =
        figures.each_mut();
    println!(
        "median of {rounds} rounds: bare consumer {:.0} records/s, decoding consumer {:.0} \
         records/s, hermes service {:.0} records/s ({:.2} us of CPU a record, all threads)",
        median(bares),
        median(decodings),
        median(services),
        median(service_cpus) * 1e6,
    );
    for (what, v) in [
        ("ratio service / bare", ratios),
        ("service / decoding consumer", of_decodings),
        (
            "per CPU second (bare's CPU per record / the service's)",
            per_cpus,
        ),
    ] {
        println!(
            "{what}: {:.2} (median of the rounds'; {:.2}-{:.2})",
            median(v),
            v[0],
            v[v.len() - 1]
        );
    }
    drop(mock);
    Ok(())
}

/// One reader's read: the time from its first record to its last, and
/// the CPU time the whole process used meanwhile (every thread: the
/// reader's, librdkafka's, the in-process mock broker's), from the
/// reader's start to its end.
struct Read {
    wall: Duration,
    cpu: Duration,
}

impl Read {
    fn rate(&self, records: u64) -> f64 {
        records as f64 / self.wall.as_secs_f64()
    }

    /// CPU seconds per record.
    fn cpu_per_record(&self, records: u64) -> f64 {
        self.cpu.as_secs_f64() / records as f64
    }

    fn describe(&self, records: u64) -> String {
        format!(
            "{:.0} records/s ({:.2} us of CPU a record)",
            self.rate(records),
            self.cpu_per_record(records) * 1e6
        )
    }
}

/// Times one reader (see [`Read`]).
fn read(f: impl FnOnce() -> anyhow::Result<Duration>) -> anyhow::Result<Read> {
    let cpu_time =
        || hermes::bench::process_cpu_time().ok_or_else(|| anyhow::anyhow!("no process CPU clock"));
    let before = cpu_time()?;
    let wall = f()?;
    Ok(Read {
        wall,
        cpu: cpu_time()?.saturating_sub(before),
    })
}

/// The middle value (the upper of the two middle ones); sorts `v`.
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Reads the topic to `produced` records with the whole service (consumer
/// group `hermes-<round>`, a fresh store): the time from its first record
/// to its last, and the records it applied.
fn service_read(
    rt: &tokio::runtime::Runtime,
    threads: u32,
    cfg_text: &str,
    bootstrap: &str,
    produced: u64,
    round: u64,
) -> anyhow::Result<(Duration, u64)> {
    let mut file = ConfigFile::from_toml(cfg_text)?;
    file.runtime.kafka.brokers = bootstrap.to_string();
    file.runtime.kafka.group_id = format!("hermes-{round}");
    file.runtime.kafka.session_timeout_ms = 6_000;
    file.runtime.service.http_listen = String::new();
    file.runtime.service.reload_check_ms = 0;
    file.runtime.service.request_threads = threads;
    rt.block_on(async {
        let store = Store::InProcess(Arc::new(Default::default()));
        let service = Service::start(file, store, None).await?;
        let m = service.metrics.clone();
        // Time from the first record consumed (the group joined) to the
        // last: the bare consumer's clock starts at its first record too.
        let mut first = None;
        let mut last_print = Instant::now();
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let consumed = m.events_consumed.load(Ordering::Relaxed);
            if consumed > 0 && first.is_none() {
                first = Some(Instant::now());
            }
            if consumed >= produced || Instant::now() > deadline {
                break;
            }
            if std::env::var_os("HERMES_E2E_PROGRESS").is_some()
                && last_print.elapsed() > Duration::from_millis(250)
            {
                last_print = Instant::now();
                eprintln!("{:?} {consumed}", first.map(|f| f.elapsed()));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let took = first.map_or(Duration::ZERO, |f| f.elapsed());
        let applied = m.events_applied.load(Ordering::Relaxed);
        service.stop().await?;
        anyhow::ensure!(
            applied == produced,
            "the service applied {applied} of {produced} records"
        );
        anyhow::Ok((took, applied))
    })
}

/// Reads `topic` to `n` records with a bare consumer (consumer group
/// `bare-<round>`), or one that also decodes each record as the service
/// does (`decoding-<round>`): the time from its first record to its last.
fn bare_consumer(
    bootstrap: &str,
    topic: &str,
    n: u64,
    round: u64,
    decode: bool,
) -> anyhow::Result<Duration> {
    let group = format!("{}-{round}", if decode { "decoding" } else { "bare" });
    let decoder = Decoder::new(WireFormat::Plain);
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        // As the request consumer sets it: with the default 1 s, a bare
        // consumer whose fetch queue ran full sat idle for up to a second
        // at a time, and read 0.39-1.9 M records/s from run to run.
        .set("fetch.queue.backoff.ms", "10");
    let consumer: BaseConsumer = c.create()?;
    consumer.subscribe(&[topic])?;
    let mut seen = 0u64;
    let mut bytes = 0usize;
    let mut first = None;
    let deadline = Instant::now() + Duration::from_secs(600);
    let deadline = deadline.min(Instant::now() + Duration::from_secs(120));
    while seen < n && Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            first.get_or_insert_with(Instant::now);
            let payload = m.payload().unwrap_or(&[]);
            bytes += if decode {
                let ev = decoder.decode(payload, &NoRegistry)?;
                std::hint::black_box(&ev);
                ev.event_id.len()
            } else {
                payload.len()
            };
            seen += 1;
        }
    }
    anyhow::ensure!(seen == n, "{group} read {seen} of {n}");
    std::hint::black_box(bytes);
    Ok(first.map_or(Duration::ZERO, |f| f.elapsed()))
}
