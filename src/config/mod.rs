//! Configuration: one TOML file, validated once, split by lifetime:
//!
//! - [`Config`], the *policy*: engine, signals, states, tiers, classes,
//!   schedule, safety, alerts and the catalogue of groups. The engine, the
//!   scheduler, the simulator and replay run on it; the service reloads it
//!   live (only a window-shape change waits for a restart).
//! - [`Runtime`]: `[kafka]`, `[redis]` and `[service]`, what `hermes run`
//!   connects to and its loops' timers, frozen at start.
//!
//! [`ConfigFile`] is both, as read from a file; only the policy travels
//! through the service's reload channel. The engine never sees an
//! unvalidated value.
//!
//! Health policies layer, most specific last:
//! built-in defaults → `[policy]` → built-in tier defaults → `[tiers.<tier>.policy]`
//! → `[[groups.channels]] policy`. Layers are partial TOML tables deep-merged
//! before one typed deserialization, so a channel can override a single bound
//! (`policy.signals.p99_latency_ms.normal = 900`) and every error names the
//! offending key with its full path.
//!
//! Every default cites where it came from: a section of `docs/decisions.md`
//! or the incident behind it (`docs/decisions.md#incidents`).

mod alerts;
mod catalogue;
mod engine;
mod policy;
mod runtime;
mod schedule;
mod sieve;

pub use alerts::*;
pub use catalogue::*;
pub use engine::*;
pub use policy::*;
pub use runtime::*;
pub use schedule::*;

use crate::event::TrafficClass;
use serde::Deserialize;
use std::collections::BTreeMap;

/// A config problem, naming the key at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct ConfigIssue {
    pub key: String,
    pub reason: String,
}

/// All problems found in one config (validation does not stop at the first).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid config:\n{}", .issues.iter().map(|i| format!("  - {i}")).collect::<Vec<_>>().join("\n"))]
pub struct ConfigError {
    pub issues: Vec<ConfigIssue>,
}

impl ConfigError {
    fn one(key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            issues: vec![ConfigIssue {
                key: key.into(),
                reason: reason.into(),
            }],
        }
    }
}

/// Collects issues with a key prefix.
#[derive(Default)]
struct Issues(Vec<ConfigIssue>);

impl Issues {
    fn push(&mut self, key: impl Into<String>, reason: impl Into<String>) {
        self.0.push(ConfigIssue {
            key: key.into(),
            reason: reason.into(),
        });
    }
    fn positive_ms(&mut self, key: String, v: i64) {
        if v <= 0 {
            self.push(key, format!("must be a positive duration in ms, got {v}"));
        }
    }
    fn fraction(&mut self, key: String, v: f64) {
        if !(0.0..=1.0).contains(&v) || v.is_nan() {
            self.push(key, format!("must be within [0, 1], got {v}"));
        }
    }
    fn non_negative(&mut self, key: String, v: f64) {
        if !(v >= 0.0 && v.is_finite()) {
            self.push(key, format!("must be a finite number >= 0, got {v}"));
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    engine: EngineConfig,
    #[serde(default)]
    alerts: AlertConfig,
    #[serde(default)]
    schedule: ScheduleConfig,
    #[serde(default)]
    safety: SafetyConfig,
    #[serde(default)]
    traffic_classes: ClassPolicies,
    policy: Option<toml::Table>,
    #[serde(default)]
    tiers: BTreeMap<Tier, RawTier>,
    #[serde(default)]
    groups: Vec<RawGroup>,
    #[serde(default)]
    kafka: KafkaConfig,
    #[serde(default)]
    redis: RedisConfig,
    #[serde(default)]
    service: ServiceConfig,
}

/// The validated policy the engine, the scheduler and the simulator run
/// on: everything in the file but the restart-only [`Runtime`].
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub engine: EngineConfig,
    pub alerts: AlertConfig,
    pub schedule: ScheduleConfig,
    pub safety: SafetyConfig,
    pub classes: ClassPolicies,
    pub groups: Vec<GroupConfig>,
}

/// A config file as `hermes run` reads it: the policy and the runtime.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigFile {
    pub policy: Config,
    pub runtime: Runtime,
    /// What the file says that will not do what it seems to: deprecated
    /// keys (each naming its new key) and `[policy]` keys a built-in tier
    /// layer shadows. The config is accepted (`hermes check-config` and
    /// `hermes replay` print them, `hermes run` logs them at start and on
    /// reload).
    pub warnings: Vec<String>,
}

