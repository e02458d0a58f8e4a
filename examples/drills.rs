//! Every shipped drill on several seeds, as one Markdown table: what the
//! README's drill table and a closing note quote.
//!
//! ```sh
//! cargo run --release --example drills -- [--seeds 1,2,3,4,5] [--only NAME] [--json]
//! ```
//!
//! Each (scenario, seed) is the same `hermes::sim::drill` that
//! `hermes simulate` and `tests/scenarios.rs` run, with the scenario's own
//! config; runs are spread over the machine's cores.

use hermes::config::Config;
use hermes::sim::report::Report;
use hermes::sim::scenario::Scenario;
use std::sync::{Arc, Mutex};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let seeds: Vec<u64> = arg("--seeds")
        .unwrap_or_else(|| "1,2,3,4,5".into())
        .split(',')
        .map(|s| s.trim().parse().expect("--seeds takes numbers"))
        .collect();
    let only = arg("--only");
    let json = args.iter().any(|a| a == "--json");
    let dir = format!("{}/scenarios", env!("CARGO_MANIFEST_DIR"));
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("scenarios/")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter_map(|n| n.strip_suffix(".toml").map(str::to_string))
        .filter(|n| n != "demo")
        .filter(|n| only.as_deref().is_none_or(|o| n.contains(o)))
        .collect();
    names.sort();
    let jobs: Vec<(String, u64)> = names
        .iter()
        .flat_map(|n| seeds.iter().map(move |s| (n.clone(), *s)))
        .collect();
    let jobs = Arc::new(Mutex::new(jobs.into_iter().enumerate().collect::<Vec<_>>()));
    let results = Arc::new(Mutex::new(Vec::new()));
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (jobs, results, dir) = (jobs.clone(), results.clone(), dir.clone());
            std::thread::spawn(move || loop {
                let Some((i, (name, seed))) = jobs.lock().expect("jobs").pop() else {
                    break;
                };
                let text = std::fs::read_to_string(format!("{dir}/{name}.toml")).expect("read");
                let sc = Scenario::from_toml(&text).expect("scenario");
                let cfg = Config::from_toml(&sc.hermes_config_text(None).expect("config"))
                    .expect("config");
                let r = hermes::sim::drill(&sc, Arc::new(cfg), seed, None).0;
                results.lock().expect("results").push((i, r));
            })
        })
        .collect();
    for h in handles {
        h.join().expect("drill thread");
    }
    let mut results = Arc::try_unwrap(results)
        .expect("threads done")
        .into_inner()
        .expect("results");
    results.sort_by_key(|(i, _)| *i);
    let reports: Vec<Report> = results.into_iter().map(|(_, r)| r).collect();
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&reports).expect("reports serialize")
        );
        return;
    }
    println!(
        "| drill | seed | failed (Hermes) | failed (static) | ratio | shed | detect_s | drain_s | recover_s | flaps | retrips | drains | false drains | overload_s | spend (budget) | peak hour / budget per hour |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let o = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.0}"));
    for r in &reports {
        let faulty: Vec<_> = r.channels.iter().filter(|c| c.faulty).collect();
        let first = |f: &dyn Fn(&hermes::sim::report::ChannelReport) -> Option<f64>| {
            faulty.iter().filter_map(|c| f(c)).reduce(f64::max)
        };
        let ratio = if r.failed_requests_static > 0 {
            format!(
                "{:.2}",
                r.failed_requests as f64 / r.failed_requests_static as f64
            )
        } else {
            "-".into()
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.scenario,
            r.seed,
            r.failed_requests,
            r.failed_requests_static,
            ratio,
            r.shed,
            o(first(&|c| c.detect_s)),
            o(first(&|c| c.drain_s)),
            o(first(&|c| c.recover_s)),
            r.channels.iter().map(|c| c.flaps).sum::<u32>(),
            r.channels.iter().map(|c| c.retrips).sum::<u32>(),
            r.channels.iter().map(|c| c.drains).sum::<u32>(),
            r.channels.iter().filter(|c| c.false_drain).count(),
            r.overload_s,
            match r.budget {
                Some(b) => format!("{:.0} ({b:.0})", r.spend),
                None => format!("{:.0}", r.spend),
            },
            match r.budget_per_hour {
                Some(b) => format!("{:.0} / {b:.0}", r.peak_hour_spend),
                None => "-".into(),
            }
        );
    }
}
