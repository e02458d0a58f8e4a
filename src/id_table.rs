//! [`IdTable`]: ids to dense indexes (channel ids to their place in the
//! engine), in one open-addressing table whose slots hold the ids inline.
//!
//! The request path looks up one channel id per record among thousands. In
//! a `HashMap<String, _>` that is three loads from main memory one after
//! the other (control bytes, bucket, the key's heap block), each ~100 ns at
//! steady state, and nothing can start them early: the hash map picks its
//! bucket inside `get`. Here the lookup is split so a batch loop can hint
//! it records ahead (`service::partition::Lookahead`): [`IdTable::hash`]
//! and [`IdTable::prefetch`] first, [`IdTable::get_hashed`] later, reading
//! one slot's cache line that is loaded by then (ids of up to 22 bytes sit
//! in the slot, see [`ShortStr`]).

use crate::short_str::ShortStr;

/// One place of the table: 32 bytes, two to a cache line, never across one.
#[repr(align(32))]
#[derive(Clone, Default)]
struct Slot {
    key: Option<ShortStr>,
    /// The hash's high half: most slots of other ids are passed over
    /// without comparing strings.
    tag: u32,
    idx: u32,
}

/// An immutable map from ids to `u32` indexes.
pub struct IdTable {
    slots: Box<[Slot]>,
    mask: usize,
    hasher: ahash::RandomState,
    len: usize,
}

impl IdTable {
    /// The table of `entries` (id, index); a repeated id keeps its first
    /// index.
    pub fn new<'a>(entries: impl IntoIterator<Item = (&'a str, u32)>) -> IdTable {
        let entries: Vec<(&str, u32)> = entries.into_iter().collect();
        // At most half full: every probe ends at an empty slot soon.
        let n = (entries.len() * 2).next_power_of_two().max(8);
        let mut table = IdTable {
            slots: vec![Slot::default(); n].into_boxed_slice(),
            mask: n - 1,
            // Fixed seeds: a hash computed ahead stays right across a
            // rebuild of the table (its ids come from the config, not from
            // whoever sends events, so they cannot be chosen to collide).
            hasher: ahash::RandomState::with_seeds(
                0x6964_7461,
                0x626c_6573,
                0x6865_726d,
                0x6573_0001,
            ),
            len: 0,
        };
        for (id, idx) in entries {
            let hash = table.hash(id);
            let mut i = hash as usize & table.mask;
            loop {
                let slot = &mut table.slots[i];
                match &slot.key {
                    None => {
                        *slot = Slot {
                            key: Some(ShortStr::new(id)),
                            tag: (hash >> 32) as u32,
                            idx,
                        };
                        table.len += 1;
                        break;
                    }
                    Some(k) if *k == *id => break,
                    Some(_) => i = (i + 1) & table.mask,
                }
            }
        }
        table
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The hash [`IdTable::get_hashed`] and [`IdTable::prefetch`] take.
    #[inline]
    pub fn hash(&self, id: &str) -> u64 {
        self.hasher.hash_one(id)
    }

    /// Hints the slot a lookup of this hash starts at (see
    /// [`crate::prefetch`]); it changes nothing else.
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        crate::prefetch::value(&self.slots[hash as usize & self.mask]);
    }

    /// The index of `id`, whose [`IdTable::hash`] is `hash`.
    #[inline]
    pub fn get_hashed(&self, id: &str, hash: u64) -> Option<u32> {
        debug_assert_eq!(hash, self.hash(id));
        let tag = (hash >> 32) as u32;
        let mut i = hash as usize & self.mask;
        loop {
            let slot = &self.slots[i];
            match &slot.key {
                None => return None,
                Some(k) if slot.tag == tag && *k == *id => return Some(slot.idx),
                Some(_) => i = (i + 1) & self.mask,
            }
        }
    }

    pub fn get(&self, id: &str) -> Option<u32> {
        self.get_hashed(id, self.hash(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn finds_what_a_hash_map_finds() {
        for n in [0usize, 1, 3, 7, 8, 9, 100, 1000, 5000] {
            let ids: Vec<String> = (0..n)
                .map(|i| match i % 3 {
                    0 => format!("ch-{i}"),
                    1 => format!("a-channel-id-longer-than-inline-{i}"),
                    _ => format!("ü{i}"),
                })
                .collect();
            let table = IdTable::new(ids.iter().enumerate().map(|(i, s)| (s.as_str(), i as u32)));
            let map: HashMap<&str, u32> = ids
                .iter()
                .enumerate()
                .map(|(i, s)| (s.as_str(), i as u32))
                .collect();
            assert_eq!(table.len(), n);
            assert_eq!(table.is_empty(), n == 0);
            for (id, idx) in &map {
                assert_eq!(table.get(id), Some(*idx), "{id}");
            }
            for i in 0..n + 50 {
                for miss in [format!("ch-{i}x"), format!("x{i}"), String::new()] {
                    assert_eq!(table.get(&miss), map.get(miss.as_str()).copied());
                }
            }
        }
    }

    #[test]
    fn a_repeated_id_keeps_its_first_index() {
        let table = IdTable::new([("a", 0), ("b", 1), ("a", 2)]);
        assert_eq!(table.len(), 2);
        assert_eq!(table.get("a"), Some(0));
        assert_eq!(table.get("b"), Some(1));
    }

    #[test]
    fn slots_are_a_cache_line_half() {
        assert_eq!(std::mem::size_of::<Slot>(), 32);
        assert_eq!(std::mem::align_of::<Slot>(), 32);
    }
}
