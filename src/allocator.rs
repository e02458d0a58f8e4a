//! The process's memory allocator: jemalloc, with its memory in huge pages.
//!
//! At steady state the request path reads a channel's state at random
//! across hundreds of MB (about 44 KB a channel, 10 000 channels a
//! partition), and with 4 KB pages nearly every record also misses the
//! TLB: a page-table walk before the load itself. In 2 MB pages the same
//! state is a few hundred TLB entries. glibc's malloc asks the kernel for
//! huge pages only for its main arena, and only when started with a
//! tunable, while a partition lives on its request thread's arena; jemalloc
//! advises every mapping it makes (`thp:always`), on every thread.
//! docs/performance.md ("Memory and huge pages") and docs/architecture.md
//! ("Why each dependency") have the measurements.
//!
//! The options are compiled in ([`MALLOC_CONF`]); jemalloc reads the
//! `_RJEM_MALLOC_CONF` environment variable after them, so an operator can
//! override them without a rebuild
//! (`_RJEM_MALLOC_CONF=thp:default,metadata_thp:disabled` leaves pages to
//! the kernel's default). The kernel decides in the end:
//! `/sys/kernel/mm/transparent_hugepage/enabled` set to `never` turns the
//! advice into a no-op.
//!
//! Declared in the library, so the service, the demo, `hermes bench` and
//! the benchmarks all run on the allocator production runs on.

use std::ffi::{c_char, CStr};

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's compiled-in options: every mapping advised for transparent
/// huge pages, its own metadata too.
pub const OPTIONS: &CStr = c"thp:always,metadata_thp:always";

/// A C string pointer jemalloc reads as its `malloc_conf` before `main`.
#[repr(transparent)]
pub struct ConfPtr(*const c_char);

// SAFETY: the pointer is to a `'static` constant string, never written.
unsafe impl Sync for ConfPtr {}

/// `const char *malloc_conf`, under the prefixed name `tikv-jemalloc-sys`
/// builds jemalloc with. jemalloc declares its own weak and empty; this
/// definition replaces it.
#[export_name = "_rjem_malloc_conf"]
#[used]
pub static MALLOC_CONF: ConfPtr = ConfPtr(OPTIONS.as_ptr());

/// What the process's memory runs on, for the service's start-up log:
/// the built-in options, the environment's override if set, and the
/// kernel's transparent huge page mode.
pub fn describe() -> String {
    let mut out = format!("jemalloc {}", OPTIONS.to_str().unwrap_or("?"));
    if let Some(env) = std::env::var_os("_RJEM_MALLOC_CONF") {
        out.push_str(&format!(
            ", overridden by _RJEM_MALLOC_CONF={}",
            env.to_string_lossy()
        ));
    }
    if let Some(mode) = kernel_thp_mode() {
        out.push_str(&format!("; kernel THP {mode}"));
    }
    out
}

/// The kernel's transparent huge page mode, the chosen one in brackets
/// (`always [madvise] never`); `None` off Linux or without THP.
pub fn kernel_thp_mode() -> Option<String> {
    let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    Some(mode.trim().to_string())
}

/// The process's resident anonymous memory in transparent huge pages
/// (`AnonHugePages`, Linux): whether the advice took effect.
#[cfg(feature = "cli")] // `hermes bench`
pub fn resident_huge_page_bytes() -> Option<u64> {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    let line = rollup.lines().find(|l| l.starts_with("AnonHugePages:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_options_are_what_jemalloc_reads() {
        // SAFETY: jemalloc reads the symbol's first word as a C string;
        // it points to `OPTIONS`, a NUL-terminated `'static` constant.
        let read = unsafe { std::ffi::CStr::from_ptr(super::MALLOC_CONF.0) };
        assert_eq!(read, super::OPTIONS);
        assert!(read.to_str().unwrap().contains("thp:always"));
        assert!(super::describe().starts_with("jemalloc thp:always"));
    }

    /// The options took effect: a large allocation lands in a mapping
    /// advised for huge pages (`hg` in its `VmFlags`). Checked where the
    /// kernel hands huge pages only to advised memory (`madvise`, this
    /// machine's and most distributions' default), unless the operator
    /// overrode the options.
    #[test]
    fn large_allocations_are_advised_for_huge_pages() {
        let mode = super::kernel_thp_mode().unwrap_or_default();
        if !mode.contains("[madvise]") || std::env::var_os("_RJEM_MALLOC_CONF").is_some() {
            eprintln!("skipped: THP mode {mode:?} or options overridden");
            return;
        }
        let block = vec![1u8; 16 << 20];
        let at = block.as_ptr() as usize;
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("Linux");
        let mut inside = false;
        let mut flags = None;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((lo, hi)) = range.split_once('-') {
                    if let (Ok(lo), Ok(hi)) =
                        (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                    {
                        inside = lo <= at && at < hi;
                        continue;
                    }
                }
            }
            if inside {
                if let Some(f) = line.strip_prefix("VmFlags:") {
                    flags = Some(f.to_string());
                }
            }
        }
        let flags = flags.expect("the block's mapping is in smaps");
        assert!(
            flags.split_whitespace().any(|f| f == "hg"),
            "the block's mapping is not advised: {flags}"
        );
        drop(block);
    }
}
