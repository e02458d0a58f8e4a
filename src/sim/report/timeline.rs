//! The drill's HTML timeline: weight, state and score per channel over the
//! run, one self-contained page.

use super::*;

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

/// A self-contained HTML page: per channel, health weight, traffic share and
/// score over time, the state as a colored band, the fault window shaded.
pub fn timeline_html(sc: &Scenario, run: &RunResult, report: &Report) -> String {
    let chart = Chart {
        w: 1000.0,
        h: 140.0,
        band: 14.0,
        dur: sc.duration_s.max(1.0),
    };
    let mut out = timeline_head(sc);
    for (j, c) in sc.channels.iter().enumerate() {
        out.push_str(&format!(
            "<h2>{} ({}, capacity {} rps)</h2>",
            escape_html(&c.id),
            c.tier.as_str(),
            c.capacity_rps
        ));
        out.push_str(&chart.svg(c, &run.channels[j].samples));
    }
    out.push_str("<h2>Report</h2><pre>");
    out.push_str(&escape_html(&table(report)));
    out.push_str("</pre></body></html>\n");
    out
}

/// The page head, title and legend.
pub(super) fn timeline_head(sc: &Scenario) -> String {
    let mut out = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Hermes drill</title><style>\
         body{font-family:sans-serif;margin:20px;color:#222} h2{margin:18px 0 4px;font-size:16px}\
         .legend span{display:inline-block;margin-right:14px;font-size:13px} pre{background:#f6f6f6;padding:8px;font-size:12px}\
         </style></head><body>",
    );
    out.push_str(&format!(
        "<h1>Drill: {}</h1><p>{}</p>",
        escape_html(&sc.name),
        escape_html(&sc.description)
    ));
    out.push_str("<div class=\"legend\"><span style=\"color:#111\">&#9644; health weight</span><span style=\"color:#1f77b4\">&#9644; traffic share</span><span style=\"color:#d62728\">&#9644; score</span><span style=\"background:#fde2e2\">&nbsp;fault window&nbsp;</span>");
    for s in [
        crate::state::StateKind::Healthy,
        crate::state::StateKind::AtRisk,
        crate::state::StateKind::Drained,
        crate::state::StateKind::Observing,
        crate::state::StateKind::Recovering,
    ] {
        out.push_str(&format!(
            "<span><span style=\"background:{};\">&nbsp;&nbsp;&nbsp;</span> {}</span>",
            state_color(s),
            s
        ));
    }
    out.push_str("</div>");
    out
}

/// One channel's chart: the plot area (`w` × `h`) over `dur` seconds, with
/// a state band `band` high under it.
pub(super) struct Chart {
    pub(super) w: f64,
    pub(super) h: f64,
    pub(super) band: f64,
    pub(super) dur: f64,
}

impl Chart {
    pub(super) fn x(&self, t: f64) -> f64 {
        40.0 + (t / self.dur) * (self.w - 60.0)
    }

    pub(super) fn y(&self, v: f64) -> f64 {
        10.0 + (1.0 - v.clamp(0.0, 1.0)) * (self.h - 20.0)
    }

    /// Fault windows, the state band, weight, share and score, time ticks.
    pub(super) fn svg(
        &self,
        c: &crate::sim::scenario::SimChannel,
        samples: &[crate::sim::Sample],
    ) -> String {
        let (w, h, band, dur) = (self.w, self.h, self.band, self.dur);
        let stride = (samples.len() / 1500).max(1);
        let mut out = format!(
            "<svg width=\"{w}\" height=\"{}\" xmlns=\"http://www.w3.org/2000/svg\">",
            h + band + 20.0
        );
        for f in &c.faults {
            out.push_str(&format!(
                "<rect x=\"{:.1}\" y=\"0\" width=\"{:.1}\" height=\"{}\" fill=\"#fde2e2\"/>",
                self.x(f.start_s),
                (self.x(f.end_s.min(dur)) - self.x(f.start_s)).max(1.0),
                h + band
            ));
        }
        out.push_str(&format!(
            "<line x1=\"40\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"#bbb\"/>",
            self.y(0.0),
            w - 20.0
        ));
        out.push_str(&format!("<text x=\"5\" y=\"{:.0}\" font-size=\"10\">1.0</text><text x=\"5\" y=\"{:.0}\" font-size=\"10\">0</text>", self.y(1.0) + 4.0, self.y(0.0)));
        for i in (0..samples.len()).step_by(stride) {
            let s = samples[i];
            let next_t = samples.get(i + stride).map_or(s.t_s + 5.0, |n| n.t_s);
            out.push_str(&format!(
                "<rect x=\"{:.1}\" y=\"{}\" width=\"{:.2}\" height=\"{band}\" fill=\"{}\" shape-rendering=\"crispEdges\"/>",
                self.x(s.t_s),
                h,
                (self.x(next_t) - self.x(s.t_s)).max(0.5),
                state_color(s.state)
            ));
        }
        let line = |f: &dyn Fn(&crate::sim::Sample) -> Option<f64>, color: &str| {
            let pts: Vec<String> = samples
                .iter()
                .step_by(stride)
                .filter_map(|s| f(s).map(|v| format!("{:.1},{:.1}", self.x(s.t_s), self.y(v))))
                .collect();
            format!(
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.3\" points=\"{}\"/>",
                pts.join(" ")
            )
        };
        out.push_str(&line(&|s| Some(s.health_weight), "#111"));
        out.push_str(&line(&|s| Some(s.traffic_share), "#1f77b4"));
        out.push_str(&line(&|s| s.score, "#d62728"));
        let ticks = 6;
        for k in 0..=ticks {
            let t = dur * k as f64 / ticks as f64;
            out.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{}\" font-size=\"10\" text-anchor=\"middle\">{:.0} s</text>",
                self.x(t),
                h + band + 14.0,
                t
            ));
        }
        out.push_str("</svg>");
        out
    }
}

/// Text safe inside HTML elements and quoted attributes (ids and names
/// come from config files and the alert stream).
pub fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}
