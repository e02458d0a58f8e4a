//! The drill report: decision quality computed from the alert stream (the
//! audit trail every action leaves), plus the cost and harm comparisons.
//!
//! Definitions (also in docs/scenarios.md):
//! - `detect_s`: fault start → first transition out of HEALTHY.
//! - `drain_s`: fault start → first transition to DRAINED.
//! - `recover_s`: fault end → HEALTHY (full weight); 0 if it already was.
//! - `flaps`: reversed decisions: a move down (to AT_RISK or DRAINED) that
//!   follows a move up (AT_RISK → HEALTHY, DRAINED → OBSERVING, OBSERVING →
//!   RECOVERING, a recovery step, RECOVERING → HEALTHY) after an earlier move
//!   down. A failed probation (OBSERVING → DRAINED) counts: traffic was let
//!   back in and taken away again.
//! - `probation_failures`: the OBSERVING → DRAINED part of `flaps`.
//! - `retrips`: `flaps` less `probation_failures`: a channel taken down again
//!   after it had earned weight back (RECOVERING, HEALTHY or AT_RISK).
//! - `false_drain`: a channel without a fault was drained.
//! - `failed_requests`: what users saw, per *request* (not attempt): its
//!   final outcome after the gateway's retries was an error or a bad answer
//!   (truncated, garbled, schema-invalid, under 30 % of the normal output
//!   median, slower than 1.2 × the normal P99 or caught in a latency pulse),
//!   or it was shed. `_static` is the same traffic on static trust-tier
//!   weights, which never shed.
//! - `harmed_attempts`: attempts harmed by an active fault (its error,
//!   latency, truncation, garbling, short output) or by overload; a
//!   diagnostic, not the verdict.
//! - `pages`: alerts that page someone (P1 and P2) naming the channel.
//!   `incidents`: the channel's episodes out of HEALTHY (each begins with
//!   a move out of HEALTHY and ends with its return to HEALTHY);
//!   `max_pages_per_incident`: the most pages any one incident raised, a
//!   page counted in the incident it falls in, or in the next one if it
//!   came while the channel was HEALTHY (an alarm ahead of the drain). A
//!   page with no incident after it is an incident of its own.
//!   `group_pages`: pages naming no channel (CORRELATED_FAILURE).
//! - `readmissions`: probations passed (OBSERVING → RECOVERING): traffic
//!   given back to a channel after a drain.

use super::{RunResult, Scenario};
use crate::alert::{AlertEvent, AlertKind};
use serde::Serialize;
use std::collections::BTreeMap;
mod timeline;
pub use timeline::*;

/// One channel's line in the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChannelReport {
    pub id: String,
    pub faulty: bool,
    pub fault_start_s: Option<f64>,
    pub fault_end_s: Option<f64>,
    pub detect_s: Option<f64>,
    pub drain_s: Option<f64>,
    pub recover_s: Option<f64>,
    pub flaps: u32,
    pub probation_failures: u32,
    pub retrips: u32,
    pub false_drain: bool,
    /// Drain incidents: transitions into DRAINED, except a failed half-open
    /// probe (OBSERVING → DRAINED), which belongs to the incident before it.
    pub drains: u32,
    /// Seconds this channel ran above its capacity (5 s mean load).
    pub overload_s: u64,
    /// Event time from the Nth consecutive hard failure to the drain.
    pub nth_failure_to_drain_s: Option<f64>,
    pub longest_at_risk_s: f64,
    pub served: u64,
    pub harmed: u64,
    /// P1 and P2 alerts naming this channel (see the module doc).
    pub pages: u32,
    /// Episodes out of HEALTHY.
    pub incidents: u32,
    pub max_pages_per_incident: u32,
    /// OBSERVING → RECOVERING transitions.
    pub readmissions: u32,
    /// OSCILLATION alerts naming this channel.
    pub oscillations: u32,
}

