//! What the service exports: Prometheus text on `/metrics` and a plain-text
//! status view on `/status` with a state column for every channel.
//!
//! Loops update these in place; the HTTP handler only reads.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// One channel as its partition owner last evaluated it.
#[derive(Debug, Clone, Default)]
pub struct ChannelGauges {
    pub group: String,
    pub state: String,
    pub score: Option<f64>,
    pub health_weight: f64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub error_rate: Option<f64>,
    pub partition: i32,
}

/// One group as its writer last published it.
#[derive(Debug, Clone, Default)]
pub struct GroupGauges {
    pub epoch: u64,
    pub version: u64,
    pub heartbeat_ms: i64,
    /// (class, channel) → weight.
    pub weights: BTreeMap<(String, String), f64>,
    pub shed: BTreeMap<String, f64>,
    pub waiting_for: Vec<String>,
}

/// A Prometheus histogram of durations, in seconds.
pub struct Histogram {
    /// Upper bounds in milliseconds (the `le` labels, in seconds).
    bounds_ms: &'static [i64],
    counts: Vec<AtomicU64>,
    sum_ms: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    pub fn new(bounds_ms: &'static [i64]) -> Histogram {
        Histogram {
            bounds_ms,
            counts: bounds_ms.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_ms: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// Records one duration (negative: a clock step between instances; 0).
    pub fn observe_ms(&self, ms: i64) {
        let ms = ms.max(0);
        for (b, c) in self.bounds_ms.iter().zip(&self.counts) {
            if ms <= *b {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.sum_ms.fetch_add(ms as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, c) in self.bounds_ms.iter().zip(&self.counts) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{}\"}} {}",
                *b as f64 / 1000.0,
                c.load(Ordering::Relaxed)
            );
        }
        let n = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {n}");
        let sum = self.sum_ms.load(Ordering::Relaxed) as f64 / 1000.0;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {n}");
    }
}

/// Buckets of `hermes_decision_publish_seconds` (ms).
const DECISION_BUCKETS_MS: &[i64] = &[5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000];

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new(DECISION_BUCKETS_MS)
    }
}

#[derive(Default)]
pub struct Metrics {
    /// Record that changed a channel's state handled → the snapshot
    /// carrying it acknowledged by Redis (Hermes' own share of a drain's
    /// path to the gateways).
    pub decision_publish: Histogram,
    pub events_consumed: AtomicU64,
    pub events_applied: AtomicU64,
    pub events_replayed: AtomicU64,
    pub duplicates: AtomicU64,
    pub too_late: AtomicU64,
    pub alerts_produced: AtomicU64,
    pub health_reports: AtomicU64,
    pub health_reports_undelivered: AtomicU64,
    /// Alerts, dead letters and health reports acknowledged by Kafka.
    pub outputs_delivered: AtomicU64,
    /// Alerts and dead letters Kafka did not take (the request loop stops).
    pub outputs_undelivered: AtomicU64,
    pub snapshots_written: AtomicU64,
    pub snapshot_heartbeats: AtomicU64,
    pub snapshot_failures: AtomicU64,
    pub snapshots_refused_stale: AtomicU64,
    pub commits: AtomicU64,
    pub config_reloads: AtomicU64,
    pub config_reload_rejected: AtomicU64,
    dead_letters: Mutex<BTreeMap<&'static str, u64>>,
    channels: Mutex<BTreeMap<String, ChannelGauges>>,
    weight_changes: Mutex<BTreeMap<String, u64>>,
    groups: Mutex<BTreeMap<String, GroupGauges>>,
    /// Request partition → lag in records.
    lag: Mutex<BTreeMap<i32, i64>>,
    /// Request partitions this instance holds.
    owned: Mutex<std::collections::BTreeSet<i32>>,
    /// What `/readyz` answers.
    pub readiness: Readiness,
}

/// A dependency `/readyz` reports on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Dependency {
    /// The request consumer's brokers (librdkafka's statistics: a broker up).
    Kafka,
    /// The health topic the group writers read.
    HealthTopic,
    /// Redis, for snapshots and saved state.
    Redis,
    /// The Schema Registry (a partition waits at a record it cannot decode
    /// without it).
    SchemaRegistry,
    /// Hermes' four topics exist.
    Topics,
}

