use super::scheduler::SpendMeter;
use super::*;
use crate::config::ClassPolicies;
use proptest::prelude::*;
use TrafficClass::*;

fn ch(id: &str, price: f64, cap: f64, initial: f64) -> ChannelInput {
    ChannelInput {
        id: id.into(),
        state: StateKind::Healthy,
        health_weight: 1.0,
        pinned: false,
        score: Some(0.05),
        signals: Vec::new(),
        price_per_1k_tokens: price,
        capacity_rps: cap,
        initial_weight: initial,
        quota_remaining: None,
        quota_exhausted_in_ms: None,
        tokens_per_request: Some(1000.0),
        failure_rate: Some(0.0),
        failure_streak: 0,
        half_open_share: 0.05,
    }
}

fn group(channels: Vec<ChannelInput>, demand: [f64; 4]) -> GroupInput {
    GroupInput {
        group: "chat".into(),
        now_ms: 1_000,
        channels,
        demand_rps: demand,
        budget_per_hour: None,
        horizon_ms: 3_600_000,
        warm: true,
        panic_since_ms: None,
        spend_calibration: 1.0,
    }
}

fn run(g: &GroupInput) -> Plan {
    plan(
        g,
        &ClassPolicies::default(),
        &ScheduleConfig::default(),
        None,
        false,
    )
}

fn set_state(g: &mut GroupInput, id: &str, state: StateKind, weight: f64, score: f64) {
    let c = g.channels.iter_mut().find(|c| c.id == id).unwrap();
    c.state = state;
    c.health_weight = weight;
    c.score = Some(score);
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6
}

/// free (cap 100 → 80 planned), paid (cap 100 → 80): 30/70 trust.
fn two() -> GroupInput {
    group(
        vec![ch("free", 0.0, 100.0, 0.3), ch("paid", 1.0, 100.0, 0.7)],
        [10.0, 10.0, 20.0, 5.0],
    )
}

#[test]
fn all_healthy_follows_trust_shares() {
    let p = run(&two());
    for &c in TrafficClass::ALL {
        assert!(
            close(p.weight(c, "free"), 0.3),
            "{c}: {}",
            p.weight(c, "free")
        );
        assert!(close(p.weight(c, "paid"), 0.7));
        assert_eq!(p.class(c).shed, 0.0);
    }
    assert_eq!(p.channels[0].reason, ShareReason::TrustCap);
}

#[test]
fn nothing_known_gives_initial_shares() {
    let mut g = two();
    g.warm = false;
    let p = run(&g);
    assert!(close(p.weight(Interactive, "free"), 0.3));
    assert_eq!(p.channels[1].reason, ShareReason::InitialShare);
}

#[test]
fn free_at_risk_batch_stays_interactive_moves() {
    let mut g = two();
    set_state(&mut g, "free", StateKind::AtRisk, 0.3, 0.5);
    let p = run(&g);
    assert_eq!(p.weight(Interactive, "free"), 0.0);
    assert_eq!(p.weight(Core, "free"), 0.0);
    assert!(p.weight(Batch, "free") > 0.0 || p.weight(Experimental, "free") > 0.0);
    // Free carried 0.3 × 45 = 13.5 rps nominally; now 30 % of that.
    assert!(
        close(p.channels[0].planned_rps, 0.3 * 13.5),
        "{}",
        p.channels[0].planned_rps
    );
    // Experimental (lowest priority, 5 rps) takes that 4.05 rps first.
    assert!(close(p.weight(Experimental, "free"), 4.05 / 5.0));
    assert_eq!(p.weight(Batch, "free"), 0.0);
    assert_eq!(p.channels[0].reason, ShareReason::AtRisk);
}

