//! Every shipped drill on several seeds, as one Markdown table: the drill
//! table of docs/scenarios.md.
//!
//! ```sh
//! cargo run --release --example drills -- [--seeds own,101,202,303,404] [--only NAME] [--json | --summary]
//! ```
//! `own` is each scenario's own seed (the test seeds are `own,101,202,303,404`).
//! `--summary` prints one row per drill: sums over the seeds, and the range
//! of the faulty channels' times (docs/scenarios.md's drill table).
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
    // `None`: the scenario's own seed.
    let seeds: Vec<Option<u64>> = arg("--seeds")
        .unwrap_or_else(|| "1,2,3,4,5".into())
        .split(',')
        .map(|s| match s.trim() {
            "own" => None,
            n => Some(n.parse().expect("--seeds takes numbers or `own`")),
        })
        .collect();
    let summary = args.iter().any(|a| a == "--summary");
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
    let jobs: Vec<(String, Option<u64>)> = names
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
                let seed = seed.unwrap_or(sc.seed);
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
    if summary {
        print_summary(&reports);
        return;
    }
    println!(
        "| drill | seed | failed (Hermes) | failed (static) | ratio | shed | detect_s | drain_s | recover_s | flaps | retrips | drains | readmissions | pages (max per incident) | oscillations | group pages | false drains | overload_s | spend (budget) | peak hour / budget per hour |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
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
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} ({}) | {} | {} | {} | {} | {} | {} |",
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
            r.channels.iter().map(|c| c.readmissions).sum::<u32>(),
            r.channels.iter().map(|c| c.pages).sum::<u32>(),
            r.channels
                .iter()
                .map(|c| c.max_pages_per_incident)
                .max()
                .unwrap_or(0),
            r.channels.iter().map(|c| c.oscillations).sum::<u32>(),
            r.group_pages,
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

/// One row per drill: sums over its seeds, ranges of the faulty channels'
/// times, the worst hour's spend against the budget.
fn print_summary(reports: &[Report]) {
    println!(
        "| drill | seeds | failed, Hermes | failed, static | ratio | shed | detect_s | drain_s | recover_s | flaps / retrips | readmissions | pages (max per incident) | oscillations | group pages | false drains | peak hour / budget |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut names: Vec<&str> = reports.iter().map(|r| r.scenario.as_str()).collect();
    names.dedup();
    for name in names {
        let rs: Vec<&Report> = reports.iter().filter(|r| r.scenario == name).collect();
        let sum = |f: &dyn Fn(&Report) -> u64| rs.iter().map(|r| f(r)).sum::<u64>();
        let (failed, failed_static) = (
            sum(&|r| r.failed_requests),
            sum(&|r| r.failed_requests_static),
        );
        let range = |f: &dyn Fn(&hermes::sim::report::ChannelReport) -> Option<f64>| {
            let v: Vec<f64> = rs
                .iter()
                .flat_map(|r| r.channels.iter().filter(|c| c.faulty))
                .filter_map(f)
                .collect();
            let lo = v.iter().copied().reduce(f64::min);
            let hi = v.iter().copied().reduce(f64::max);
            match (lo, hi) {
                (Some(a), Some(b)) if (a - b).abs() < 0.5 => format!("{a:.0}"),
                (Some(a), Some(b)) => format!("{a:.0}–{b:.0}"),
                _ => "–".into(),
            }
        };
        let chans = |f: &dyn Fn(&hermes::sim::report::ChannelReport) -> u64| {
            rs.iter()
                .flat_map(|r| r.channels.iter())
                .map(f)
                .sum::<u64>()
        };
        let peak = rs.iter().map(|r| r.peak_hour_spend).reduce(f64::max);
        println!(
            "| `{name}` | {} | {failed} | {failed_static} | {} | {} | {} | {} | {} | {} / {} | {} | {} ({}) | {} | {} | {} | {} |",
            rs.iter().map(|r| r.seed.to_string()).collect::<Vec<_>>().join(","),
            if failed_static > 0 {
                format!("{:.2}", failed as f64 / failed_static as f64)
            } else {
                "–".into()
            },
            sum(&|r| r.shed),
            range(&|c| c.detect_s),
            range(&|c| c.drain_s),
            range(&|c| c.recover_s),
            chans(&|c| c.flaps as u64),
            chans(&|c| c.retrips as u64),
            chans(&|c| c.readmissions as u64),
            chans(&|c| c.pages as u64),
            rs.iter()
                .flat_map(|r| r.channels.iter())
                .map(|c| c.max_pages_per_incident)
                .max()
                .unwrap_or(0),
            chans(&|c| c.oscillations as u64),
            sum(&|r| r.group_pages as u64),
            chans(&|c| c.false_drain as u64),
            match (peak, rs[0].budget_per_hour) {
                (Some(p), Some(b)) => format!("{p:.0} / {b:.0}"),
                _ => "–".into(),
            }
        );
    }
}
