//! `compose/local.sh`, the compose topology from local binaries: started as
//! a person would, it brings the loop up (a drain reaches Redis, Prometheus
//! scrapes both replicas), and Ctrl-C stops every process it started.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::free_port;

/// GET `path` on 127.0.0.1:`port`; the body of a 200 answer.
fn get(port: u16, path: &str) -> Option<String> {
    let url = format!("http://127.0.0.1:{port}{path}");
    support::http_get(&url, &[], Duration::from_secs(5))
        .filter(|(status, _)| *status == 200)
        .map(|(_, body)| body)
}

fn listening(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

#[test]
fn the_local_stack_closes_the_loop_and_stops_on_ctrl_c() {
    let ports: Vec<u16> = (0..5).map(|_| free_port()).collect();
    let (kafka, redis, a, b, prom) = (ports[0], ports[1], ports[2], ports[3], ports[4]);
    let dir = std::env::temp_dir().join(format!("hermes-stack-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let root = env!("CARGO_MANIFEST_DIR");
    let out = std::fs::File::create(
        std::env::temp_dir().join(format!("hermes-stack-test-{}.out", std::process::id())),
    )
    .unwrap();
    // The test stops the script with SIGINT, which a shell cannot trap if
    // it started with the signal ignored: what a process started in the
    // background of a non-interactive shell (a CI runner's `cmd &`)
    // inherits. `env --default-signal` gives it back its default first.
    let mut script = Command::new("env")
        .args(["--default-signal=INT", "bash"])
        .arg(format!("{root}/compose/local.sh"))
        .env("KAFKA_PORT", kafka.to_string())
        .env("REDIS_PORT", redis.to_string())
        .env("HERMES_A_PORT", a.to_string())
        .env("HERMES_B_PORT", b.to_string())
        .env("PROMETHEUS_PORT", prom.to_string())
        .env("HERMES_BIN", env!("CARGO_BIN_EXE_hermes"))
        .env("STACK_DIR", &dir)
        .env("PATH", {
            let tansu_dir = support::tansu_bin()
                .parent()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            format!("{tansu_dir}:{}", std::env::var("PATH").unwrap_or_default())
        })
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .stdin(Stdio::null())
        .spawn()
        .expect("env bash compose/local.sh");
    let logs = || {
        let mut s = String::new();
        for name in ["tansu", "hermes-a", "hermes-b", "gateways", "prometheus"] {
            let text = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            s += &format!(
                "--- {name}\n{}\n",
                lines[lines.len().saturating_sub(15)..].join("\n")
            );
        }
        s
    };
    let t0 = Instant::now();

    // Prometheus scrapes both replicas: `up == 1` for each instance.
    let both_up = |body: &str| {
        let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        let up: Vec<String> = v["data"]["result"]
            .as_array()
            .map(|r| {
                r.iter()
                    .filter(|s| s["value"][1] == "1")
                    .filter_map(|s| s["metric"]["instance"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        [a, b]
            .iter()
            .all(|p| up.contains(&format!("127.0.0.1:{p}")))
    };
    // Until `check` holds (the time since start), failing with the logs
    // after `limit` or when the script exits.
    let mut until = |limit: Duration, what: &str, check: &mut dyn FnMut() -> bool| loop {
        if check() {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < limit, "{what}:\n{}", logs());
        assert!(
            script.try_wait().unwrap().is_none(),
            "local.sh exited:\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let scraped = until(
        Duration::from_secs(180),
        "Prometheus never scraped both replicas",
        &mut || {
            get(prom, "/api/v1/query?query=up%7Bjob%3D%22hermes%22%7D").is_some_and(|b| both_up(&b))
        },
    );

    // scenarios/demo.toml: free-a fails silently from 60 s; the drain
    // reaches Redis.
    let client = redis::Client::open(format!("redis://127.0.0.1:{redis}/")).unwrap();
    let drained = until(
        Duration::from_secs(420),
        "free-a was never drained in Redis",
        &mut || {
            let Ok(mut c) = client.get_connection_with_timeout(Duration::from_secs(1)) else {
                return false;
            };
            let json: Option<String> = redis::cmd("GET")
                .arg(hermes::publish::snapshot_key("chat"))
                .query(&mut c)
                .unwrap_or(None);
            json.and_then(|j| serde_json::from_str::<hermes::publish::WeightSnapshot>(&j).ok())
                .is_some_and(|s| {
                    s.channels
                        .get("free-a")
                        .is_some_and(|c| c.state == "DRAINED")
                })
        },
    );

    // Ctrl-C: everything it started stops.
    assert!(Command::new("kill")
        .args(["-INT", &script.id().to_string()])
        .status()
        .unwrap()
        .success());
    let stopping = Instant::now();
    let status = loop {
        if let Some(s) = script.try_wait().unwrap() {
            break s;
        }
        assert!(
            stopping.elapsed() < Duration::from_secs(90),
            "local.sh did not stop on SIGINT"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let stopped = stopping.elapsed();
    let still: Vec<u16> = ports.iter().copied().filter(|p| listening(*p)).collect();
    assert!(still.is_empty(), "still listening after Ctrl-C: {still:?}");
    eprintln!(
        "local.sh: Prometheus scraped both replicas {scraped:?} after start, free-a DRAINED in Redis {drained:?} after start, \
         stopped in {stopped:?} ({status})"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