#[test]
fn free_drained_with_ample_paid_capacity() {
    let mut g = two();
    set_state(&mut g, "free", StateKind::Drained, 0.0, 0.9);
    let p = run(&g);
    for &c in TrafficClass::ALL {
        assert_eq!(p.weight(c, "free"), 0.0);
        assert!(close(p.weight(c, "paid"), 1.0));
        assert_eq!(p.class(c).shed, 0.0);
    }
    assert_eq!(p.channels[0].reason, ShareReason::Drained);
}

#[test]
fn free_drained_paid_absorbs_only_what_fits_highest_priority_first() {
    // 100 rps: free carries 90 (trust 0.9), paid 10 with capacity
    // 57.5 × 0.8 = 46, i.e. room for 36 more: 40 % of free's traffic.
    let mut g = group(
        vec![ch("free", 0.0, 200.0, 0.9), ch("paid", 1.0, 57.5, 0.1)],
        [20.0, 30.0, 40.0, 10.0],
    );
    let healthy = run(&g);
    assert!(close(healthy.channels[0].planned_rps, 90.0));
    assert!(close(healthy.channels[1].planned_rps, 10.0));
    set_state(&mut g, "free", StateKind::Drained, 0.0, 0.9);
    // Down hard: nothing would be served there, so the rest is shed.
    g.channels[0].failure_rate = Some(1.0);
    let p = run(&g);
    let paid = &p.channels[1];
    assert!(
        paid.planned_rps <= paid.cap_rps + 1e-9,
        "never over capacity × headroom"
    );
    assert!(close(paid.planned_rps, 46.0));
    // Highest priority first: interactive whole, core 26 of 30, the rest shed.
    assert_eq!(p.class(Interactive).shed, 0.0);
    assert!(close(p.class(Core).shed, 4.0 / 30.0));
    assert!(close(p.class(Batch).shed, 1.0));
    assert!(close(p.class(Experimental).shed, 1.0));
    assert_eq!(paid.reason, ShareReason::CapacityCap);
}

#[test]
fn a_drained_channel_that_still_serves_takes_the_overflow_instead_of_a_shed() {
    // docs/decisions.md#safety-rails: health never sheds what static routing would have
    // served. Free fails 20 % and is drained; paid can take 46 of 100.
    let mut g = group(
        vec![ch("free", 0.0, 200.0, 0.9), ch("paid", 1.0, 57.5, 0.1)],
        [20.0, 30.0, 40.0, 10.0],
    );
    set_state(&mut g, "free", StateKind::Drained, 0.0, 0.9);
    g.channels[0].failure_rate = Some(0.2);
    let p = run(&g);
    for c in &p.classes {
        assert_eq!(c.shed, 0.0, "{:?} shed", c.class);
    }
    // Interactive stays off the sick channel; the overflow is what the
    // lowest priorities could not fit on paid.
    assert_eq!(p.weight(Interactive, "free"), 0.0);
    assert!(close(p.channels[1].planned_rps, 46.0));
    assert!(close(p.channels[0].planned_rps, 54.0));
    // Past the limit it fails about everything: shed after all.
    g.channels[0].failure_rate = Some(0.95);
    assert!(run(&g).class(Batch).shed > 0.99);
}

#[test]
fn a_correlated_failure_is_planned_like_static_routing() {
    let mut g = group(
        vec![ch("free", 0.0, 60.0, 0.3), ch("paid", 1.0, 60.0, 0.7)],
        [10.0, 10.0, 10.0, 0.0],
    );
    let calm = run(&g);
    set_state(&mut g, "free", StateKind::Drained, 0.0, 0.9);
    set_state(&mut g, "paid", StateKind::AtRisk, 0.3, 0.6);
    g.panic_since_ms = Some(0);
    let p = run(&g);
    assert!(p.same_routing(&calm), "{p:?}");
    // A pin still holds.
    g.channels[0].pinned = true;
    assert_eq!(run(&g).weight(Core, "free"), 0.0);
}

