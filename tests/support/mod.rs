//! Test fixtures: real servers on free loopback ports, stopped by PID.
#![allow(dead_code)]

pub mod config;
pub mod registry;
pub mod stack;
#[allow(unused_imports)] // not every test binary starts a registry
pub use registry::FakeRegistry;
#[allow(unused_imports)] // not every test binary starts a stack
pub use stack::{Scratch, Stack};

use hermes::event::{Dispatch, ErrorClass, FinishReason, RequestEvent, TrafficClass};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// GET `url` with `query` parameters (encoded here), waiting at most
/// `timeout`: the status and the body, or `None` when nothing answered.
pub fn http_get(url: &str, query: &[(&str, &str)], timeout: Duration) -> Option<(u16, String)> {
    let agent = ureq::AgentBuilder::new().timeout(timeout).build();
    let mut request = agent.get(url);
    for (k, v) in query {
        request = request.query(k, v);
    }
    // Read whole: `into_string` refuses a body over 10 MB, and an
    // instance's `/metrics` at 20 000 channels is more.
    let body = |r: ureq::Response| {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut r.into_reader(), &mut text).map(|_| text)
    };
    match request.call() {
        Ok(r) => Some((r.status(), body(r).ok()?)),
        Err(ureq::Error::Status(code, r)) => Some((code, body(r).unwrap_or_default())),
        Err(_) => None,
    }
}