/// The whole report (`--json` prints exactly this).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub scenario: String,
    pub duration_s: f64,
    pub seed: u64,
    pub channels: Vec<ChannelReport>,
    pub requests: u64,
    /// Per request, shed counted as failed (see the module doc).
    pub failed_requests: u64,
    pub failed_requests_static: u64,
    pub shed: u64,
    pub retries: u64,
    pub retries_static: u64,
    /// Attempts answered 429 (rate limit or quota), and with static weights.
    pub rate_limited_attempts: u64,
    pub rate_limited_attempts_static: u64,
    pub harmed_attempts: u64,
    pub harmed_attempts_static: u64,
    pub spend: f64,
    pub spend_baseline: f64,
    /// Budget over the whole run (budget per hour × hours), if any.
    pub budget: Option<f64>,
    /// The most spent in any hour of the run (rolling, minute steps), as a
    /// rate per hour; a run shorter than an hour is one window, scaled.
    /// Compare with `budget_per_hour`: a budget holds at every hour, not
    /// only on average.
    pub peak_hour_spend: f64,
    pub budget_per_hour: Option<f64>,
    pub overload_s: u64,
    /// Seconds in which a class with demand had no weight on a healthy
    /// channel while one had room: a retry of it had nowhere healthy to go.
    pub no_retry_path_s: f64,
    pub events: u64,
    /// Alerts raised, by kind.
    pub alerts: BTreeMap<String, u64>,
    /// P1 and P2 alerts naming no channel.
    pub group_pages: u32,
}

struct Move {
    t_s: f64,
    from: String,
    to: String,
    up: bool,
    down: bool,
    probation_failure: bool,
}

fn moves(alerts: &[AlertEvent], channel: &str, start_ms: i64) -> Vec<Move> {
    alerts
        .iter()
        .filter(|a| a.channel_id.as_deref() == Some(channel))
        .filter(|a| matches!(a.kind, AlertKind::Transition | AlertKind::WeightChange))
        .map(|a| {
            let from = a.from_state.clone().unwrap_or_default();
            let to = a.to_state.clone().unwrap_or_default();
            let down = (to == "AT_RISK" || to == "DRAINED") && from != to;
            let up = a.kind == AlertKind::WeightChange
                || (to == "HEALTHY" && from != "HEALTHY")
                || (to == "OBSERVING" && from == "DRAINED")
                || (to == "RECOVERING" && from == "OBSERVING");
            Move {
                t_s: (a.event_time_ms - start_ms) as f64 / 1000.0,
                probation_failure: from == "OBSERVING" && to == "DRAINED",
                from,
                to,
                up,
                down,
            }
        })
        .collect()
}

/// Builds the report from the Hermes run, the static-weights run and the
/// no-fault baseline run.
pub fn build(
    sc: &Scenario,
    seed: u64,
    hermes: &RunResult,
    static_run: &RunResult,
    baseline: &RunResult,
) -> Report {
    let channels = sc
        .channels
        .iter()
        .enumerate()
        .map(|(j, c)| channel_report(sc, c, &hermes.channels[j], &hermes.alerts))
        .collect();
    let mut alerts = BTreeMap::new();
    for a in &hermes.alerts {
        *alerts.entry(a.kind.as_str().to_string()).or_insert(0) += 1;
    }
    Report {
        scenario: sc.name.clone(),
        duration_s: sc.duration_s,
        seed,
        channels,
        requests: hermes.requests,
        failed_requests: hermes.failed_requests,
        failed_requests_static: static_run.failed_requests,
        shed: hermes.shed,
        retries: hermes.retries,
        retries_static: static_run.retries,
        rate_limited_attempts: hermes.rate_limited,
        rate_limited_attempts_static: static_run.rate_limited,
        harmed_attempts: hermes.channels.iter().map(|c| c.bad).sum(),
        harmed_attempts_static: static_run.channels.iter().map(|c| c.bad).sum(),
        spend: round2(hermes.spend),
        spend_baseline: round2(baseline.spend),
        budget: sc
            .budget_per_hour
            .map(|b| round2(b * sc.duration_s / 3600.0)),
        peak_hour_spend: round2(peak_hour_spend(&hermes.spend_by_minute, sc.duration_s)),
        budget_per_hour: sc.budget_per_hour,
        overload_s: hermes.overload_s,
        no_retry_path_s: round2(hermes.no_retry_path_s),
        events: hermes.events,
        alerts,
        group_pages: hermes
            .alerts
            .iter()
            .filter(|a| a.channel_id.is_none() && a.pages())
            .count() as u32,
    }
}

