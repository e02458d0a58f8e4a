//! Duplicate events: the same `event_id` seen again within a short horizon
//! of event time is ignored (at-least-once producers retry; a rebalance
//! replays). Pure and deterministic, driven by event time.
//!
//! # Layout: 8 bytes a slot, at most 16 bytes a remembered id
//! Open-addressing tables (linear probing; 256 shards by fingerprint, so a
//! rebuild moves a 256th of the entries) of `u64` slots: 0 is empty;
//! otherwise the id's 48-bit fingerprint (from ahash with fixed keys, so a
//! replay decides the same) above a 16-bit tag of its event time, in units
//! of `horizon / 4096`. An entry whose tag is older than the horizon (by the
//! latest event time seen) is expired: it no longer counts, and an insert
//! reuses its slot. When live and expired entries fill three quarters of
//! the table, it is rebuilt with the live ones at half load, so a
//! remembered id costs 10.7 to 16 bytes and nothing else is kept per id (no
//! insertion queue). At a million ids in the horizon the chance that a new
//! id meets a remembered 48-bit fingerprint is about 4e-9 per event.

/// Remembers event ids for `horizon_ms` of event time.
pub struct Dedup {
    horizon_ms: i64,
    hasher: ahash::RandomState,
    /// Event-time units of a tag, and the horizon in tags (at most 4096,
    /// so a wrapped 16-bit age is never ambiguous within 16 horizons).
    tag_ms: i64,
    horizon_tags: u16,
    /// By the fingerprint's top bits: a rebuild moves one shard's entries,
    /// so it never pauses the request path for the whole table.
    shards: Vec<Shard>,
    latest_ms: i64,
    /// When the next shard is rebuilt whatever its load (round robin): a
    /// 16-bit tag wraps after 16 horizons, so no expired entry may live
    /// that long; each shard is swept every 8 horizons.
    next_sweep_ms: i64,
    next_sweep_shard: usize,
    duplicates: u64,
}

/// One open-addressing table.
#[derive(Clone)]
struct Shard {
    slots: Vec<u64>,
    /// Slots holding an entry, live or expired.
    occupied: usize,
}

/// Shards (a power of two) and the fingerprint bits that pick one.
const SHARDS: usize = 256;
const SHARD_SHIFT: u32 = 48 - 8;
/// Fewest slots a shard has.
const MIN_SLOTS: usize = 16;
/// Rebuilt past this share of occupied slots, to half of it.
const MAX_LOAD: f64 = 0.75;
const REBUILT_LOAD: f64 = 0.5;

impl Shard {
    fn new() -> Shard {
        Shard {
            slots: vec![0; MIN_SLOTS],
            occupied: 0,
        }
    }

    /// The slot a fingerprint starts probing at (fast range reduction over
    /// the bits below the shard's).
    fn home(fingerprint: u64, slots: usize) -> usize {
        let low = fingerprint & ((1 << SHARD_SHIFT) - 1);
        ((low as u128 * slots as u128) >> SHARD_SHIFT) as usize
    }
}

impl Dedup {
    pub fn new(horizon_ms: i64) -> Dedup {
        let horizon_ms = horizon_ms.max(1);
        // Rounded up, so the horizon is at most 4096 tags and a 16-bit tag
        // wraps only after 16 horizons (each shard is swept every 8).
        let tag_ms = ((horizon_ms + 4095) / 4096).max(1);
        Dedup {
            horizon_ms,
            hasher: ahash::RandomState::with_seeds(
                0x6865_726d,
                0x6573_6475,
                0x7075_6c69,
                0x6361_7465,
            ),
            tag_ms,
            // Rounded up: an id is remembered at least the horizon.
            horizon_tags: ((horizon_ms + tag_ms - 1) / tag_ms) as u16,
            shards: vec![Shard::new(); SHARDS],
            latest_ms: i64::MIN,
            next_sweep_ms: i64::MIN,
            next_sweep_shard: 0,
            duplicates: 0,
        }
    }

    fn tag(&self, t_ms: i64) -> u16 {
        t_ms.div_euclid(self.tag_ms) as u16
    }

    fn expired(&self, slot: u64, now_tag: u16) -> bool {
        now_tag.wrapping_sub(slot as u16) > self.horizon_tags
    }

    /// Moves the latest event time to `t` (if later): forgets everything
    /// on a jump past the horizon, and sweeps the next shard when due.
    fn advance(&mut self, t: i64) {
        if t <= self.latest_ms {
            return;
        }
        if self.latest_ms != i64::MIN && t.saturating_sub(self.latest_ms) > self.horizon_ms {
            // Everything remembered is older than the horizon now (and a
            // wrapped tag must never make it look young again).
            self.shards = vec![Shard::new(); SHARDS];
        }
        self.latest_ms = t;
        if t >= self.next_sweep_ms {
            let every = self.horizon_ms.saturating_mul(8) / SHARDS as i64;
            self.next_sweep_ms = t.saturating_add(every.max(1));
            let k = self.next_sweep_shard;
            self.next_sweep_shard = (k + 1) % SHARDS;
            self.rebuild(k, self.tag(t));
        }
    }

    /// An id's 48-bit fingerprint (never 0: 0 is an empty slot).
    /// What the table keeps of an id (never 0): computed once per record
    /// when the look-ahead hints its slot ([`Dedup::prefetch`]).
    pub fn fingerprint(&self, event_id: &str) -> u64 {
        (self.hasher.hash_one(event_id.as_bytes()) >> 16).max(1)
    }

