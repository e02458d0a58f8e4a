//! The drill's HTML timeline: weight, state and score per channel over the
//! run, one self-contained page, built with `maud` (every value escaped).

use super::{table, Report};
use crate::sim::{RunResult, Scenario};
use maud::{html, Markup};

pub(super) fn state_color(s: crate::state::StateKind) -> &'static str {
    use crate::state::StateKind::*;
    match s {
        Healthy => "#2e9e4f",
        AtRisk => "#e0a800",
        Drained => "#c0392b",
        Observing => "#8e44ad",
        Recovering => "#2980b9",
    }
}

const STYLE: &str = "body{font-family:sans-serif;margin:20px;color:#222} h2{margin:18px 0 4px;font-size:16px} \
     .legend span{display:inline-block;margin-right:14px;font-size:13px} pre{background:#f6f6f6;padding:8px;font-size:12px}";

/// A self-contained HTML page: per channel, health weight, traffic share and
/// score over time, the state as a colored band, the fault window shaded.
pub fn timeline_html(sc: &Scenario, run: &RunResult, report: &Report) -> String {
    let chart = Chart {
        w: 1000.0,
        h: 140.0,
        band: 14.0,
        dur: sc.duration_s.max(1.0),
    };
    let panics = panic_spans(&run.channels);
    let body = html! {
        h1 { "Drill: " (sc.name) }
        p { (sc.description) }
        p {
            "Group mode: "
            @if panics.is_empty() {
                "normal throughout."
            } @else {
                @for (i, (from, to)) in panics.iter().enumerate() {
                    @if i > 0 { ", " }
                    b { "panic " (format!("{from:.0}–{to:.0} s")) }
                }
                " (a correlated failure: health does not route; channels are planned like \
                 static routing, and one failing nearly everything gets only a probe's share)."
            }
        }
        (legend())
        @for (j, c) in sc.channels.iter().enumerate() {
            h2 { (c.id) " (" (c.tier.as_str()) ", capacity " (c.capacity_rps) " rps)" }
            (chart.svg(c, &run.channels[j].samples))
        }
        h2 { "Report" }
        pre { (table(report)) }
    };
    crate::present::html_page("Hermes drill", STYLE, body)
}

/// When the group was in panic mode: the spans of samples whose plan gave
/// a channel a panic reason.
fn panic_spans(channels: &[crate::sim::ChannelRun]) -> Vec<(f64, f64)> {
    use crate::schedule::ShareReason::{FailingInPanic, Panic};
    let mut at: Vec<(f64, bool)> = Vec::new();
    for c in channels {
        for s in &c.samples {
            at.push((s.t_s, matches!(s.reason, Panic | FailingInPanic)));
        }
    }
    at.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
    at.dedup_by(|b, a| a.0 == b.0);
    let mut spans: Vec<(f64, f64)> = Vec::new();
    let mut open: Option<f64> = None;
    for (t, panic) in at {
        match (panic, open) {
            (true, None) => open = Some(t),
            (false, Some(from)) => {
                spans.push((from, t));
                open = None;
            }
            _ => {}
        }
    }
    if let Some(from) = open {
        spans.push((from, f64::INFINITY));
    }
    spans
}

/// The colour of the band under the state band: why a channel carries
/// weight while it scores badly (panic mode), or nothing.
pub(super) fn reason_color(r: crate::schedule::ShareReason) -> Option<&'static str> {
    use crate::schedule::ShareReason::*;
    match r {
        Panic => Some("#f39c12"),
        FailingInPanic => Some("#5b2c2c"),
        _ => None,
    }
}

/// What the lines and colours mean.
fn legend() -> Markup {
    let states = crate::state::StateKind::ALL;
    html! {
        div.legend {
            span style="color:#111" { "\u{25AC} health weight" }
            span style="color:#1f77b4" { "\u{25AC} traffic share" }
            span style="color:#d62728" { "\u{25AC} score" }
            span style="background:#fde2e2" { "\u{A0}fault window\u{A0}" }
            @for s in states {
                span {
                    span style=(format!("background:{};", state_color(s))) { "\u{A0}\u{A0}\u{A0}" }
                    " " (s)
                }
            }
            @for (r, what) in [
                (crate::schedule::ShareReason::Panic, "panic mode: planned like static routing"),
                (crate::schedule::ShareReason::FailingInPanic, "panic mode: fails nearly everything, a probe's share"),
            ] {
                span {
                    span style=(format!("background:{};", reason_color(r).unwrap_or("#fff"))) { "\u{A0}\u{A0}\u{A0}" }
                    " " (what)
                }
            }
        }
    }
}

