//! Every key the config types refuse, found at once: each unknown key
//! (with the nearest known one), wrong type or unknown tier is reported
//! where the user wrote it and taken out of the table, so the typed parse
//! that follows succeeds and range validation still runs on the rest. One
//! mistake never hides the others.
//!
//! Each key is tried on its own against its type (merged onto the
//! section's defaults), so the message is serde's own and the path is the
//! key's full path as `key_lines` finds it in the text. A key set in a
//! policy layer (`[policy]`, `[tiers.<tier>.policy]`, a channel's
//! `policy`) is reported in that layer, once, not again under every tier
//! that inherits it.

use super::catalogue::{RawChannel, RawGroup, RawTier};
use super::{
    deep_merge, AlertConfig, ClassPolicies, EngineConfig, HealthPolicy, Issues, KafkaConfig,
    RedisConfig, SafetyConfig, ScheduleConfig, ServiceConfig, Tier, RETIRED_KEYS,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeMap;

/// The file's top-level sections, as `RawConfig` reads them.
const SECTIONS: &[&str] = &[
    "engine",
    "alerts",
    "schedule",
    "safety",
    "traffic_classes",
    "policy",
    "tiers",
    "groups",
    "kafka",
    "redis",
    "service",
];

/// Reports and removes every key of `table` its type refuses.
pub(super) fn sieve(table: &mut toml::Table, v: &mut Issues) {
    let keys: Vec<String> = table.keys().cloned().collect();
    for k in keys {
        if !SECTIONS.contains(&k.as_str()) {
            v.push(k.clone(), unknown(&k, SECTIONS));
            table.remove(&k);
            continue;
        }
        let value = table.get_mut(&k).expect("key listed above");
        let is_array = matches!(value, toml::Value::Array(_));
        if k == "groups" {
            if !is_array {
                v.push(k.clone(), "must be an array of tables ([[groups]])");
                table.remove(&k);
            } else if let toml::Value::Array(groups) = value {
                sieve_groups(groups, v);
            }
            continue;
        }
        let Some(section) = value.as_table_mut() else {
            v.push(k.clone(), format!("must be a table ([{k}])"));
            table.remove(&k);
            continue;
        };
        match k.as_str() {
            "engine" => leaves::<EngineConfig>(&k, section, v),
            "alerts" => leaves::<AlertConfig>(&k, section, v),
            "schedule" => leaves::<ScheduleConfig>(&k, section, v),
            "safety" => leaves::<SafetyConfig>(&k, section, v),
            "traffic_classes" => {
                // A class table lists only what it changes; the rest keeps
                // that class's defaults.
                leaves::<ClassPolicies>(&k, section, v);
                let mut all = defaults_of::<ClassPolicies>(&k);
                deep_merge(&mut all, section);
                *section = all;
            }
            "policy" => leaves::<HealthPolicy>(&k, section, v),
            "kafka" => leaves::<KafkaConfig>(&k, section, v),
            "redis" => leaves::<RedisConfig>(&k, section, v),
            "service" => leaves::<ServiceConfig>(&k, section, v),
            "tiers" => sieve_tiers(section, v),
            _ => unreachable!("every section in SECTIONS has an arm"),
        }
    }
}

/// `[tiers.<tier>]`: a known tier, its `initial_weight`, its policy layer.
fn sieve_tiers(tiers: &mut toml::Table, v: &mut Issues) {
    let names: Vec<String> = tiers.keys().cloned().collect();
    for name in names {
        let path = format!("tiers.{name}");
        let probe =
            toml::Table::from_iter([(name.clone(), toml::Value::Table(Default::default()))]);
        if let Err(e) = try_as::<BTreeMap<Tier, RawTier>>(probe) {
            v.push(path, reason(&e));
            tiers.remove(&name);
            continue;
        }
        let Some(tier) = tiers.get_mut(&name).and_then(|t| t.as_table_mut()) else {
            v.push(path, "must be a table");
            tiers.remove(&name);
            continue;
        };
        one_by_one::<RawTier>(&path, tier, &[], &["policy"], v);
        policy_layer(&format!("{path}.policy"), tier, v);
    }
}

/// `[[groups]]` and their `[[groups.channels]]`: each key on its own, a
/// missing required key reported and stood in for so the rest validates.
fn sieve_groups(groups: &mut [toml::Value], v: &mut Issues) {
    for (gi, g) in groups.iter_mut().enumerate() {
        let Some(g) = g.as_table_mut() else {
            v.push(format!("groups[{gi}]"), "must be a table");
            continue;
        };
        let gk = element_path("groups", gi, g);
        let required = [("id", format!("<groups[{gi}]>").into())];
        one_by_one::<RawGroup>(&gk, g, &required, &["channels"], v);
        let Some(channels) = g.get_mut("channels") else {
            continue;
        };
        let Some(channels) = channels.as_array_mut() else {
            v.push(
                format!("{gk}.channels"),
                "must be an array of tables ([[groups.channels]])",
            );
            g.remove("channels");
            continue;
        };
        for (ci, c) in channels.iter_mut().enumerate() {
            let Some(c) = c.as_table_mut() else {
                v.push(format!("{gk}.channels[{ci}]"), "must be a table");
                continue;
            };
            let ck = element_path(&format!("{gk}.channels"), ci, c);
            let required = [
                ("id", format!("<groups[{gi}].channels[{ci}]>").into()),
                ("tier", "paid".into()),
                ("capacity_rps", 1.0.into()),
            ];
            one_by_one::<RawChannel>(&ck, c, &required, &["policy"], v);
            policy_layer(&format!("{ck}.policy"), c, v);
        }
    }
}

/// `groups[0] (chat)`: an element by index and, when it has one, its id,
/// the way validation names it.
fn element_path(array: &str, i: usize, t: &toml::Table) -> String {
    match t.get("id").and_then(|id| id.as_str()) {
        Some(id) => format!("{array}[{i}] ({id})"),
        None => format!("{array}[{i}]"),
    }
}

/// A partial policy table at `t.policy`, each leaf tried on its own.
fn policy_layer(path: &str, t: &mut toml::Table, v: &mut Issues) {
    match t.get_mut("policy") {
        None => {}
        Some(toml::Value::Table(p)) => leaves::<HealthPolicy>(path, p, v),
        Some(_) => {
            v.push(path.to_string(), "must be a table");
            t.remove("policy");
        }
    }
}

/// Each top-level key of `t` on its own, except `skip` (handled by the
/// caller), next to stand-ins for the type's `required` keys. A refused key
/// is removed; a required key refused or missing is reported and its
/// stand-in put in its place, so the rest still validates.
fn one_by_one<T: DeserializeOwned>(
    path: &str,
    t: &mut toml::Table,
    required: &[(&str, toml::Value)],
    skip: &[&str],
    v: &mut Issues,
) {
    let base: toml::Table = required
        .iter()
        .map(|(k, stand_in)| (k.to_string(), stand_in.clone()))
        .collect();
    let keys: Vec<String> = t.keys().cloned().collect();
    for k in keys.into_iter().filter(|k| !skip.contains(&k.as_str())) {
        let mut probe = base.clone();
        probe.insert(k.clone(), t[&k].clone());
        if let Err(e) = try_as::<T>(probe) {
            v.push(at(path, &[k.as_str()], &e), reason(&e));
            t.remove(&k);
        }
    }
    for (k, stand_in) in required {
        if !t.contains_key(*k) {
            if !v.0.iter().any(|i| i.key == format!("{path}.{k}")) {
                v.push(format!("{path}.{k}"), "missing: this key is required");
            }
            t.insert(k.to_string(), stand_in.clone());
        }
    }
}

/// Each leaf of the partial table `t` (arrays are leaves) merged on its own
/// onto `T`'s defaults: a leaf the type refuses is reported and removed.
fn leaves<T: DeserializeOwned + Serialize + Default>(
    path: &str,
    t: &mut toml::Table,
    v: &mut Issues,
) {
    let defaults = defaults_of::<T>(path);
    let mut refused: Vec<Vec<String>> = Vec::new();
    let mut trail = Vec::new();
    walk(t, &mut trail, &mut |leaf, value| {
        let mut probe = defaults.clone();
        set(&mut probe, leaf, value.clone());
        if let Err(e) = try_as::<T>(probe) {
            let parts: Vec<&str> = leaf.iter().map(String::as_str).collect();
            v.push(at(path, &parts, &e), reason(&e));
            refused.push(leaf.to_vec());
        }
    });
    for leaf in refused {
        remove(t, &leaf);
    }
}

/// `T`'s defaults as a table (every config section serializes to TOML).
fn defaults_of<T: Serialize + Default>(path: &str) -> toml::Table {
    match toml::Table::try_from(T::default()) {
        Ok(d) => d,
        Err(e) => panic!("{path}: the defaults must serialize to TOML: {e}"),
    }
}

fn walk(t: &toml::Table, trail: &mut Vec<String>, f: &mut impl FnMut(&[String], &toml::Value)) {
    for (k, value) in t {
        trail.push(k.clone());
        match value {
            toml::Value::Table(inner) if !inner.is_empty() => walk(inner, trail, f),
            _ => f(trail, value),
        }
        trail.pop();
    }
}

/// Sets `leaf` in `t`, replacing whatever is in the way; an empty table
/// (the only table a leaf can be) merged onto a table changes nothing.
fn set(t: &mut toml::Table, leaf: &[String], value: toml::Value) {
    let (last, parents) = leaf.split_last().expect("a leaf has a name");
    let mut at = t;
    for p in parents {
        let slot = at
            .entry(p.clone())
            .or_insert_with(|| toml::Value::Table(Default::default()));
        if !slot.is_table() {
            *slot = toml::Value::Table(Default::default());
        }
        at = slot.as_table_mut().expect("made a table above");
    }
    if value.is_table() && at.get(last).is_some_and(toml::Value::is_table) {
        return;
    }
    at.insert(last.clone(), value);
}

/// Removes `leaf`, and the tables it leaves empty.
fn remove(t: &mut toml::Table, leaf: &[String]) {
    let Some((first, rest)) = leaf.split_first() else {
        return;
    };
    if rest.is_empty() {
        t.remove(first);
        return;
    }
    if let Some(inner) = t.get_mut(first).and_then(|i| i.as_table_mut()) {
        remove(inner, rest);
        if inner.is_empty() {
            t.remove(first);
        }
    }
}

fn try_as<T: DeserializeOwned>(t: toml::Table) -> Result<T, toml::de::Error> {
    toml::Value::Table(t).try_into::<T>()
}

/// The path to report: the leaf's, cut at the unknown name when the
/// refusal is an unknown key part way down (`policy.signals.p99_latncy_ms`,
/// not its `.normal`).
fn at(path: &str, leaf: &[&str], e: &toml::de::Error) -> String {
    let mut parts: Vec<&str> = leaf.to_vec();
    if let Some(name) = unknown_name(e.message()) {
        if let Some(i) = parts.iter().position(|p| *p == name) {
            parts.truncate(i + 1);
        }
    }
    format!("{path}.{}", parts.join("."))
}

/// The name in serde's "unknown field `x`" / "unknown variant `x`".
fn unknown_name(msg: &str) -> Option<&str> {
    msg.strip_prefix("unknown field `")
        .or_else(|| msg.strip_prefix("unknown variant `"))
        .and_then(|r| r.split('`').next())
}

/// serde's message, an unknown name turned into the way forward: a
/// retired key's replacement, or the nearest known name.
fn reason(e: &toml::de::Error) -> String {
    let msg = e.message();
    let Some(name) = unknown_name(msg) else {
        return msg.to_string();
    };
    if let Some((_, _, hint)) = RETIRED_KEYS.iter().find(|(_, key, _)| *key == name) {
        return format!("unknown key `{name}`: {hint}");
    }
    let expected = msg.split_once("expected").map(|(_, r)| r).unwrap_or("");
    let known: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    let text = unknown(name, &known);
    if msg.starts_with("unknown variant") {
        text.replacen("unknown key", "unknown value", 1)
    } else {
        text
    }
}

/// "unknown key `x`", with the nearest of `known` when one is close, else
/// the list.
pub(super) fn unknown(name: &str, known: &[&str]) -> String {
    match nearest(name, known) {
        Some(k) => format!("unknown key `{name}`; did you mean `{k}`?"),
        None if known.is_empty() => format!("unknown key `{name}`"),
        None => format!(
            "unknown key `{name}`; known here: {}",
            known
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The known name closest to `name` by edit distance, when it is close
/// enough to be a typo (a third of the name's length, at least 2 edits),
/// to the name or to it without its unit (`capcity` → `capacity_rps`), or
/// when `name` is a prefix or extension of it (`request_thread`).
fn nearest<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    let limit = (name.chars().count() / 3).max(2);
    let stem = |k: &'a str| k.rsplit_once('_').map(|(s, _)| s).unwrap_or(k);
    known
        .iter()
        .map(|k| {
            let d = edit_distance(name, k).min(edit_distance(name, stem(k)));
            (d, *k)
        })
        .filter(|(d, k)| *d <= limit || k.starts_with(name) || name.starts_with(k))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let up = row[j + 1];
            row[j + 1] = (diag + usize::from(ca != *cb)).min(row[j] + 1).min(up + 1);
            diag = up;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_find_their_key_and_strangers_get_the_list() {
        let known = ["request_threads", "heartbeat_ms", "http_listen"];
        assert_eq!(nearest("request_thread", &known), Some("request_threads"));
        assert_eq!(nearest("hartbeat_ms", &known), Some("heartbeat_ms"));
        assert_eq!(nearest("colour", &known), None);
        assert_eq!(
            nearest("capcity", &["id", "capacity_rps"]),
            Some("capacity_rps")
        );
        assert!(unknown("colour", &known).contains("known here: `request_threads`"));
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
    }
}