impl Dependency {
    pub fn as_str(self) -> &'static str {
        match self {
            Dependency::Kafka => "kafka",
            Dependency::HealthTopic => "health_topic",
            Dependency::Redis => "redis",
            Dependency::SchemaRegistry => "schema_registry",
            Dependency::Topics => "topics",
        }
    }
}

/// Each dependency's last known problem, and the request loop's progress.
/// A dependency never seen failing counts as fine: readiness says what is
/// known to be wrong, with the reason.
#[derive(Default)]
pub struct Readiness {
    problems: Mutex<BTreeMap<Dependency, String>>,
    /// The request loop received an assignment (possibly empty).
    assigned: std::sync::atomic::AtomicBool,
    /// Owned partitions still replaying or catching up.
    catching_up: std::sync::atomic::AtomicU32,
}

impl Readiness {
    /// Records a dependency's state: `Some(problem)` or fine. Logs once
    /// per change (a dependency that stays down is not a log line per
    /// retry). `target` names the address tried.
    pub fn set(&self, dep: Dependency, target: &str, problem: Option<String>) {
        let mut problems = lock(&self.problems);
        match problem {
            Some(p) => {
                if problems.get(&dep) != Some(&p) {
                    tracing::warn!(dependency = dep.as_str(), %target, problem = %p, "dependency unavailable; retrying");
                    problems.insert(dep, p);
                }
            }
            None => {
                if problems.remove(&dep).is_some() {
                    tracing::info!(dependency = dep.as_str(), %target, "dependency available again");
                }
            }
        }
    }

    pub fn set_assigned(&self) {
        self.assigned.store(true, Ordering::Relaxed);
    }

    pub fn set_catching_up(&self, partitions: u32) {
        self.catching_up.store(partitions, Ordering::Relaxed);
    }