    /// Hints the slot [`Dedup::first_seen`] starts probing at for the id
    /// of this fingerprint (see [`crate::prefetch`]): at steady state the
    /// table is far larger than the caches and each id's slot is a random
    /// one.
    pub fn prefetch(&self, fingerprint: u64) {
        let slots = &self.shards[(fingerprint >> SHARD_SHIFT) as usize].slots;
        crate::prefetch::value(&slots[Shard::home(fingerprint, slots.len())]);
    }

    /// True the first time an id is seen within the horizon; false for a
    /// duplicate (counted).
    pub fn first_seen(&mut self, event_id: &str, event_time_ms: i64) -> bool {
        let fingerprint = self.fingerprint(event_id);
        self.first_seen_fingerprint(fingerprint, event_time_ms)
    }

    /// [`Dedup::first_seen`] of the id whose [`Dedup::fingerprint`] this is.
    pub fn first_seen_fingerprint(&mut self, fingerprint: u64, event_time_ms: i64) -> bool {
        debug_assert_ne!(fingerprint, 0, "a fingerprint is never 0");
        self.advance(event_time_ms);
        let now_tag = self.tag(self.latest_ms);
        let entry = fingerprint << 16 | self.tag(event_time_ms) as u64;
        let k = (fingerprint >> SHARD_SHIFT) as usize;
        let n = self.shards[k].slots.len();
        let mut i = Shard::home(fingerprint, n);
        let mut reusable = None;
        loop {
            let slot = self.shards[k].slots[i];
            if slot == 0 {
                break;
            }
            let expired = self.expired(slot, now_tag);
            if slot >> 16 == fingerprint && !expired {
                self.duplicates += 1;
                return false;
            }
            if expired && reusable.is_none() {
                reusable = Some(i);
            }
            i = if i + 1 == n { 0 } else { i + 1 };
        }
        let shard = &mut self.shards[k];
        match reusable {
            Some(r) => shard.slots[r] = entry,
            None => {
                shard.slots[i] = entry;
                shard.occupied += 1;
                if shard.occupied as f64 > MAX_LOAD * n as f64 {
                    self.rebuild(k, now_tag);
                }
            }
        }
        true
    }

    /// Shard `k` anew, holding its live entries at half load.
    fn rebuild(&mut self, k: usize, now_tag: u16) {
        let live: Vec<u64> = self.shards[k]
            .slots
            .iter()
            .copied()
            .filter(|&s| s != 0 && !self.expired(s, now_tag))
            .collect();
        let n = ((live.len() as f64 / REBUILT_LOAD).ceil() as usize).max(MIN_SLOTS);
        let mut slots = vec![0u64; n];
        for entry in &live {
            let mut i = Shard::home(entry >> 16, n);
            while slots[i] != 0 {
                i = if i + 1 == n { 0 } else { i + 1 };
            }
            slots[i] = *entry;
        }
        self.shards[k] = Shard {
            slots,
            occupied: live.len(),
        };
    }

    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// Ids currently remembered (live entries; a scan).
    pub fn len(&self) -> usize {
        let now_tag = self.tag(self.latest_ms);
        self.shards
            .iter()
            .flat_map(|s| &s.slots)
            .filter(|&&s| s != 0 && !self.expired(s, now_tag))
            .count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the tables hold.
    pub fn bytes(&self) -> usize {
        self.shards.iter().map(|s| s.slots.len()).sum::<usize>() * std::mem::size_of::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeat_within_the_horizon_is_a_duplicate() {
        let mut d = Dedup::new(60_000);
        assert!(d.first_seen("a", 1_000));
        assert!(d.first_seen("b", 2_000));
        assert!(!d.first_seen("a", 3_000));
        assert_eq!(d.duplicates(), 1);
    }

    #[test]
    fn ids_expire_after_the_horizon_of_event_time() {
        let mut d = Dedup::new(60_000);
        assert!(d.first_seen("a", 0));
        assert!(d.first_seen("b", 61_000));
        assert_eq!(d.len(), 1, "`a` expired");
        assert!(
            d.first_seen("a", 61_001),
            "an id older than the horizon counts again"
        );
    }

    #[test]
    fn a_million_ids_cost_at_most_sixteen_bytes_each_and_expire() {
        let horizon = 60_000;
        let mut d = Dedup::new(horizon);
        // 20 000 ids a second for two horizons; every 100th sent twice.
        let mut dups = 0;
        for i in 0..2_400_000u64 {
            let t = (i / 20) as i64;
            assert!(d.first_seen(&format!("e{i}"), t), "a new id");
            if i % 100 == 0 {
                assert!(!d.first_seen(&format!("e{i}"), t));
                dups += 1;
            }
            if i % 200_000 == 199_999 && t > horizon {
                let live = d.len();
                assert!(
                    (1_150_000..=1_250_000).contains(&live),
                    "about a horizon of ids remembered: {live}"
                );
                let per_id = d.bytes() as f64 / live as f64;
                assert!(per_id <= 16.5, "{per_id:.1} bytes per remembered id");
            }
        }
        assert_eq!(d.duplicates(), dups);
        // An id older than the horizon counts again; a younger one does not.
        assert!(d.first_seen("e1100000", 120_000 - 1), "65 s old");
        assert!(!d.first_seen("e2399000", 120_000 - 1), "50 ms old");
    }

    #[test]
    fn the_same_input_decides_the_same_way() {
        let run = || {
            let mut d = Dedup::new(10);
            (0..1000)
                .map(|i| d.first_seen(&format!("id-{}", i % 37), i))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
    }
}
