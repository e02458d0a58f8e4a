//! The operator surface against the real Prometheus tools (Debian's
//! `prometheus` package; `bash .ci/run` installs it):
//! - `promtool check config` on compose's Prometheus config and `promtool
//!   test rules` on the alert rules' unit tests;
//! - `promtool check metrics` on a live Hermes exposition: zero findings;
//! - a real Prometheus scraping a running Hermes (the embedded demo, a
//!   channel failing hard) on loopback: every dashboard query and every rule
//!   expression parses and returns series, and every metric a rule reads
//!   exists.
//!
//! Without the tools the tests say so and pass, except under CI=true,
//! where a missing tool is a failure (CI must install it).

mod support;

use hermes::demo::{run, DemoOptions};
use hermes::sim::scenario::Scenario;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The tool's path, or `None` (outside CI) when it is not installed.
fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var("CI").is_err(),
            "{name} is not installed; CI installs Debian's prometheus package"
        );
        eprintln!("{name} not installed: skipped (apt-get install prometheus)");
    }
    found
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("running the tool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

#[test]
fn the_prometheus_config_checks_and_the_alert_rules_pass_their_tests() {
    let Some(promtool) = tool("promtool") else {
        return;
    };
    let dir = root().join("compose/prometheus");
    run_ok(
        Command::new(&promtool)
            .current_dir(&dir)
            .args(["check", "config", "prometheus.yml"]),
    );
    let out = run_ok(Command::new(&promtool).current_dir(&dir).args([
        "test",
        "rules",
        "hermes-rules.test.yml",
    ]));
    assert!(out.contains("SUCCESS"), "{out}");
}

/// Every alert rule's name and expression, from the rules file (a
/// line-based reader for the file we write: `- alert:` then `expr:` either
/// inline or as a `|` block).
fn rules() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root().join("compose/prometheus/hermes-rules.yml")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if let Some(name) = lines[i].trim().strip_prefix("- alert: ") {
            let e = lines[i + 1]
                .trim()
                .strip_prefix("expr:")
                .expect("expr follows alert");
            let expr = if e.trim() == "|" {
                let mut block = Vec::new();
                let mut j = i + 2;
                while j < lines.len() && lines[j].starts_with("          ") {
                    block.push(lines[j].trim());
                    j += 1;
                }
                block.join(" ")
            } else {
                e.trim().to_string()
            };
            out.push((name.to_string(), expr));
        }
        i += 1;
    }
    assert!(out.len() >= 10, "rules read: {out:?}");
    out
}

/// Every query of the Grafana dashboard, with `$group` set to all groups.
fn dashboard_queries() -> Vec<(String, String)> {
    let text =
        std::fs::read_to_string(root().join("compose/grafana/dashboards/hermes.json")).unwrap();
    let d: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut out = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().expect("targets") {
            let expr = t["expr"].as_str().expect("expr").replace("$group", ".*");
            out.push((p["title"].as_str().unwrap_or("?").to_string(), expr));
        }
    }
    assert!(out.len() >= 10, "queries read: {out:?}");
    out
}

/// The `hermes_…` metric names an expression reads (a `_bucket` series
/// names the histogram's bucket series as exposed).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("hermes_") {
        let start = i + at;
        let mut end = start;
        while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
            end += 1;
        }
        out.insert(expr[start..end].to_string());
        i = end;
    }
    out
}

/// GET `path` on `addr`; the body, or `None` when not answered.
fn get(addr: &str, path: &str, query: &[(&str, &str)]) -> Option<String> {
    support::http_get(
        &format!("http://{addr}{path}"),
        query,
        Duration::from_secs(5),
    )
    .map(|(_, body)| body)
}

/// An instant query: `Err` with Prometheus' error when it does not parse,
/// else how many series it returned.
fn query(prom: &str, expr: &str) -> Result<usize, String> {
    let body = get(prom, "/api/v1/query", &[("query", expr)]).ok_or("prometheus did not answer")?;
    let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
    if v["status"] != "success" {
        return Err(body);
    }
    Ok(v["data"]["result"].as_array().map_or(0, Vec::len))
}

const SCENARIO: &str = r#"
name = "prometheus-live"
duration_s = 60
seed = 3
# A budget (so its series exists) far above what the traffic costs: a
# binding one would shed the traffic the windows need.
budget_per_hour = 1000000.0
[gateway]
probe_interval_s = 2
[[channels]]
id = "free-a"
tier = "free"
capacity_rps = 30
[[channels.faults]]
start_s = 9
end_s = 60
refuse_all = true
[[channels]]
id = "paid-a"
tier = "paid"
price_per_1k_tokens = 0.6
capacity_rps = 60
[[traffic]]
class = "core"
rps = 20
[[traffic]]
class = "batch"
rps = 10

[config.engine]
slice_ms = 1000
short_window_ms = 5000
long_window_ms = 15000
evaluation_interval_ms = 1000
allowed_lateness_ms = 2000
[config.schedule]
group_warmup_ms = 3000
"#;

