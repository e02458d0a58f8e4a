//! `hermes report`: the weekly channel report (incident 003) from the alert
//! stream alone, as Markdown and as one self-contained HTML page.
//!
//! Every state change is a TRANSITION alert, so the alerts between `from`
//! and `to` replay each channel's state machine over the period:
//! - the state at `from` is the `to_state` of the channel's last
//!   transition before it (HEALTHY when the stream holds none: said so in
//!   the report);
//! - **time in each state** and **availability** follow: available is the
//!   share of the period in a routable state (HEALTHY, AT_RISK,
//!   RECOVERING); DRAINED and OBSERVING (probes or a half-open share only)
//!   count as unavailable;
//! - an **incident** runs from a transition out of HEALTHY to the next
//!   transition back into it (still open at `to` if none). It reports when
//!   it began (Hermes detected it: the state left HEALTHY), the time from
//!   there to the first DRAINED (time to drain), the time spent DRAINED,
//!   and the time from its start to HEALTHY again (time to recover), with
//!   the worst signals of its alerts (largest score contributions).
//!   The fault's own start is not in the alert stream, so "time to detect"
//!   measured from it belongs to the drills (`hermes simulate`), which know
//!   it; this report starts the clock at the detection;
//! - **overrides**: every OVERRIDE alert (who and why are in its message);
//! - **spend** is not in the alert stream: the report says where it is
//!   (`hermes_group_projected_spend_per_hour`) rather than guess it.
//!
//! Reading the stream is the caller's (a file of JSON lines, as `hermes
//! simulate --alerts` writes, or the alert topic); this module is pure.

use crate::alert::{AlertEvent, AlertKind};
use crate::wall_clock::{age, utc};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;

/// The states a channel can be in, in display order.
const STATES: [&str; 5] = ["HEALTHY", "AT_RISK", "DRAINED", "OBSERVING", "RECOVERING"];

/// Whether a state routes real traffic.
fn routable(state: &str) -> bool {
    matches!(state, "HEALTHY" | "AT_RISK" | "RECOVERING")
}

/// One incident of one channel.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Incident {
    /// When the channel left HEALTHY (Hermes detected it).
    pub began_ms: i64,
    /// The first state it went to.
    pub first_state: String,
    /// The first time it was DRAINED, if it was.
    pub drained_ms: Option<i64>,
    /// Total time DRAINED within the incident (to `to` if still open).
    pub drained_for_ms: i64,
    /// Back to HEALTHY; `None` while still open at the end of the period.
    pub recovered_ms: Option<i64>,
    /// Signal → the largest contribution it made to the score in the
    /// incident's alerts; the worst first, at most three.
    pub worst_signals: Vec<(String, f64)>,
    /// P1 alerts raised for the channel during the incident.
    pub p1_alerts: u32,
}

impl Incident {
    fn began(at_ms: i64, state: &str, drained_ms: Option<i64>, p1_alerts: u32) -> Incident {
        Incident {
            began_ms: at_ms,
            first_state: state.to_string(),
            drained_ms,
            drained_for_ms: 0,
            recovered_ms: None,
            worst_signals: Vec::new(),
            p1_alerts,
        }
    }

    pub fn time_to_drain_ms(&self) -> Option<i64> {
        self.drained_ms.map(|d| d - self.began_ms)
    }

    pub fn time_to_recover_ms(&self) -> Option<i64> {
        self.recovered_ms.map(|r| r - self.began_ms)
    }
}

/// One operator override, as its alert says.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OverrideLine {
    pub at_ms: i64,
    pub reason: String,
    pub message: String,
}

