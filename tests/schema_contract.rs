//! The Avro schemas are a contract with gateway teams and with whoever reads
//! the alert topic: every field documented, every field after the required
//! ones defaulted, and FULL compatibility (old reader / new writer and new
//! reader / old writer, by Avro's resolution rules as apache-avro checks
//! them) with every released schema kept in `schemas/released/`.
//!
//! Releasing a schema: copy it to `schemas/released/<name>.<n>.avsc`. A
//! change that breaks a released schema fails here before it ships: by the
//! checker, by real datums read across both ways, and for a renamed type by
//! the alias it must keep.

mod support;

use apache_avro::schema_compatibility::SchemaCompatibility;
use apache_avro::Schema;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn parse(path: &Path) -> Schema {
    let text = std::fs::read_to_string(path).unwrap();
    Schema::parse_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Each current schema and its released versions.
fn pairs() -> Vec<(PathBuf, Vec<PathBuf>)> {
    ["request_event", "alert_event"]
        .iter()
        .map(|name| {
            let current = root().join(format!("schemas/{name}.avsc"));
            let mut released: Vec<PathBuf> = std::fs::read_dir(root().join("schemas/released"))
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|f| f.to_str())
                        .is_some_and(|f| f.starts_with(&format!("{name}.")) && f.ends_with(".avsc"))
                })
                .collect();
            released.sort();
            (current, released)
        })
        .collect()
}

#[test]
fn every_schema_is_fully_compatible_with_every_released_one() {
    for (current, released) in pairs() {
        assert!(
            !released.is_empty(),
            "{}: no released version to check against",
            current.display()
        );
        let new = parse(&current);
        for old_path in released {
            let old = parse(&old_path);
            SchemaCompatibility::can_read(&old, &new).unwrap_or_else(|e| {
                panic!(
                    "a new reader cannot read data written with {}: {e}",
                    old_path.display()
                )
            });
            // An enum symbol added since resolves to the old reader's
            // default (Avro 1.9+ resolution; apache-avro's checker does not
            // know it): check the rest without the added symbols, and that
            // the old enum has a default for them.
            let without = without_added_symbols(&current, &old_path);
            SchemaCompatibility::can_read(&without, &old).unwrap_or_else(|e| {
                panic!(
                    "an old reader ({}) cannot read data written with {}: {e}",
                    old_path.display(),
                    current.display()
                )
            });
        }
    }
}

/// `current`'s schema with every enum symbol the released one at
/// `old_path` lacks removed; panics if such an enum has no default there
/// (an old reader would then fail on the new symbol).
fn without_added_symbols(current: &Path, old_path: &Path) -> Schema {
    fn enums(v: &serde_json::Value, out: &mut Vec<serde_json::Value>) {
        match v {
            serde_json::Value::Object(m) => {
                if m.get("type").and_then(|t| t.as_str()) == Some("enum") {
                    out.push(v.clone());
                }
                m.values().for_each(|x| enums(x, out));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| enums(x, out)),
            _ => {}
        }
    }
    fn strip(v: &mut serde_json::Value, old: &[serde_json::Value], path: &Path) {
        match v {
            serde_json::Value::Object(m) => {
                if m.get("type").and_then(|t| t.as_str()) == Some("enum") {
                    let name = m["name"].clone();
                    if let Some(o) = old.iter().find(|o| o["name"] == name) {
                        let had = o["symbols"].as_array().cloned().unwrap_or_default();
                        let syms = m["symbols"].as_array_mut().unwrap();
                        if syms.iter().any(|x| !had.contains(x)) {
                            assert!(
                                o.get("default").is_some(),
                                "{}: enum {name} gains symbols but has no default there",
                                path.display()
                            );
                        }
                        syms.retain(|x| had.contains(x));
                    }
                }
                m.values_mut().for_each(|x| strip(x, old, path));
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(|x| strip(x, old, path)),
            _ => {}
        }
    }
    let read = |p: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    };
    let mut old_enums = Vec::new();
    enums(&read(old_path), &mut old_enums);
    let mut new = read(current);
    strip(&mut new, &old_enums, old_path);
    Schema::parse_str(&new.to_string()).unwrap()
}

