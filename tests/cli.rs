//! The command line as people type it: values that look like flags,
//! one-of choices, durations with units, dates that exist, flags after the
//! subcommand, and one exit-code convention across commands (2 for usage
//! and input errors, 1 for failures while running).

use std::process::Command;

/// Runs `hermes` with `args`; (exit code, stderr).
fn hermes(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_hermes"))
        .args(args)
        .env_remove("HERMES_CONTROL_TOKEN")
        .env_remove("HERMES_URL")
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("hermes runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A loopback URL nothing listens on.
fn nowhere() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    format!("http://127.0.0.1:{port}")
}

fn temp(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("hermes-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn ctl_reads_values_choices_and_durations_as_people_write_them() {
    let url = nowhere();
    // A negative weight is a value, refused for its range, not a flag.
    let (code, err) = hermes(&[
        "ctl", "pin", "free-a", "--weight", "-0.5", "--reason", "x", "--url", &url,
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("within 0..1"), "{err}");
    // One of three choices, named as one.
    let (code, err) = hermes(&["ctl", "pin", "free-a", "--reason", "x"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("<--drain|--weight <WEIGHT>|--healthy>"),
        "{err}"
    );
    // A bare number is not a duration.
    let (code, err) = hermes(&[
        "ctl", "pin", "free-a", "--drain", "--for", "30", "--reason", "x",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("needs a unit"), "{err}");
    // --url and --token-file after the subcommand; the token is read from
    // the file, so the failure is the unreachable instance (exit 1).
    let token = temp("token", "0123456789abcdef-token\n");
    let (code, err) = hermes(&[
        "ctl",
        "pin",
        "free-a",
        "--drain",
        "--for",
        "30m",
        "--reason",
        "x",
        "--url",
        &url,
        "--token-file",
        token.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("is `hermes run` serving its control API"),
        "{err}"
    );
    assert!(!err.contains("needs the control token"), "{err}");
}

#[test]
fn impossible_dates_are_refused() {
    let alerts = temp("alerts.jsonl", "");
    let (code, err) = hermes(&[
        "report",
        "--alerts",
        alerts.to_str().unwrap(),
        "--from",
        "2026-02-31",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("2026-02-31"), "{err}");
}

#[test]
fn a_bad_config_is_exit_2_with_its_line_in_every_command() {
    let bad = temp("bad.toml", "# overrides\n\n[engine]\nslice_ms = -5\n");
    let path = bad.to_str().unwrap();
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/hard-down.toml");
    for args in [
        vec!["check-config", path, "--engine-only"],
        vec!["simulate", scenario, "--config", path],
        vec!["run", "--config", path],
    ] {
        let (code, err) = hermes(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("engine.slice_ms (line 4)"), "{args:?}: {err}");
    }
}
