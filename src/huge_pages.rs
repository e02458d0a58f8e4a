//! Transparent huge pages for the heap.
//!
//! A partition keeps ~60 KB per channel in many small allocations and reads
//! them in the order events arrive, which is random across channels: at 10 k
//! channels every event lands on pages the TLB does not hold, and each miss
//! walks the page tables. With 2 MB pages the same state needs 512 times
//! fewer entries; `hermes bench` at 10 k channels runs ~13 % faster (README,
//! Performance).
//!
//! Most kernels ship transparent huge pages in `madvise` mode: a mapping
//! gets them only when the program asks. glibc's malloc asks when its
//! tunable `glibc.malloc.hugetlb=1` is set, and glibc reads tunables from the
//! environment (`GLIBC_TUNABLES`) only as a process starts. So [`ensure`]
//! runs first in `main`: it re-executes the same binary, with the same
//! arguments, once, with the tunable added. An operator who sets
//! `glibc.malloc.hugetlb` in `GLIBC_TUNABLES` (`=0` turns it off) is left
//! alone, as is a kernel with transparent huge pages `never`.

/// glibc's tunable for transparent huge pages in malloc.
pub const TUNABLE: &str = "glibc.malloc.hugetlb";

/// What [`ensure`] found (it returns only when it did not re-execute).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heap {
    /// `GLIBC_TUNABLES` already sets the tunable (to this value): this
    /// process was re-executed, or the operator chose.
    Set(String),
    /// The kernel has no transparent huge pages, or they are `never`.
    KernelOff,
    /// Not a glibc build on Linux: nothing to ask.
    Unsupported,
    /// Re-executing failed (the error): the heap keeps 4 KB pages.
    ExecFailed(String),
}

impl std::fmt::Display for Heap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Heap::Set(v) => write!(f, "{TUNABLE}={v}"),
            Heap::KernelOff => write!(f, "the kernel's transparent huge pages are off"),
            Heap::Unsupported => write!(f, "not a glibc build on Linux"),
            Heap::ExecFailed(e) => write!(f, "re-executing with {TUNABLE}=1 failed: {e}"),
        }
    }
}

/// The value `GLIBC_TUNABLES` gives the tunable, if it names it.
pub fn tunable_value(tunables: &str) -> Option<&str> {
    // glibc's syntax: `name=value` pairs separated by ':'.
    tunables
        .split(':')
        .filter_map(|pair| pair.split_once('='))
        .find(|(name, _)| *name == TUNABLE)
        .map(|(_, value)| value)
}

/// `GLIBC_TUNABLES` with the tunable added, or `None` when it names it
/// already.
pub fn with_tunable(tunables: Option<&str>) -> Option<String> {
    match tunables {
        Some(t) if tunable_value(t).is_some() => None,
        Some(t) if !t.is_empty() => Some(format!("{t}:{TUNABLE}=1")),
        _ => Some(format!("{TUNABLE}=1")),
    }
}

/// Whether the kernel's mode (the text of
/// `/sys/kernel/mm/transparent_hugepage/enabled`) lets a program ask.
pub fn kernel_allows(mode: &str) -> bool {
    mode.contains("[always]") || mode.contains("[madvise]")
}

/// Re-execute this binary with the tunable set, unless it is set already
/// or would change nothing. Call it first in `main`, before any thread
/// starts; it returns only when it did not re-execute.
pub fn ensure() -> Heap {
    if !cfg!(all(target_os = "linux", target_env = "gnu")) {
        return Heap::Unsupported;
    }
    let current = std::env::var("GLIBC_TUNABLES").ok();
    let Some(tunables) = with_tunable(current.as_deref()) else {
        let value = current.as_deref().and_then(tunable_value).unwrap_or("");
        return Heap::Set(value.to_string());
    };
    match std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled") {
        Ok(mode) if kernel_allows(&mode) => {}
        _ => return Heap::KernelOff,
    }
    Heap::ExecFailed(reexec(&tunables))
}

#[cfg(unix)]
fn reexec(tunables: &str) -> String {
    use std::os::unix::process::CommandExt;
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return format!("finding the binary: {e}"),
    };
    // `exec` returns only on failure.
    let err = std::process::Command::new(&exe)
        .args(std::env::args_os().skip(1))
        .env("GLIBC_TUNABLES", tunables)
        .exec();
    format!("{}: {err}", exe.display())
}

#[cfg(not(unix))]
fn reexec(_: &str) -> String {
    "not a Unix system".to_string()
}

/// Bytes of this process's anonymous memory on transparent huge pages
/// (Linux's `AnonHugePages`), or `None` where that is not reported.
pub fn anon_huge_bytes() -> Option<u64> {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    anon_huge_bytes_of(&rollup)
}

fn anon_huge_bytes_of(rollup: &str) -> Option<u64> {
    let line = rollup.lines().find(|l| l.starts_with("AnonHugePages:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tunable_is_added_once_and_an_operators_choice_is_kept() {
        assert_eq!(
            with_tunable(None).as_deref(),
            Some("glibc.malloc.hugetlb=1")
        );
        assert_eq!(
            with_tunable(Some("")).as_deref(),
            Some("glibc.malloc.hugetlb=1")
        );
        assert_eq!(
            with_tunable(Some("glibc.malloc.arena_max=2")).as_deref(),
            Some("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")
        );
        assert_eq!(with_tunable(Some("glibc.malloc.hugetlb=1")), None);
        assert_eq!(
            with_tunable(Some("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0")),
            None
        );
        // A longer name that starts with it is another tunable.
        assert!(with_tunable(Some("glibc.malloc.hugetlbx=0")).is_some());
        assert_eq!(tunable_value("a=1:glibc.malloc.hugetlb=0"), Some("0"));
        assert_eq!(tunable_value("a=1"), None);
    }

    #[test]
    fn the_kernel_mode_is_read_from_its_brackets() {
        assert!(kernel_allows("always [madvise] never\n"));
        assert!(kernel_allows("[always] madvise never\n"));
        assert!(!kernel_allows("always madvise [never]\n"));
        assert!(!kernel_allows(""));
    }

    #[test]
    fn huge_pages_are_read_from_the_rollup() {
        let rollup = "Rss:  1000 kB\nAnonHugePages:    612352 kB\nShared_Hugetlb: 0 kB\n";
        assert_eq!(anon_huge_bytes_of(rollup), Some(612352 * 1024));
        assert_eq!(anon_huge_bytes_of("Rss: 1 kB\n"), None);
    }
}
