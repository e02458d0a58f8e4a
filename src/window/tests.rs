use super::*;
use crate::codec::tests::sample_event;
use crate::config::EngineConfig;
use crate::digest;
use crate::event::{ErrorClass, RequestEvent};
use crate::window::slice::SliceDigests;
use crate::window::{Baseline, FailureStreak, OutcomeWindow};

fn cfg() -> EngineConfig {
    EngineConfig::default()
}

fn ev_at(t: i64, latency: i32) -> RequestEvent<'static> {
    let mut e = sample_event();
    e.event_time_ms = t;
    e.latency_ms = latency;
    e
}

#[test]
fn views_cover_exactly_their_slices() {
    let mut ring = SliceRing::new(cfg().ring_shape());
    let t0 = 1_000_000_000;
    for i in 0..120 {
        // one event per second for two minutes
        ring.record(&ev_at(t0 + i * 1000, 100));
    }
    let now = t0 + 119_000;
    let short = ring.counters(now, 60_000, i64::MIN / 2);
    let long = ring.counters(now, 300_000, i64::MIN / 2);
    // The short view is 12 whole slices ending with the current one.
    let first = (now / 5000 - 11) * 5000;
    let expected = (t0..=now).step_by(1000).filter(|t| *t >= first).count() as u32;
    assert_eq!(short.real.requests, expected);
    assert_eq!(long.real.requests, 120);
    // not_before clips the view.
    let clipped = ring.counters(now, 300_000, now - 10_000);
    assert!(clipped.real.requests <= 15 && clipped.real.requests >= 10);
}

#[test]
fn ring_rotation_forgets_old_slices() {
    let mut ring = SliceRing::new(cfg().ring_shape());
    let t0 = 1_000_000_000;
    ring.record(&ev_at(t0, 100));
    // Exactly one ring length (5 min) later the same slot is reused.
    let later = t0 + 300_000;
    ring.record(&ev_at(later, 100));
    let view = ring.counters(later, 300_000, i64::MIN / 2);
    assert_eq!(view.real.requests, 1);
    // An event for a slice the ring has already overwritten is refused.
    assert!(!ring.record(&ev_at(t0 + 5, 100)));
}

#[test]
fn quantiles_come_from_the_view() {
    let mut ring = SliceRing::new(cfg().ring_shape());
    let t0 = 2_000_000_000;
    for i in 0..1000 {
        ring.record(&ev_at(t0 + i * 50, (i % 100) as i32 * 10 + 5));
    }
    let now = t0 + 999 * 50;
    let mut d = ring
        .digest(Digest::Latency, now, 60_000, i64::MIN / 2)
        .unwrap();
    let p50 = d.estimate_quantile(0.5);
    let p99 = d.estimate_quantile(0.99);
    assert!((p50 - 500.0).abs() < 30.0, "p50 {p50}");
    assert!((p99 - 985.0).abs() < 30.0, "p99 {p99}");
    assert!(ring
        .digest(Digest::LatencyProbe, now, 60_000, i64::MIN / 2)
        .is_none());
}

/// A deterministic spread of latencies over 0..1000 ms.
fn spread(i: i64) -> i32 {
    (i * 7919 % 1000) as i32
}

