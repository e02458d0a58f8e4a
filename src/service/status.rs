//! The status view, one table for two scopes: the whole fleet read from
//! Redis (`hermes status`, no instance needed) and one instance's own
//! channels and groups (`/status`). Both have the same columns and the same
//! JSON (`--json`, `?format=json`).

use super::overrides::{Action, Overrides};
use super::state_store::SavedState;
use crate::publish::WeightSnapshot;
use crate::wall_clock::{age, utc};
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;

/// One route group.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupRow {
    pub group: String,
    /// The writer's epoch (a takeover takes a higher one); `None` before a
    /// first snapshot.
    pub epoch: Option<u64>,
    pub version: Option<u64>,
    /// Wall time since the snapshot was last written or refreshed.
    pub age_ms: Option<i64>,
    /// Weights frozen by an operator (manual mode).
    pub manual: bool,
    /// In panic mode (a correlated failure: health does not route) since
    /// this event time.
    #[serde(default)]
    pub panic_since_ms: Option<i64>,
    /// Class → share of its requests the gateways shed.
    pub shed: BTreeMap<String, f64>,
    pub projected_spend_per_hour: Option<f64>,
    /// Anything else an operator should know (warming up, frozen by whom).
    pub note: Option<String>,
}

/// One channel.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChannelRow {
    pub channel: String,
    pub group: String,
    pub state: String,
    pub score: Option<f64>,
    /// The score's largest contributions, largest first.
    pub signals: Vec<(String, f64)>,
    /// Class → published routing weight.
    pub weights: BTreeMap<String, f64>,
    /// Why the plan gave it its share (`schedule::ShareReason`): in panic
    /// mode, why it carries weight while it scores badly.
    #[serde(default)]
    pub plan: Option<String>,
    /// The operator pin in force: what, by whom, why, until when.
    pub pin: Option<String>,
}

/// The whole view.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusView {
    /// Where it was read (`redis …` or `instance …`).
    pub source: String,
    pub generated_ms: i64,
    pub groups: Vec<GroupRow>,
    pub channels: Vec<ChannelRow>,
}

/// What each column means, printed under the tables.
const LEGEND: &str = "\
STATE   the channel's health state machine (HEALTHY, AT_RISK, DRAINED, OBSERVING, RECOVERING)
SCORE   0 healthy .. 1 failing; WHY: the signals adding most to it
WEIGHTS published routing weight per traffic class (what gateways read); SHED: share of a class shed
PLAN    why the plan gave it that share; panic: the group fails as a whole (MODE PANIC), so it is
        planned like static routing whatever its score; failing_in_panic: it fails nearly
        everything, so it gets only a probe's share and the rest is shed
AGE     since the writer last wrote or refreshed the snapshot (gateways alarm after 3 heartbeats)
";

