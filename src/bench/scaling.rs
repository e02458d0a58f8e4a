//! `hermes bench --partitions P --threads T`: the same steady state split
//! over partitions, one thread against T, each thread owning its partitions
//! as request loops do.

use super::{run, BenchOptions};
use std::time::Instant;

/// The request path on several threads: `partitions` partitions of
/// `channels / partitions` channels each, run once on one thread and once
/// pinned to `threads` threads (partition `p` on thread `p % threads`, as a
/// request loop owns its partitions), in the same process one after the
/// other. Each thread runs its partitions' [`run`]s in turn; the rate of a
/// thread is its events over its timed request-path time, and the rate of
/// the phase is the sum of its threads' rates (every thread is busy for the
/// whole phase: warm-up and encoding between the timed parts are CPU work
/// too, so the threads contend as request loops do).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ScalingReport {
    pub channels: usize,
    pub partitions: usize,
    pub threads: usize,
    /// Cores the process may use.
    pub cores: usize,
    pub events: u64,
    /// One thread over every partition.
    pub one_thread_events_per_s: f64,
    /// `threads` threads at once.
    pub events_per_s: f64,
    pub events_per_s_per_thread: f64,
    /// `events_per_s / one_thread_events_per_s`.
    pub speedup: f64,
    /// `speedup / threads`.
    pub efficiency: f64,
    /// The same by the wall clock of each whole phase (warm-up and
    /// encoding included).
    pub wall_speedup: f64,
}

/// Runs [`ScalingReport`]'s two phases.
pub fn scaling(
    opts: &BenchOptions,
    partitions: usize,
    threads: usize,
) -> anyhow::Result<ScalingReport> {
    anyhow::ensure!(partitions > 0, "--partitions must be at least 1");
    anyhow::ensure!(threads > 0, "--threads must be at least 1");
    anyhow::ensure!(
        opts.channels >= partitions,
        "--channels must be at least --partitions"
    );
    let per_partition = |p: usize| BenchOptions {
        channels: opts.channels / partitions,
        seed: opts.seed.wrapping_add(p as u64),
        ..opts.clone()
    };
    // One thread's share: (events, timed seconds).
    let lane = |ps: Vec<usize>| -> anyhow::Result<(u64, f64)> {
        let mut total = (0u64, 0.0f64);
        for p in ps {
            let r = run(&per_partition(p))?;
            total.0 += r.events;
            total.1 += r.events as f64 / r.events_per_s;
        }
        Ok(total)
    };
    let started = Instant::now();
    let (events, secs) = lane((0..partitions).collect())?;
    let one_wall = started.elapsed();
    let one = events as f64 / secs;
    let started = Instant::now();
    let results: Vec<anyhow::Result<(u64, f64)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let ps: Vec<usize> = (0..partitions).filter(|p| p % threads == t).collect();
                scope.spawn(move || lane(ps))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a bench thread panicked")))
            })
            .collect()
    });
    let many_wall = started.elapsed();
    let mut rate = 0.0;
    for r in results {
        let (e, secs) = r?;
        if e > 0 {
            rate += e as f64 / secs;
        }
    }
    let busy = threads.min(partitions);
    Ok(ScalingReport {
        channels: opts.channels / partitions * partitions,
        partitions,
        threads,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        events,
        one_thread_events_per_s: one,
        events_per_s: rate,
        events_per_s_per_thread: rate / busy as f64,
        speedup: rate / one,
        efficiency: rate / one / busy as f64,
        wall_speedup: one_wall.as_secs_f64() / many_wall.as_secs_f64().max(1e-9),
    })
}

impl ScalingReport {
    /// The report for people.
    pub fn table(&self) -> String {
        format!(
            "{} channels in {} partitions, {} cores\n\
             threads    events/s  events/s/thread  speedup  efficiency\n\
             {:>7} {:>11.0} {:>16.0} {:>8.2} {:>11.2}\n\
             {:>7} {:>11.0} {:>16.0} {:>8.2} {:>11.2}\n\
             (by each phase's wall clock, warm-up and encoding included: {:.2}x)",
            self.channels,
            self.partitions,
            self.cores,
            1,
            self.one_thread_events_per_s,
            self.one_thread_events_per_s,
            1.0,
            1.0,
            self.threads,
            self.events_per_s,
            self.events_per_s_per_thread,
            self.speedup,
            self.efficiency,
            self.wall_speedup,
        )
    }
}