/// A Prometheus of our own on a free loopback port; SIGKILLed on drop.
struct Prometheus {
    child: std::process::Child,
    addr: String,
    dir: PathBuf,
}

impl Prometheus {
    fn start(bin: &Path, target: &str) -> Prometheus {
        let port = support::free_port();
        let dir =
            std::env::temp_dir().join(format!("hermes-prometheus-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(
            root().join("compose/prometheus/hermes-rules.yml"),
            dir.join("hermes-rules.yml"),
        )
        .unwrap();
        std::fs::write(
            dir.join("prometheus.yml"),
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - hermes-rules.yml\nscrape_configs:\n  - job_name: hermes\n    static_configs:\n      - targets: [\"{target}\"]\n"
            ),
        )
        .unwrap();
        let addr = format!("127.0.0.1:{port}");
        let child = Command::new(bin)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .expect("starting prometheus");
        Prometheus { child, addr, dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How long the demo runs (wall clock), and how long the test waits for
/// the drain it shows (the fault starts at 9 s; on an idle machine the
/// drain comes at ~12 s). Generous: on CI's two cores the demo shares the
/// machine with Prometheus and with promtool's rule tests.
const DEMO_SECONDS: u64 = 60;
const DRAIN_WITHIN_S: u64 = 45;

#[test]
fn a_real_prometheus_scrapes_hermes_and_every_dashboard_query_and_rule_works() {
    let (Some(promtool), Some(prometheus)) = (tool("promtool"), tool("prometheus")) else {
        return;
    };
    // The demo binds port 0 and says which port it got: a port picked
    // here and bound there later can be taken in between (CI saw it).
    let (bound_tx, bound_rx) = std::sync::mpsc::channel();
    // The demo's future holds the mock cluster (not Send): its own thread
    // and runtime.
    let demo = std::thread::spawn(move || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(run(DemoOptions {
                scenario: Scenario::from_toml(SCENARIO).unwrap(),
                seconds: DEMO_SECONDS,
                redis_url: None,
                redraw: false,
                show_status: false,
                garbage_every: 50,
                http_listen: Some("127.0.0.1:0".into()),
                http_bound: Some(bound_tx),
                commands: Vec::new(),
                config_path: None,
            }))
    });
    let target = match bound_rx.recv_timeout(Duration::from_secs(DRAIN_WITHIN_S)) {
        Ok(addr) => addr.to_string(),
        Err(e) => panic!(
            "the demo never served HTTP ({e}): {:?}",
            demo.join().map(|r| r.map(|_| ()))
        ),
    };
    let prom = Prometheus::start(&prometheus, &target);
    let t0 = Instant::now();

    // The exposition once the demo has drained free-a: promtool finds
    // nothing in it.
    let text = loop {
        let t = get(&target, "/metrics", &[]).unwrap_or_default();
        if t.contains("hermes_channel_state{group=\"chat\",channel=\"free-a\",state=\"DRAINED\"} 1")
        {
            break t;
        }
        if demo.is_finished() {
            // The demo's runtime, and its HTTP server with it, are gone:
            // say why instead of waiting for a drain that cannot come.
            panic!(
                "the demo stopped before free-a drained: {:?}\nlast exposition:\n{t}",
                demo.join().map(|r| r.map(|_| ()))
            );
        }
        assert!(
            t0.elapsed() < Duration::from_secs(DRAIN_WITHIN_S),
            "free-a never drained within {DRAIN_WITHIN_S} s{}:\n{t}",
            if t.is_empty() {
                " (/metrics never answered)"
            } else {
                ""
            }
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let mut lint = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    lint.stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = lint.wait_with_output().unwrap();
    let findings = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && findings.trim().is_empty(),
        "promtool check metrics: {findings}"
    );

    // Every query returns series once Prometheus has scraped a few times.
    let mut pending: Vec<(String, String)> = dashboard_queries();
    for (name, expr) in rules() {
        for metric in metric_names(&expr) {
            pending.push((format!("{name} reads {metric}"), metric));
        }
        pending.push((format!("rule {name}"), format!("({expr}) or vector(0)")));
    }
    let mut last = Vec::new();
    while t0.elapsed() < Duration::from_secs(DEMO_SECONDS - 2) {
        last.clear();
        for (what, expr) in &pending {
            match query(&prom.addr, expr) {
                Ok(n) if n > 0 => {}
                Ok(_) => last.push(format!("{what}: no series for {expr}")),
                Err(e) => panic!("{what}: `{expr}` does not parse: {e}"),
            }
        }
        if last.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(
        last.is_empty(),
        "queries without series:\n{}\nthe channel series Hermes served:\n{}\nprometheus log:\n{}",
        last.join("\n"),
        get(&target, "/metrics", &[])
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("hermes_channel"))
            .collect::<Vec<_>>()
            .join("\n"),
        prom.log()
    );
    let summary = demo.join().unwrap().unwrap();
    assert!(summary.dead_lettered > 0, "the dead-letter series had data");
}