fn fmt_weights(w: &BTreeMap<String, f64>) -> String {
    if w.is_empty() {
        return "-".into();
    }
    w.iter()
        .map(|(c, x)| format!("{c}={x:.2}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A group's mode: frozen by an operator, in panic since when, or auto.
fn mode(g: &GroupRow) -> String {
    match (g.manual, g.panic_since_ms) {
        (true, _) => "FROZEN".into(),
        (false, Some(t)) => format!("PANIC since {}", utc(t)),
        (false, None) => "auto".into(),
    }
}

impl StatusView {
    /// The tables for people, with the legend.
    pub fn render(&self) -> String {
        use crate::present::{Align, Table};
        let mut s = String::new();
        let _ = writeln!(s, "{} at {}\n", self.source, utc(self.generated_ms));
        if self.groups.is_empty() {
            let _ = writeln!(s, "no group written yet (no snapshot here)");
        } else {
            let mut groups = Table::new(&[
                ("GROUP", Align::Left),
                ("WRITER EPOCH", Align::Right),
                ("VERSION", Align::Right),
                ("AGE", Align::Right),
                ("MODE", Align::Left),
                ("SHED", Align::Left),
                ("SPEND/h", Align::Right),
                ("NOTE", Align::Left),
            ]);
            for g in &self.groups {
                let shed: BTreeMap<String, f64> = g
                    .shed
                    .iter()
                    .filter(|(_, x)| **x > 0.0)
                    .map(|(c, x)| (c.clone(), *x))
                    .collect();
                groups.row([
                    g.group.clone(),
                    g.epoch.map_or("-".into(), |e| e.to_string()),
                    g.version.map_or("-".into(), |v| v.to_string()),
                    g.age_ms.map_or("-".into(), age),
                    mode(g),
                    fmt_weights(&shed),
                    g.projected_spend_per_hour
                        .map_or("-".into(), |x| format!("{x:.2}")),
                    g.note.clone().unwrap_or_default(),
                ]);
            }
            s.push_str(&groups.render());
        }
        let mut channels = Table::new(&[
            ("CHANNEL", Align::Left),
            ("GROUP", Align::Left),
            ("STATE", Align::Left),
            ("SCORE", Align::Right),
            ("WHY (top signals)", Align::Left),
            ("WEIGHTS", Align::Left),
            ("PLAN", Align::Left),
            ("PIN", Align::Left),
        ])
        .min_width(0, 16)
        .min_width(1, 12)
        .min_width(2, 10);
        for c in &self.channels {
            channels.row([
                c.channel.clone(),
                c.group.clone(),
                c.state.clone(),
                c.score.map_or("-".into(), |v| format!("{v:.2}")),
                crate::present::fmt_signals(&c.signals),
                fmt_weights(&c.weights),
                c.plan.clone().unwrap_or_else(|| "-".into()),
                c.pin.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
        let _ = write!(s, "\n{}", channels.render());
        let _ = write!(s, "\n{LEGEND}");
        s
    }

    /// The pin column and the frozen note from the operators' overrides.
    pub fn with_overrides(mut self, o: &Overrides) -> StatusView {
        let now = self.generated_ms;
        for c in &mut self.channels {
            if let Some(ov) = o.channels.get(&c.channel) {
                if ov.action != Action::Clear && ov.live_at(now) {
                    c.pin = Some(ov.note());
                }
            }
        }
        for g in &mut self.groups {
            if let Some(ov) = o.groups.get(&g.group) {
                if ov.action == Action::Freeze && ov.live_at(now) {
                    g.note = Some(ov.note());
                }
            }
        }
        self
    }

    /// Rows from a group's snapshot and its saved state machines.
    pub fn add_group(
        &mut self,
        group: &str,
        snap: Option<WeightSnapshot>,
        machines: BTreeMap<String, SavedState>,
    ) {
        let mut row = GroupRow {
            group: group.to_string(),
            ..Default::default()
        };
        let mut channels: BTreeMap<String, ChannelRow> = BTreeMap::new();
        if let Some(snap) = &snap {
            row.epoch = Some(snap.epoch);
            row.version = Some(snap.version);
            row.age_ms = Some((self.generated_ms - snap.heartbeat_ms).max(0));
            row.manual = snap.manual;
            row.panic_since_ms = snap.panic_since_ms;
            row.projected_spend_per_hour = Some(snap.projected_spend_per_hour);
            for (class, cw) in &snap.classes {
                row.shed.insert(class.clone(), cw.shed);
                for (ch, w) in &cw.weights {
                    channels
                        .entry(ch.clone())
                        .or_default()
                        .weights
                        .insert(class.clone(), *w);
                }
            }
            for (ch, st) in &snap.channels {
                let c = channels.entry(ch.clone()).or_default();
                c.state = st.state.clone();
                c.plan = Some(st.reason.clone());
                c.score = st.score;
                c.signals = st.signals.clone();
            }
        } else {
            row.note = Some("no snapshot: warming up, or no writer".into());
        }
        // The owner saves a machine on every change: fresher than the
        // state the writer last planned with.
        for (ch, saved) in machines {
            let c = channels.entry(ch.clone()).or_default();
            c.state = saved.machine.kind().as_str().to_string();
            c.pin = saved.machine.pin().map(|p| describe_pin(&p));
        }
        for (id, mut c) in channels {
            c.channel = id;
            c.group = group.to_string();
            self.channels.push(c);
        }
        self.groups.push(row);
    }
}

impl StatusView {
    /// The fleet as the Redis at `url` holds it: every group with a
    /// snapshot or saved state machines, every channel in them, and the
    /// overrides (`hermes status`; needs no instance). Connecting and each
    /// answer wait at most 3 s.
    pub async fn from_redis(url: &str) -> anyhow::Result<StatusView> {
        use crate::redis_keys::{group_of_key, snapshot_key, GROUP_KEY_PATTERNS};
        use std::collections::BTreeSet;
        let redacted = crate::publish::redact_url(url);
        let client = redis::Client::open(url)
            .map_err(|e| anyhow::anyhow!("bad redis url {redacted}: {e}"))?;
        let cfg = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(std::time::Duration::from_secs(3)))
            .set_response_timeout(Some(std::time::Duration::from_secs(3)));
        let mut c = client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await
            .map_err(|e| anyhow::anyhow!("redis {redacted}: {e}"))?;
        let mut groups = BTreeSet::new();
        for pattern in GROUP_KEY_PATTERNS {
            let opts = redis::ScanOptions::default()
                .with_pattern(pattern)
                .with_count(1000);
            let mut keys = c.scan_options::<String>(opts).await?;
            while let Some(k) = futures_util::StreamExt::next(&mut keys).await {
                groups.extend(group_of_key(&k?).map(str::to_string));
            }
        }
        let mut view = StatusView {
            source: format!("hermes status: redis {redacted}"),
            generated_ms: crate::wall_clock::now_ms(),
            ..Default::default()
        };
        for group in groups {
            let raw: Option<String> = c.get(snapshot_key(&group)).await?;
            let snap = raw.and_then(|r| serde_json::from_str::<WeightSnapshot>(&r).ok());
            let machines = super::state_store::read_saved(&mut c, &[group.as_str()]).await?;
            view.add_group(&group, snap, machines);
        }
        let overrides: BTreeMap<String, String> =
            c.hgetall(crate::redis_keys::OVERRIDES_KEY).await?;
        Ok(view.with_overrides(&Overrides::from_fields(overrides)))
    }
}

/// A pin in force, when no override says who set it.
pub fn describe_pin(p: &crate::state::Pin) -> String {
    let what = match p.kind {
        crate::state::PinKind::Drain => "drain".to_string(),
        crate::state::PinKind::Weight(w) => format!("weight {w}"),
    };
    match p.until_ms {
        Some(t) => format!("{what} until {}", utc(t)),
        None => what,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_explains_itself_and_shows_ages_and_reasons() {
        let view = StatusView {
            source: "test".into(),
            generated_ms: 1_796_136_000_000,
            groups: vec![GroupRow {
                group: "chat".into(),
                epoch: Some(7),
                version: Some(42),
                age_ms: Some(3_000),
                ..Default::default()
            }],
            channels: vec![ChannelRow {
                channel: "free-a".into(),
                group: "chat".into(),
                state: "DRAINED".into(),
                score: Some(0.81),
                signals: vec![("truncation_rate".into(), 0.4)],
                weights: [("CORE".to_string(), 0.0)].into(),
                plan: Some("drained".into()),
                pin: None,
            }],
        };
        let text = view.render();
        assert!(text.contains("2026-12-01T14:40:00Z"), "{text}");
        assert!(text.contains(" drained "), "{text}");
        assert!(text.contains("3s"), "{text}");
        assert!(text.contains("truncation_rate 0.40"), "{text}");
        assert!(text.contains("CORE=0.00"), "{text}");
        assert!(text.contains("SCORE   0 healthy .. 1 failing"), "{text}");
        let json = serde_json::to_string(&view).unwrap();
        assert_eq!(serde_json::from_str::<StatusView>(&json).unwrap(), view);
    }

    #[test]
    fn panic_mode_shows_in_the_group_and_the_channels_plan() {
        let view = StatusView {
            source: "test".into(),
            generated_ms: 1_796_136_000_000,
            groups: vec![GroupRow {
                group: "chat".into(),
                panic_since_ms: Some(1_796_135_940_000),
                ..Default::default()
            }],
            channels: vec![ChannelRow {
                channel: "paid-a".into(),
                group: "chat".into(),
                state: "HEALTHY".into(),
                score: Some(1.0),
                plan: Some("failing_in_panic".into()),
                ..Default::default()
            }],
        };
        let text = view.render();
        assert!(text.contains("PANIC since 2026-12-01T14:39:00Z"), "{text}");
        assert!(text.contains("failing_in_panic"), "{text}");
        assert!(text.contains("PLAN    why the plan"), "{text}");
    }

    #[test]
    fn a_long_why_does_not_run_into_the_weights() {
        let row = |id: &str, signals: Vec<(String, f64)>| ChannelRow {
            channel: id.into(),
            group: "chat".into(),
            state: "DRAINED".into(),
            score: Some(0.83),
            signals,
            weights: [("CORE".to_string(), 0.0), ("BATCH".to_string(), 0.0)].into(),
            plan: None,
            pin: None,
        };
        let long = vec![
            ("bad_outcome_rate".into(), 0.51),
            ("p99_latency_ms".into(), 0.25),
            ("long_p99_latency_ms".into(), 0.05),
        ];
        let view = StatusView {
            source: "test".into(),
            generated_ms: 0,
            groups: vec![],
            channels: vec![row("free-a", long), row("paid-a", vec![])],
        };
        let text = view.render();
        let lines: Vec<&str> = text.lines().collect();
        let header = lines.iter().find(|l| l.starts_with("CHANNEL")).unwrap();
        let at = header.find("WEIGHTS").unwrap();
        for id in ["free-a", "paid-a"] {
            let l = lines.iter().find(|l| l.starts_with(id)).unwrap();
            assert_eq!(l.find("BATCH=").unwrap(), at, "{text}");
            assert!(l[..at].ends_with("  ") || l[..at].ends_with(' '), "{text}");
        }
    }
}
