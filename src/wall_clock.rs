//! The shell's one wall clock. Heartbeats, snapshot age, replay floors,
//! lateness of live input and latency metrics read it; no engine decision
//! does (the engine runs on event time, see `clock`).

/// Wall-clock milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// `ms` since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ` (UTC), for people.
pub fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// A duration in ms as people read an age: `42s`, `7m05s`, `3h12m`, `2d4h`.
pub fn age(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86_400, s % 86_400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_and_ages_read_as_people_write_them() {
        assert_eq!(super::utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::utc(1_796_136_000_000), "2026-12-01T14:40:00Z");
        assert_eq!(super::utc(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(super::age(42_000), "42s");
        assert_eq!(super::age(425_000), "7m05s");
        assert_eq!(super::age(11_520_000), "3h12m");
        assert_eq!(super::age(187_200_000), "2d4h");
    }
}