#[test]
fn slices_leaving_the_short_view_are_merged_into_panes() {
    let c = cfg();
    let mut ring = SliceRing::new(c.ring_shape());
    let t0 = 1_000_000_000 - 1_000_000_000 % 60_000;
    // 20 events/s for 7 min.
    let mut values = Vec::new();
    for i in 0..(7 * 60 * 20) {
        let t = t0 + i * 50;
        ring.record(&ev_at(t, spread(i)));
        values.push((t, spread(i)));
    }
    let now = t0 + 7 * 60_000 - 1;
    let long = ring.counters(now, c.long_window_ms, i64::MIN / 2);
    let mut d = ring
        .digest(Digest::Latency, now, c.long_window_ms, i64::MIN / 2)
        .unwrap();
    // Only the short view is kept per slice; the rest is in panes of a
    // minute (aligned, so the 4 minutes before the short view and a
    // part of a fifth).
    let kept = ring.fine.iter().filter(|f| f.index != i64::MIN).count();
    assert_eq!(kept, c.short_slices());
    assert!(ring.panes.len() <= 5, "{} panes", ring.panes.len());
    for w in ring.panes.iter().collect::<Vec<_>>().windows(2) {
        assert!(w[0].hi < w[1].lo, "panes overlap");
    }
    // Counters are exact; the digest holds the view and at most a pane
    // more at its old edge.
    let per_slice = 100.0;
    assert_eq!(long.real.requests, 6000);
    assert!(
        d.count() >= 6000.0 && d.count() <= 6000.0 + 11.0 * per_slice,
        "{}",
        d.count()
    );
    // The short view is the fine slices alone, exactly.
    let short = ring
        .digest(Digest::Latency, now, c.short_window_ms, i64::MIN / 2)
        .unwrap();
    assert_eq!(short.count(), 1200.0);
    // Quantiles of the long view stay close to the exact ones.
    let first = now - d.count() as i64 * 50;
    let mut exact: Vec<i32> = values
        .iter()
        .filter(|(t, _)| *t > first)
        .map(|v| v.1)
        .collect();
    exact.sort_unstable();
    for q in [0.5, 0.95, 0.99] {
        let want = exact[((exact.len() as f64 * q) as usize).min(exact.len() - 1)] as f64;
        let got = d.estimate_quantile(q);
        assert!((got - want).abs() <= 15.0, "q {q}: {got} vs {want}");
    }
}

#[test]
fn the_panes_never_grow_after_a_channels_first_event() {
    let c = cfg();
    let mut ring = SliceRing::new(c.ring_shape());
    // Not aligned to a pane, queried every 5 s as the engine does, a
    // probation starting mid-pane, and a quiet spell of 3 min.
    let t0 = 1_000_000_000 - 1_000_000_000 % 60_000 + 17_000;
    ring.record(&ev_at(t0, 100));
    let reserved = ring.panes.capacity();
    assert!(reserved >= ring.most_panes(), "{reserved}");
    let buffers: Vec<*const digest::Packed> = ring.spare.iter().map(|b| b.as_ptr()).collect();
    assert_eq!(buffers.len(), ring.live_panes());
    let mut most = 0;
    for i in 1..(15 * 60 * 4) {
        let t = t0 + i * 250;
        let quiet = (8 * 60_000..11 * 60_000).contains(&(t - t0));
        if !quiet {
            ring.record(&ev_at(t, spread(i)));
        }
        if i % 20 == 0 {
            let not_before = if t - t0 >= 6 * 60_000 + 25_000 {
                t0 + 6 * 60_000 + 25_000
            } else {
                i64::MIN / 2
            };
            ring.digest(Digest::Latency, t, c.long_window_ms, not_before);
        }
        most = most.max(ring.panes.len());
        assert_eq!(ring.panes.capacity(), reserved, "grown at {} ms", t - t0);
        if t - t0 < 6 * 60_000 + 25_000 {
            // Until the probation (whose cut makes one pane more),
            // every pane's digests are in a buffer reserved at the
            // first event.
            for p in &ring.panes {
                let at = p.digests.centroids.as_ptr();
                assert!(buffers.contains(&at), "a new buffer at {} ms", t - t0);
            }
        }
        if quiet && t - t0 > 9 * 60_000 {
            // Quiet, it lets its spare buffers go.
            assert!(ring.spare.is_empty());
        }
    }
    // The run did fill the panes a ring holds.
    assert!(most >= 5, "{most} panes at most");
}

#[test]
fn a_probation_view_never_reads_what_came_before_it() {
    let c = cfg();
    let mut ring = SliceRing::new(c.ring_shape());
    let t0 = 1_000_000_000 - 1_000_000_000 % 60_000;
    // Slow for 3 min, then a probation starts mid-pane (at 3 min 25 s)
    // and everything is fast; evaluated every 5 s as the engine does.
    let since = t0 + 205_000;
    let checks = [since + 30_000, since + 100_000, since + 250_000];
    let mut t = t0;
    let mut checked = 0;
    while t < t0 + 9 * 60_000 {
        let latency = if t < since { 5_000 } else { 100 };
        ring.record(&ev_at(t, latency));
        t += 100;
        if t % 5_000 != 0 {
            continue;
        }
        let not_before = if t > since { since } else { i64::MIN / 2 };
        ring.digest(Digest::Latency, t, c.long_window_ms, not_before);
        // Probation views at every age: within and past the short
        // view, the pane holding `since` included.
        if checks.contains(&t) {
            let counted = ring.counters(t, c.long_window_ms, since).real.requests;
            let d = ring
                .digest(Digest::Latency, t, c.long_window_ms, since)
                .unwrap();
            assert_eq!(d.max(), 100.0, "at {}", t - since);
            assert_eq!(d.count() as u32, counted, "at {}", t - since);
            checked += 1;
        }
        if t == checks[1] {
            // The pane holding the probation's start was cut there.
            let cut = ring.slice_of(since) - 1;
            assert!(ring.panes.iter().any(|p| p.hi == cut && p.lo < p.hi));
            assert!(ring.panes.iter().any(|p| p.lo == cut + 1));
        }
    }
    assert_eq!(checked, checks.len());
}