/// An alert of a kind added after a release reaches a reader holding that
/// release as its enum default (OTHER), through apache-avro's resolving
/// decoder.
#[test]
fn a_new_alert_kind_reads_as_other_with_an_old_schema() {
    let mut alert = support::sample_alert();
    alert.kind = hermes::alert::AlertKind::PartitionSplit;
    let datum = alert.to_avro().unwrap();
    let new = parse(&root().join("schemas/alert_event.avsc"));
    let old = parse(&root().join("schemas/released/alert_event.1.avsc"));
    let read = apache_avro::from_avro_datum(&new, &mut datum.as_slice(), Some(&old)).unwrap();
    let apache_avro::types::Value::Record(fields) = read else {
        panic!("a record");
    };
    let kind = fields
        .iter()
        .find(|(n, _)| n == "kind")
        .map(|(_, v)| v.clone());
    assert!(
        matches!(kind, Some(apache_avro::types::Value::Enum(_, ref s)) if s == "OTHER"),
        "{kind:?}"
    );
}

/// The checker itself refuses what it should: a new required field, and a
/// removed one without a default, against the released request schema.
#[test]
fn a_breaking_change_is_caught() {
    let released = parse(&root().join("schemas/released/request_event.1.avsc"));
    let text = std::fs::read_to_string(root().join("schemas/request_event.avsc")).unwrap();
    let added = text.replacen(
        "\"fields\": [",
        "\"fields\": [\n    {\"name\": \"tenant\", \"type\": \"string\"},",
        1,
    );
    let added = Schema::parse_str(&added).unwrap();
    assert!(
        SchemaCompatibility::can_read(&released, &added).is_err(),
        "a new reader with a required field cannot read old data"
    );
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["fields"]
        .as_array_mut()
        .unwrap()
        .retain(|f| f["name"] != "latency_ms");
    let removed = Schema::parse_str(&json.to_string()).unwrap();
    assert!(
        SchemaCompatibility::can_read(&removed, &released).is_err(),
        "an old reader needs latency_ms, which has no default"
    );
}

/// Beyond the checker: real datums cross every released schema both ways.
/// What Hermes writes today is read by a reader holding a released schema,
/// and what that released schema wrote is read by today's, through
/// apache-avro's resolving decoder (names, aliases, enum defaults).
#[test]
fn datums_cross_every_released_schema_both_ways() {
    let request = {
        let mut bytes = Vec::new();
        hermes::codec::Encoder::default()
            .encode_plain(&support::sample_event(), &mut bytes)
            .unwrap();
        bytes
    };
    let alert = support::sample_alert().to_avro().unwrap();
    for ((current, released), datum) in pairs().into_iter().zip([request, alert]) {
        let new = parse(&current);
        for old_path in released {
            let old = parse(&old_path);
            let as_old = apache_avro::from_avro_datum(&new, &mut datum.as_slice(), Some(&old))
                .unwrap_or_else(|e| {
                    panic!("{} cannot read today's datum: {e}", old_path.display())
                });
            let written_old = apache_avro::to_avro_datum(&old, as_old.clone()).unwrap();
            let as_new =
                apache_avro::from_avro_datum(&old, &mut written_old.as_slice(), Some(&new))
                    .unwrap_or_else(|e| {
                        panic!(
                            "today's schema cannot read {}'s datum: {e}",
                            old_path.display()
                        )
                    });
            // Nothing was lost on the way: the same datum comes back.
            let again = apache_avro::to_avro_datum(&new, as_new).unwrap();
            assert_eq!(
                again,
                datum,
                "{} -> {} -> today's changed the datum",
                current.display(),
                old_path.display()
            );
        }
    }
}

