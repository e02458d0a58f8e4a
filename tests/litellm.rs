//! LiteLLM on Hermes, end to end: a real LiteLLM `Router` (PyPI, pinned in
//! `.ci/run`) in front of three OpenAI-compatible fake upstreams, with the
//! Python gateway library (`clients/python`) as its callback and routing
//! strategy; events through tansu (Confluent-framed, schema registered by
//! the client) into `hermes run`, weights through redis-server back into
//! the Router. The Python side (`clients/python/tests/e2e_litellm.py`)
//! drives the upstreams, stops Hermes midway and judges what LiteLLM saw;
//! this test starts the servers and Hermes and prints its report.

mod support;

use std::process::Command;
use support::{free_port, FakeRegistry, Hermes, RedisServer, Tansu};

const TOPICS: &[(&str, u32)] = &[
    ("hermes.requests", 3),
    ("hermes.alerts", 1),
    ("hermes.dead-letters", 1),
    ("hermes.health", 2),
];

fn config(brokers: &str, redis: &str, registry: &str, http_port: u16) -> String {
    format!(
        r#"
[kafka]
brokers = "{brokers}"
session_timeout_ms = 6000
schema_registry_url = "{registry}"

[redis]
url = "{redis}"

[schedule]
group_warmup_ms = 5000

[service]
heartbeat_ms = 2000
commit_interval_ms = 500
http_listen = "127.0.0.1:{http_port}"
idle_advance_ms = 3000

# Windows of seconds instead of minutes, so the test sees a whole incident.
[engine]
slice_ms = 1000
short_window_ms = 10000
long_window_ms = 30000
evaluation_interval_ms = 1000
allowed_lateness_ms = 2000

# Cool-downs of seconds: the default cap (grown by failed probations while
# the upstream is still down) would keep the test waiting for minutes.
[tiers.free.policy.states]
cooldown_ms = 10000
max_cooldown_ms = 60000
probation_min_samples = 20
observe_passes = 2

[[tiers.free.policy.states.recovery_steps]]
until = 1.0
step = 0.5
every_ms = 2000

[[groups]]
id = "chat"

[[groups.channels]]
id = "free-a"
tier = "free"
price_per_1k_tokens = 0.0
capacity_rps = 100.0

[[groups.channels]]
id = "paid-a"
tier = "paid"
price_per_1k_tokens = 0.5
capacity_rps = 100.0

[[groups.channels]]
id = "paid-b"
tier = "paid"
price_per_1k_tokens = 0.6
capacity_rps = 100.0
"#
    )
}

/// The Python that runs the gateway side: `.ci/run`'s virtual environment
/// with the library's wheel installed, else `python3` with this checkout's.
fn python() -> String {
    std::env::var("HERMES_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn have_litellm() -> bool {
    Command::new(python())
        .args([
            "-c",
            "import litellm, confluent_kafka.schema_registry.avro, redis, jsonschema",
        ])
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn litellm_routes_around_a_sick_deployment_by_hermes_weights_and_keeps_routing_without_hermes() {
    if !have_litellm() {
        assert!(
            std::env::var("CI").is_err(),
            "CI must run the LiteLLM test: .ci/run installs litellm"
        );
        eprintln!("skipped: python3 with litellm, confluent-kafka, redis and jsonschema not found");
        return;
    }
    let kafka = Tansu::start(TOPICS);
    let redis = RedisServer::start();
    let registry = FakeRegistry::start();
    let dir = std::env::temp_dir().join(format!("hermes-litellm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    let mut hermes = Hermes::start(
        &dir,
        "hermes",
        &config(&kafka.bootstrap(), &redis.url(), &registry.url, port),
        port,
    );
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/clients/python/tests/e2e_litellm.py"
    );
    let out = Command::new(python())
        .arg(script)
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .env("HERMES_E2E_BOOTSTRAP", kafka.bootstrap())
        .env("HERMES_E2E_REDIS", redis.url())
        .env("HERMES_E2E_REGISTRY", &registry.url)
        .env("HERMES_E2E_PID", hermes.child.id().to_string())
        .env("HERMES_E2E_HTTP", &hermes.http)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    let subjects: Vec<String> = registry
        .registered
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.0.clone())
        .collect();
    assert!(
        out.status.success(),
        "the LiteLLM run failed:\n{stdout}\n{}\nhermes log:\n{}",
        stderr.lines().rev().take(40).collect::<Vec<_>>().join("\n"),
        hermes.log_tail()
    );
    assert!(
        subjects.iter().any(|s| s == "hermes.requests-value"),
        "the Python emitter registered the request schema: {subjects:?}"
    );
    hermes.kill();
    let _ = std::fs::remove_dir_all(&dir);
}