    /// `Ok` when ready; otherwise every reason it is not.
    pub fn check(&self) -> Result<(), Vec<String>> {
        let mut reasons: Vec<String> = lock(&self.problems)
            .iter()
            .map(|(d, p)| format!("{}: {p}", d.as_str()))
            .collect();
        if !self.assigned.load(Ordering::Relaxed) {
            reasons.push("no partition assignment received yet".into());
        }
        let n = self.catching_up.load(Ordering::Relaxed);
        if n > 0 {
            reasons.push(format!("{n} partition(s) still replaying or catching up"));
        }
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(reasons)
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    pub fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn dead_letter(&self, kind: &'static str) {
        *lock(&self.dead_letters).entry(kind).or_default() += 1;
    }

    pub fn dead_letters_total(&self) -> u64 {
        lock(&self.dead_letters).values().sum()
    }

    pub fn set_channel(&self, id: &str, g: ChannelGauges) {
        lock(&self.channels).insert(id.to_string(), g);
    }

    /// Every channel's state as its owner last evaluated it.
    pub fn channel_states(&self) -> BTreeMap<String, String> {
        lock(&self.channels)
            .iter()
            .map(|(id, g)| (id.clone(), g.state.clone()))
            .collect()
    }

    pub fn forget_partition(&self, partition: i32) {
        lock(&self.channels).retain(|_, g| g.partition != partition);
        lock(&self.lag).remove(&partition);
    }

    pub fn set_owned(&self, owned: std::collections::BTreeSet<i32>) {
        *lock(&self.owned) = owned;
    }

    pub fn set_lag(&self, partition: i32, lag: i64) {
        lock(&self.lag).insert(partition, lag);
    }

    pub fn set_group(&self, group: &str, g: GroupGauges) {
        let mut groups = lock(&self.groups);
        if let Some(old) = groups.get(group) {
            let mut changes = lock(&self.weight_changes);
            for (k, w) in &g.weights {
                if old.weights.get(k).is_some_and(|o| (o - w).abs() > 1e-9) {
                    *changes.entry(k.1.clone()).or_default() += 1;
                }
            }
        }
        groups.insert(group.to_string(), g);
    }

    pub fn set_group_waiting(&self, group: &str, waiting: Vec<String>) {
        lock(&self.groups)
            .entry(group.to_string())
            .or_default()
            .waiting_for = waiting;
    }

    pub fn forget_group(&self, group: &str) {
        lock(&self.groups).remove(group);
    }

    /// Prometheus text exposition format 0.0.4.
    pub fn render_prometheus(&self) -> String {
        let mut s = String::new();
        self.render_counters(&mut s);
        self.render_instance(&mut s);
        self.render_channels(&mut s);
        self.render_groups(&mut s);
        s
    }

    /// The process-wide counters.
    /// Every plain counter: name, help, value.
    fn counters(&self) -> [(&'static str, &'static str, &AtomicU64); 17] {
        [
            ("hermes_outputs_delivered_total", "Output records (alerts, dead letters, health reports) acknowledged.", &self.outputs_delivered),
            ("hermes_outputs_undelivered_total", "Alerts and dead letters Kafka did not take; the instance stops without committing past them.", &self.outputs_undelivered),
            ("hermes_health_reports_undelivered_total", "Health reports not delivered (best effort: the next one replaces them).", &self.health_reports_undelivered),
            (
                "hermes_events_consumed_total",
                "Records read from the request topic.",
                &self.events_consumed,
            ),
            (
                "hermes_events_applied_total",
                "Events applied to the engine.",
                &self.events_applied,
            ),
            (
                "hermes_events_replayed_total",
                "Events re-applied to rebuild windows after an assignment.",
                &self.events_replayed,
            ),
            (
                "hermes_events_duplicate_total",
                "Events ignored as duplicates (same event id).",
                &self.duplicates,
            ),
            (
                "hermes_events_too_late_total",
                "Events older than the allowed lateness.",
                &self.too_late,
            ),
            (
                "hermes_alerts_produced_total",
                "Alert events produced.",
                &self.alerts_produced,
            ),
            (
                "hermes_health_reports_total",
                "Health reports produced to the health topic.",
                &self.health_reports,
            ),
            (
                "hermes_snapshots_written_total",
                "New snapshot versions written to Redis.",
                &self.snapshots_written,
            ),
            (
                "hermes_snapshot_heartbeats_total",
                "Snapshot heartbeat refreshes.",
                &self.snapshot_heartbeats,
            ),
            (
                "hermes_snapshot_failures_total",
                "Snapshot writes that failed after retries.",
                &self.snapshot_failures,
            ),
            (
                "hermes_snapshots_refused_stale_total",
                "Snapshot writes refused because a newer writer owns the group.",
                &self.snapshots_refused_stale,
            ),
            (
                "hermes_offset_commits_total",
                "Offset commits.",
                &self.commits,
            ),
            (
                "hermes_config_reloads_total",
                "Config reloads applied.",
                &self.config_reloads,
            ),
            (
                "hermes_config_reloads_rejected_total",
                "Config reloads refused (invalid file).",
                &self.config_reload_rejected,
            ),
        ]
    }

    fn render_counters(&self, s: &mut String) {
        for (name, help, c) in self.counters() {
            let _ = writeln!(
                s,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                c.load(Ordering::Relaxed)
            );
        }
    }

    /// Decision latency, dead letters, partitions held and consumer lag.
    fn render_instance(&self, s: &mut String) {
        self.decision_publish.render(
            "hermes_decision_publish_seconds",
            "From handling the record that changed a channel's state to Redis acknowledging the snapshot that carries it.",
            s,
        );
        let _ = writeln!(s, "# HELP hermes_dead_letters_total Records sent to the dead-letter topic, by reason kind.\n# TYPE hermes_dead_letters_total counter");
        for (k, n) in lock(&self.dead_letters).iter() {
            let _ = writeln!(s, "hermes_dead_letters_total{{kind=\"{k}\"}} {n}");
        }
        let _ = writeln!(s, "# HELP hermes_partition_assigned Request partitions this instance holds.\n# TYPE hermes_partition_assigned gauge");
        for p in lock(&self.owned).iter() {
            let _ = writeln!(s, "hermes_partition_assigned{{partition=\"{p}\"}} 1");
        }
        let _ = writeln!(s, "# HELP hermes_consumer_lag Records between the last applied offset and the high watermark.\n# TYPE hermes_consumer_lag gauge");
        for (p, lag) in lock(&self.lag).iter() {
            let _ = writeln!(s, "hermes_consumer_lag{{partition=\"{p}\"}} {lag}");
        }
    }

    /// Per channel this instance evaluates: score, weight factor, latency,
    /// error rate and state.
    fn render_channels(&self, s: &mut String) {
        let channels = lock(&self.channels).clone();
        let gauge =
            |s: &mut String, name: &str, help: &str, f: &dyn Fn(&ChannelGauges) -> Option<f64>| {
                let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge");
                for (id, g) in &channels {
                    if let Some(v) = f(g) {
                        let _ = writeln!(
                            s,
                            "{name}{{group=\"{}\",channel=\"{}\"}} {v}",
                            esc(&g.group),
                            esc(id)
                        );
                    }
                }
            };
        gauge(
            s,
            "hermes_channel_score",
            "Health score (0 healthy .. 1 failing).",
            &|g| g.score,
        );
        gauge(
            s,
            "hermes_channel_health_weight",
            "State-machine weight factor.",
            &|g| Some(g.health_weight),
        );
        gauge(
            s,
            "hermes_channel_p50_ms",
            "Latency P50 over the short window.",
            &|g| g.p50_ms,
        );
        gauge(
            s,
            "hermes_channel_p99_ms",
            "Latency P99 over the short window.",
            &|g| g.p99_ms,
        );
        gauge(
            s,
            "hermes_channel_error_rate",
            "Hard-failure rate over the short window.",
            &|g| g.error_rate,
        );
        let _ = writeln!(s, "# HELP hermes_channel_state 1 for the channel's current state.\n# TYPE hermes_channel_state gauge");
        for (id, g) in &channels {
            let _ = writeln!(
                s,
                "hermes_channel_state{{group=\"{}\",channel=\"{}\",state=\"{}\"}} 1",
                esc(&g.group),
                esc(id),
                g.state
            );
        }
    }

    /// Per group this instance writes: published weights, shed shares,
    /// snapshot versions; and weight changes.
    fn render_groups(&self, s: &mut String) {
        let groups = lock(&self.groups).clone();
        let _ = writeln!(s, "# HELP hermes_channel_weight Published routing weight per class.\n# TYPE hermes_channel_weight gauge");
        for (group, g) in &groups {
            for ((class, channel), w) in &g.weights {
                let _ = writeln!(
                    s,
                    "hermes_channel_weight{{group=\"{}\",class=\"{class}\",channel=\"{}\"}} {w}",
                    esc(group),
                    esc(channel)
                );
            }
        }
        let _ = writeln!(s, "# HELP hermes_channel_weight_changes_total Published weight changes.\n# TYPE hermes_channel_weight_changes_total counter");
        for (channel, n) in lock(&self.weight_changes).iter() {
            let _ = writeln!(
                s,
                "hermes_channel_weight_changes_total{{channel=\"{}\"}} {n}",
                esc(channel)
            );
        }
        let _ = writeln!(s, "# HELP hermes_group_shed Published share of a class's requests to shed.\n# TYPE hermes_group_shed gauge");
        for (group, g) in &groups {
            for (class, x) in &g.shed {
                let _ = writeln!(
                    s,
                    "hermes_group_shed{{group=\"{}\",class=\"{class}\"}} {x}",
                    esc(group)
                );
            }
        }
        let _ = writeln!(s, "# HELP hermes_group_snapshot_version Version of the last snapshot written.\n# TYPE hermes_group_snapshot_version gauge");
        for (group, g) in &groups {
            let _ = writeln!(
                s,
                "hermes_group_snapshot_version{{group=\"{}\",epoch=\"{}\"}} {}",
                esc(group),
                g.epoch,
                g.version
            );
        }
    }

    /// The status view: one line per channel this instance evaluates, then
    /// the groups it writes.
    pub fn render_status(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<16} {:<12} {:<11} {:>6} {:>7} {:>8} {:>7} {:>5}",
            "channel", "group", "state", "score", "weight", "p99_ms", "err_%", "part"
        );
        for (id, g) in lock(&self.channels).iter() {
            let _ = writeln!(
                s,
                "{:<16} {:<12} {:<11} {:>6} {:>7.2} {:>8} {:>7} {:>5}",
                id,
                g.group,
                g.state,
                g.score.map_or("-".into(), |v| format!("{v:.2}")),
                g.health_weight,
                g.p99_ms.map_or("-".into(), |v| format!("{v:.0}")),
                g.error_rate
                    .map_or("-".into(), |v| format!("{:.1}", v * 100.0)),
                g.partition
            );
        }
        let groups = lock(&self.groups);
        if groups.is_empty() {
            let _ = writeln!(
                s,
                "\nno snapshot written by this instance (warming up, or another instance writes the groups)"
            );
        } else {
            let _ = writeln!(s, "\ngroups written by this instance:");
        }
        for (group, g) in groups.iter() {
            let _ = writeln!(
                s,
                "{group}: epoch {} version {} heartbeat_ms {}{}",
                g.epoch,
                g.version,
                g.heartbeat_ms,
                if g.waiting_for.is_empty() {
                    String::new()
                } else {
                    format!("  (waiting for {})", g.waiting_for.join(", "))
                }
            );
            for ((class, channel), w) in &g.weights {
                let _ = writeln!(s, "  {class:<13} {channel:<16} {w:.3}");
            }
        }
        let _ = writeln!(
            s,
            "\nconsumed {} applied {} dead-lettered {} duplicates {} alerts {}",
            self.events_consumed.load(Ordering::Relaxed),
            self.events_applied.load(Ordering::Relaxed),
            self.dead_letters_total(),
            self.duplicates.load(Ordering::Relaxed),
            self.alerts_produced.load(Ordering::Relaxed)
        );
        s
    }
}