impl ConfigFile {
    /// Reads and validates a config file.
    pub fn from_file(path: &std::path::Path) -> Result<ConfigFile, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::one(path.display().to_string(), format!("cannot read: {e}"))
        })?;
        ConfigFile::from_toml(&text)
    }

    /// Parses and validates config text, every section, and reports every
    /// problem at once (a TOML syntax error alone stops it: past one, the
    /// parser cannot tell what the rest means).
    pub fn from_toml(text: &str) -> Result<ConfigFile, ConfigError> {
        let mut table = text.parse::<toml::Table>().map_err(|e| {
            let key = e
                .span()
                .map(|s| locate(text, s.start))
                .unwrap_or_else(|| "config".into());
            ConfigError::one(key, e.message().to_string())
        })?;
        let mut warnings = migrate_renamed(&mut table);
        let mut v = Issues::default();
        sieve::sieve(&mut table, &mut v);
        warnings.extend(policy::shadowed_by_tiers(&table));
        let parsed = match table.try_into::<RawConfig>() {
            Ok(raw) => Config::resolve(raw, v),
            // The sieve took out every key its type refuses; this is a
            // shape it does not know (reported, never a panic).
            Err(e) => {
                v.push("config", e.message().to_string());
                Err(ConfigError { issues: v.0 })
            }
        };
        parsed
            .map(|mut f| {
                f.warnings = warnings;
                f
            })
            .map_err(|e| e.with_migration_hints().with_lines(text).in_file_order())
    }
}

/// Keys renamed in this release, accepted at their old place until the
/// next one: (old section, key, new section).
const RENAMED_KEYS: &[(&str, &str, &str)] = &[("service", "group_warmup_ms", "schedule")];

/// Moves every renamed key of the file's table to its new place, with a
/// warning per key moved.
fn migrate_renamed(table: &mut toml::Table) -> Vec<String> {
    let mut warnings = Vec::new();
    for (old, key, new) in RENAMED_KEYS {
        let Some(value) = table
            .get_mut(*old)
            .and_then(|t| t.as_table_mut())
            .and_then(|t| t.remove(*key))
        else {
            continue;
        };
        let target = table
            .entry(new.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let Some(target) = target.as_table_mut() else {
            continue;
        };
        if target.contains_key(*key) {
            warnings.push(format!(
                "{old}.{key} is deprecated and ignored: {new}.{key} is set too"
            ));
        } else {
            target.insert(key.to_string(), value);
            warnings.push(format!(
                "{old}.{key} is deprecated: it is read as {new}.{key}; rename it (the old \
                 name is refused from the next release)"
            ));
        }
    }
    warnings
}

/// Every `key = value` line of a TOML text by its full path, the way
/// validation names keys: `engine.slice_ms`,
/// `groups[0].channels[1].capacity_rps` (arrays of tables by index).
fn key_lines(text: &str) -> ahash::AHashMap<String, usize> {
    let mut lines = ahash::AHashMap::new();
    // Per array-of-tables path: how many elements so far.
    let mut counts: ahash::AHashMap<String, usize> = ahash::AHashMap::new();
    let mut header = String::new();
    fn clean(k: &str) -> Vec<&str> {
        k.split('.').map(|p| p.trim().trim_matches('"')).collect()
    }
    // A dotted name with every array-of-tables prefix indexed.
    let indexed = |parts: &[&str], counts: &ahash::AHashMap<String, usize>| {
        let mut out = String::new();
        let mut plain = String::new();
        for p in parts {
            if !plain.is_empty() {
                plain.push('.');
                out.push('.');
            }
            plain.push_str(p);
            out.push_str(p);
            if let Some(n) = counts.get(&plain) {
                out.push_str(&format!("[{}]", n - 1));
            }
        }
        out
    };
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if let Some(name) = line.strip_prefix("[[").and_then(|l| l.split("]]").next()) {
            let parts = clean(name);
            let plain = parts.join(".");
            *counts.entry(plain.clone()).or_insert(0) += 1;
            // A new element starts its nested arrays afresh.
            counts.retain(|k, _| !k.starts_with(&format!("{plain}.")));
            header = indexed(&parts, &counts);
            lines.entry(header.clone()).or_insert(i + 1);
        } else if let Some(name) = line.strip_prefix('[').and_then(|l| l.split(']').next()) {
            header = indexed(&clean(name), &counts);
            lines.entry(header.clone()).or_insert(i + 1);
        } else if let Some((k, _)) = line.split_once('=') {
            if line.starts_with('#') {
                continue;
            }
            let key = clean(k).join(".");
            let full = if header.is_empty() {
                key
            } else {
                format!("{header}.{key}")
            };
            lines.entry(full).or_insert(i + 1);
        }
    }
    lines
}

