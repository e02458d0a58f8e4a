//! `hermes replay`: recorded request events (an Avro object container file)
//! through a config, to see the decisions a threshold change would have made
//! before rolling it out. The events drive the same `Composition` as the service.

use crate::alert::AlertKind;
use crate::composition::Composition;
use crate::config::Config;
use crate::event::RequestEvent;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One state transition as replayed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    pub event_time_ms: i64,
    pub from: String,
    pub to: String,
    pub reason: String,
    pub severity: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChannelDecisions {
    pub id: String,
    pub final_state: String,
    pub drains: u32,
    pub decisions: Vec<Decision>,
}

/// What a replay reports (`--json` prints exactly this).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayReport {
    pub events: u64,
    pub applied: u64,
    pub decode_errors: u64,
    /// Events the engine refused, by reason.
    pub rejected: BTreeMap<String, u64>,
    /// Event-time range of the applied events (a refused event, such as one
    /// stamped years ahead, is not part of what was replayed).
    pub first_event_ms: Option<i64>,
    pub last_event_ms: Option<i64>,
    pub channels: Vec<ChannelDecisions>,
    pub alerts: BTreeMap<String, u64>,
}

/// Writes encoded request events (bare datums in the current schema) as an
/// object container file.
pub fn write_events<W: std::io::Write>(out: W, datums: &[Vec<u8>]) -> Result<W, String> {
    let mut cfg = serde_avro_fast::ser::SerializerConfig::new(crate::codec::request_schema());
    let mut w = serde_avro_fast::object_container_file_encoding::WriterBuilder::new(&mut cfg)
        .build(out)
        .map_err(|e| e.to_string())?;
    for d in datums {
        w.push_serialized(d, 1).map_err(|e| e.to_string())?;
    }
    w.into_inner().map_err(|e| e.to_string())
}

/// Replays an object container file of request events through `cfg`.
pub fn replay(file: &[u8], cfg: Arc<Config>) -> Result<ReplayReport, String> {
    let mut reader = serde_avro_fast::object_container_file_encoding::Reader::from_slice(file)
        .map_err(|e| format!("not an Avro object container file: {e}"))?;
    let mut composition = Composition::new(cfg.clone());
    let mut report = ReplayReport {
        events: 0,
        applied: 0,
        decode_errors: 0,
        rejected: BTreeMap::new(),
        first_event_ms: None,
        last_event_ms: None,
        channels: Vec::new(),
        alerts: BTreeMap::new(),
    };
    loop {
        let ev: RequestEvent<'_> = match reader.deserialize_next_borrowed() {
            Ok(Some(ev)) => ev,
            Ok(None) => break,
            Err(e) => {
                // A corrupt block ends what can be read of the file.
                report.decode_errors += 1;
                tracing::warn!(error = %e, "stopping replay at an undecodable record");
                break;
            }
        };
        report.events += 1;
        if let Err(e) = crate::codec::validate(&ev) {
            report.decode_errors += 1;
            tracing::debug!(error = %e, "skipping invalid event");
            continue;
        }
        match composition.apply(&ev) {
            Ok(()) => {
                report.applied += 1;
                report.first_event_ms.get_or_insert(ev.event_time_ms);
                report.last_event_ms = Some(
                    report
                        .last_event_ms
                        .map_or(ev.event_time_ms, |l| l.max(ev.event_time_ms)),
                );
            }
            Err(e) => *report.rejected.entry(e.kind().to_string()).or_insert(0) += 1,
        }
    }
    if let Some(last) = report.last_event_ms {
        // Let the last evaluation tick run.
        composition.advance_to(last + cfg.engine.evaluation_interval_ms);
    }
    report.channels = decisions(&composition, &cfg);
    for a in &composition.alerts {
        *report
            .alerts
            .entry(a.kind.as_str().to_string())
            .or_insert(0) += 1;
    }
    Ok(report)
}

/// Every channel's transitions in the replay, and its final state.
fn decisions(composition: &Composition, cfg: &Config) -> Vec<ChannelDecisions> {
    cfg.channels()
        .map(|c| {
            let decisions: Vec<Decision> = composition
                .alerts
                .iter()
                .filter(|a| {
                    a.kind == AlertKind::Transition
                        && a.channel_id.as_deref() == Some(c.id.as_str())
                })
                .map(|a| Decision {
                    event_time_ms: a.event_time_ms,
                    from: a.from_state.clone().unwrap_or_default(),
                    to: a.to_state.clone().unwrap_or_default(),
                    reason: a.reason.clone(),
                    severity: a.severity.as_str().to_string(),
                })
                .collect();
            let idx = composition.engine.channel_index(&c.id);
            ChannelDecisions {
                id: c.id.clone(),
                final_state: idx.map_or("UNKNOWN".into(), |i| {
                    composition.engine.machine(i).kind().as_str().to_string()
                }),
                drains: decisions.iter().filter(|d| d.to == "DRAINED").count() as u32,
                decisions,
            }
        })
        .collect()
}

/// The human-readable replay summary.
pub fn table(r: &ReplayReport) -> String {
    let mut s = format!(
        "{} events, {} applied, {} undecodable, rejected: {:?}\n\n",
        r.events, r.applied, r.decode_errors, r.rejected
    );
    for c in &r.channels {
        s.push_str(&format!(
            "{:<16} final {:<10} drains {}\n",
            c.id, c.final_state, c.drains
        ));
        let t0 = r.first_event_ms.unwrap_or(0);
        for d in &c.decisions {
            s.push_str(&format!(
                "    +{:>8.1} s  {:<10} -> {:<10} {} {}\n",
                (d.event_time_ms - t0) as f64 / 1000.0,
                d.from,
                d.to,
                d.severity,
                d.reason
            ));
        }
    }
    let alerts: Vec<String> = r.alerts.iter().map(|(k, v)| format!("{k}={v}")).collect();
    s.push_str(&format!("\nalerts: {}\n", alerts.join(", ")));
    s
}