/// Serves `/metrics`, `/status`, `/healthz` (the process answers) and
/// `/readyz` (ready, or 503 with every reason it is not) until the task is
/// dropped.
pub async fn serve(listener: tokio::net::TcpListener, metrics: std::sync::Arc<Metrics>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            // Read the request head (up to a blank line, 8 KiB at most):
            // closing with unread input would reset the connection and
            // truncate the response.
            let mut buf = Vec::with_capacity(1024);
            let mut chunk = [0u8; 1024];
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 8192 {
                match tokio::time::timeout_at(deadline, sock.read(&mut chunk)).await {
                    Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
                    Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let n = buf.len();
            let req = String::from_utf8_lossy(&buf[..n]);
            let path = req.split_whitespace().nth(1).unwrap_or("/");
            let (status, ctype, body) = match path {
                "/metrics" => (
                    "200 OK",
                    "text/plain; version=0.0.4",
                    metrics.render_prometheus(),
                ),
                "/status" | "/" => (
                    "200 OK",
                    "text/plain; charset=utf-8",
                    metrics.render_status(),
                ),
                "/healthz" => ("200 OK", "text/plain", "ok\n".to_string()),
                "/readyz" => match metrics.readiness.check() {
                    Ok(()) => ("200 OK", "text/plain", "ready\n".to_string()),
                    Err(reasons) => (
                        "503 Service Unavailable",
                        "text/plain",
                        format!("not ready:\n{}\n", reasons.join("\n")),
                    ),
                },
                _ => ("404 Not Found", "text/plain", "not found\n".to_string()),
            };
            let head = format!(
                "HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = sock.write_all(head.as_bytes()).await;
            let _ = sock.write_all(body.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_head_split_over_two_writes_gets_the_whole_response() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let server = tokio::spawn(serve(l, std::sync::Arc::new(Metrics::default())));
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /met").await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        c.write_all(b"rics HTTP/1.0\r\nAccept: */*\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        assert!(out.contains("hermes_events_consumed_total 0"), "{out}");
        server.abort();
    }

    #[test]
    fn exposition_has_a_state_line_per_channel_and_counts_weight_changes() {
        let m = Metrics::default();
        m.set_channel(
            "free",
            ChannelGauges {
                group: "chat".into(),
                state: "DRAINED".into(),
                score: Some(0.9),
                ..Default::default()
            },
        );
        let mut g = GroupGauges::default();
        g.weights.insert(("CORE".into(), "free".into()), 0.3);
        m.set_group("chat", g.clone());
        g.weights.insert(("CORE".into(), "free".into()), 0.0);
        g.shed.insert("BATCH".into(), 0.25);
        m.set_group("chat", g);
        m.dead_letter("malformed");
        let text = m.render_prometheus();
        assert!(text
            .contains("hermes_channel_state{group=\"chat\",channel=\"free\",state=\"DRAINED\"} 1"));
        assert!(text.contains("hermes_channel_weight_changes_total{channel=\"free\"} 1"));
        assert!(text.contains("hermes_dead_letters_total{kind=\"malformed\"} 1"));
        assert!(text.contains("hermes_group_shed{group=\"chat\",class=\"BATCH\"} 0.25"));
        assert!(m.render_status().contains("DRAINED"));
    }
}