/// A second implementation agrees: fastavro (what confluent-kafka's
/// `AvroDeserializer` decodes with) resolves a datum of each current schema
/// with every released one as the reader and the other way round
/// (`tests/interop/schema_resolution.py`; `bash .ci/run` installs it).
#[test]
fn fastavro_resolves_every_released_schema_both_ways() {
    let out = std::process::Command::new("python3")
        .arg(root().join("tests/interop/schema_resolution.py"))
        .arg(root())
        .output()
        .expect("python3 is needed (bash .ci/run installs what the tests need)");
    assert!(
        out.status.success(),
        "fastavro refused a resolution (or is missing: pip install fastavro): {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The namespace carries no version (`hermes`, not `hermes.v1`), and every
/// named type of a released schema whose full name changed keeps that name
/// as an alias: Avro matches records and enums by their unqualified name,
/// and readers that match full names strictly resolve through the alias.
#[test]
fn renamed_types_keep_their_released_names_as_aliases() {
    fn named(json: &serde_json::Value, ns: &str, out: &mut Vec<(String, Vec<String>)>) {
        match json {
            serde_json::Value::Object(m) => {
                let ns = m.get("namespace").and_then(|n| n.as_str()).unwrap_or(ns);
                if let (Some(t), Some(name)) = (m.get("type"), m.get("name")) {
                    if t == "record" || t == "enum" || t == "fixed" {
                        let aliases = m
                            .get("aliases")
                            .and_then(|a| a.as_array())
                            .into_iter()
                            .flatten()
                            .filter_map(|x| x.as_str().map(String::from))
                            .collect();
                        out.push((format!("{ns}.{}", name.as_str().unwrap()), aliases));
                    }
                }
                for v in m.values() {
                    named(v, ns, out);
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| named(v, ns, out)),
            _ => {}
        }
    }
    let read = |p: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    };
    for (current, released) in pairs() {
        let json = read(&current);
        assert_eq!(json["namespace"], "hermes", "{}", current.display());
        let mut now = Vec::new();
        named(&json, "", &mut now);
        for old_path in released {
            let mut then = Vec::new();
            named(&read(&old_path), "", &mut then);
            for (old_name, _) in then {
                let short = old_name.rsplit('.').next().unwrap();
                let (new_name, aliases) = now
                    .iter()
                    .find(|(n, _)| n.rsplit('.').next() == Some(short))
                    .unwrap_or_else(|| panic!("{old_name} is gone from {}", current.display()));
                assert!(
                    *new_name == old_name || aliases.contains(&old_name),
                    "{new_name} in {} was {old_name} in {}: keep the old name as an alias",
                    current.display(),
                    old_path.display()
                );
            }
        }
    }
}

#[test]
fn every_field_is_documented_and_only_the_required_ones_lack_a_default() {
    let required: &[(&str, &[&str])] = &[
        (
            "request_event",
            &[
                "event_id",
                "event_time_ms",
                "gateway_id",
                "channel_id",
                "route_group",
                "model",
                "error_class",
                "latency_ms",
            ],
        ),
        (
            "alert_event",
            &[
                "alert_id",
                "event_time_ms",
                "route_group",
                "kind",
                "severity",
                "reason",
                "message",
            ],
        ),
    ];
    for (name, required) in required {
        let path = root().join(format!("schemas/{name}.avsc"));
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert!(json["doc"].is_string(), "{name}: the record has no doc");
        for f in json["fields"].as_array().unwrap() {
            let field = f["name"].as_str().unwrap();
            assert!(f["doc"].is_string(), "{name}.{field} has no doc");
            let has_default = f.get("default").is_some();
            assert_eq!(
                !has_default,
                required.contains(&field),
                "{name}.{field}: {} a default, but it is {} the required list",
                if has_default { "has" } else { "lacks" },
                if required.contains(&field) {
                    "in"
                } else {
                    "not in"
                },
            );
        }
    }
}

mod snapshot {
    use hermes::composition::Composition;
    use hermes::config::{Config, Tier};
    use hermes::event::{Dispatch, ErrorClass, FinishReason, RequestEvent, TrafficClass};
    use std::sync::Arc;

    const T0: i64 = 1_764_000_000_000;

    fn event<'a>(channel: &'a str, id: &'a str, t: i64, failed: bool) -> RequestEvent<'a> {
        RequestEvent {
            event_id: id,
            event_time_ms: t,
            gateway_id: "gw-1",
            channel_id: channel,
            route_group: "chat",
            model: "m",
            traffic_class: TrafficClass::ALL[(t / 100 % 4) as usize],
            attempt: 0,
            http_status: if failed { 503 } else { 200 },
            error_class: if failed {
                ErrorClass::ServerError
            } else {
                ErrorClass::None
            },
            latency_ms: 800,
            ttfb_ms: Some(100),
            input_tokens: 500,
            output_tokens: 300,
            finish_reason: FinishReason::Stop,
            truncated: false,
            schema_valid: None,
            replacement_chars: 0,
            is_probe: false,
            cost: 0.001,
            quota_remaining: None,
            trace_id: None,
            dispatch: Dispatch::Sent,
        }
    }

    /// Every distinct snapshot a group writer publishes through a healthy
    /// start, a hard-down free channel, and manual mode, as JSON.
    fn published() -> Vec<serde_json::Value> {
        let cfg = Config::single_group(
            "chat",
            &[
                ("free-a", Tier::Free, 0.0, 50.0),
                ("paid-a", Tier::Paid, 1.0, 100.0),
            ],
        );
        let mut c = Composition::new(Arc::new(cfg));
        let mut out = Vec::new();
        let mut seen = 0;
        let mut t = T0;
        let mut n = 0u64;
        let mut step = |c: &mut Composition, channel: &str, t: i64, failed: bool| {
            n += 1;
            let id = format!("e{n}");
            let _ = c.apply(&event(channel, &id, t, failed));
        };
        while t < T0 + 300_000 {
            let failing = t > T0 + 150_000 && t < T0 + 200_000;
            step(&mut c, "free-a", t, failing);
            step(&mut c, "paid-a", t, false);
            if c.published() > seen {
                seen = c.published();
                out.push(serde_json::to_value(c.snapshot("chat").unwrap()).unwrap());
            }
            if t == T0 + 250_000 {
                c.set_manual("chat", true, t);
            }
            t += 100;
        }
        out
    }

    #[test]
    fn what_the_writer_publishes_is_valid_by_the_snapshot_schema() {
        let path = super::root().join("schemas/weight_snapshot.schema.json");
        let schema: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let validator = jsonschema::validator_for(&schema).expect("a valid JSON Schema");
        let snapshots = published();
        assert!(snapshots.len() >= 3, "{} snapshots", snapshots.len());
        let states: std::collections::BTreeSet<String> = snapshots
            .iter()
            .filter_map(|s| s["channels"]["free-a"]["state"].as_str().map(String::from))
            .collect();
        assert!(
            states.contains("DRAINED") && states.contains("HEALTHY"),
            "the run should publish a drain and a recovery: {states:?}"
        );
        assert!(snapshots.iter().any(|s| s["manual"] == true));
        for s in &snapshots {
            let errors: Vec<String> = validator.iter_errors(s).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{errors:?}\n{s:#}");
            // The change message is the version as a decimal string.
            let change = serde_json::Value::String(s["version"].to_string());
            let msg = &schema["$defs"]["change_message"];
            let v = jsonschema::validator_for(msg).unwrap();
            assert!(v.is_valid(&change), "{change}");
        }
        // And the schema refuses what a client must not accept.
        let mut bad = snapshots[0].clone();
        bad["classes"]["core"] = bad["classes"]["CORE"].clone();
        assert!(
            !validator.is_valid(&bad),
            "lowercase class keys are refused"
        );
        let mut bad = snapshots[0].clone();
        bad.as_object_mut().unwrap().remove("heartbeat_ms");
        assert!(!validator.is_valid(&bad), "no staleness clock");
    }
}
