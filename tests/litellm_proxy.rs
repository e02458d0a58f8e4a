//! The LiteLLM *Proxy* on Hermes, end to end, at Hermes' default decision
//! timing: the Proxy as users run it (`litellm --config config.yaml`, two
//! workers) with one callback line in its config and the Hermes addresses
//! in the environment; Hermes' catalogue generated from that same
//! config.yaml by `hermes catalogue`, checked by `hermes check-config
//! --gateway`; tansu, redis-server and `hermes run` with no decision
//! setting changed. The Python side
//! (`clients/python/tests/e2e_litellm_proxy.py`) runs the fake upstreams,
//! the Proxy and OpenAI-client callers, injects the faults and judges what
//! the callers saw; this test prepares the files and the servers and prints
//! its report.

mod support;

use std::process::Command;
use support::{free_port, Hermes, Stack};

const TOPICS: &[(&str, u32)] = &[
    ("hermes.requests", 3),
    ("hermes.alerts", 1),
    ("hermes.dead-letters", 1),
    ("hermes.health", 2),
];

const CHANNELS: &[&str] = &["free-a", "free-b", "paid-a", "paid-b"];

/// The Proxy's config.yaml: four deployments of model group `chat`, the
/// Hermes callback, LiteLLM's own retries.
fn proxy_config(ports: &[(&str, u16)]) -> String {
    let mut s = String::from("model_list:\n");
    for (id, port) in ports {
        let (costs, rpm) = match *id {
            "free-a" | "free-b" => ("", 1200),
            "paid-a" => (
                "      input_cost_per_token: 0.0000005\n      output_cost_per_token: 0.0000015\n",
                1800,
            ),
            _ => (
                "      input_cost_per_token: 0.000001\n      output_cost_per_token: 0.000003\n",
                6000,
            ),
        };
        s.push_str(&format!(
            "  - model_name: chat\n    litellm_params:\n      model: openai/m-{id}\n      \
             api_base: http://127.0.0.1:{port}/v1\n      api_key: x\n      rpm: {rpm}\n{costs}    \
             model_info:\n      id: {id}\n"
        ));
    }
    s.push_str(
        "\nrouter_settings:\n  num_retries: 2\n\nlitellm_settings:\n  callbacks: \
         [\"hermes_gateway.litellm.proxy_handler\"]\n",
    );
    s
}

fn python() -> String {
    std::env::var("HERMES_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn have_proxy() -> bool {
    Command::new(python())
        .args([
            "-c",
            "import litellm.proxy.proxy_server, openai, confluent_kafka, redis, jsonschema, fastavro",
        ])
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn the_litellm_proxy_routes_by_hermes_at_the_default_timing() {
    if !have_proxy() {
        assert!(
            std::env::var("CI").is_err(),
            "CI must run the LiteLLM Proxy test: .ci/run installs litellm's proxy"
        );
        eprintln!("skipped: python3 with the LiteLLM Proxy not found");
        return;
    }
    let stack = Stack::start(TOPICS);
    let (kafka, redis, dir) = (&stack.kafka, &stack.redis, stack.dir());
    let ports: Vec<(&str, u16)> = CHANNELS.iter().map(|c| (*c, free_port())).collect();
    let config_yaml = dir.join("config.yaml");
    std::fs::write(&config_yaml, proxy_config(&ports)).unwrap();

    // One catalogue: Hermes' groups and channels from the Proxy's config.
    let hermes_bin = env!("CARGO_BIN_EXE_hermes");
    let catalogue = Command::new(hermes_bin)
        .args(["catalogue", "--litellm"])
        .arg(&config_yaml)
        .output()
        .unwrap();
    assert!(
        catalogue.status.success(),
        "{}",
        String::from_utf8_lossy(&catalogue.stderr)
    );
    let http_port = free_port();
    // Addresses only: every decision setting at its default.
    let hermes_toml = format!(
        "[kafka]\nbrokers = \"{}\"\n\n[redis]\nurl = \"{}\"\n\n[service]\nhttp_listen = \"127.0.0.1:{http_port}\"\n\n{}",
        kafka.bootstrap(),
        redis.url(),
        String::from_utf8_lossy(&catalogue.stdout)
    );
    let toml_path = dir.join("hermes.toml");
    std::fs::write(&toml_path, &hermes_toml).unwrap();
    let check = Command::new(hermes_bin)
        .args(["check-config"])
        .arg(&toml_path)
        .arg("--gateway")
        .arg(&config_yaml)
        .output()
        .unwrap();
    let warnings = String::from_utf8_lossy(&check.stderr);
    assert!(
        check.status.success() && !warnings.contains("warning"),
        "check-config: {warnings}"
    );
    let mut hermes = Hermes::start(dir, "hermes", &hermes_toml, http_port);

    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/clients/python/tests/e2e_litellm_proxy.py"
    );
    let ports_json = serde_json::to_string(
        &ports
            .iter()
            .map(|(c, p)| (c.to_string(), *p))
            .collect::<std::collections::BTreeMap<_, _>>(),
    )
    .unwrap();
    let proxy_log = dir.join("proxy.log");
    let mut cmd = Command::new(python());
    cmd.arg(script)
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .env("HERMES_E2E_BOOTSTRAP", kafka.bootstrap())
        .env("HERMES_E2E_REDIS", redis.url())
        .env("HERMES_E2E_REDIS_PID", redis.pid().unwrap().to_string())
        .env("HERMES_E2E_PID", hermes.child.id().to_string())
        .env("HERMES_E2E_HTTP", &hermes.http)
        .env("HERMES_E2E_CONFIG", &config_yaml)
        .env("HERMES_E2E_UPSTREAM_PORTS", ports_json)
        .env("HERMES_E2E_PROXY_PORT", free_port().to_string())
        .env("HERMES_E2E_PROXY_LOG", &proxy_log);
    if std::env::var_os("HERMES_PYTHON").is_none() {
        // Not installed: the library from this checkout.
        cmd.env(
            "PYTHONPATH",
            concat!(env!("CARGO_MANIFEST_DIR"), "/clients/python"),
        );
    }
    let out = cmd.output().expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "the LiteLLM Proxy run failed:\n{stdout}\n{}\nproxy log:\n{}\nhermes log:\n{}",
        stderr.lines().rev().take(40).collect::<Vec<_>>().join("\n"),
        std::fs::read_to_string(&proxy_log)
            .unwrap_or_default()
            .lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .join("\n"),
        hermes.log_tail()
    );
    hermes.kill();
}