/// One channel over the period.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChannelPeriod {
    pub channel: String,
    pub group: String,
    /// The state at the start of the period, and whether it was known (a
    /// transition before `from`) or assumed HEALTHY.
    pub initial_state: String,
    pub initial_state_known: bool,
    /// State → milliseconds spent in it within the period.
    pub time_in_state_ms: BTreeMap<String, i64>,
    /// Share of the period in a routable state.
    pub availability: f64,
    pub incidents: Vec<Incident>,
    pub overrides: Vec<OverrideLine>,
    /// Signal → largest contribution seen in any of the channel's alerts.
    pub worst_signals: Vec<(String, f64)>,
    /// Alerts naming the channel in the period, by kind.
    pub alerts_by_kind: BTreeMap<String, u32>,
    /// (start, end, state) segments covering the period, for the chart.
    pub segments: Vec<(i64, i64, String)>,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChannelReport {
    pub from_ms: i64,
    pub to_ms: i64,
    pub alerts_read: usize,
    pub channels: Vec<ChannelPeriod>,
    /// Group-level alerts (correlated failure, freezes) in the period.
    pub group_alerts: Vec<(String, i64, String, String)>,
}

fn top3(m: &BTreeMap<String, f64>) -> Vec<(String, f64)> {
    let mut v: Vec<(String, f64)> = m.iter().map(|(k, x)| (k.clone(), *x)).collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v.truncate(3);
    v
}

fn note_worst(into: &mut BTreeMap<String, f64>, a: &AlertEvent) {
    for (k, c) in &a.breakdown {
        if *c > 0.0 {
            let e = into.entry(k.clone()).or_insert(0.0);
            *e = e.max(*c);
        }
    }
}

/// Replays one channel's alerts (sorted by time) over `[from, to)`.
fn channel_period(
    channel: &str,
    group: &str,
    alerts: &[&AlertEvent],
    from: i64,
    to: i64,
) -> ChannelPeriod {
    let before = alerts.iter().rev().find(|a| {
        a.event_time_ms < from && a.kind == AlertKind::Transition && a.to_state.is_some()
    });
    let initial = before
        .and_then(|a| a.to_state.clone())
        .unwrap_or_else(|| "HEALTHY".to_string());
    let mut walk = PeriodWalk::start(channel, group, initial, before.is_some(), from);
    for a in alerts
        .iter()
        .filter(|a| (from..to).contains(&a.event_time_ms))
    {
        walk.alert(a);
    }
    walk.finish(from, to)
}

/// An incident still open, with the largest contribution of each signal
/// seen in its alerts so far.
type OpenIncident = (Incident, BTreeMap<String, f64>);

/// [`channel_period`]'s walk through the alerts: the state the channel is
/// in since when, and the incident open, if any.
struct PeriodWalk {
    p: ChannelPeriod,
    state: String,
    since: i64,
    worst: BTreeMap<String, f64>,
    open: Option<OpenIncident>,
}

impl PeriodWalk {
    fn start(channel: &str, group: &str, initial: String, known: bool, from: i64) -> PeriodWalk {
        // A period that starts outside HEALTHY starts inside an incident.
        let open = (initial != "HEALTHY").then(|| {
            let drained_ms = (initial == "DRAINED").then_some(from);
            (
                Incident::began(from, &initial, drained_ms, 0),
                BTreeMap::new(),
            )
        });
        PeriodWalk {
            p: ChannelPeriod {
                channel: channel.to_string(),
                group: group.to_string(),
                initial_state_known: known,
                initial_state: initial.clone(),
                time_in_state_ms: STATES.iter().map(|s| (s.to_string(), 0)).collect(),
                availability: 0.0,
                incidents: Vec::new(),
                overrides: Vec::new(),
                worst_signals: Vec::new(),
                alerts_by_kind: BTreeMap::new(),
                segments: Vec::new(),
            },
            state: initial,
            since: from,
            worst: BTreeMap::new(),
            open,
        }
    }

    fn alert(&mut self, a: &AlertEvent) {
        *self
            .p
            .alerts_by_kind
            .entry(a.kind.as_str().to_string())
            .or_default() += 1;
        note_worst(&mut self.worst, a);
        if let Some((inc, w)) = self.open.as_mut() {
            note_worst(w, a);
            if a.severity == crate::alert::Severity::P1 {
                inc.p1_alerts += 1;
            }
        }
        match a.kind {
            AlertKind::Override => self.p.overrides.push(OverrideLine {
                at_ms: a.event_time_ms,
                reason: a.reason.clone(),
                message: a.message.clone(),
            }),
            AlertKind::Transition => {
                if let Some(next) = a.to_state.clone() {
                    self.transition(a, next);
                }
            }
            _ => {}
        }
    }