impl ConfigError {
    /// The same issues with the lines of another text that sets the same
    /// keys under `prefix`: a config assembled from a user's file (the
    /// simulator's, over a scenario's channels) is reported against the
    /// file the user wrote, not the assembled text.
    pub fn relocated(mut self, text: &str, prefix: &str) -> ConfigError {
        for issue in &mut self.issues {
            if let Some(i) = issue.key.find(" (line ") {
                issue.key.truncate(i);
            }
        }
        let lines = key_lines(text);
        self.locate_with(|path| lines.get(&format!("{prefix}{path}")).copied())
    }

    /// Each issue that names a key but not yet a line gets the line that
    /// sets the key, so a range error is found as fast as a parse error.
    fn with_lines(self, text: &str) -> ConfigError {
        let lines = key_lines(text);
        self.locate_with(|path| lines.get(path).copied())
    }

    /// Issues by the line they are on, those without one (a missing
    /// section) last.
    fn in_file_order(mut self) -> ConfigError {
        let line = |i: &ConfigIssue| {
            i.key
                .split(" (line ")
                .nth(1)
                .and_then(|r| r.trim_end_matches(')').parse::<usize>().ok())
                .unwrap_or(usize::MAX)
        };
        self.issues.sort_by_key(line);
        self
    }

    fn locate_with(mut self, line_of: impl Fn(&str) -> Option<usize>) -> ConfigError {
        for issue in &mut self.issues {
            if issue.key.contains("(line ") {
                continue;
            }
            // `groups[0] (chat).channels[1] (free-a).x` names elements by
            // index and id; the index is what the text has.
            let mut path = String::new();
            let mut skip = false;
            for c in issue.key.chars() {
                match c {
                    '(' => skip = true,
                    ')' => skip = false,
                    ' ' => {}
                    c if !skip => path.push(c),
                    _ => {}
                }
            }
            // A key the file does not set (a missing one) is found at its
            // table's header.
            let mut at = path.as_str();
            let line = loop {
                if let Some(n) = line_of(at) {
                    break Some(n);
                }
                match at.rfind('.') {
                    Some(i) => at = &at[..i],
                    None => break None,
                }
            };
            if let Some(n) = line {
                issue.key = format!("{} (line {n})", issue.key);
            }
        }
        self
    }
}

/// Keys an earlier version read, and what became of them: a config written
/// for it is refused with the way forward, not only "unknown field".
/// (section the key was in, key, what to do).
const RETIRED_KEYS: &[(&str, &str, &str)] = &[
    (
        "",
        "oscillation_max_changes",
        "removed: OSCILLATION is raised by relapses after re-admission \
         (`policy.states.oscillation_relapses`, `oscillation_window_ms`)",
    ),
    (
        "",
        "oscillation_penalty",
        "removed: each relapse after re-admission multiplies later cool-downs \
         (`cooldown_growth`, up to `policy.states.max_relapse_cooldown_ms`)",
    ),
];

impl ConfigError {
    /// An unknown-field issue for a retired key says what replaced it.
    fn with_migration_hints(mut self) -> ConfigError {
        for issue in &mut self.issues {
            let Some(field) = issue
                .reason
                .strip_prefix("unknown field `")
                .and_then(|r| r.split('`').next())
            else {
                continue;
            };
            let hint = RETIRED_KEYS
                .iter()
                .find(|(section, key, _)| *key == field && issue.key.starts_with(section));
            if let Some((_, key, hint)) = hint {
                issue.reason = format!("unknown field `{key}`: {hint}");
            }
        }
        self
    }
}

/// Where a parse error at byte `at` of `text` is, as a person looks for it:
/// the section and key when the line has one, and the line number
/// (`engine.slice_ms (line 12)`, `groups.channels.wat (line 7)`).
fn locate(text: &str, at: usize) -> String {
    let at = at.min(text.len());
    let line_no = text[..at].matches('\n').count() + 1;
    let line = text.lines().nth(line_no - 1).unwrap_or("").trim();
    let section = text
        .lines()
        .take(line_no)
        .map(str::trim)
        .filter(|l| l.starts_with('['))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_string())
        .last();
    let key = line
        .split_once('=')
        .map(|(k, _)| k.trim().trim_matches('"').to_string())
        .filter(|k| !k.is_empty() && !k.starts_with('#'));
    match (section, key) {
        (Some(s), Some(k)) => format!("{s}.{k} (line {line_no})"),
        (None, Some(k)) => format!("{k} (line {line_no})"),
        (Some(s), None) => format!("[{s}] (line {line_no})"),
        (None, None) => format!("line {line_no}"),
    }
}

