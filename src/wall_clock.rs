//! The shell's one wall clock. Heartbeats, snapshot age, replay floors,
//! lateness of live input and latency metrics read it; no engine decision
//! does (the engine runs on event time, see `clock`).

/// Wall-clock milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