#[test]
fn the_writer_sees_a_correlated_failure_no_single_engine_saw() {
    // Two partitions each report one channel, neither flags the group;
    // both channels were drained seconds ago. The writer's own rule
    // plans the group like static routing.
    let cfg = std::sync::Arc::new(crate::config::Config::single_group(
        "chat",
        &[
            ("free-a", crate::config::Tier::Free, 0.0, 50.0),
            ("paid-a", crate::config::Tier::Paid, 1.0, 50.0),
        ],
    ));
    let report = |id: &str, state: StateKind, incident: Option<i64>| crate::health::ChannelHealth {
        score: Some(0.2),
        demand_rps: [1.0, 2.0, 2.0, 0.0],
        failure_rate: Some(1.0),
        incident_since_ms: incident,
        ..crate::health::ChannelHealth::fixture(id, state)
    };
    let now = 1_000_000;
    let mut s = Scheduler::new(cfg.clone());
    let calm = vec![
        report("free-a", StateKind::Healthy, None),
        report("paid-a", StateKind::Healthy, None),
    ];
    let before = s.plan_group(0, now - 5_000, &calm, true).0.clone();
    let down = vec![
        report("free-a", StateKind::Drained, Some(now - 3_000)),
        report("paid-a", StateKind::Drained, Some(now - 2_000)),
    ];
    let (p, _) = s.plan_group(0, now, &down, true);
    assert!(p.same_routing(&before), "{p:?}");
    // One channel drained alone is its own fault: it is drained.
    let mut t = Scheduler::new(cfg);
    t.plan_group(0, now - 5_000, &calm, true);
    let one = vec![
        report("free-a", StateKind::Drained, Some(now - 3_000)),
        report("paid-a", StateKind::Healthy, None),
    ];
    let (p, _) = t.plan_group(0, now, &one, true);
    assert_eq!(p.weight(TrafficClass::Core, "free-a"), 0.0);
}

/// Demand of a shed class: measured from unsent reports when gateways
/// send them; scaled up by the shed share only when they do not.
#[test]
fn shed_demand_is_measured_when_gateways_report_it() {
    let cfg = std::sync::Arc::new(crate::config::Config::single_group(
        "chat",
        &[("paid-a", crate::config::Tier::Paid, 1.0, 10.0)],
    ));
    let now = 1_000_000;
    // 20 rps of core demand on a channel with room for 8: half is shed.
    let report = |served: f64, unsent: f64| crate::health::ChannelHealth {
        demand_rps: [0.0, served + unsent, 0.0, 0.0],
        unsent_rps: [0.0, unsent, 0.0, 0.0],
        ..crate::health::ChannelHealth::fixture("paid-a", StateKind::Healthy)
    };
    let core = |p: &Plan| p.class(Core).clone();
    let mut s = Scheduler::new(cfg.clone());
    let first = core(s.plan_group(0, now, &[report(20.0, 0.0)], true).0);
    assert!(first.shed > 0.5, "{first:?}");
    // Reporting gateways: 8 served + 12 unsent is 20, nothing inflated.
    let p = core(s.plan_group(0, now + 5_000, &[report(8.0, 12.0)], true).0);
    assert!(close(p.demand_rps, 20.0), "{p:?}");
    // Older gateways: only the 8 served are seen; scaled back up.
    let mut old = Scheduler::new(cfg);
    old.plan_group(0, now, &[report(20.0, 0.0)], true);
    let p = core(old.plan_group(0, now + 5_000, &[report(8.0, 0.0)], true).0);
    assert!(p.demand_rps > 8.0 * 1.5, "{p:?}");
}