/// A free loopback port (bound and released; the server binds it next).
/// Picked below the kernel's ephemeral range (`ip_local_port_range`): a
/// port from that range, once released, can go to any socket that binds
/// port 0 or connects out before the server binds it (seen in CI: the
/// demo's librdkafka mock brokers took the port its HTTP server was about
/// to bind). Below it, nothing binds a port unless asked to.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const FROM: u32 = 10_000;
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let span = ephemeral.saturating_sub(FROM);
    if span >= 1_000 {
        // Spread over the range by process and clock, then stepped: tests
        // of one binary run in parallel threads and share the counter.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let start = std::process::id().wrapping_mul(2_654_435_761) ^ nanos;
        for _ in 0..span {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let port = FROM + start.wrapping_add(n.wrapping_mul(7_919)) % span;
            if TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
                return port as u16;
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A redis-server of our own; SIGKILLed on drop.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    /// Its working directory (the AOF lives here when persistent).
    pub dir: std::path::PathBuf,
    /// Extra arguments (persistence, TLS, ACL) kept across restarts.
    args: Vec<String>,
    /// Served over TLS only: readiness is a TCP connect, not a PING.
    tls: bool,
}

impl RedisServer {
    /// No persistence: a restart comes back empty.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&["--save", "", "--appendonly", "no"], false)
    }

    /// With an append-only file (fsync every write): a restart comes back
    /// with its data, as a production Redis configured for it does.
    pub fn start_persistent() -> RedisServer {
        RedisServer::start_with(
            &[
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ],
            false,
        )
    }

    /// TLS only (no plain port) with a self-signed certificate made here
    /// by `openssl`, and `users` as ACL rules (`user NAME on >PASS ...`).
    /// Returns the server and the certificate's path (the CA to trust).
    pub fn start_tls(users: &[&str]) -> (RedisServer, std::path::PathBuf) {
        let dir = redis_dir();
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        let out = Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .args([
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
            ])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .expect("openssl (a self-signed certificate for the TLS test)");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let acl = dir.join("users.acl");
        std::fs::write(&acl, users.join("\n") + "\n").expect("acl file");
        let port = free_port();
        let mut args: Vec<String> = ["--port", "0", "--save", "", "--appendonly", "no"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(["--tls-port".into(), port.to_string()]);
        for (flag, path) in [
            ("--tls-cert-file", &cert),
            ("--tls-key-file", &key),
            ("--tls-ca-cert-file", &cert),
            ("--aclfile", &acl),
        ] {
            args.extend([flag.to_string(), path.display().to_string()]);
        }
        args.extend(["--tls-auth-clients".into(), "no".into()]);
        let mut s = RedisServer {
            port,
            child: None,
            dir,
            args,
            tls: true,
        };
        s.restart();
        (s, cert)
    }

    fn start_with(args: &[&str], tls: bool) -> RedisServer {
        let port = free_port();
        let mut all: Vec<String> = vec!["--port".into(), port.to_string()];
        all.extend(args.iter().map(|s| s.to_string()));
        let mut s = RedisServer {
            port,
            child: None,
            dir: redis_dir(),
            args: all,
            tls,
        };
        s.restart();
        s
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Starts (again) on the same port and directory: with its data when
    /// persistent, empty otherwise.
    pub fn restart(&mut self) {
        let child = Command::new("redis-server")
            .args(&self.args)
            .args(["--bind", "127.0.0.1", "--dir"])
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("redis-server could not start ({e}); `bash .ci/run` installs it")
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
                if self.tls {
                    return;
                }
                use std::io::{Read, Write};
                let _ = c.set_read_timeout(Some(Duration::from_millis(500)));
                if c.write_all(b"PING\r\n").is_ok() {
                    let mut buf = [0u8; 7];
                    if c.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n" {
                        return;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Removes the data a persistent server would come back with.
    pub fn wipe(&self) {
        for e in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with("appendonly") {
                let _ = std::fs::remove_dir_all(e.path());
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

fn redis_dir() -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "hermes-redis-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("redis dir");
    d
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Polls `check` until it holds or `limit` passes (a bound on a wait, not a
/// performance target).
pub async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    check()
}

/// The tansu binary: on PATH or in cargo's bin dir (`bash .ci/run` installs
/// it when missing).
pub fn tansu_bin() -> std::path::PathBuf {
    let home = std::env::var("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| {
            std::path::PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cargo")
        });
    let candidate = home.join("bin").join("tansu");
    if candidate.exists() {
        return candidate;
    }
    std::path::PathBuf::from("tansu")
}

/// Whether tansu and redis-server can be started here (the benchmarks
/// that need them skip with a message otherwise).
pub fn have_tansu_and_redis() -> bool {
    let on_path = |bin: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {bin}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    on_path("redis-server") && (tansu_bin().exists() || on_path("tansu"))
}

/// A tansu broker with SQLite storage in its own temp dir; SIGKILLed on drop.
pub struct Tansu {
    pub port: u16,
    pub dir: std::path::PathBuf,
    child: Option<Child>,
}

impl Tansu {
    /// Starts the broker and creates `topics` (name, partitions).
    pub fn start(topics: &[(&str, u32)]) -> Tansu {
        Tansu::start_on(free_port(), topics)
    }

    /// [`Tansu::start`] on a given port (a broker that comes up where a
    /// client was already told to look).
    pub fn start_on(port: u16, topics: &[(&str, u32)]) -> Tansu {
        let dir = std::env::temp_dir().join(format!("hermes-tansu-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut t = Tansu {
            port,
            dir,
            child: None,
        };
        t.resume();
        let url = format!("tcp://127.0.0.1:{port}");
        for (name, partitions) in topics {
            let out = Command::new(tansu_bin())
                .args([
                    "topic",
                    "create",
                    name,
                    "--partitions",
                    &partitions.to_string(),
                    "--broker",
                    &url,
                ])
                .output()
                .expect("tansu topic create");
            assert!(
                out.status.success(),
                "creating topic {name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        t
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// SIGKILL, as a crashed or restarted broker host; the SQLite file
    /// stays for [`Tansu::resume`].
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the broker (again) on its port and data; returns once it
    /// listens.
    pub fn resume(&mut self) {
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("broker.log"))
            .expect("broker log");
        let child = Command::new(tansu_bin())
            .current_dir(&self.dir)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
                "--storage-engine",
                "sqlite://tansu.db",
            ])
            // Warnings only: at `info` tansu traces every span of every
            // request (a gigabyte of log per service test, and a busy core
            // spent writing it). HERMES_TEST_TANSU_LOG=info brings it back.
            .env(
                "RUST_LOG",
                std::env::var("HERMES_TEST_TANSU_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(log.try_clone().expect("broker log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("tansu could not start ({e}); `bash .ci/run` installs it (cargo install tansu --locked --features libsql)")
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "tansu did not listen on {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            // The log, not the data: a loaded broker's SQLite file runs to
            // gigabytes.
            for e in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
                if e.file_name() != "broker.log" {
                    let _ = std::fs::remove_file(e.path());
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
            eprintln!("tansu log kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A `hermes run` process; SIGKILLed on drop.
pub struct Hermes {
    pub child: Child,
    pub http: String,
    pub log: std::path::PathBuf,
}

impl Hermes {
    /// Starts `hermes run` with `config` written to `dir/name.toml`.
    pub fn start(dir: &std::path::Path, name: &str, config: &str, http_port: u16) -> Hermes {
        Hermes::start_env(dir, name, config, http_port, &[])
    }

    /// [`Hermes::start`] with extra environment variables.
    pub fn start_env(
        dir: &std::path::Path,
        name: &str,
        config: &str,
        http_port: u16,
        env: &[(&str, &str)],
    ) -> Hermes {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, config).expect("write config");
        let log = dir.join(format!("{name}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_hermes"))
            .args(["run", "--config"])
            .arg(&path)
            .env(
                "RUST_LOG",
                std::env::var("HERMES_TEST_RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("hermes log"))
            .spawn()
            .expect("starting hermes run");
        Hermes {
            child,
            http: format!("127.0.0.1:{http_port}"),
            log,
        }
    }

    /// GET a path on the instance's HTTP endpoint: the body, whatever the
    /// status (`/readyz` answers 503 with its reasons).
    pub fn get(&self, path: &str) -> Option<String> {
        http_get(
            &format!("http://{}{path}", self.http),
            &[],
            Duration::from_secs(2),
        )
        .map(|(_, body)| body)
    }

    /// A counter or gauge value from `/metrics` (first line starting with
    /// `series`).
    pub fn metric(&self, series: &str) -> Option<f64> {
        let text = self.get("/metrics")?;
        text.lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with([' ', '{']))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    /// The sum of every series of a metric (all its labels) on `/metrics`;
    /// 0 when the instance does not answer.
    pub fn metric_sum(&self, series: &str) -> f64 {
        self.get("/metrics")
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with(series) && l[series.len()..].starts_with([' ', '{']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, as a deploy stops it: the instance leaves the consumer
    /// group (tansu strands a group whose SIGKILLed member led it). Waits
    /// up to 30 s, then SIGKILLs.
    pub fn terminate(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.kill();
    }

    pub fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Hermes {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Hands `rec` to the producer, waiting while its queue is full (a
/// synthetic gateway is paced by the broker, not dropped).
pub fn send_retrying<C, K, P>(
    producer: &rdkafka::producer::ThreadedProducer<C>,
    mut rec: rdkafka::producer::BaseRecord<'_, K, P, C::DeliveryOpaque>,
) where
    C: rdkafka::producer::ProducerContext,
    K: rdkafka::message::ToBytes + ?Sized,
    P: rdkafka::message::ToBytes + ?Sized,
{
    loop {
        match producer.send(rec) {
            Ok(()) => return,
            Err((_, r)) => {
                rec = r;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// A synthetic gateway's attempt: healthy (HTTP 200, 400 output tokens) or
/// failing (HTTP 503), stamped now, class by `seq`.
pub fn event<'a>(id: &'a str, channel: &'a str, failing: bool, seq: u64) -> RequestEvent<'a> {
    RequestEvent {
        event_id: id,
        event_time_ms: hermes::wall_clock::now_ms(),
        gateway_id: "gw-test",
        channel_id: channel,
        route_group: "chat",
        model: "m",
        traffic_class: match seq % 4 {
            0 => TrafficClass::Interactive,
            1 => TrafficClass::Core,
            2 => TrafficClass::Batch,
            _ => TrafficClass::Experimental,
        },
        attempt: 0,
        http_status: if failing { 503 } else { 200 },
        error_class: if failing {
            ErrorClass::ServerError
        } else {
            ErrorClass::None
        },
        latency_ms: 300 + (seq % 200) as i32,
        ttfb_ms: Some(80),
        input_tokens: 500,
        output_tokens: if failing { 0 } else { 400 },
        finish_reason: if failing {
            FinishReason::Error
        } else {
            FinishReason::Stop
        },
        truncated: false,
        schema_valid: None,
        replacement_chars: 0,
        is_probe: false,
        cost: 0.0,
        quota_remaining: None,
        trace_id: None,
        dispatch: Dispatch::Sent,
    }
}

/// The codec and schema-contract tests' sample request event (a probe's
/// 429 retry with a quota report).
pub fn sample_event() -> RequestEvent<'static> {
    RequestEvent {
        event_id: "e-42",
        event_time_ms: 1_764_000_123_456,
        gateway_id: "gw-7",
        channel_id: "free-a",
        route_group: "chat",
        model: "m-large",
        traffic_class: TrafficClass::Interactive,
        attempt: 2,
        http_status: 429,
        error_class: ErrorClass::RateLimited,
        latency_ms: 31,
        ttfb_ms: None,
        input_tokens: 5_000,
        output_tokens: 0,
        finish_reason: FinishReason::Error,
        truncated: false,
        schema_valid: None,
        replacement_chars: 0,
        is_probe: true,
        cost: 0.0,
        quota_remaining: Some(77),
        trace_id: None,
        dispatch: Dispatch::Sent,
    }
}

/// An alert with a channel, states, a breakdown and a weight: the codec and
/// schema-contract tests' sample.
pub fn sample_alert() -> hermes::alert::AlertEvent {
    use hermes::alert::{AlertEvent, AlertKind, Severity};
    AlertEvent {
        alert_id: "free-a/TRANSITION/1/1".into(),
        event_time_ms: 1,
        route_group: "chat".into(),
        channel_id: Some("free-a".into()),
        kind: AlertKind::Transition,
        severity: Severity::P1,
        from_state: Some("HEALTHY".into()),
        to_state: Some("DRAINED".into()),
        reason: "consecutive_failures(n=3)".into(),
        score: None,
        breakdown: [("error_rate".to_string(), 0.2)].into_iter().collect(),
        weight: Some(0.0),
        message: "drained".into(),
    }
}
