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
    match jiff::Timestamp::from_second(secs) {
        Ok(t) => t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        Err(_) => format!("{ms} ms"),
    }
}

/// A date (`2026-11-24`, midnight UTC), a UTC time (`2026-11-24T08:00:00Z`)
/// or epoch milliseconds, as milliseconds since the epoch. Impossible dates
/// (`2026-02-31`) are refused.
pub fn parse_utc_ms(text: &str) -> Result<i64, String> {
    let t = text.trim();
    if let Ok(ms) = t.parse::<i64>() {
        return Ok(ms);
    }
    let bad = |e: &dyn std::fmt::Display| {
        format!(
            "`{text}`: a date (2026-11-24), a UTC time (2026-11-24T08:00:00Z) or epoch \
             milliseconds ({e})"
        )
    };
    if t.contains('T') {
        let ts: jiff::Timestamp = t.parse().map_err(|e| bad(&e))?;
        return Ok(ts.as_millisecond());
    }
    let date: jiff::civil::Date = t.parse().map_err(|e| bad(&e))?;
    let ts = date
        .to_zoned(jiff::tz::TimeZone::UTC)
        .map_err(|e| bad(&e))?
        .timestamp();
    Ok(ts.as_millisecond())
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
        assert_eq!(super::utc(-1), "1969-12-31T23:59:59Z");
        assert_eq!(
            super::parse_utc_ms("2026-12-01").unwrap(),
            1_796_083_200_000
        );
        assert_eq!(
            super::parse_utc_ms("2026-12-01T14:40:00Z").unwrap(),
            1_796_136_000_000
        );
        assert_eq!(
            super::parse_utc_ms("1796136000000").unwrap(),
            1_796_136_000_000
        );
        assert_eq!(super::parse_utc_ms("1970-01-01").unwrap(), 0);
        let leap = super::parse_utc_ms("2024-02-29T23:59:59Z").unwrap();
        assert_eq!(super::utc(leap), "2024-02-29T23:59:59Z");
        for bad in [
            "2026-02-31",
            "2026-13-01",
            "2026-12-01T25:00:00Z",
            "yesterday",
        ] {
            assert!(super::parse_utc_ms(bad).is_err(), "{bad}");
        }
        assert_eq!(super::age(42_000), "42s");
        assert_eq!(super::age(425_000), "7m05s");
        assert_eq!(super::age(11_520_000), "3h12m");
        assert_eq!(super::age(187_200_000), "2d4h");
    }
}
