//! The weight reader conformance cases (`schemas/conformance/`) against the
//! Rust client's algorithm, `hermes::client::SnapshotView`: the same files
//! the Python client is tested with.

use hermes::client::SnapshotView;
use hermes::event::TrafficClass;
use hermes::routing::{Pick, StaticWeights};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Share of each outcome over a regular grid of the pick's uniform numbers
/// (a grid integrates the sampler exactly up to its resolution).
fn distribution(view: &SnapshotView, class: TrafficClass) -> BTreeMap<String, f64> {
    let (ns, n) = (40, 120);
    let mut counts = BTreeMap::<String, f64>::new();
    let table = view.table();
    for s in 0..ns {
        let u_shed = (s as f64 + 0.5) / ns as f64;
        for i in 0..n {
            for j in 0..n {
                let (u1, u2) = ((i as f64 + 0.5) / n as f64, (j as f64 + 0.5) / n as f64);
                let outcome = match table.as_ref().map(|t| t.pick(class, u_shed, u1, u2)) {
                    Some(Pick::Channel(c)) => c.to_string(),
                    Some(Pick::Shed) => "SHED".to_string(),
                    Some(Pick::NoRoute) | None => "NO_CHANNEL".to_string(),
                };
                *counts.entry(outcome).or_default() += 1.0;
            }
        }
    }
    let total = (ns * n * n) as f64;
    counts.values_mut().for_each(|v| *v /= total);
    counts
}

fn run_case(name: &str, case: &Value) {
    let static_weights: StaticWeights = serde_json::from_value(case["static"].clone()).unwrap();
    let known: Option<BTreeSet<String>> =
        serde_json::from_value(case["known_channels"].clone()).unwrap();
    let mut view = SnapshotView::new("chat", &static_weights, known);
    for read in case["reads"].as_array().unwrap() {
        let raw = match (&read["value"], &read["raw"]) {
            (Value::Null, Value::String(raw)) => Some(raw.clone()),
            (Value::Null, _) => None,
            (v, _) => Some(v.to_string()),
        };
        let _ = view.offer(raw.as_deref());
    }
    let expect = &case["expect"];
    let table = view.table();
    let source = match &table {
        Some(t) if !t.is_static() => "snapshot",
        _ => "static",
    };
    assert_eq!(source, expect["source"], "{name}: source");
    assert_eq!(
        view.snapshot().map(|s| s.version),
        expect["version"].as_u64(),
        "{name}: version"
    );
    let (now, stale_after) = (
        case["now_ms"].as_i64().unwrap(),
        case["stale_after_ms"].as_i64().unwrap(),
    );
    assert_eq!(
        Value::Bool(view.is_stale(now, stale_after)),
        expect["stale"],
        "{name}: stale"
    );
    assert_eq!(
        Value::from(view.rejected),
        expect["rejected"],
        "{name}: rejected"
    );
    for (class, want) in expect["distribution"].as_object().unwrap() {
        let class = *TrafficClass::ALL
            .iter()
            .find(|c| c.as_str() == class)
            .unwrap();
        let got = distribution(&view, class);
        let want: BTreeMap<String, f64> = serde_json::from_value(want.clone()).unwrap();
        let keys: BTreeSet<&String> = got.keys().chain(want.keys()).collect();
        for k in keys {
            let (g, w) = (
                got.get(k).copied().unwrap_or(0.0),
                want.get(k).copied().unwrap_or(0.0),
            );
            assert!(
                (g - w).abs() <= 0.01,
                "{name}: {} {k}: got {g:.4}, want {w:.4} (all: {got:?})",
                class.as_str()
            );
        }
    }
}

#[test]
fn the_rust_client_passes_every_conformance_case() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/schemas/conformance");
    let mut ran = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let case: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let name = path.file_stem().unwrap().to_string_lossy().to_string();
            run_case(&name, &case);
            ran.push(name);
        }
    }
    assert!(ran.len() >= 10, "every case ran: {ran:?}");
}