#[test]
fn spend_calibration_follows_what_was_measured() {
    let mut m = SpendMeter::default();
    assert_eq!(m.update(0, None, 0.0, 60_000), 1.0, "nothing known yet");
    // Plans project 100/h while 120/h is measured, for ten minutes.
    let mut r = 1.0;
    for i in 1..=120 {
        r = m.update(i * 5_000, Some(100.0), 120.0, 60_000);
    }
    assert!((r - 1.2).abs() < 0.02, "{r}");
    // The calibration lowers the budget the plan works with.
    let mut g = two();
    g.budget_per_hour = Some(60_000.0);
    let plain = run(&g).projected_spend_per_hour;
    g.spend_calibration = r;
    let calibrated = run(&g).projected_spend_per_hour;
    assert!(
        calibrated * r <= 60_000.0 * (1.0 - 0.03) + 1e-6,
        "{calibrated}"
    );
    assert!(calibrated < plain);
}

#[test]
fn at_risk_capacity_takes_tolerant_overflow_before_shedding() {
    let mut g = group(
        vec![ch("free", 0.0, 200.0, 0.9), ch("paid", 1.0, 50.0, 0.1)],
        [20.0, 30.0, 40.0, 20.0],
    );
    set_state(&mut g, "free", StateKind::AtRisk, 0.3, 0.5);
    let p = run(&g);
    // Interactive and core fit on paid (40) except 10 core rps, which
    // go to the least-bad channel rather than being shed (docs/decisions.md#safety-rails).
    assert_eq!(p.weight(Interactive, "free"), 0.0);
    assert_eq!(p.class(Core).shed, 0.0);
    assert!(close(p.weight(Core, "free"), 10.0 / 30.0));
    // Batch and experimental stay on the degraded free channel, unshed.
    assert_eq!(p.class(Batch).shed, 0.0);
    assert_eq!(p.class(Experimental).shed, 0.0);
    assert!(p.channels[0].planned_rps <= p.channels[0].cap_rps + 1e-9);
}

#[test]
fn budget_binding_moves_low_priority_off_paid() {
    let mut g = two();
    // Paid at trust share: 0.7 × 45 = 31.5 rps × 3600 × 1 = 113 400/h.
    g.budget_per_hour = Some(60_000.0);
    let p = run(&g);
    assert!(
        p.projected_spend_per_hour <= 60_000.0 + 1e-6,
        "{}",
        p.projected_spend_per_hour
    );
    // Experimental and batch moved to free (beyond its trust cap).
    assert!(close(p.weight(Experimental, "free"), 1.0));
    assert!(p.weight(Batch, "free") > 0.3);
    // Interactive untouched.
    assert!(close(p.weight(Interactive, "free"), 0.3));
    assert_eq!(p.channels[1].reason, ShareReason::BudgetCap);
}

#[test]
fn budget_sheds_when_nothing_cheaper_has_room() {
    let mut g = group(vec![ch("paid", 1.0, 100.0, 1.0)], [10.0, 10.0, 10.0, 10.0]);
    g.budget_per_hour = Some(3600.0 * 25.0);
    let p = run(&g);
    assert!(p.projected_spend_per_hour <= 3600.0 * 25.0 + 1e-6);
    assert!(close(p.class(Experimental).shed, 1.0));
    // The plan keeps `budget_margin` of the budget in reserve.
    let affordable = 25.0 * (1.0 - ScheduleConfig::default().budget_margin);
    assert!(close(p.class(Batch).shed, 1.0 - (affordable - 20.0) / 10.0));
    assert_eq!(p.class(Core).shed, 0.0);
}

#[test]
fn quota_running_out_is_planned_down() {
    let mut g = two();
    let free = &mut g.channels[0];
    free.quota_remaining = Some(3_600 * 5); // 5 rps sustainable over the hour
    free.quota_exhausted_in_ms = Some(1_200_000);
    let p = run(&g);
    assert!(
        close(p.channels[0].planned_rps, 5.0),
        "{}",
        p.channels[0].planned_rps
    );
    assert_eq!(p.channels[0].reason, ShareReason::QuotaCap);
    assert!(p.class(Interactive).shed == 0.0);
}