    /// A move to `next`: the segment before it closes; leaving HEALTHY
    /// opens an incident, a drain dates it, coming back closes it.
    fn transition(&mut self, a: &AlertEvent, next: String) {
        let at = a.event_time_ms;
        self.close_segment(at);
        self.since = at;
        if self.state == "HEALTHY" && next != "HEALTHY" && self.open.is_none() {
            let mut w = BTreeMap::new();
            note_worst(&mut w, a);
            let p1 = u32::from(a.severity == crate::alert::Severity::P1);
            self.open = Some((Incident::began(at, &next, None, p1), w));
        }
        if let Some((inc, _)) = self.open.as_mut() {
            if next == "DRAINED" && inc.drained_ms.is_none() {
                inc.drained_ms = Some(at);
            }
        }
        if next == "HEALTHY" {
            if let Some((mut inc, w)) = self.open.take() {
                inc.recovered_ms = Some(at);
                inc.worst_signals = top3(&w);
                self.p.incidents.push(inc);
            }
        }
        self.state = next;
    }

    /// The time from `since` to `until` in the current state.
    fn close_segment(&mut self, until: i64) {
        if until <= self.since {
            return;
        }
        let spent = until - self.since;
        *self
            .p
            .time_in_state_ms
            .entry(self.state.clone())
            .or_default() += spent;
        self.p
            .segments
            .push((self.since, until, self.state.clone()));
        if self.state == "DRAINED" {
            if let Some((inc, _)) = self.open.as_mut() {
                inc.drained_for_ms += spent;
            }
        }
    }

    fn finish(mut self, from: i64, to: i64) -> ChannelPeriod {
        self.close_segment(to);
        if let Some((mut inc, w)) = self.open.take() {
            inc.worst_signals = top3(&w);
            self.p.incidents.push(inc);
        }
        let up: i64 = self
            .p
            .time_in_state_ms
            .iter()
            .filter(|(s, _)| routable(s))
            .map(|(_, t)| *t)
            .sum();
        self.p.availability = if to > from {
            up as f64 / (to - from) as f64
        } else {
            1.0
        };
        self.p.worst_signals = top3(&self.worst);
        self.p
    }
}

/// The report over `[from_ms, to_ms)` from every alert read (those before
/// `from_ms` only give the state each channel started in). `catalogue`
/// (channel, group) adds the configured channels that raised no alert, so
/// a quiet channel shows as such instead of missing from the report.
pub fn build(
    alerts: &[AlertEvent],
    from_ms: i64,
    to_ms: i64,
    catalogue: &[(String, String)],
) -> ChannelReport {
    let mut sorted: Vec<&AlertEvent> = alerts.iter().collect();
    sorted.sort_by_key(|a| a.event_time_ms);
    let mut by_channel: BTreeMap<(String, String), Vec<&AlertEvent>> = BTreeMap::new();
    let mut group_alerts = Vec::new();
    for (c, g) in catalogue {
        by_channel.entry((c.clone(), g.clone())).or_default();
    }
    for a in &sorted {
        match &a.channel_id {
            Some(c) => by_channel
                .entry((c.clone(), a.route_group.clone()))
                .or_default()
                .push(a),
            None if (from_ms..to_ms).contains(&a.event_time_ms) => group_alerts.push((
                a.route_group.clone(),
                a.event_time_ms,
                a.kind.as_str().to_string(),
                a.message.clone(),
            )),
            None => {}
        }
    }
    ChannelReport {
        from_ms,
        to_ms,
        alerts_read: alerts.len(),
        channels: by_channel
            .iter()
            .map(|((c, g), a)| channel_period(c, g, a, from_ms, to_ms))
            .collect(),
        group_alerts,
    }
}