#[test]
fn a_late_event_lands_in_its_pane() {
    let c = cfg();
    let mut ring = SliceRing::new(c.ring_shape());
    let t0 = 1_000_000_000 - 1_000_000_000 % 60_000;
    for i in 0..(3 * 60 * 10) {
        ring.record(&ev_at(t0 + i * 100, 100));
    }
    let now = t0 + 180_000;
    let before = ring
        .digest(Digest::Latency, now, c.long_window_ms, i64::MIN / 2)
        .unwrap();
    // Two minutes old: its slice has left the short view.
    assert!(ring.record(&ev_at(now - 120_000, 9_000)));
    let after = ring
        .digest(Digest::Latency, now, c.long_window_ms, i64::MIN / 2)
        .unwrap();
    assert_eq!(after.count(), before.count() + 1.0);
    assert_eq!(after.max(), 9_000.0);
    let short = ring
        .digest(Digest::Latency, now, c.short_window_ms, i64::MIN / 2)
        .unwrap();
    assert_eq!(short.max(), 100.0);
}

#[test]
fn events_back_and_forth_across_a_boundary_stage_as_in_order() {
    // Two gateways' clocks a few seconds apart: a channel's events
    // alternate between two slices. Each slice takes its values in the
    // same batches as when they come slice by slice, so its digests
    // are the same, bit for bit (one staging buffer drained at every
    // crossing: batches of one).
    let c = cfg();
    let t0 = 1_000_000_000 - 1_000_000_000 % c.slice_ms;
    let at = |i: i64| match i % 2 {
        0 => t0 + 3_000 + i,
        _ => t0 + c.slice_ms + i,
    };
    let (mut mixed, mut sorted) = (
        SliceRing::new(c.ring_shape()),
        SliceRing::new(c.ring_shape()),
    );
    for i in 0..400 {
        assert!(mixed.record(&ev_at(at(i), spread(i))));
    }
    for i in (0..400).step_by(2).chain((1..400).step_by(2)) {
        assert!(sorted.record(&ev_at(at(i), spread(i))));
    }
    let now = t0 + 2 * c.slice_ms - 1;
    for ring in [&mut mixed, &mut sorted] {
        let d = ring.digest(Digest::Latency, now, c.short_window_ms, i64::MIN / 2);
        assert_eq!(d.map(|d| d.count()), Some(400.0));
    }
    let fine = |r: &SliceRing| {
        let mut held: Vec<_> = (r.fine.iter())
            .filter(|f| f.index != i64::MIN)
            .map(|f| {
                let d = &f.digests;
                (f.index, d.centroids.clone(), d.count, d.min, d.max)
            })
            .collect();
        held.sort_by_key(|h| h.0);
        held
    };
    let (a, b) = (fine(&mixed), fine(&sorted));
    assert_eq!(a.len(), 2);
    assert_eq!(a, b);
}

#[test]
fn slice_digests_keep_each_kind_apart_and_round_trip() {
    let mut d = SliceDigests::default();
    let values = |base: f32, n: usize| -> Vec<f32> { (0..n).map(|i| base + i as f32).collect() };
    let add = |d: &mut SliceDigests, k: usize, values: Vec<f32>| {
        let t = digest::add_values(25, |runs| d.add_to(runs, k), &values).unwrap();
        d.store_merged(k, &t);
    };
    // Fill kinds out of order, then grow one in the middle: the others
    // keep their centroids and summaries.
    for (k, base) in [(3, 3000.0), (0, 0.0), (4, 4000.0), (1, 1000.0)] {
        add(&mut d, k, values(base, 100));
    }
    add(&mut d, 1, values(1100.0, 300));
    assert!(d.is_empty(2));
    for (k, lo, hi, n) in [
        (0, 0.0, 99.0, 100),
        (1, 1000.0, 1399.0, 400),
        (3, 3000.0, 3099.0, 100),
        (4, 4000.0, 4099.0, 100),
    ] {
        let t = digest::gather(25, |runs| d.add_to(runs, k)).unwrap();
        assert_eq!(t.count() as u32, n, "kind {k}");
        assert_eq!((t.min(), t.max()), (lo, hi), "kind {k}");
        assert!(t.centroids().len() <= 25);
        let median = t.estimate_quantile(0.5);
        assert!((median - (lo + hi) / 2.0).abs() < 3.0, "kind {k}: {median}");
    }
    assert_eq!(d.ends[4] as usize, d.centroids.len());
}

