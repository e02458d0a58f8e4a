//! One severity contract, from the code: docs/operating.md's table of what
//! each alert is, when it is raised, how severe and whether it pages is
//! generated from `hermes::alert::SEVERITIES` (which the alert tests hold
//! the code to), and the shipped Prometheus rules speak the same language.
//! `HERMES_BLESS=1 cargo test --test severity_contract` rewrites the table.

use hermes::alert::{Severity, SEVERITIES};

const OPERATING: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operating.md");
const RULES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/compose/prometheus/hermes-rules.yml"
);
const BEGIN: &str = "<!-- severity contract: generated from hermes::alert::SEVERITIES (HERMES_BLESS=1 cargo test --test severity_contract) -->";
const END: &str = "<!-- end of the severity contract -->";

fn pages(s: Severity) -> &'static str {
    match s {
        Severity::P1 | Severity::P2 => "pages",
        Severity::P3 => "a ticket",
        Severity::Info => "the audit trail",
    }
}

fn table() -> String {
    let mut s = String::from("| kind | raised when | severity | |\n|---|---|---|---|\n");
    for r in SEVERITIES {
        let kind = match r.kind {
            hermes::alert::AlertKind::Other => "any".to_string(),
            k => format!("`{}`", k.as_str()),
        };
        s.push_str(&format!(
            "| {kind} | {} | {} | {} |\n",
            r.when,
            r.severity.as_str(),
            pages(r.severity)
        ));
    }
    s
}

#[test]
fn the_severity_table_is_generated_from_the_code() {
    let doc = std::fs::read_to_string(OPERATING).unwrap();
    let (Some(b), Some(e)) = (doc.find(BEGIN), doc.find(END)) else {
        panic!("docs/operating.md lacks the severity contract markers");
    };
    let want = format!("{BEGIN}\n{}{END}", table());
    let have = &doc[b..e + END.len()];
    if std::env::var_os("HERMES_BLESS").is_some() {
        std::fs::write(OPERATING, doc.replacen(have, &want, 1)).unwrap();
        return;
    }
    assert_eq!(
        have, want,
        "docs/operating.md's severity table differs from hermes::alert::SEVERITIES: \
         HERMES_BLESS=1 cargo test --test severity_contract"
    );
}

#[test]
fn the_alert_rules_page_as_hermes_does() {
    let rules = std::fs::read_to_string(RULES).unwrap();
    assert!(
        rules.contains("P1 and P2 page, P3 is a ticket"),
        "the rules' header states the paging contract"
    );
    let mut seen = 0;
    for line in rules.lines() {
        if let Some(v) = line.trim().strip_prefix("severity:") {
            seen += 1;
            assert!(
                ["P1", "P2", "P3"].contains(&v.trim()),
                "a rule's severity outside the contract: {line}"
            );
        }
    }
    assert!(seen > 10, "every rule carries a severity label");
}
