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
use support::{free_port, FakeRegistry, Hermes, Stack};

const TOPICS: &[(&str, u32)] = &[
    ("hermes.requests", 3),
    ("hermes.alerts", 1),
    ("hermes.dead-letters", 1),
    ("hermes.health", 2),
];

fn config(brokers: &str, redis: &str, registry: &str, http_port: u16) -> String {
    // The default cool-down cap (grown by failed probations while the
    // upstream is still down) would keep the test waiting for minutes.
    support::config::TestConfig {
        registry: Some(registry),
        free_max_cooldown_ms: Some(60_000),
        ..support::config::TestConfig::new(brokers, redis, http_port)
    }
    .text()
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
    let stack = Stack::start(TOPICS);
    let (kafka, redis, dir) = (&stack.kafka, &stack.redis, stack.dir());
    let registry = FakeRegistry::start();
    let port = free_port();
    let mut hermes = Hermes::start(
        dir,
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
}