#[test]
fn outcome_window_keeps_only_the_last_n() {
    let mut w = OutcomeWindow::new(100);
    for i in 0..250 {
        w.record(i % 50 == 0);
    }
    assert_eq!(w.len(), 100);
    assert_eq!(w.failures(), 2);
    assert_eq!(w.failure_rate(), Some(0.02));
}

#[test]
fn failure_streak_resets_on_success_only() {
    let mut s = FailureStreak::default();
    assert_eq!(s.record(ErrorClass::ConnectionReset), 1);
    assert_eq!(s.record(ErrorClass::RateLimited), 1);
    assert_eq!(s.record(ErrorClass::ClientError), 1);
    assert_eq!(s.record(ErrorClass::ServerError), 2);
    assert_eq!(s.record(ErrorClass::None), 0);
}

#[test]
fn baseline_median_needs_enough_points() {
    let mut b = Baseline::new(5);
    for p in [100.0, 300.0, 200.0] {
        b.learn(p, f64::NAN);
    }
    assert_eq!(b.p99_ms(5), None);
    assert_eq!(b.p99_ms(3), Some(200.0));
    assert_eq!(b.output_median(1), None);
    for p in [400.0, 500.0, 600.0] {
        b.learn(p, 10.0);
    }
    // capacity 5: the first point (100) is gone
    assert_eq!(b.p99_ms(1), Some(400.0));
}

#[test]
fn quota_reports_are_kept_per_slice_and_forgotten_with_it() {
    let mut ring = SliceRing::new(cfg().ring_shape());
    let t0 = 1_000_000_000;
    let ev_at = |t: i64, latency: i32| RequestEvent {
        quota_remaining: None,
        ..ev_at(t, latency)
    };
    // No report: nothing is kept for them.
    ring.record(&ev_at(t0, 100));
    assert!(ring.quota_reports(t0, 300_000).is_none());
    assert!(ring.quotas.is_empty(), "no quota storage without a report");
    let with_quota = |t: i64, q: i64| {
        let mut e = ev_at(t, 100);
        e.quota_remaining = Some(q);
        e
    };
    // The latest report by event time wins within a slice, whatever the
    // arrival order; the view's oldest and newest slice reports are given.
    ring.record(&with_quota(t0 + 1_000, 900));
    ring.record(&with_quota(t0 + 3_000, 700));
    ring.record(&with_quota(t0 + 2_000, 800));
    ring.record(&with_quota(t0 + 60_000, 400));
    assert_eq!(
        ring.quota_reports(t0 + 60_000, 300_000),
        Some(((t0 + 3_000, 700), (t0 + 60_000, 400)))
    );
    // A slot taken by a newer slice forgets its report.
    ring.record(&ev_at(t0 + 300_000, 100));
    assert_eq!(
        ring.quota_reports(t0 + 300_000, 300_000),
        Some(((t0 + 60_000, 400), (t0 + 60_000, 400)))
    );
}

#[test]
fn class_tokens_saturate_within_a_slice_and_sum_wide_across_slices() {
    let mut ring = SliceRing::new(cfg().ring_shape());
    let t0 = 1_000_000_000;
    let mut e = ev_at(t0, 100);
    e.input_tokens = i32::MAX;
    e.output_tokens = i32::MAX;
    for i in 0..3 {
        e.event_time_ms = t0 + i;
        ring.record(&e);
    }
    e.event_time_ms = t0 + 5_000;
    ring.record(&e);
    let view = ring.counters(t0 + 5_000, 300_000, i64::MIN / 2);
    let class = e.traffic_class.index();
    // An event's tokens are 2 * i32::MAX = u32::MAX - 1: the first slice's
    // three saturate, the second slice holds one event's.
    let one = 2 * i32::MAX as u64;
    assert_eq!(view.class_tokens[class], u32::MAX as u64 + one);
    assert_eq!(view.class_requests[class], 4);
}

