//! What a measurement reads from the OS: thread and process CPU time and
//! resident memory.

use std::time::Duration;

/// The CPU time between two readings of [`thread_cpu_time`] (`None` if
/// either failed).
pub(super) fn cpu_between(from: Option<Duration>, to: Option<Duration>) -> Option<Duration> {
    Some(to?.saturating_sub(from?))
}

/// The calling thread's CPU time (user and system).
pub fn thread_cpu_time() -> Option<Duration> {
    cpu_clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// The CPU time this process has used, all its threads (finished ones
/// too).
pub fn process_cpu_time() -> Option<Duration> {
    cpu_clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}

pub(super) fn cpu_clock(clock: libc::clockid_t) -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the call only writes it.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    (rc == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// Resident set size in bytes (Linux).
pub fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}
