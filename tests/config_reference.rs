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
    fields_in_order(file, name).into_iter().collect()
}

/// The fields of `struct name` in `file` in declaration order, each with
/// its doc comment (one line).
fn fields_in_order(file: &str, name: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root().join(file)).unwrap();
    let mut out = Vec::new();
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
            out.push((field, doc.join(" ")));
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

/// A plain section of the file: its title, its defaults, and the struct
/// (file, name) whose doc comments say what each key means.
struct Section {
    title: &'static str,
    defaults: toml::Value,
    file: &'static str,
    ty: &'static str,
}

/// Every plain section (one struct, no layers), as the file lists them.
fn plain_sections() -> Vec<Section> {
    fn of<T: serde::Serialize + Default>(
        title: &'static str,
        file: &'static str,
        ty: &'static str,
    ) -> Section {
        Section {
            title,
            defaults: toml::Value::try_from(T::default()).unwrap(),
            file,
            ty,
        }
    }
    vec![
        of::<KafkaConfig>("kafka", "src/config/runtime.rs", "KafkaConfig"),
        of::<RedisConfig>("redis", "src/config/runtime.rs", "RedisConfig"),
        of::<ServiceConfig>("service", "src/config/runtime.rs", "ServiceConfig"),
        of::<EngineConfig>("engine", "src/config/engine.rs", "EngineConfig"),
        of::<AlertConfig>("alerts", "src/config/alerts.rs", "AlertConfig"),
        of::<ScheduleConfig>("schedule", "src/config/schedule.rs", "ScheduleConfig"),
        of::<SafetyConfig>("safety", "src/config/schedule.rs", "SafetyConfig"),
        Section {
            title: "policy.states",
            defaults: toml::Value::try_from(HealthPolicy::default().states).unwrap(),
            file: "src/config/policy.rs",
            ty: "StatePolicy",
        },
    ]
}

fn plain(title: &str) -> Section {
    plain_sections()
        .into_iter()
        .find(|s| s.title == title)
        .unwrap_or_else(|| panic!("no section {title}"))
}