#[test]
fn pins_are_obeyed() {
    let mut g = two();
    let free = &mut g.channels[0];
    free.pinned = true;
    free.health_weight = 0.0;
    let p = run(&g);
    assert_eq!(p.weight(Interactive, "free"), 0.0);
    assert_eq!(p.channels[0].reason, ShareReason::Pinned);
}

#[test]
fn a_recovering_channel_carries_its_step_of_each_class() {
    let mut g = two();
    set_state(&mut g, "free", StateKind::Recovering, 0.2, 0.1);
    let all = run(&two());
    let p = run(&g);
    // Its step (20 %) of what it carries at full weight, in every class:
    // no class lands wholly on a channel still proving itself.
    for class in [Interactive, Core, Batch, Experimental] {
        let full = all.weight(class, "free");
        assert!(
            close(p.weight(class, "free"), 0.2 * full),
            "{class:?}: {p:?}"
        );
    }
    assert!(close(
        p.channels[0].planned_rps,
        0.2 * all.channels[0].planned_rps
    ));
}

#[test]
fn a_probation_takes_the_same_share_of_every_class_and_leaves_a_retry_path() {
    // Little experimental demand: 5 % of the group's traffic must not land
    // as most of that class on the channel on probation.
    let mut g = group(
        vec![ch("free", 0.0, 100.0, 0.3), ch("paid", 1.0, 100.0, 0.7)],
        [10.0, 10.0, 5.0, 0.5],
    );
    set_state(&mut g, "free", StateKind::Observing, 0.05, 0.1);
    let p = run(&g);
    for class in [Interactive, Core, Batch, Experimental] {
        assert!(close(p.weight(class, "free"), 0.05), "{class:?}: {p:?}");
        assert!(p.weight(class, "paid") > 0.9, "{class:?}: {p:?}");
    }
    assert!(p.classes_without_retry_path().is_empty());
}

#[test]
fn a_quiet_probation_gets_at_least_the_floor_within_its_normal_share() {
    // 0.7 rps in all: 5 % would be one attempt every 30 s.
    let mut g = group(
        vec![ch("free", 0.0, 10.0, 0.3), ch("paid", 1.0, 10.0, 0.7)],
        [0.2, 0.3, 0.2, 0.0],
    );
    set_state(&mut g, "free", StateKind::Observing, 0.05, 0.1);
    let p = run(&g);
    let floor = ScheduleConfig::default().half_open_min_rps;
    assert!(close(p.channels[0].planned_rps, floor), "{p:?}");
    // Never above what it would carry at full weight (0.3 × 0.7 rps).
    set_state(&mut g, "free", StateKind::Observing, 0.05, 0.1);
    g.demand_rps = [0.1, 0.2, 0.1, 0.0];
    let p = run(&g);
    assert!(close(p.channels[0].planned_rps, 0.3 * 0.4), "{p:?}");
}

#[test]
fn an_at_risk_channel_never_holds_a_whole_class() {
    // Batch is tolerant and small: the AT_RISK allowance (30 % of free's
    // nominal load) would take all of it; a retry path stays on paid.
    let mut g = group(
        vec![ch("free", 0.0, 100.0, 0.5), ch("paid", 1.0, 100.0, 0.5)],
        [10.0, 10.0, 1.0, 0.0],
    );
    set_state(&mut g, "free", StateKind::AtRisk, 0.3, 0.5);
    let p = run(&g);
    let share = ScheduleConfig::default().retry_path_share;
    assert!(p.weight(Batch, "paid") >= share - 1e-9, "{p:?}");
    assert!(p.classes_without_retry_path().is_empty());
}

