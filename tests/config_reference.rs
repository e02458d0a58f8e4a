//! `docs/configuration.md`'s key reference is generated from the config
//! types: every key and its default from the types' `Default` (serialized
//! as a config file would write it), its meaning from the field's doc
//! comment in `src/config/`, so the page cannot drift from the code. A key
//! added, renamed, re-defaulted or re-documented without the page fails
//! here; `HERMES_BLESS=1 cargo test --test config_reference` rewrites the
//! generated part (between the two markers) and leaves the rest alone.

use hermes::config::{
    AlertConfig, ClassPolicies, Config, EngineConfig, HealthPolicy, KafkaConfig, RedisConfig,
    SafetyConfig, ScheduleConfig, ServiceConfig, Tier,
};
use hermes::signals::SIGNALS;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const BEGIN: &str = "<!-- BEGIN GENERATED: tests/config_reference.rs -->";
const END: &str = "<!-- END GENERATED -->";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Field name → its doc comment (one line), for `struct name` in `file`.
fn field_docs(file: &str, name: &str) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(root().join(file)).unwrap();
    let mut out = BTreeMap::new();
    let mut inside = false;
    let mut doc: Vec<String> = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if !inside {
            if t.contains(&format!("struct {name} {{")) {
                inside = true;
                doc.clear();
            }
            continue;
        }
        if line.starts_with('}') {
            break;
        }
        if let Some(d) = t.strip_prefix("///") {
            doc.push(d.trim().to_string());
        } else if t.starts_with("#[") {
        } else if let Some((lhs, _)) = t.split_once(':') {
            let field = lhs.rsplit(' ').next().unwrap().to_string();
            out.insert(field, doc.join(" "));
            doc.clear();
        }
    }
    assert!(inside, "struct {name} not found in {file}");
    out
}

/// A default as a config file writes it.
fn show(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) if s.is_empty() => "`\"\"`".into(),
        toml::Value::Table(t) => {
            let parts: Vec<String> = t.iter().map(|(k, v)| format!("{k} = {v}")).collect();
            format!("`{{ {} }}`", parts.join(", "))
        }
        toml::Value::Array(a) => {
            let parts: Vec<String> = a
                .iter()
                .map(|v| show(v).trim_matches('`').to_string())
                .collect();
            format!("`[{}]`", parts.join(", "))
        }
        v => format!("`{v}`"),
    }
}

/// A doc comment as a table cell: pipes escaped, and the design notes it
/// cites (`docs/decisions.md#` and a heading) as links relative to this page.
fn cell(s: &str) -> String {
    let s = s.replace('|', "\\|");
    let mut out = String::new();
    let mut rest = s.as_str();
    while let Some(i) = rest.find("docs/decisions.md#") {
        out.push_str(&rest[..i]);
        let target = &rest[i + "docs/".len()..];
        let end = target
            .find(|c: char| !(c.is_ascii_alphanumeric() || "-.#".contains(c)))
            .unwrap_or(target.len());
        let target = target[..end].trim_end_matches('.');
        out.push_str(&format!("[{target}]({target})"));
        rest = &rest[i + "docs/".len() + target.len()..];
    }
    out.push_str(rest);
    out
}

fn unit(key: &str) -> &'static str {
    if key.ends_with("_ms") {
        "ms"
    } else if key.ends_with("_rps") {
        "requests/s"
    } else if key.ends_with("_tokens") {
        "tokens"
    } else if key.ends_with("_bytes") {
        "bytes"
    } else {
        ""
    }
}

/// One section's table: every documented field, with its default.
fn section<T: serde::Serialize>(
    out: &mut String,
    title: &str,
    reload: &str,
    value: &T,
    file: &str,
    ty: &str,
) {
    let table = toml::Value::try_from(value).unwrap();
    let table = table.as_table().unwrap();
    let docs = field_docs(file, ty);
    for k in table.keys() {
        assert!(
            docs.contains_key(k),
            "{title}: key `{k}` is serialized but not a field of {ty} in {file}"
        );
    }
    out.push_str(&format!("\n### `{title}`\n\n{reload}\n\n"));
    out.push_str("| key | default | unit | meaning |\n|---|---|---|---|\n");
    for (k, doc) in &docs {
        let default = table.get(k).map(show).unwrap_or_else(|| "unset".into());
        assert!(!doc.is_empty(), "{title}.{k} has no doc comment in {file}");
        out.push_str(&format!(
            "| `{k}` | {default} | {} | {} |\n",
            unit(k),
            cell(doc)
        ));
    }
}