#[test]
fn a_slice_is_168_bytes_so_sixty_fit_the_10_kib_size_class() {
    use crate::window::slice::{Fine, Pane, Slice};
    use std::mem::size_of;
    assert_eq!(size_of::<Slice>(), 168);
    assert!(60 * size_of::<Slice>() <= 10 * 1024);
    // The slice number is in the line an event's counts go to, and what
    // a real event writes (the number, its counters, the class counts) is
    // the first 112 bytes: two lines when the slot starts on one, three
    // when it does not, and the request path hints them all.
    assert_eq!(std::mem::offset_of!(Slice, index), 0);
    assert_eq!(Slice::REAL_BYTES, 112);
    // And a slice's digests, before their centroids: a ring keeps twelve
    // fine slots in one allocation (1 248 B, jemalloc's 1 280 B class),
    // and room for eight panes (1 024 B, the 1 024 B class).
    assert_eq!(size_of::<SliceDigests>(), 96);
    assert_eq!(size_of::<Fine>(), 104);
    assert!(12 * size_of::<Fine>() <= 1280);
    assert_eq!(size_of::<Pane>(), 128);
}

#[test]
fn probe_counts_saturate_within_a_slice_and_sum_wide_across_slices() {
    let mut ring = SliceRing::new(cfg().ring_shape());
    let t0 = 1_000_000_000;
    let mut e = ev_at(t0, 100);
    e.is_probe = true;
    // Two slices: the first takes more probes than a `u16` holds.
    for i in 0..u16::MAX as i64 + 10 {
        e.event_time_ms = t0 + i % 4_000;
        ring.record(&e);
    }
    for i in 0..7 {
        e.event_time_ms = t0 + 5_000 + i;
        ring.record(&e);
    }
    let view = ring.counters(t0 + 5_000, 300_000, i64::MIN / 2);
    assert_eq!(view.probe.requests, u16::MAX as u32 + 7);
    assert_eq!(view.probe.successes, u16::MAX as u32 + 7);
    assert_eq!(view.real.requests, 0);
    // The cost is not a count: it sums every probe.
    let probes = u16::MAX as f64 + 17.0;
    assert!((view.probe.cost - probes * e.cost).abs() < 1e-6 * probes * e.cost.max(1.0));
}

/// Values a few `f32` steps apart merge into centroids whose `f64` means
/// narrow to one `f32`, and then the weights can put a stored kind out of
/// key order. A kind says so (`unordered`), so a view sorts it; one in order
/// is merged as it is. Either way the view is what checking every run gives.
#[test]
fn a_kind_stored_out_of_key_order_says_so_and_its_views_still_sort_it() {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut d = SliceDigests::default();
    let (mut seen_unordered, mut seen_ordered) = (false, false);
    for round in 0..40 {
        let k = round % 2;
        let values: Vec<f32> = (0..64)
            .map(|_| 1.0 + (next() % 4) as f32 * f32::EPSILON)
            .collect();
        let t = digest::add_values(25, |runs| d.add_to(runs, k), &values).unwrap();
        d.store_merged(k, &t);
        for k in (0..2).filter(|&k| !d.is_empty(k)) {
            let ordered = digest::in_order(&d.centroids[d.range(k)]);
            assert_eq!(
                d.unordered & (1 << k) == 0,
                ordered,
                "round {round} kind {k}"
            );
            (seen_unordered, seen_ordered) = (seen_unordered || !ordered, seen_ordered || ordered);
            let flagged = digest::gather(200, |runs| d.add_to(runs, k)).unwrap();
            let checked = digest::gather(200, |runs| {
                let c = &d.centroids[d.range(k)];
                runs.add(c, d.count[k] as f64, d.min[k] as f64, d.max[k] as f64);
            })
            .unwrap();
            assert_eq!(flagged, checked, "round {round} kind {k}");
            assert!(flagged
                .centroids()
                .windows(2)
                .all(|w| w[0].mean <= w[1].mean));
        }
    }
    assert!(seen_unordered && seen_ordered);
}