#[test]
fn smoothing_limits_steps_except_drains() {
    let g = two();
    let cfg = ScheduleConfig::default();
    let classes = ClassPolicies::default();
    let p0 = plan(&g, &classes, &cfg, None, false);
    // Budget forces experimental fully onto free: a big move, smoothed.
    let mut g1 = g.clone();
    g1.budget_per_hour = Some(60_000.0);
    let p1 = plan(&g1, &classes, &cfg, Some(&p0), false);
    let d = p1.weight(Experimental, "free") - p0.weight(Experimental, "free");
    assert!(close(d, cfg.max_weight_step), "{d}");
    assert_eq!(p1.version, p0.version + 1);
    // A drain is immediate.
    let mut g2 = g.clone();
    set_state(&mut g2, "free", StateKind::Drained, 0.0, 0.9);
    let p2 = plan(&g2, &classes, &cfg, Some(&p0), false);
    assert_eq!(p2.weight(Interactive, "free"), 0.0);
    // Same inputs again: same version.
    let p3 = plan(&g2, &classes, &cfg, Some(&p2), false);
    assert_eq!(p3.version, p2.version);
}

#[test]
fn manual_mode_freezes_the_plan() {
    let g = two();
    let p0 = run(&g);
    let mut g1 = g.clone();
    set_state(&mut g1, "free", StateKind::Drained, 0.0, 0.9);
    let p1 = plan(
        &g1,
        &ClassPolicies::default(),
        &ScheduleConfig::default(),
        Some(&p0),
        true,
    );
    assert!(p1.manual);
    assert!(p1.same_routing(&p0));
    assert_eq!(p1.version, p0.version + 1, "the switch itself is published");
    let p2 = plan(
        &g1,
        &ClassPolicies::default(),
        &ScheduleConfig::default(),
        Some(&p1),
        true,
    );
    assert_eq!(p2.version, p1.version, "frozen: nothing new after that");
    let p3 = plan(
        &g,
        &ClassPolicies::default(),
        &ScheduleConfig::default(),
        Some(&p2),
        false,
    );
    assert!(!p3.manual);
    assert!(p3.version > p2.version, "leaving manual mode is published");
}

#[test]
fn a_state_is_published_with_the_weight_it_explains() {
    // The score alone had taken free's weight (above every class's
    // max_score) before the machine drained it: the drain moves no weight,
    // but the snapshot's state must not lag it until the next heartbeat.
    let mut g = two();
    set_state(&mut g, "free", StateKind::Healthy, 1.0, 0.99);
    let p0 = run(&g);
    assert_eq!(p0.weight(Batch, "free"), 0.0);
    set_state(&mut g, "free", StateKind::Drained, 0.0, 0.99);
    let p1 = plan(
        &g,
        &ClassPolicies::default(),
        &ScheduleConfig::default(),
        Some(&p0),
        false,
    );
    assert!(p1.same_routing(&p0));
    assert_eq!(p1.channels[0].state, StateKind::Drained);
    assert_eq!(p1.version, p0.version + 1, "a new state is a new version");
    // In manual mode the routing stays, the states are still news.
    let mut m = g.clone();
    set_state(&mut m, "free", StateKind::Observing, 0.05, 0.2);
    let p2 = plan(
        &m,
        &ClassPolicies::default(),
        &ScheduleConfig::default(),
        Some(&p1),
        true,
    );
    assert!(p2.same_routing(&p1));
    assert_eq!(p2.channels[0].state, StateKind::Observing);
}