/// Every section that is checked on its own (not the policy layers or the
/// groups).
fn validate_sections(raw: &RawConfig, v: &mut Issues) {
    raw.engine.validate(v);
    validate_alerts(&raw.alerts, v);
    if raw.alerts.quota_alert_ms <= raw.engine.quota_horizon_ms {
        v.push(
            "alerts.quota_alert_ms",
            format!(
                "must exceed engine.quota_horizon_ms ({} ms): a channel planned down for \
                 its quota keeps its forecast near that horizon, so the alert would never fire",
                raw.engine.quota_horizon_ms
            ),
        );
    }
    validate_schedule(&raw.schedule, v);
    validate_safety(&raw.safety, v);
    raw.kafka.validate(v);
    raw.service.validate(v);
    if raw.service.dedup_horizon_ms < raw.engine.allowed_lateness_ms {
        v.push(
            "service.dedup_horizon_ms",
            format!(
                "must be at least engine.allowed_lateness_ms ({} ms): a copy of an event \
                 the engine still takes as on time would be counted twice",
                raw.engine.allowed_lateness_ms
            ),
        );
    }
    for class in TrafficClass::ALL {
        let c = raw.traffic_classes.get(*class);
        let name = class.as_str().to_ascii_lowercase();
        v.fraction(format!("traffic_classes.{name}.max_score"), c.max_score);
    }
}

impl Config {
    /// Reads and validates a config file; its policy.
    pub fn from_file(path: &std::path::Path) -> Result<Config, ConfigError> {
        ConfigFile::from_file(path).map(|f| f.policy)
    }

    /// Parses and validates config text (every section); its policy.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        ConfigFile::from_toml(text).map(|f| f.policy)
    }

    /// Validates what the sieve let through; `v` holds what it did not.
    fn resolve(raw: RawConfig, mut v: Issues) -> Result<ConfigFile, ConfigError> {
        validate_sections(&raw, &mut v);
        let tiers = TierPolicies::resolve(&raw, &mut v);
        for (tier, r) in &raw.tiers {
            if let Some(w) = r.initial_weight {
                v.fraction(format!("tiers.{}.initial_weight", tier.as_str()), w);
            }
        }
        let mut ids = Ids::default();
        if raw.groups.is_empty() {
            v.push("groups", "at least one route group is needed");
        }
        let groups = raw
            .groups
            .iter()
            .enumerate()
            .map(|(gi, g)| resolve_group(gi, g, &raw, &tiers, &mut ids, &mut v))
            .collect();
        if !v.0.is_empty() {
            return Err(ConfigError { issues: v.0 });
        }
        let policy = Config {
            engine: raw.engine,
            alerts: raw.alerts,
            schedule: raw.schedule,
            safety: raw.safety,
            classes: raw.traffic_classes,
            groups,
        };
        let runtime = Runtime {
            kafka: raw.kafka,
            redis: raw.redis,
            service: raw.service,
        };
        Ok(ConfigFile {
            policy,
            runtime,
            warnings: Vec::new(),
        })
    }

    /// Every channel, in config order (groups, then channels).
    pub fn channels(&self) -> impl Iterator<Item = &ChannelConfig> {
        self.groups.iter().flat_map(|g| g.channels.iter())
    }

    /// A config with one group of the given channels and all defaults; for
    /// tests and examples.
    pub fn single_group(group: &str, channels: &[(&str, Tier, f64, f64)]) -> Config {
        let mut text = format!("[[groups]]\nid = \"{group}\"\n");
        for (id, tier, price, cap) in channels {
            text.push_str(&format!(
                "[[groups.channels]]\nid = \"{id}\"\ntier = \"{}\"\nprice_per_1k_tokens = {price:?}\ncapacity_rps = {cap:?}\n",
                tier.as_str()
            ));
        }
        match Config::from_toml(&text) {
            Ok(c) => c,
            Err(e) => panic!("single_group config is invalid: {e}"),
        }
    }
}

#[cfg(test)]
mod tests;
