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
    // Replay runs one more evaluation tick after the last event than the
    // live run, which stops at the scenario's end.
    let end = sc.start_ms + (sc.duration_s * 1000.0) as i64;
    let replayed: Vec<_> = replayed.into_iter().filter(|d| d.0 <= end).collect();
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

/// The recorded drill with its events spread over four gateways, through
/// `edit` (which may change or drop each one), as a container file.
fn edited(
    recorded: &[Vec<u8>],
    edit: impl Fn(usize, &mut hermes::event::RequestEvent<'_>) -> bool,
) -> Vec<u8> {
    use hermes::codec::{Decoder, Encoder, NoRegistry, WireFormat};
    let decoder = Decoder::new(WireFormat::Plain);
    let mut encoder = Encoder::default();
    const GATEWAYS: [&str; 4] = ["gw-0", "gw-1", "gw-2", "gw-3"];
    let mut out = Vec::new();
    for (i, bytes) in recorded.iter().enumerate() {
        let mut ev = decoder.decode(bytes, &NoRegistry).unwrap();
        ev.gateway_id = GATEWAYS[i % 4];
        if !edit(i, &mut ev) {
            continue;
        }
        let mut buf = Vec::new();
        encoder.encode_plain(&ev, &mut buf).unwrap();
        out.push(buf);
    }
    hermes::replay::write_events(Vec::new(), &out).unwrap()
}

fn decisions(r: &hermes::replay::ReplayReport) -> Vec<(String, i64, String, String)> {
    r.channels
        .iter()
        .flat_map(|c| {
            c.decisions
                .iter()
                .map(|d| (c.id.clone(), d.event_time_ms, d.from.clone(), d.to.clone()))
        })
        .collect()
}

#[test]
fn one_event_ten_years_ahead_is_refused_in_bounded_time() {
    let sc = scenario();
    let cfg = Arc::new(Config::from_toml(&sc.hermes_config_text(None).unwrap()).unwrap());
    let mut recorded = Vec::new();
    hermes::sim::drill(&sc, cfg.clone(), sc.seed, Some(&mut recorded));
    let middle = recorded.len() / 2;
    let clean = hermes::replay::replay(&edited(&recorded, |_, _| true), cfg.clone()).unwrap();
    let poisoned = edited(&recorded, |i, ev| {
        if i == middle {
            ev.event_time_ms += 10 * 365 * 86_400_000;
        }
        true
    });
    let started = std::time::Instant::now();
    let report = hermes::replay::replay(&poisoned, cfg).unwrap();
    // Generous: the whole replay takes well under a second here; a hang
    // (a tick every 5 s for ten years) would not end in this test's lifetime.
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    assert_eq!(report.rejected.get("future_timestamp"), Some(&1));
    assert_eq!(report.rejected.get("too_late"), None);
    assert_eq!(report.applied, clean.applied - 1);
    assert_eq!(decisions(&report), decisions(&clean));
}

#[test]
fn a_gateway_an_hour_fast_costs_the_others_nothing() {
    let sc = scenario();
    let cfg = Arc::new(Config::from_toml(&sc.hermes_config_text(None).unwrap()).unwrap());
    let mut recorded = Vec::new();
    hermes::sim::drill(&sc, cfg.clone(), sc.seed, Some(&mut recorded));
    // gw-2's clock runs an hour fast (its first event is not the file's first).
    let fast = edited(&recorded, |i, ev| {
        if i % 4 == 2 {
            ev.event_time_ms += 3_600_000;
        }
        true
    });
    let without = edited(&recorded, |i, _| i % 4 != 2);
    let report = hermes::replay::replay(&fast, cfg.clone()).unwrap();
    let baseline = hermes::replay::replay(&without, cfg).unwrap();
    let fast_events = recorded.iter().skip(2).step_by(4).count() as u64;
    assert_eq!(report.rejected.get("future_timestamp"), Some(&fast_events));
    assert_eq!(
        report.rejected.get("too_late"),
        None,
        "{:?}",
        report.rejected
    );
    assert_eq!(report.applied, baseline.applied);
    assert_eq!(decisions(&report), decisions(&baseline));
}

/// The README's what-if recipe, as written: `hermes simulate
/// scenarios/hard-down.toml --record ev.avro --write-config sim.toml`, the
/// free tier's `consecutive_failures = 10` added to `sim.toml`, then
/// `hermes replay ev.avro --config sim.toml`: free-a drains on its 10th
/// failure in a row instead of its 4th. The same edit under `[policy]` is
/// shadowed by the free tier's built-in settings, and replay says so.
#[test]
fn the_readmes_what_if_recipe_changes_the_outcome_it_claims() {
    let dir = std::env::temp_dir().join(format!("hermes-what-if-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hermes = env!("CARGO_BIN_EXE_hermes");
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/hard-down.toml");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(hermes)
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    run(&[
        "simulate",
        scenario,
        "--record",
        "ev.avro",
        "--write-config",
        "sim.toml",
    ]);
    let sim = std::fs::read_to_string(dir.join("sim.toml")).unwrap();
    let first_drain = |stdout: &str| {
        stdout
            .lines()
            .find(|l| l.contains("-> DRAINED"))
            .unwrap_or_default()
            .to_string()
    };
    let (before, _) = run(&["replay", "ev.avro", "--config", "sim.toml"]);
    assert!(
        first_drain(&before).contains("consecutive_failures(n=4)"),
        "{before}"
    );

    std::fs::write(
        dir.join("sim.toml"),
        format!("{sim}\n[tiers.free.policy.states]\nconsecutive_failures = 10\n"),
    )
    .unwrap();
    let (after, warned) = run(&["replay", "ev.avro", "--config", "sim.toml"]);
    assert!(
        first_drain(&after).contains("consecutive_failures(n=10)"),
        "{after}"
    );
    assert!(!warned.contains("warning"), "{warned}");

    std::fs::write(
        dir.join("sim.toml"),
        format!("{sim}\n[policy.states]\nconsecutive_failures = 10\n"),
    )
    .unwrap();
    let (shadowed, warned) = run(&["replay", "ev.avro", "--config", "sim.toml"]);
    assert_eq!(
        first_drain(&shadowed),
        first_drain(&before),
        "no effect on free-a"
    );
    assert!(
        warned.contains("policy.states.consecutive_failures")
            && warned.contains("[tiers.free.policy.states]"),
        "{warned}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