#[test]
fn panic_mode_shows_why_and_feeds_no_dead_channel() {
    // Both paid channels refuse everything; the free ones cannot carry all
    // of it. The dead get their half-open share only, the rest is shed,
    // and the plan says why each channel carries what it does.
    let mut g = group(
        vec![
            ch("free-a", 0.0, 15.0, 0.3),
            ch("free-b", 0.0, 15.0, 0.3),
            ch("paid-a", 0.6, 20.0, 0.7),
            ch("paid-b", 1.2, 20.0, 0.7),
        ],
        [10.0, 10.0, 10.0, 0.0],
    );
    for id in ["paid-a", "paid-b"] {
        let c = g.channels.iter_mut().find(|c| c.id == id).unwrap();
        c.score = Some(1.0);
        c.failure_rate = Some(1.0);
        c.failure_streak = 40;
    }
    g.panic_since_ms = Some(500);
    let p = run(&g);
    assert_eq!(p.panic_since_ms, Some(500));
    let by_id = |id: &str| p.channels.iter().find(|c| c.id == id).unwrap();
    for id in ["paid-a", "paid-b"] {
        let c = by_id(id);
        assert_eq!(c.reason, ShareReason::FailingInPanic, "{c:?}");
        assert_eq!(c.state, StateKind::Healthy, "the machine's state is shown");
        assert!(c.planned_rps < 1.0, "{c:?}");
    }
    for id in ["free-a", "free-b"] {
        assert_eq!(by_id(id).reason, ShareReason::Panic);
        assert!(close(by_id(id).planned_rps, 12.0), "{:?}", by_id(id));
    }
    assert!(p.classes.iter().any(|c| c.shed > 0.1), "the excess is shed");
    // The first answer after the common cause ends clears the streak: the
    // channel is planned like the others again at once.
    for id in ["paid-a", "paid-b"] {
        g.channels
            .iter_mut()
            .find(|c| c.id == id)
            .unwrap()
            .failure_streak = 0;
    }
    let p = run(&g);
    assert!(p.channels.iter().all(|c| c.reason == ShareReason::Panic));
    assert!(p.classes.iter().all(|c| c.shed == 0.0));
    // Every channel failing nearly everything: nothing better to send to,
    // planned like static routing.
    for c in g.channels.iter_mut() {
        c.failure_rate = Some(1.0);
        c.failure_streak = 10;
    }
    let p = run(&g);
    assert!(p.channels.iter().all(|c| c.reason == ShareReason::Panic));
}

#[test]
fn shuffled_inputs_give_the_same_plan() {
    let mut g = group(
        vec![
            ch("c", 0.5, 30.0, 0.7),
            ch("a", 0.0, 20.0, 0.3),
            ch("b", 2.0, 50.0, 0.7),
        ],
        [5.0, 10.0, 30.0, 3.0],
    );
    set_state(&mut g, "a", StateKind::AtRisk, 0.3, 0.5);
    let p = run(&g);
    g.channels.reverse();
    assert_eq!(run(&g), p);
    g.channels.swap(0, 1);
    assert_eq!(run(&g), p);
}

fn arb_group() -> impl Strategy<Value = GroupInput> {
    let chan = (
        0.0f64..3.0,
        1.0f64..200.0,
        0.05f64..1.0,
        0usize..5,
        0.0f64..1.0,
    );
    (
        proptest::collection::vec(chan, 1..8),
        proptest::array::uniform4(0.0f64..150.0),
        proptest::option::of(0.0f64..500_000.0),
    )
        .prop_map(|(chans, demand, budget)| {
            let states = StateKind::ALL;
            let channels = chans
                .into_iter()
                .enumerate()
                .map(|(i, (price, cap, init, st, w))| {
                    let state = states[st];
                    let health_weight = match state {
                        StateKind::Healthy => 1.0,
                        StateKind::AtRisk => 0.3,
                        StateKind::Drained => 0.0,
                        StateKind::Observing => 0.05,
                        StateKind::Recovering => w,
                    };
                    ChannelInput {
                        state,
                        health_weight,
                        score: Some(if state == StateKind::Healthy {
                            0.1
                        } else {
                            0.5
                        }),
                        ..ch(&format!("ch{i}"), price, cap, init)
                    }
                })
                .collect();
            let mut g = group(channels, demand);
            g.budget_per_hour = budget;
            g
        })
}

