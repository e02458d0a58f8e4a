//! `hermes` asks glibc for transparent huge pages by re-executing itself
//! once with `glibc.malloc.hugetlb=1`, and leaves an operator's own setting
//! alone. Checked from outside: a short `hermes bench` reports the value
//! its process ran with.

use std::process::Command;

fn bench_hugetlb(tunables: Option<&str>) -> serde_json::Value {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hermes"));
    cmd.args([
        "bench",
        "--channels",
        "20",
        "--seconds",
        "1",
        "--warmup",
        "1",
        "--json",
    ]);
    match tunables {
        Some(t) => cmd.env("GLIBC_TUNABLES", t),
        None => cmd.env_remove("GLIBC_TUNABLES"),
    };
    let out = cmd.output().expect("running hermes bench");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    report["malloc_hugetlb"].clone()
}

fn kernel_allows() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .map(|mode| hermes::huge_pages::kernel_allows(&mode))
        .unwrap_or(false)
}

#[test]
fn hermes_runs_with_huge_pages_unless_the_operator_said_otherwise() {
    let glibc_linux = cfg!(all(target_os = "linux", target_env = "gnu"));
    let asked = bench_hugetlb(None);
    if glibc_linux && kernel_allows() {
        assert_eq!(asked, "1");
    } else {
        assert!(asked.is_null(), "{asked}");
    }
    // The operator's choice, and the tunables beside it, are kept.
    assert_eq!(bench_hugetlb(Some("glibc.malloc.hugetlb=0")), "0");
    assert_eq!(
        bench_hugetlb(Some("glibc.malloc.arena_max=4:glibc.malloc.hugetlb=0")),
        "0"
    );
}