/// Signal name → the doc comment of its entry in the signal table.
fn signal_docs() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(root().join("src/signals/mod.rs")).unwrap();
    let body = text.split("signal_table! {").nth(1).unwrap();
    let mut out = BTreeMap::new();
    let mut doc: Vec<String> = Vec::new();
    for line in body.lines() {
        let t = line.trim();
        if let Some(d) = t.strip_prefix("///") {
            doc.push(d.trim().to_string());
        } else if let Some((_, rest)) = t.split_once(" = \"") {
            let name = rest.split('"').next().unwrap().to_string();
            out.insert(name, doc.join(" "));
            doc.clear();
        } else if t == "}" {
            break;
        }
    }
    out
}

fn signals(out: &mut String) {
    let policy = toml::Value::try_from(HealthPolicy::default()).unwrap();
    let table = policy["signals"].as_table().unwrap();
    let docs = signal_docs();
    out.push_str(
        "\n### `policy.signals`\n\nReloads live. Per signal `policy.signals.<signal>`: its \
         `weight` in the score, the `normal` and `degraded` bounds its severity runs \
         between (in the signal's unit; for output tokens lower is worse), and \
         `min_samples` (below it the signal does not vote). The signal table is \
         `src/signals/mod.rs`.\n\n",
    );
    out.push_str(
        "| signal | weight | normal | degraded | min_samples | meaning |\n\
         |---|---|---|---|---|---|\n",
    );
    for d in &SIGNALS {
        let p = &d.default;
        let doc = docs
            .get(d.name)
            .unwrap_or_else(|| panic!("signal `{}` has no doc in the table", d.name));
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} |\n",
            d.name,
            p.weight,
            p.normal,
            p.degraded,
            p.min_samples,
            cell(doc)
        ));
    }
    let settings = field_docs("src/signals/policy.rs", "SignalPolicies");
    out.push_str(
        "\nAnd four settings of `policy.signals`:\n\n| key | default | meaning |\n|---|---|---|\n",
    );
    for (k, v) in table.iter().filter(|(_, v)| !v.is_table()) {
        let doc = settings
            .get(k)
            .unwrap_or_else(|| panic!("policy.signals.{k}: no field SignalPolicies.{k}"));
        out.push_str(&format!("| `{k}` | {} | {} |\n", show(v), cell(doc)));
    }
}

/// The built-in tier layers: what a free or paid channel's policy holds
/// that differs from `[policy]`'s defaults.
fn tiers(out: &mut String) {
    let cfg = Config::from_toml(
        "[[groups]]\nid = \"g\"\n\
         [[groups.channels]]\nid = \"f\"\ntier = \"free\"\ncapacity_rps = 1.0\n\
         [[groups.channels]]\nid = \"p\"\ntier = \"paid\"\ncapacity_rps = 1.0\n",
    )
    .unwrap();
    let base = flatten(&toml::Value::try_from(HealthPolicy::default()).unwrap());
    out.push_str(
        "\n### Built-in tier layers\n\nWhat a channel of each tier starts from, where it \
         differs from the defaults above (`[tiers.<tier>.policy]` and a channel's own \
         `policy` are layered over these):\n\n| tier | initial weight | policy keys that differ |\n\
         |---|---|---|\n",
    );
    for tier in [Tier::Free, Tier::Paid] {
        let ch = cfg.channels().find(|c| c.tier == tier).unwrap();
        let mine = flatten(&toml::Value::try_from(ch.policy.as_ref()).unwrap());
        let diff: Vec<String> = mine
            .iter()
            .filter(|(k, v)| base.get(*k) != Some(*v))
            .map(|(k, v)| format!("`{k} = {v}`"))
            .collect();
        out.push_str(&format!(
            "| `{}` | {} | {} |\n",
            tier.as_str(),
            ch.initial_weight,
            if diff.is_empty() {
                "none".into()
            } else {
                diff.join(", ")
            }
        ));
    }
}

fn flatten(v: &toml::Value) -> BTreeMap<String, String> {
    fn walk(prefix: &str, v: &toml::Value, out: &mut BTreeMap<String, String>) {
        match v {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    let p = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&p, v, out);
                }
            }
            v => {
                out.insert(prefix.to_string(), v.to_string());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk("", v, &mut out);
    out
}

fn classes(out: &mut String) {
    let docs = field_docs("src/config/schedule.rs", "ClassPolicy");
    let all = toml::Value::try_from(ClassPolicies::default()).unwrap();
    out.push_str(
        "\n### `traffic_classes.<class>`\n\nReloads live. One table per class \
         (`interactive`, `core`, `batch`, `experimental`):\n\n| class |",
    );
    for k in docs.keys() {
        out.push_str(&format!(" `{k}` |"));
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(docs.len()));
    out.push('\n');
    for class in ["interactive", "core", "batch", "experimental"] {
        out.push_str(&format!("| `{class}` |"));
        for k in docs.keys() {
            out.push_str(&format!(" {} |", show(&all[class][k.as_str()])));
        }
        out.push('\n');
    }
    out.push('\n');
    for (k, d) in &docs {
        out.push_str(&format!("- `{k}`: {d}\n"));
    }
}