/// One channel's verdicts, from its moves in the Hermes run.
fn channel_report(
    sc: &Scenario,
    c: &super::scenario::SimChannel,
    run: &super::ChannelRun,
    alerts: &[AlertEvent],
) -> ChannelReport {
    let faulty = !c.faults.is_empty();
    let fault_start = c.faults.iter().map(|f| f.start_s).reduce(f64::min);
    let fault_end = c.faults.iter().map(|f| f.end_s).reduce(f64::max);
    let mv = moves(alerts, &c.id, sc.start_ms);
    let first = |pred: &dyn Fn(&Move) -> bool, after: f64| {
        mv.iter().find(|m| m.t_s >= after && pred(m)).map(|m| m.t_s)
    };
    let detect_s = fault_start
        .and_then(|fs| first(&|m| m.to != "HEALTHY" && m.from != m.to, fs).map(|t| t - fs));
    let drain_s = fault_start.and_then(|fs| first(&|m| m.to == "DRAINED", fs).map(|t| t - fs));
    let recover_s = fault_end.and_then(|fe| {
        let state_at_end = mv
            .iter()
            .rfind(|m| m.t_s < fe)
            .map_or("HEALTHY", |m| m.to.as_str());
        if state_at_end == "HEALTHY" {
            Some(0.0)
        } else {
            first(&|m| m.to == "HEALTHY", fe).map(|t| t - fe)
        }
    });
    let (flaps, probation_failures) = reversals(&mv);
    let drains = mv
        .iter()
        .filter(|m| m.to == "DRAINED" && m.from != "DRAINED" && m.from != "OBSERVING")
        .count() as u32;
    let nth_failure_to_drain_s = run.nth_failure_s.and_then(|nth| {
        mv.iter()
            .find(|m| m.to == "DRAINED" && m.t_s >= nth - 1e-6)
            .map(|m| m.t_s - nth)
    });
    let (pages, incidents, max_pages_per_incident) = pages_by_incident(alerts, &c.id);
    ChannelReport {
        id: c.id.clone(),
        faulty,
        fault_start_s: fault_start,
        fault_end_s: fault_end,
        detect_s,
        drain_s,
        recover_s,
        flaps,
        probation_failures,
        retrips: flaps - probation_failures,
        false_drain: !faulty && drains > 0,
        drains,
        overload_s: run.overload_s,
        nth_failure_to_drain_s,
        longest_at_risk_s: longest_at_risk(&mv, sc.duration_s),
        served: run.served,
        harmed: run.bad,
        pages,
        incidents,
        max_pages_per_incident,
        readmissions: mv
            .iter()
            .filter(|m| m.from == "OBSERVING" && m.to == "RECOVERING")
            .count() as u32,
        oscillations: alerts
            .iter()
            .filter(|a| a.channel_id.as_deref() == Some(&c.id) && a.kind == AlertKind::Oscillation)
            .count() as u32,
    }
}

/// A channel's pages, its incidents (episodes out of HEALTHY), and the most
/// pages any one incident raised (see the module doc).
fn pages_by_incident(alerts: &[AlertEvent], channel: &str) -> (u32, u32, u32) {
    let mut per_incident: Vec<u32> = Vec::new();
    // Pages raised while HEALTHY, waiting for the incident they announce.
    let mut pending = 0;
    let mut open = false;
    for a in alerts
        .iter()
        .filter(|a| a.channel_id.as_deref() == Some(channel))
    {
        let transition = matches!(a.kind, AlertKind::Transition);
        let (from, to) = (a.from_state.as_deref(), a.to_state.as_deref());
        if transition && from == Some("HEALTHY") && to != Some("HEALTHY") && !open {
            open = true;
            per_incident.push(pending);
            pending = 0;
        }
        if a.pages() {
            match per_incident.last_mut() {
                Some(n) if open => *n += 1,
                _ => pending += 1,
            }
        }
        if transition && to == Some("HEALTHY") && from != Some("HEALTHY") {
            open = false;
        }
    }
    if pending > 0 {
        per_incident.push(pending);
    }
    let pages = per_incident.iter().sum();
    let incidents = per_incident.len() as u32;
    (
        pages,
        incidents,
        per_incident.into_iter().max().unwrap_or(0),
    )
}

/// `flaps` (every move down after a move up that followed an earlier move
/// down) and the failed probations among them.
fn reversals(mv: &[Move]) -> (u32, u32) {
    let mut flaps = 0;
    let mut probation_failures = 0;
    let mut downs = 0;
    let mut went_up = false;
    for m in mv {
        if m.down {
            if downs > 0 && went_up {
                flaps += 1;
                probation_failures += m.probation_failure as u32;
            }
            downs += 1;
            went_up = false;
        } else if m.up {
            went_up = true;
        }
    }
    (flaps, probation_failures)
}

