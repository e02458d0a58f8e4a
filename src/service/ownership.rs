//! Which request partitions this instance owns: written by the request
//! loops, read by the group writers (which groups to write).

use std::collections::BTreeSet;
use std::sync::atomic::AtomicU32;
use std::sync::Mutex;

/// The request partitions this instance owns, as the request loop last
/// saw them, and how many the topic has.
#[derive(Default)]
pub struct Ownership {
    /// Per request loop (`service.request_threads`): each is a member of
    /// the consumer group with partitions of its own.
    owned: Mutex<std::collections::BTreeMap<usize, BTreeSet<i32>>>,
    pub request_partitions: AtomicU32,
}

impl Ownership {
    /// Request loop `lane`'s partitions.
    pub fn set_owned(&self, lane: usize, owned: BTreeSet<i32>) {
        super::lock(&self.owned).insert(lane, owned);
    }
    /// Every partition this instance's request loops own.
    pub fn owned(&self) -> BTreeSet<i32> {
        super::lock(&self.owned)
            .values()
            .flatten()
            .copied()
            .collect()
    }
}