fn opt_age(ms: Option<i64>) -> String {
    ms.map_or("-".into(), age)
}

use crate::present::fmt_signals as signals_text;

impl ChannelPeriod {
    /// "HEALTHY 6d23h, AT_RISK 1m00s, …".
    fn times_text(&self) -> String {
        STATES
            .iter()
            .map(|st| {
                format!(
                    "{st} {}",
                    age(self.time_in_state_ms.get(*st).copied().unwrap_or(0))
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The incident table's header and one row's cells (Markdown and HTML).
const INCIDENT_COLUMNS: [&str; 7] = [
    "began (detected)",
    "first state",
    "time to drain",
    "drained for",
    "time to recover",
    "P1 alerts",
    "worst signals",
];

impl Incident {
    fn cells(&self) -> [String; 7] {
        [
            utc(self.began_ms),
            self.first_state.clone(),
            opt_age(self.time_to_drain_ms()),
            age(self.drained_for_ms),
            self.time_to_recover_ms().map_or("still open".into(), age),
            self.p1_alerts.to_string(),
            signals_text(&self.worst_signals),
        ]
    }
}

impl ChannelReport {
    /// The report as Markdown.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# Hermes channel report\n");
        let _ = writeln!(
            s,
            "{} to {} ({}), from {} alerts.\n",
            utc(self.from_ms),
            utc(self.to_ms),
            age(self.to_ms - self.from_ms),
            self.alerts_read
        );
        let _ = writeln!(s, "Availability: share of the period in HEALTHY, AT_RISK or RECOVERING. An incident runs from leaving HEALTHY to coming back; its clock starts at the detection. Spend is not in the alert stream: see `hermes_group_projected_spend_per_hour`.\n");
        let _ = writeln!(
            s,
            "| channel | group | availability | incidents | drained | worst signals | overrides |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|");
        for c in &self.channels {
            let _ = writeln!(
                s,
                "| {} | {} | {:.2} % | {} | {} | {} | {} |",
                c.channel,
                c.group,
                c.availability * 100.0,
                c.incidents.len(),
                age(c.time_in_state_ms.get("DRAINED").copied().unwrap_or(0)),
                signals_text(&c.worst_signals),
                c.overrides.len()
            );
        }
        for c in &self.channels {
            let _ = writeln!(s, "\n## {} ({})\n", c.channel, c.group);
            if !c.initial_state_known {
                let _ = writeln!(
                    s,
                    "No transition before the period: assumed HEALTHY at its start.\n"
                );
            } else {
                let _ = writeln!(s, "{} at the start of the period.\n", c.initial_state);
            }
            let _ = writeln!(s, "Time in each state: {}.\n", c.times_text());
            if c.incidents.is_empty() {
                let _ = writeln!(s, "No incident.");
            } else {
                let _ = writeln!(s, "| {} |", INCIDENT_COLUMNS.join(" | "));
                let _ = writeln!(s, "|{}", "---|".repeat(INCIDENT_COLUMNS.len()));
                for i in &c.incidents {
                    let _ = writeln!(s, "| {} |", i.cells().join(" | "));
                }
            }
            for o in &c.overrides {
                let _ = writeln!(s, "\n- override at {}: {}", utc(o.at_ms), o.message);
            }
        }
        if !self.group_alerts.is_empty() {
            let _ = writeln!(s, "\n## Group alerts\n");
            for (g, t, k, m) in &self.group_alerts {
                let _ = writeln!(s, "- {} {g} {k}: {m}", utc(*t));
            }
        }
        s
    }

    /// One self-contained HTML page: the same tables, and a state strip
    /// per channel (inline SVG, no script, nothing fetched). Built with
    /// `maud`: every value is escaped.
    pub fn html(&self) -> String {
        use maud::html;
        let body = html! {
            h1 { "Hermes channel report" }
            p {
                (utc(self.from_ms)) " to " (utc(self.to_ms)) " ("
                (age(self.to_ms - self.from_ms)) "), from " (self.alerts_read)
                " alerts. Availability: share of the period in HEALTHY, AT_RISK or \
                 RECOVERING. Spend is not in the alert stream: see "
                code { "hermes_group_projected_spend_per_hour" } "."
            }
            p.legend {
                @for st in STATES {
                    span { i.sw style=(format!("background:{}", colour(st))) {} (st) }
                }
            }
            table {
                tr {
                    @for h in ["channel", "group", "availability", "incidents", "drained", "worst signals", "overrides"] {
                        th { (h) }
                    }
                }
                @for c in &self.channels {
                    tr {
                        td { (c.channel) }
                        td { (c.group) }
                        td { (format!("{:.2} %", c.availability * 100.0)) }
                        td { (c.incidents.len()) }
                        td { (age(c.time_in_state_ms.get("DRAINED").copied().unwrap_or(0))) }
                        td { (signals_text(&c.worst_signals)) }
                        td { (c.overrides.len()) }
                    }
                }
            }
            @for c in &self.channels {
                (self.html_channel(c))
            }
        };
        crate::present::html_page("Hermes channel report", REPORT_STYLE, body)
    }

    /// One channel's section: its state over the period, its incidents and
    /// overrides.
    fn html_channel(&self, c: &ChannelPeriod) -> maud::Markup {
        use maud::html;
        let span = (self.to_ms - self.from_ms).max(1) as f64;
        let segments = c.segments.iter().map(|(a, b, st)| {
            let x = (a - self.from_ms) as f64 / span * 1000.0;
            let w = ((b - a) as f64 / span * 1000.0).max(0.5);
            let tip = format!("{st} {} .. {}", utc(*a), utc(*b));
            (format!("{x:.1}"), format!("{w:.1}"), colour(st), tip)
        });
        html! {
            h2 { (c.channel) " (" (c.group) ")" }
            svg width="1000" height="40" role="img" aria-label=(format!("state of {}", c.channel)) {
                @for (x, w, fill, tip) in segments {
                    rect x=(x) y="0" width=(w) height="24" fill=(fill) { title { (tip) } }
                }
                text x="0" y="38" font-size="11" { (utc(self.from_ms)) }
                text x="1000" y="38" font-size="11" text-anchor="end" { (utc(self.to_ms)) }
            }
            p { "Time in each state: " (c.times_text()) "." }
            @if !c.incidents.is_empty() {
                table {
                    tr { @for h in INCIDENT_COLUMNS { th { (h) } } }
                    @for i in &c.incidents {
                        tr { @for cell in i.cells() { td { (cell) } } }
                    }
                }
            }
            @for o in &c.overrides {
                p { "Override at " (utc(o.at_ms)) ": " (o.message) }
            }
        }
    }
}

const REPORT_STYLE: &str = "body{font-family:sans-serif;margin:2em;max-width:1100px}\
    table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}\
    th{background:#f4f4f4}.legend span{display:inline-block;margin-right:1em}\
    .sw{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:middle}";

/// A state's colour on the report's charts.
fn colour(state: &str) -> &'static str {
    match state {
        "HEALTHY" => "#2e7d32",
        "AT_RISK" => "#f9a825",
        "DRAINED" => "#c62828",
        "OBSERVING" => "#ef6c00",
        _ => "#1565c0",
    }
}

/// Alerts from JSON lines (`hermes simulate --alerts`); a line that does
/// not parse is an error naming it.
pub fn read_json_lines(text: &str) -> Result<Vec<AlertEvent>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("line {}: {e}", i + 1)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alert::Severity;

    fn transition(
        t: i64,
        from: &str,
        to: &str,
        sev: Severity,
        breakdown: &[(&str, f64)],
    ) -> AlertEvent {
        AlertEvent {
            alert_id: format!("a{t}"),
            event_time_ms: t,
            route_group: "chat".into(),
            channel_id: Some("free-a".into()),
            kind: AlertKind::Transition,
            severity: sev,
            from_state: Some(from.into()),
            to_state: Some(to.into()),
            reason: "r".into(),
            score: None,
            breakdown: breakdown.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            weight: None,
            message: "m".into(),
        }
    }

    #[test]
    fn names_from_the_alert_stream_are_escaped_in_the_page() {
        let mut a = transition(5_000, "HEALTHY", "DRAINED", Severity::P1, &[]);
        a.channel_id = Some("<b onclick=\"x\">'&'</b>".into());
        let html = build(&[a], 0, 10_000, &[]).html();
        assert!(!html.contains("<b onclick"), "{html}");
        assert!(html.contains("&lt;b onclick=&quot;x&quot;&gt;'&amp;'&lt;/b&gt;"));
    }

    #[test]
    fn a_period_replays_states_incidents_and_availability() {
        let m = 60_000;
        let alerts = vec![
            // Before the period: it started the period DRAINED.
            transition(-5 * m, "HEALTHY", "DRAINED", Severity::P1, &[]),
            transition(2 * m, "DRAINED", "OBSERVING", Severity::Info, &[]),
            transition(4 * m, "OBSERVING", "RECOVERING", Severity::Info, &[]),
            transition(6 * m, "RECOVERING", "HEALTHY", Severity::Info, &[]),
            transition(
                10 * m,
                "HEALTHY",
                "AT_RISK",
                Severity::P2,
                &[("p99_latency_ms", 0.2)],
            ),
            transition(
                11 * m,
                "AT_RISK",
                "DRAINED",
                Severity::P1,
                &[("p99_latency_ms", 0.3), ("error_rate", 0.4)],
            ),
            transition(15 * m, "DRAINED", "OBSERVING", Severity::Info, &[]),
        ];
        let r = build(&alerts, 0, 20 * m, &[("paid-a".into(), "chat".into())]);
        let quiet = r.channels.iter().find(|c| c.channel == "paid-a").unwrap();
        assert_eq!(
            (quiet.availability, quiet.incidents.len()),
            (1.0, 0),
            "a configured channel with no alert"
        );
        let c = r.channels.iter().find(|c| c.channel == "free-a").unwrap();
        assert!(c.initial_state_known);
        assert_eq!(c.initial_state, "DRAINED");
        assert_eq!(c.time_in_state_ms["DRAINED"], 2 * m + 4 * m);
        assert_eq!(c.time_in_state_ms["OBSERVING"], 2 * m + 5 * m);
        assert_eq!(c.time_in_state_ms["HEALTHY"], 4 * m);
        let total: i64 = c.time_in_state_ms.values().sum();
        assert_eq!(total, 20 * m, "the states cover the period");
        // Routable: RECOVERING 2 + HEALTHY 4 + AT_RISK 1 of 20 minutes.
        assert!((c.availability - 7.0 / 20.0).abs() < 1e-9);
        assert_eq!(c.incidents.len(), 2);
        let first = &c.incidents[0];
        assert_eq!(
            (first.began_ms, first.drained_ms, first.recovered_ms),
            (0, Some(0), Some(6 * m))
        );
        let second = &c.incidents[1];
        assert_eq!(second.time_to_drain_ms(), Some(m));
        assert_eq!(second.drained_for_ms, 4 * m);
        assert_eq!(second.recovered_ms, None, "still open at the end");
        assert_eq!(second.worst_signals[0], ("error_rate".to_string(), 0.4));
        assert_eq!(second.p1_alerts, 1);
        let md = r.markdown();
        assert!(md.contains("still open") && md.contains("35.00 %"), "{md}");
        let html = r.html();
        assert!(
            html.contains("<svg") && !html.contains("<script"),
            "self-contained"
        );
    }

    #[test]
    fn no_transition_before_the_period_assumes_healthy_and_says_so() {
        let r = build(
            &[transition(5_000, "HEALTHY", "AT_RISK", Severity::P2, &[])],
            0,
            10_000,
            &[],
        );
        assert!(!r.channels[0].initial_state_known);
        assert!(r.markdown().contains("assumed HEALTHY"));
        assert!(read_json_lines("{nope").unwrap_err().starts_with("line 1"));
    }
}