/// The longest stretch in AT_RISK (one still open counts to the run's end).
fn longest_at_risk(mv: &[Move], duration_s: f64) -> f64 {
    let mut longest: f64 = 0.0;
    let mut entered: Option<f64> = None;
    for m in mv {
        if m.to == "AT_RISK" && m.from != "AT_RISK" {
            entered = Some(m.t_s);
        } else if m.from == "AT_RISK" && m.to != "AT_RISK" {
            if let Some(e) = entered.take() {
                longest = longest.max(m.t_s - e);
            }
        }
    }
    if let Some(e) = entered {
        longest = longest.max(duration_s - e);
    }
    longest
}

/// The largest spend over any window of an hour (or of the whole run, if
/// shorter), per hour. Windows end on minute boundaries.
pub fn peak_hour_spend(by_minute: &[f64], duration_s: f64) -> f64 {
    let minutes = ((duration_s / 60.0).ceil() as usize).max(1);
    let window = minutes.min(60);
    let at = |i: usize| by_minute.get(i).copied().unwrap_or(0.0);
    let mut sum: f64 = (0..window).map(at).sum();
    let mut peak = sum;
    for end in window..minutes {
        sum += at(end) - at(end - window);
        peak = peak.max(sum);
    }
    peak * 60.0 / window as f64
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn opt(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.1}"))
}

/// The human-readable table.
pub fn table(r: &Report) -> String {
    let mut s = format!(
        "scenario {} ({} s simulated, seed {})\n\n",
        r.scenario, r.duration_s, r.seed
    );
    s.push_str(&channel_table(&r.channels));
    s.push_str(&totals(r));
    s
}

/// One row per channel.
fn channel_table(channels: &[ChannelReport]) -> String {
    use crate::present::{Align, Table};
    let mut columns = vec![("channel", Align::Left)];
    columns.extend(
        [
            "faulty",
            "fault_s",
            "detect_s",
            "drain_s",
            "recov_s",
            "nth→drn",
            "flaps",
            "retrips",
            "drains",
            "readmit",
            "pages",
            "false_drain",
            "served",
            "harmed",
        ]
        .map(|h| (h, Align::Right)),
    );
    let mut t = Table::new(&columns).min_width(0, 14);
    for c in channels {
        let window = match (c.fault_start_s, c.fault_end_s) {
            (Some(a), Some(b)) => format!("{a:.0}-{b:.0}"),
            _ => "-".into(),
        };
        t.row([
            c.id.clone(),
            c.faulty.to_string(),
            window,
            opt(c.detect_s),
            opt(c.drain_s),
            opt(c.recover_s),
            opt(c.nth_failure_to_drain_s),
            c.flaps.to_string(),
            c.retrips.to_string(),
            c.drains.to_string(),
            c.readmissions.to_string(),
            c.pages.to_string(),
            c.false_drain.to_string(),
            c.served.to_string(),
            c.harmed.to_string(),
        ]);
    }
    t.render()
}

/// What users saw against static weights, spend, overload and alerts.
fn totals(r: &Report) -> String {
    let pct = |a: u64, b: u64| {
        if b > 0 {
            format!("{:.1} %", 100.0 * a as f64 / b as f64)
        } else {
            "n/a".into()
        }
    };
    let mut s = format!(
        "\nfailed requests (after retries, shed counted): {} with Hermes vs {} with static weights ({} of static)\n",
        r.failed_requests,
        r.failed_requests_static,
        pct(r.failed_requests, r.failed_requests_static)
    );
    s.push_str(&format!(
        "  of {} requests: shed {}, retries {} (static {}), harmed attempts {} (static {})\n",
        r.requests,
        r.shed,
        r.retries,
        r.retries_static,
        r.harmed_attempts,
        r.harmed_attempts_static
    ));
    s.push_str(&format!(
        "spend: {:.2} (no-fault baseline {:.2}{}); peak hour {:.2}{}\n",
        r.spend,
        r.spend_baseline,
        r.budget
            .map_or(String::new(), |b| format!(", budget {b:.2}")),
        r.peak_hour_spend,
        r.budget_per_hour
            .map_or(String::new(), |b| format!(" per hour (budget {b:.2})"))
    ));
    s.push_str(&format!(
        "overload: {} s; a class without a healthy channel: {} s; events {}\n",
        r.overload_s, r.no_retry_path_s, r.events
    ));
    let alerts: Vec<String> = r.alerts.iter().map(|(k, v)| format!("{k}={v}")).collect();
    s.push_str(&format!(
        "alerts: {}; pages: {} naming channels, {} naming the group\n",
        alerts.join(", "),
        r.channels.iter().map(|c| c.pages).sum::<u32>(),
        r.group_pages
    ));
    s
}
