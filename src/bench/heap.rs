//! What the heap holds by allocation size, from jemalloc's statistics: a
//! census before and after a run says which sizes of allocation the
//! channels' state added, so its memory can be attributed to structures
//! (a slice ring's counters are one allocation of their own size, a fine
//! slice's digests another) and told apart from what the resident set
//! adds on top (allocator slack, huge-page rounding).

use std::collections::BTreeMap;

/// Live allocations by size: jemalloc's size classes (small ones in slabs,
/// large ones each its own extent) and how many of each are in use.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeapCensus {
    /// Bytes in live allocations, all sizes (`stats.allocated`).
    pub allocated: u64,
    /// Size class in bytes → allocations of it in use.
    pub by_size: BTreeMap<u64, u64>,
}

/// One size class's share of what a run added, per channel.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HeapClass {
    /// The size class, bytes.
    pub size: u64,
    /// Allocations of it the run added, per channel.
    pub per_channel: f64,
    /// `size * per_channel`.
    pub bytes_per_channel: f64,
}

impl HeapCensus {
    /// The heap now (every arena merged); `None` if jemalloc does not
    /// answer (statistics compiled out) or answers what this does not read.
    pub fn take() -> Option<HeapCensus> {
        tikv_jemalloc_ctl::epoch::advance().ok()?;
        let mut json = Vec::new();
        let mut options = tikv_jemalloc_ctl::stats_print::Options::default();
        options.json_format = true;
        options.skip_per_arena = true;
        options.skip_mutex_statistics = true;
        tikv_jemalloc_ctl::stats_print::stats_print(&mut json, options).ok()?;
        HeapCensus::from_stats_json(&json)
    }

    /// Reads jemalloc's JSON statistics (`malloc_stats_print` with `J`):
    /// the sizes from `arenas.bin` and `arenas.lextent`, the counts in use
    /// from the merged arena's `bins[].curregs` and
    /// `lextents[].curlextents`.
    pub fn from_stats_json(json: &[u8]) -> Option<HeapCensus> {
        let v: serde_json::Value = serde_json::from_slice(json).ok()?;
        let je = v.get("jemalloc")?;
        let sizes = |kind: &str| -> Option<Vec<u64>> {
            je.get("arenas")?
                .get(kind)?
                .as_array()?
                .iter()
                .map(|b| b.get("size")?.as_u64())
                .collect()
        };
        let merged = je.get("stats.arenas")?.get("merged")?;
        let counts = |kind: &str, field: &str| -> Option<Vec<u64>> {
            merged
                .get(kind)?
                .as_array()?
                .iter()
                .map(|b| b.get(field)?.as_u64())
                .collect()
        };
        let mut by_size = BTreeMap::new();
        for (sizes, counts) in [
            (sizes("bin")?, counts("bins", "curregs")?),
            (sizes("lextent")?, counts("lextents", "curlextents")?),
        ] {
            if sizes.len() != counts.len() {
                return None;
            }
            for (size, n) in sizes.into_iter().zip(counts) {
                if n > 0 {
                    *by_size.entry(size).or_insert(0) += n;
                }
            }
        }
        let allocated = je.get("stats")?.get("allocated")?.as_u64()?;
        Some(HeapCensus { allocated, by_size })
    }

    /// What the heap gained since `before`, per channel of `channels`: live
    /// bytes, and by size class (those that grew, largest share first).
    pub fn since(&self, before: &HeapCensus, channels: usize) -> (u64, Vec<HeapClass>) {
        let n = channels.max(1) as f64;
        let mut classes: Vec<HeapClass> = self
            .by_size
            .iter()
            .filter_map(|(&size, &now)| {
                let added = now.saturating_sub(before.by_size.get(&size).copied().unwrap_or(0));
                (added > 0).then(|| HeapClass {
                    size,
                    per_channel: added as f64 / n,
                    bytes_per_channel: (size * added) as f64 / n,
                })
            })
            .collect();
        classes.sort_by(|a, b| b.bytes_per_channel.total_cmp(&a.bytes_per_channel));
        let bytes = self.allocated.saturating_sub(before.allocated) / channels.max(1) as u64;
        (bytes, classes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sizes_and_counts_from_jemallocs_json() {
        let json = br#"{"jemalloc": {
            "arenas": {"bin": [{"size": 8}, {"size": 16}], "lextent": [{"size": 16384}]},
            "stats": {"allocated": 70000},
            "stats.arenas": {"merged": {
                "bins": [{"curregs": 3}, {"curregs": 0}],
                "lextents": [{"curlextents": 4}]}}}}"#;
        let c = HeapCensus::from_stats_json(json).unwrap();
        assert_eq!(c.allocated, 70_000);
        assert_eq!(c.by_size, BTreeMap::from([(8, 3), (16_384, 4)]));
        assert_eq!(HeapCensus::from_stats_json(b"{}"), None);
    }

    #[test]
    fn a_census_says_what_each_size_added_per_channel() {
        let before = HeapCensus {
            allocated: 1_000,
            by_size: BTreeMap::from([(8, 10), (96, 1)]),
        };
        let after = HeapCensus {
            allocated: 1_000 + 2 * (96 * 4 + 10_240 * 2),
            by_size: BTreeMap::from([(8, 9), (96, 9), (10_240, 4)]),
        };
        let (bytes, classes) = after.since(&before, 2);
        assert_eq!(bytes, 96 * 4 + 10_240 * 2);
        assert_eq!(classes.len(), 2, "the size that shrank is not listed");
        assert_eq!((classes[0].size, classes[0].per_channel), (10_240, 2.0));
        assert_eq!(classes[0].bytes_per_channel, 20_480.0);
        assert_eq!((classes[1].size, classes[1].per_channel), (96, 4.0));
    }

    #[test]
    fn this_process_heap_is_counted() {
        let held: Vec<Box<[u8; 10_000]>> = (0..64).map(|_| Box::new([1u8; 10_000])).collect();
        let census = HeapCensus::take().expect("jemalloc statistics");
        // 10 000 bytes is in jemalloc's 10 KiB class; other tests' threads
        // may hold more of it, never fewer than these.
        assert!(census.by_size.get(&10_240).copied().unwrap_or(0) >= 64);
        assert!(census.allocated >= 64 * 10_240);
        drop(held);
    }
}
