//! Replay: recorded events through a config give back the decisions the
//! live run made (same engine, event time only), and through another config
//! give that config's decisions.

use hermes::config::Config;
use hermes::sim::scenario::Scenario;
use std::sync::Arc;

fn scenario() -> Scenario {
    let path = format!("{}/scenarios/hard-down.toml", env!("CARGO_MANIFEST_DIR"));
    let mut sc = Scenario::from_toml(&std::fs::read_to_string(path).unwrap()).unwrap();
    sc.duration_s = 900.0;
    sc
}

#[test]
fn replay_reproduces_the_recorded_decisions() {
    let sc = scenario();
    let text = sc.hermes_config_text(None).unwrap();
    let cfg = Arc::new(Config::from_toml(&text).unwrap());
    let mut recorded = Vec::new();
    let (_, run) = hermes::sim::drill(&sc, cfg.clone(), sc.seed, Some(&mut recorded));
    let file = hermes::replay::write_events(Vec::new(), &recorded).unwrap();

    let report = hermes::replay::replay(&file, cfg).unwrap();
    assert_eq!(report.events, recorded.len() as u64);
    assert_eq!(report.applied, report.events);
    assert_eq!(report.decode_errors, 0);

    let live: Vec<(i64, String, String)> = run
        .alerts
        .iter()
        .filter(|a| a.kind == hermes::alert::AlertKind::Transition)
        .map(|a| {
            (
                a.event_time_ms,
                a.from_state.clone().unwrap(),
                a.to_state.clone().unwrap(),
            )
        })
        .collect();
    let replayed: Vec<(i64, String, String)> = {
        let mut v: Vec<_> = report
            .channels
            .iter()
            .flat_map(|c| {
                c.decisions
                    .iter()
                    .map(|d| (d.event_time_ms, d.from.clone(), d.to.clone()))
            })
            .collect();
        v.sort();
        v
    };
    let mut live_sorted = live.clone();
    live_sorted.sort();
    assert!(!live.is_empty());
    assert_eq!(replayed, live_sorted);
}

#[test]
fn another_config_makes_other_decisions() {
    let sc = scenario();
    let cfg = Arc::new(Config::from_toml(&sc.hermes_config_text(None).unwrap()).unwrap());
    let mut recorded = Vec::new();
    hermes::sim::drill(&sc, cfg.clone(), sc.seed, Some(&mut recorded));
    let file = hermes::replay::write_events(Vec::new(), &recorded).unwrap();

    // What if free channels needed 50 consecutive failures to trip?
    let mut other = toml::Table::new();
    other.insert(
        "tiers".into(),
        toml::from_str::<toml::Value>(
            "free = { policy = { states = { consecutive_failures = 50 } } }",
        )
        .unwrap(),
    );
    let what_if =
        Arc::new(Config::from_toml(&sc.hermes_config_text(Some(&other)).unwrap()).unwrap());
    let base = hermes::replay::replay(&file, cfg).unwrap();
    let alt = hermes::replay::replay(&file, what_if).unwrap();
    let first_drain = |r: &hermes::replay::ReplayReport| {
        r.channels[0]
            .decisions
            .iter()
            .find(|d| d.to == "DRAINED")
            .map(|d| (d.event_time_ms, d.reason.clone()))
    };
    let (t_base, why_base) = first_drain(&base).unwrap();
    let (t_alt, _) = first_drain(&alt).unwrap();
    assert!(
        why_base.starts_with("consecutive_failures(n=4)"),
        "{why_base}"
    );
    assert!(t_alt > t_base, "a laxer fast path drains later");
}

#[test]
fn garbage_is_not_a_container_file() {
    let cfg = Arc::new(Config::from_toml(&scenario().hermes_config_text(None).unwrap()).unwrap());
    let err = hermes::replay::replay(b"not avro", cfg).unwrap_err();
    assert!(err.contains("not an Avro object container file"), "{err}");
}