/// One channel's chart: the plot area (`w` × `h`) over `dur` seconds, with
/// a state band `band` high under it.
pub(super) struct Chart {
    pub(super) w: f64,
    pub(super) h: f64,
    pub(super) band: f64,
    pub(super) dur: f64,
}

/// A coordinate as the chart writes it.
fn at(v: f64) -> String {
    format!("{v:.1}")
}

impl Chart {
    pub(super) fn x(&self, t: f64) -> f64 {
        40.0 + (t / self.dur) * (self.w - 60.0)
    }

    pub(super) fn y(&self, v: f64) -> f64 {
        10.0 + (1.0 - v.clamp(0.0, 1.0)) * (self.h - 20.0)
    }

    /// A series as a polyline's points (samples without a value skipped).
    fn points(
        &self,
        samples: &[crate::sim::Sample],
        stride: usize,
        f: impl Fn(&crate::sim::Sample) -> Option<f64>,
    ) -> String {
        let pts: Vec<String> = samples
            .iter()
            .step_by(stride)
            .filter_map(|s| f(s).map(|v| format!("{:.1},{:.1}", self.x(s.t_s), self.y(v))))
            .collect();
        pts.join(" ")
    }

    /// Fault windows, the state band, weight, share and score, time ticks.
    /// Every SVG element is closed explicitly: inside HTML an unclosed one
    /// would hold the ones after it.
    pub(super) fn svg(
        &self,
        c: &crate::sim::scenario::SimChannel,
        samples: &[crate::sim::Sample],
    ) -> Markup {
        let (w, h, band, dur) = (self.w, self.h, self.band, self.dur);
        let stride = (samples.len() / 1500).max(1);
        let bands = (0..samples.len()).step_by(stride).map(|i| {
            let s = samples[i];
            let next_t = samples.get(i + stride).map_or(s.t_s + 5.0, |n| n.t_s);
            let width = (self.x(next_t) - self.x(s.t_s)).max(0.5);
            (
                at(self.x(s.t_s)),
                format!("{width:.2}"),
                state_color(s.state),
            )
        });
        let why = (0..samples.len()).step_by(stride).filter_map(|i| {
            let s = samples[i];
            let next_t = samples.get(i + stride).map_or(s.t_s + 5.0, |n| n.t_s);
            let width = (self.x(next_t) - self.x(s.t_s)).max(0.5);
            reason_color(s.reason).map(|fill| (at(self.x(s.t_s)), format!("{width:.2}"), fill))
        });
        let ticks = 6;
        let strip = band / 2.0;
        html! {
            svg width=(w) height=(h + band + strip + 20.0) xmlns="http://www.w3.org/2000/svg" {
                @for f in &c.faults {
                    rect x=(at(self.x(f.start_s))) y="0"
                        width=(at((self.x(f.end_s.min(dur)) - self.x(f.start_s)).max(1.0)))
                        height=(h + band) fill="#fde2e2" {}
                }
                line x1="40" y1=(self.y(0.0)) x2=(w - 20.0) y2=(self.y(0.0)) stroke="#bbb" {}
                text x="5" y=(format!("{:.0}", self.y(1.0) + 4.0)) font-size="10" { "1.0" }
                text x="5" y=(format!("{:.0}", self.y(0.0))) font-size="10" { "0" }
                @for (x, width, fill) in bands {
                    rect x=(x) y=(h) width=(width) height=(band) fill=(fill)
                        shape-rendering="crispEdges" {}
                }
                @for (x, width, fill) in why {
                    rect x=(x) y=(h + band) width=(width) height=(strip) fill=(fill)
                        shape-rendering="crispEdges" {}
                }
                polyline fill="none" stroke="#111" stroke-width="1.3"
                    points=(self.points(samples, stride, |s| Some(s.health_weight))) {}
                polyline fill="none" stroke="#1f77b4" stroke-width="1.3"
                    points=(self.points(samples, stride, |s| Some(s.traffic_share))) {}
                polyline fill="none" stroke="#d62728" stroke-width="1.3"
                    points=(self.points(samples, stride, |s| s.score)) {}
                @for k in 0..=ticks {
                    @let t = dur * k as f64 / ticks as f64;
                    text x=(at(self.x(t))) y=(h + band + strip + 14.0) font-size="10" text-anchor="middle" {
                        (format!("{t:.0} s"))
                    }
                }
            }
        }
    }
}
