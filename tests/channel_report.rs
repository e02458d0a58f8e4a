//! `hermes report` against drills whose answers are known: the simulator
//! knows when each fault began and ended, and its drill report says when
//! Hermes detected, drained and recovered; the channel report, built from
//! the alert stream alone, must find the same instants.

use hermes::channel_report::build;
use hermes::config::Config;
use hermes::sim::scenario::Scenario;
use std::sync::Arc;

fn load(name: &str) -> Scenario {
    let path = format!("{}/scenarios/{name}.toml", env!("CARGO_MANIFEST_DIR"));
    Scenario::from_toml(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

#[test]
fn the_report_finds_the_drills_detection_drain_and_recovery() {
    for (name, seed) in [
        ("hard-down", 5),
        ("hard-down", 101),
        ("silent-truncation", 7),
    ] {
        let sc = load(name);
        let cfg = Arc::new(Config::from_toml(&sc.hermes_config_text(None).unwrap()).unwrap());
        let (drill, run) = hermes::sim::drill(&sc, cfg, seed, None);
        let from = sc.start_ms;
        let to = sc.start_ms + (sc.duration_s * 1000.0) as i64;
        let catalogue: Vec<(String, String)> = sc
            .channels
            .iter()
            .map(|c| (c.id.clone(), sc.gateway.group.clone()))
            .collect();
        let r = build(&run.alerts, from, to, &catalogue);
        assert_eq!(
            r.channels.len(),
            sc.channels.len(),
            "{name}/{seed}: every channel, quiet ones too"
        );
        let at = |s: f64| from + (s * 1000.0).round() as i64;
        for c in drill.channels.iter().filter(|c| c.faulty) {
            let ch = r
                .channels
                .iter()
                .find(|x| x.channel == c.id)
                .unwrap_or_else(|| panic!("{name}/{seed}: {} not in the report", c.id));
            let total: i64 = ch.time_in_state_ms.values().sum();
            assert_eq!(
                total,
                to - from,
                "{name}/{seed}: the states cover the period"
            );
            let fs = c.fault_start_s.unwrap();
            let first = ch
                .incidents
                .iter()
                .find(|i| i.began_ms >= at(fs))
                .unwrap_or_else(|| {
                    panic!(
                        "{name}/{seed}: no incident after the fault: {:?}",
                        ch.incidents
                    )
                });
            // Transition alerts carry event time in ms; the drill reads the
            // same alerts in seconds.
            let close = |a: i64, b: i64| (a - b).abs() <= 1;
            assert!(
                close(first.began_ms, at(fs + c.detect_s.unwrap())),
                "{name}/{seed}: detected"
            );
            assert!(
                close(first.drained_ms.unwrap(), at(fs + c.drain_s.unwrap())),
                "{name}/{seed}: drained {:?} vs drill {:?}",
                first.drained_ms,
                c.drain_s
            );
            let fe = c.fault_end_s.unwrap();
            let last = ch.incidents.last().unwrap();
            assert!(
                close(last.recovered_ms.unwrap(), at(fe + c.recover_s.unwrap())),
                "{name}/{seed}: recovered {:?} vs drill {:?}",
                last.recovered_ms,
                c.recover_s
            );
            // Each drain incident of the drill is in one report incident.
            let drained_incidents = ch
                .incidents
                .iter()
                .filter(|i| i.drained_ms.is_some())
                .count() as u32;
            assert!(
                drained_incidents >= 1 && drained_incidents <= c.drains,
                "{name}/{seed}"
            );
            assert!(
                ch.availability < 1.0 && ch.availability > 0.5,
                "{name}/{seed}: {}",
                ch.availability
            );
            assert!(
                !ch.worst_signals.is_empty(),
                "{name}/{seed}: the alerts name signals"
            );
        }
        for c in drill
            .channels
            .iter()
            .filter(|c| !c.faulty && !c.false_drain)
        {
            let ch = r.channels.iter().find(|x| x.channel == c.id);
            assert!(
                ch.is_some_and(|ch| ch.incidents.iter().all(|i| i.drained_ms.is_none())),
                "{name}/{seed}: {} was never drained",
                c.id
            );
        }
        let md = r.markdown();
        assert!(md.contains("| free-a |") || md.contains("## "), "{md}");
    }
}
