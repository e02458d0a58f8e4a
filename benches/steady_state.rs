//! The request path at steady state (windows full), the figures a capacity
//! plan needs: `hermes::bench` (also `hermes bench`) for 1 k, 10 k and 50 k
//! channels at 20 events/s each, uniform and skewed (Zipf: the busiest 1 %
//! of channels carry about half the traffic), and uniform from eight
//! gateways whose clocks are spread over 3.5 s ("spread": each channel's
//! events arrive out of event-time order, as from a real fleet).
//!
//! `cargo bench --bench steady_state` runs 1 k and 10 k (about ten
//! minutes); `HERMES_BENCH_CHANNELS=1000,10000,50000` picks the sizes (50 k
//! warms up 300 M events: about ten minutes on one core).
//! Each run is its own process (this binary again, with `--one`), so the
//! resident memory one run freed never flatters the next one's figure.
//! Prints one table line per run, and the JSON objects.

use hermes::bench::{run, BenchOptions, BenchReport, Mix};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--one") {
        let channels = args[i + 1].parse().expect("channels");
        let mix = if args[i + 2] == "skewed" {
            Mix::Skewed
        } else {
            Mix::Uniform
        };
        let (gateways, clock_spread_ms) = match args[i + 2].as_str() {
            "spread" => (8, 3_500),
            _ => (1, 0),
        };
        let opts = BenchOptions {
            channels,
            rate: 20.0,
            seconds: 30,
            warmup_seconds: None,
            mix,
            gateways,
            clock_spread_ms,
            seed: 1,
            base_config: None,
        };
        let r = run(&opts).expect("bench run");
        println!("{}", serde_json::to_string(&r).expect("json"));
        return;
    }
    // `cargo test --benches` runs this binary without `--bench`: skip.
    if !args.iter().any(|a| a == "--bench") {
        return;
    }
    let sizes: Vec<usize> = std::env::var("HERMES_BENCH_CHANNELS")
        .unwrap_or_else(|_| "1000,10000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    println!("{}", BenchReport::HEADER);
    let mut lines = Vec::new();
    for &channels in &sizes {
        for mix in ["uniform", "skewed", "spread"] {
            let out = std::process::Command::new(std::env::current_exe().expect("self"))
                .args(["--one", &channels.to_string(), mix])
                .output()
                .expect("running one bench");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let json = String::from_utf8(out.stdout).expect("utf-8");
            let r: BenchReport = serde_json::from_str(json.trim()).expect("json");
            println!("{}", r.line());
            lines.push(json);
        }
    }
    for l in lines {
        print!("{l}");
    }
}