fn catalogue(out: &mut String) {
    let raw = field_docs("src/config/catalogue.rs", "RawChannel");
    let docs = field_docs("src/config/catalogue.rs", "ChannelConfig");
    let tier_docs = field_docs("src/config/catalogue.rs", "RawTier");
    out.push_str(
        "\n### `[[groups]]`, `[[groups.channels]]`, `[tiers.<tier>]`\n\nReloads live \
         (channels may come and go). A group has an `id` and an optional \
         `budget_per_hour` (spend ceiling per hour in the cost currency; unset: \
         unbounded). A channel:\n\n| key | meaning |\n|---|---|\n",
    );
    for k in raw.keys() {
        let d = match k.as_str() {
            "id" => "Unique across the config; the Kafka key of its events.",
            "tier" => "`free` or `paid`: picks the built-in policy layer and initial weight.",
            "policy" => "A partial `[policy]` table layered over the tier's (most specific last).",
            _ => docs
                .get(k)
                .map(String::as_str)
                .unwrap_or_else(|| panic!("channel key `{k}`: no doc on ChannelConfig.{k}")),
        };
        out.push_str(&format!("| `{k}` | {} |\n", cell(d)));
    }
    out.push_str("\nA tier (`[tiers.free]`, `[tiers.paid]`):\n\n| key | meaning |\n|---|---|\n");
    for (k, d) in &tier_docs {
        let d = if k == "policy" {
            "A partial `[policy]` table layered over the built-in tier layer."
        } else {
            d.as_str()
        };
        out.push_str(&format!("| `{k}` | {} |\n", cell(d)));
    }
}

fn generate() -> String {
    let live = "Reloads live: a valid edit applies at the next reload check.";
    let restart_engine =
        "Read at start: a reload that changes it is refused until a restart (the windows' shape).";
    let restart =
        "Read at start: an edit applies at the next restart (a warning names the section).";
    let mut out = String::new();
    section(
        &mut out,
        "engine",
        restart_engine,
        &EngineConfig::default(),
        "src/config/engine.rs",
        "EngineConfig",
    );
    signals(&mut out);
    section(
        &mut out,
        "policy.states",
        live,
        &HealthPolicy::default().states,
        "src/config/policy.rs",
        "StatePolicy",
    );
    tiers(&mut out);
    classes(&mut out);
    section(
        &mut out,
        "schedule",
        live,
        &ScheduleConfig::default(),
        "src/config/schedule.rs",
        "ScheduleConfig",
    );
    section(
        &mut out,
        "safety",
        live,
        &SafetyConfig::default(),
        "src/config/schedule.rs",
        "SafetyConfig",
    );
    section(
        &mut out,
        "alerts",
        live,
        &AlertConfig::default(),
        "src/config/alerts.rs",
        "AlertConfig",
    );
    catalogue(&mut out);
    section(
        &mut out,
        "kafka",
        restart,
        &KafkaConfig::default(),
        "src/config/runtime.rs",
        "KafkaConfig",
    );
    section(
        &mut out,
        "redis",
        restart,
        &RedisConfig::default(),
        "src/config/runtime.rs",
        "RedisConfig",
    );
    section(
        &mut out,
        "service",
        restart,
        &ServiceConfig::default(),
        "src/config/runtime.rs",
        "ServiceConfig",
    );
    out
}

fn page() -> PathBuf {
    root().join("docs/configuration.md")
}

#[test]
fn the_configuration_reference_is_generated_from_the_config_types() {
    let text = std::fs::read_to_string(page()).unwrap();
    let (head, rest) = text
        .split_once(BEGIN)
        .expect("docs/configuration.md has the BEGIN marker");
    let (_, tail) = rest
        .split_once(END)
        .expect("docs/configuration.md has the END marker");
    let want = format!("{head}{BEGIN}\n{}\n{END}{tail}", generate());
    if std::env::var_os("HERMES_BLESS").is_some() {
        std::fs::write(page(), &want).unwrap();
        return;
    }
    assert!(
        text == want,
        "docs/configuration.md is out of date with the config types: run \
         `HERMES_BLESS=1 cargo test --test config_reference` and review the diff"
    );
}

#[test]
fn the_example_config_is_valid_and_uses_only_documented_sections() {
    let example = root().join("hermes.example.toml");
    hermes::config::ConfigFile::from_file(Path::new(&example)).unwrap();
    let text = std::fs::read_to_string(page()).unwrap();
    let parsed: toml::Table = std::fs::read_to_string(&example).unwrap().parse().unwrap();
    for section in parsed.keys() {
        assert!(
            text.contains(&format!("`{section}")) || text.contains(&format!("[{section}")),
            "hermes.example.toml section `{section}` is not in docs/configuration.md"
        );
    }
}