/// One section's table: every documented field, with its default.
fn section(out: &mut String, reload: &str, sec: Section) {
    let Section {
        title,
        defaults,
        file,
        ty,
    } = sec;
    let table = defaults.as_table().unwrap();
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

/// Each tier's built-in layer: a channel's initial weight and the policy
/// keys (`key = value`) that differ from `[policy]`'s defaults.
fn tier_layers() -> Vec<(Tier, f64, Vec<String>)> {
    let cfg = Config::from_toml(
        "[[groups]]\nid = \"g\"\n\
         [[groups.channels]]\nid = \"f\"\ntier = \"free\"\ncapacity_rps = 1.0\n\
         [[groups.channels]]\nid = \"p\"\ntier = \"paid\"\ncapacity_rps = 1.0\n",
    )
    .unwrap();
    let base = flatten(&toml::Value::try_from(HealthPolicy::default()).unwrap());
    [Tier::Free, Tier::Paid]
        .into_iter()
        .map(|tier| {
            let ch = cfg.channels().find(|c| c.tier == tier).unwrap();
            let mine = flatten(&toml::Value::try_from(ch.policy.as_ref()).unwrap());
            let diff = mine
                .iter()
                .filter(|(k, v)| base.get(*k) != Some(*v))
                .map(|(k, v)| format!("{k} = {v}"))
                .collect();
            (tier, ch.initial_weight, diff)
        })
        .collect()
}

/// The built-in tier layers: what a free or paid channel's policy holds
/// that differs from `[policy]`'s defaults.
fn tiers(out: &mut String) {
    out.push_str(
        "\n### Built-in tier layers\n\nWhat a channel of each tier starts from, where it \
         differs from the defaults above (`[tiers.<tier>.policy]` and a channel's own \
         `policy` are layered over these):\n\n| tier | initial weight | policy keys that differ |\n\
         |---|---|---|\n",
    );
    for (tier, initial_weight, diff) in tier_layers() {
        let diff: Vec<String> = diff.iter().map(|d| format!("`{d}`")).collect();
        out.push_str(&format!(
            "| `{}` | {} | {} |\n",
            tier.as_str(),
            initial_weight,
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
         (`interactive`, `core`, `batch`, `experimental`); a table lists only the keys \
         it changes, the rest keep the class's defaults:\n\n| class |",
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
         (channels and groups may come and go, in any order): a channel that stays \
         keeps its windows, state, open incident and saved state; a removed one's \
         are dropped; a new channel or group starts empty and is evaluated from its \
         next phase. A group has an `id` and an optional \
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
    section(&mut out, restart_engine, plain("engine"));
    signals(&mut out);
    section(&mut out, live, plain("policy.states"));
    tiers(&mut out);
    classes(&mut out);
    for title in ["schedule", "safety", "alerts"] {
        section(&mut out, live, plain(title));
    }
    catalogue(&mut out);
    for title in ["kafka", "redis", "service"] {
        section(&mut out, restart, plain(title));
    }
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

// ---------------------------------------------------------------------------
// hermes.example.toml: every key with its default and the first sentence of
// its doc comment, generated from the same types and doc comments.

const EXAMPLE_HEAD: &str = "\
# Hermes configuration: every key, with its default and what it means.
# Generated from the config types (tests/config_reference.rs); edit the doc
# comments in src/config/ and run `HERMES_BLESS=1 cargo test --test
# config_reference` to change it. docs/configuration.md has the same keys
# with the whole of each explanation.
#
# Two keys have no default and are needed by `hermes run` only:
# `kafka.brokers` and `redis.url` (the values below are examples). Every
# other key is shown at its default and can be left out: a file lists only
# what it changes. `hermes check-config FILE` validates a file as `hermes
# run` would (`--engine-only` for a `simulate`/`replay` config) and names the
# section, key and line of every problem. Durations are milliseconds (`_ms`).
";

/// Values shown for keys that are required or unset by default.
const EXAMPLE_VALUES: &[(&str, &str, &str)] = &[
    (
        "kafka.brokers",
        "\"127.0.0.1:9092\"",
        "REQUIRED by `hermes run` (no default)",
    ),
    (
        "redis.url",
        "\"redis://127.0.0.1:6379/\"",
        "REQUIRED by `hermes run` (no default)",
    ),
    (
        "engine.max_clock_skew_ms",
        "10000",
        "unset: = engine.allowed_lateness_ms",
    ),
    ("engine.pane_ms", "60000", "unset: = engine.short_window_ms"),
];

/// Keys shown commented out: secrets belong in the environment or a file.
const EXAMPLE_COMMENTED: &[&str] = &[
    "kafka.schema_registry_password",
    "kafka.schema_registry_token",
    "service.control_token",
];

/// The first sentence of a doc comment (abbreviations do not end one).
fn first_sentence(doc: &str) -> String {
    let mut end = doc.len();
    let mut from = 0;
    while let Some(i) = doc[from..].find(". ") {
        let at = from + i;
        if doc[..at].ends_with('.') {
            // An ellipsis ("reaches this ... once at least").
            from = at + 2;
            continue;
        }
        let word = doc[..at].rsplit([' ', '(']).next().unwrap_or("");
        if ["e.g", "i.e", "vs", "cf"].contains(&word) {
            from = at + 2;
            continue;
        }
        end = at + 1;
        break;
    }
    doc[..end].trim().to_string()
}

/// `text` as `# ` comment lines of at most 78 columns.
fn comment(text: &str) -> String {
    let mut out = String::new();
    let mut line = String::from("#");
    for word in text.split_whitespace() {
        if line.len() + 1 + word.len() > 78 && line.len() > 1 {
            out.push_str(&line);
            out.push('\n');
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(word);
    }
    if line.len() > 1 {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// A value as TOML writes it on one line.
fn inline(v: &toml::Value) -> String {
    match v {
        toml::Value::Table(t) => {
            let parts: Vec<String> = t
                .iter()
                .map(|(k, v)| format!("{k} = {}", inline(v)))
                .collect();
            format!("{{ {} }}", parts.join(", "))
        }
        toml::Value::Array(a) => {
            let parts: Vec<String> = a.iter().map(inline).collect();
            format!("[{}]", parts.join(", "))
        }
        v => v.to_string(),
    }
}

/// `[title]` and each field of `ty` in declaration order: its doc's first
/// sentence, then `key = default`.
fn example_section(out: &mut String, sec: Section) {
    let Section {
        title,
        defaults,
        file,
        ty,
    } = sec;
    let table = defaults.as_table().unwrap();
    out.push_str(&format!("\n[{title}]\n"));
    let mut sub_tables = Vec::new();
    for (k, doc) in fields_in_order(file, ty) {
        let path = format!("{title}.{k}");
        if let Some(toml::Value::Table(t)) = table.get(&k) {
            if t.is_empty() {
                // A free-form map (kafka.properties): its own table, below.
                sub_tables.push((k.clone(), doc.clone()));
                continue;
            }
        }
        out.push_str(&comment(&first_sentence(&doc)));
        let given = EXAMPLE_VALUES.iter().find(|(p, _, _)| *p == path);
        let (value, note) = match (table.get(&k), given) {
            (_, Some((_, v, note))) => (v.to_string(), Some(*note)),
            (Some(v), None) => (inline(v), None),
            (None, None) => panic!("{path} is unset by default: give it a value in EXAMPLE_VALUES"),
        };
        let line = format!("{k} = {value}");
        let line = match note {
            Some(n)
                if table.get(&k).is_none() || !table[&k].as_str().is_some_and(|s| s.is_empty()) =>
            {
                if table.get(&k).is_none() {
                    format!("# {line}  # {n}")
                } else {
                    format!("{line}  # {n}")
                }
            }
            Some(n) => format!("{line}  # {n}"),
            None => line,
        };
        if EXAMPLE_COMMENTED.contains(&path.as_str()) {
            out.push_str(&format!("# {line}\n"));
        } else {
            out.push_str(&format!("{line}\n"));
        }
    }
    for (k, doc) in sub_tables {
        out.push_str(&format!(
            "\n{}[{title}.{k}]\n",
            comment(&first_sentence(&doc))
        ));
        if title == "kafka" && k == "properties" {
            out.push_str(
                "# Passed verbatim to librdkafka; values of keys naming a password, secret,\n\
                 # key, token or JAAS config never appear in any log line.\n\
                 # \"security.protocol\" = \"SASL_SSL\"\n\
                 # \"sasl.mechanisms\" = \"SCRAM-SHA-512\"\n\
                 # \"sasl.username\" = \"hermes\"\n\
                 # \"sasl.password\" = \"...\"\n\
                 # \"ssl.ca.location\" = \"/etc/ssl/certs/ca.pem\"\n",
            );
        }
    }
}

fn example_classes(out: &mut String) {
    out.push_str(
        "\n# Traffic classes, served in priority order. A class table lists only what\n\
         # it changes; the rest keeps that class's defaults.\n",
    );
    for (k, doc) in fields_in_order("src/config/schedule.rs", "ClassPolicy") {
        out.push_str(&comment(&format!("`{k}`: {}", first_sentence(&doc))));
    }
    let all = toml::Value::try_from(ClassPolicies::default()).unwrap();
    for class in ["interactive", "core", "batch", "experimental"] {
        out.push_str(&format!("\n[traffic_classes.{class}]\n"));
        for (k, _) in fields_in_order("src/config/schedule.rs", "ClassPolicy") {
            out.push_str(&format!("{k} = {}\n", inline(&all[class][k.as_str()])));
        }
    }
}

fn example_policy(out: &mut String) {
    out.push_str(
        "\n# The health policy of every channel (a tier's layer and a channel's own\n\
         # `policy` go over it; see [tiers] below). Each signal maps linearly from\n\
         # `normal` (0) to `degraded` (1), times its `weight`; the score is their\n\
         # clamped sum. `min_samples`: below it the signal does not vote.\n\
         [policy.signals]\n",
    );
    let policy = toml::Value::try_from(HealthPolicy::default()).unwrap();
    let signals = policy["signals"].as_table().unwrap();
    let settings = field_docs("src/signals/policy.rs", "SignalPolicies");
    for (k, v) in signals.iter().filter(|(_, v)| !v.is_table()) {
        out.push_str(&comment(&first_sentence(&settings[k])));
        out.push_str(&format!("{k} = {}\n", inline(v)));
    }
    let docs = signal_docs();
    for d in &SIGNALS {
        out.push_str(&format!(
            "\n{}[policy.signals.{}]\n",
            comment(&first_sentence(&docs[d.name])),
            d.name
        ));
        for (k, _) in fields_in_order("src/signals/policy.rs", "SignalPolicy") {
            out.push_str(&format!("{k} = {}\n", inline(&signals[d.name][k.as_str()])));
        }
    }
    example_section(out, plain("policy.states"));
}

fn example_tiers(out: &mut String) {
    let docs = field_docs("src/config/catalogue.rs", "RawTier");
    out.push_str(
        "\n# Trust tiers. A channel's policy is layered: [policy] above, then the\n\
         # built-in layer of its tier, then [tiers.<tier>.policy], then its own\n\
         # `policy`. A key the built-in layer sets must be changed here, under the\n\
         # tier, not in [policy] (check-config warns when it is).\n",
    );
    for (tier, initial_weight, diff) in tier_layers() {
        let t = tier.as_str();
        out.push_str(&format!("\n[tiers.{t}]\n"));
        out.push_str(&comment(&first_sentence(&docs["initial_weight"])));
        out.push_str(&format!("initial_weight = {initial_weight:?}\n"));
        if diff.is_empty() {
            out.push_str(&format!("# The built-in {t} layer changes nothing.\n"));
        } else {
            out.push_str(&comment(&format!(
                "The built-in {t} layer sets: {}. For example, to trip on 6 consecutive failures:",
                diff.join(", ")
            )));
            out.push_str(&format!(
                "# [tiers.{t}.policy.states]\n# consecutive_failures = 6\n"
            ));
        }
    }
}

/// The catalogue: hand-written channels, every channel key shown once.
const EXAMPLE_GROUPS: &str = r#"
# Route groups: interchangeable channels. Channel ids are the Kafka key of
# their events (a LiteLLM deployment's `model_info.id`; `hermes catalogue
# --litellm config.yaml` writes this part from a LiteLLM config).
[[groups]]
id = "chat"
budget_per_hour = 20.0          # optional spend ceiling, cost currency per hour

[[groups.channels]]
id = "free-a"
tier = "free"                   # free or paid: the policy layer and initial weight
price_per_1k_tokens = 0.0       # input + output tokens
capacity_rps = 40.0             # requests/s before it degrades
quota = 500000                  # optional: attempts per quota_period_ms the upstream allows,
quota_period_ms = 86400000      # counted by Hermes when gateways do not report quota_remaining

[[groups.channels]]
id = "paid-a"
tier = "paid"
price_per_1k_tokens = 0.6
capacity_rps = 60.0
initial_weight = 0.7            # optional: the tier's unless set

[[groups.channels]]
id = "paid-b"
tier = "paid"
price_per_1k_tokens = 1.2
capacity_rps = 30.0
# A channel can override any policy key for itself:
[groups.channels.policy.signals.p99_latency_ms]
normal = 2500.0
"#;

fn example() -> String {
    let mut out = String::from(EXAMPLE_HEAD);
    out.push_str("\n# --- Where `hermes run` connects; the engine, `hermes simulate` and replay\n# ignore these, `hermes demo` fills them in itself. ---\n");
    for sec in plain_sections() {
        if sec.title == "policy.states" {
            continue;
        }
        if sec.title == "engine" {
            out.push_str(
                "\n# --- The decisions (reload live, except [engine]'s window shape). ---\n",
            );
        }
        example_section(&mut out, sec);
    }
    example_classes(&mut out);
    example_policy(&mut out);
    example_tiers(&mut out);
    out.push_str(EXAMPLE_GROUPS);
    out
}

#[test]
fn the_example_config_is_generated_from_the_config_types() {
    let path = root().join("hermes.example.toml");
    let want = example();
    if std::env::var_os("HERMES_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
        return;
    }
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text == want,
        "hermes.example.toml is out of date with the config types: run \
         `HERMES_BLESS=1 cargo test --test config_reference` and review the diff"
    );
}

/// Every key the types serialize is in the example, at its default (the
/// example is the defaults, so parsing it changes nothing but the
/// catalogue and the two required keys).
#[test]
fn the_example_config_shows_every_key_at_its_default() {
    let text = std::fs::read_to_string(root().join("hermes.example.toml")).unwrap();
    let file = hermes::config::ConfigFile::from_toml(&text).unwrap();
    assert!(file.warnings.is_empty(), "{:?}", file.warnings);
    assert_eq!(file.policy.engine, EngineConfig::default());
    assert_eq!(file.policy.alerts, AlertConfig::default());
    assert_eq!(file.policy.schedule, ScheduleConfig::default());
    assert_eq!(file.policy.safety, SafetyConfig::default());
    assert_eq!(file.policy.classes, ClassPolicies::default());
    assert_eq!(file.runtime.service, ServiceConfig::default());
    let kafka = KafkaConfig {
        brokers: "127.0.0.1:9092".into(),
        ..KafkaConfig::default()
    };
    assert_eq!(file.runtime.kafka, kafka);
    let parsed: toml::Table = text.parse().unwrap();
    let policy = flatten(&parsed["policy"]);
    let defaults = flatten(&toml::Value::try_from(HealthPolicy::default()).unwrap());
    assert_eq!(
        policy, defaults,
        "[policy] is every policy key at its default"
    );
    let mut shown = flatten(&toml::Value::Table(parsed.clone()));
    shown.retain(|k, _| !k.starts_with("groups"));
    for Section {
        title: section,
        defaults: value,
        ..
    } in plain_sections()
    {
        for key in flatten(&value).keys() {
            let path = format!("{section}.{key}");
            assert!(
                shown.contains_key(&path) || text.contains(&format!("# {key} = ")),
                "hermes.example.toml does not show {path}"
            );
        }
    }
    let channel_keys = field_docs("src/config/catalogue.rs", "RawChannel");
    for k in channel_keys.keys() {
        assert!(
            EXAMPLE_GROUPS.contains(&format!("\n{k} = "))
                || EXAMPLE_GROUPS.contains(&format!("channels.{k}")),
            "the example catalogue does not show a channel's `{k}`"
        );
    }
}
