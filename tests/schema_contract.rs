//! The Avro schemas are a contract with gateway teams and with whoever reads
//! the alert topic: every field documented, every field after the required
//! ones defaulted, and FULL compatibility (old reader / new writer and new
//! reader / old writer, by Avro's resolution rules as apache-avro checks
//! them) with every released schema kept in `schemas/released/`.
//!
//! Releasing a schema: copy it to `schemas/released/<name>.<n>.avsc`. A
//! change that breaks a released schema fails here before it ships.

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
            SchemaCompatibility::can_read(&new, &old).unwrap_or_else(|e| {
                panic!(
                    "an old reader ({}) cannot read data written with {}: {e}",
                    old_path.display(),
                    current.display()
                )
            });
        }
    }
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