proptest! {
    #[test]
    fn plans_are_well_formed(g in arb_group()) {
        let cfg = ScheduleConfig::default();
        let p = run(&g);
        for c in &p.classes {
            let sum: f64 = c.weights.iter().map(|(_, w)| *w).sum();
            prop_assert!(c.weights.iter().all(|(_, w)| *w >= 0.0));
            prop_assert!((0.0..=1.0).contains(&c.shed));
            prop_assert!(close(sum, 1.0) || (sum == 0.0 && close(c.shed, 1.0)), "sum {} shed {}", sum, c.shed);
        }
        let sorted = { let mut v = g.channels.clone(); v.sort_by(|a, b| a.id.cmp(&b.id)); v };
        for (c, input) in p.channels.iter().zip(&sorted) {
            prop_assert!(c.planned_rps <= input.capacity_rps * cfg.capacity_headroom + 1e-6,
                "{} planned {} cap {}", c.id, c.planned_rps, input.capacity_rps);
        }
        // A drained channel only carries what healthy capacity could not
        // (docs/decisions.md#safety-rails overflow): while it carries anything, every healthy
        // channel is full. (Without a budget, which may move load later.)
        let overflow = p.channels.iter().zip(&sorted)
            .any(|(c, i)| i.state == StateKind::Drained && c.planned_rps > 1e-9);
        if overflow && g.budget_per_hour.is_none() {
            for (c, input) in p.channels.iter().zip(&sorted) {
                if input.state == StateKind::Healthy {
                    prop_assert!(c.planned_rps >= c.cap_rps - 1e-6,
                        "{} has room ({} of {}) while a drained channel carries load", c.id, c.planned_rps, c.cap_rps);
                }
            }
        }
        let mut shuffled = g.clone();
        shuffled.channels.reverse();
        prop_assert_eq!(run(&shuffled), p);
    }

    /// docs/decisions.md#safety-rails, every class keeps a way out: while a
    /// class has demand and a healthy channel has room, a healthy channel
    /// carries some of it; and a channel on probation carries no class
    /// beyond its fair part of the half-open share, unless healthy
    /// capacity ran out (overflow).
    #[test]
    fn every_class_keeps_a_retry_path(g in arb_group()) {
        let mut g = g;
        g.budget_per_hour = None;
        let p = run(&g);
        prop_assert_eq!(p.classes_without_retry_path(), Vec::<TrafficClass>::new(), "{:?}", p);
        let cfg = ScheduleConfig::default();
        let demand: f64 = g.demand_rps.iter().map(|d| d.max(1e-6)).sum();
        let room = p.channels.iter().any(|c| c.state == StateKind::Healthy && c.planned_rps < c.cap_rps - 1e-6);
        for (j, c) in p.channels.iter().enumerate() {
            let input = g.channels.iter().find(|x| x.id == c.id).unwrap();
            if c.state != StateKind::Observing || input.pinned || !room {
                continue;
            }
            let fair = input.health_weight.max(cfg.half_open_min_rps / demand);
            for cl in &p.classes {
                let carried = cl.weights[j].1 * (1.0 - cl.shed);
                prop_assert!(carried <= fair + 1e-9, "{} carries {} of {:?}, fair part {}", c.id, carried, cl.class, fair);
            }
        }
    }

    #[test]
    fn smoothing_never_overloads(g in arb_group(), h in arb_group()) {
        // Previous plan from one health picture, next from another over the
        // same channels: the smoothed plan still respects capacity.
        let mut h = h;
        h.channels = g.channels.iter().zip(h.channels.iter().cycle()).map(|(a, b)| ChannelInput {
            state: b.state, health_weight: b.health_weight, score: b.score, ..a.clone()
        }).collect();
        h.demand_rps = g.demand_rps;
        let cfg = ScheduleConfig::default();
        let classes = ClassPolicies::default();
        let p0 = plan(&g, &classes, &cfg, None, false);
        let p1 = plan(&h, &classes, &cfg, Some(&p0), false);
        for c in &p1.channels {
            let cap = h.channels.iter().find(|x| x.id == c.id).unwrap().capacity_rps * cfg.capacity_headroom;
            prop_assert!(c.planned_rps <= cap + 1e-6, "{} {} {}", c.id, c.planned_rps, cap);
        }
    }
}
