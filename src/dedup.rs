//! Duplicate events: the same attempt reported again (the same gateway,
//! event id and event time) within a horizon of event time is ignored
//! (at-least-once producers retry; a rebalance replays). Pure and
//! deterministic, driven by event time.
//!
//! # What counts as the same event
//! A record sent twice carries the same bytes: the same `gateway_id`,
//! `event_id` and `event_time_ms`. All three make the key, so two gateways
//! whose local ids collide (the schema allows gateway-local ids) never drop
//! each other's events, and an id reused at another time is a new event.
//!
//! # Layout: tables by event time, 8 bytes a slot
//! Event time is cut into buckets of `horizon / 62` (rounded up), and the
//! keys of one bucket go to that bucket's open-addressing table (linear
//! probing) of `u64` fingerprints (0 is empty). A ring of 64 tables holds
//! the horizon and a bucket either side; a table whose bucket has left the
//! horizon (behind the latest event time seen) is cleared when a newer
//! bucket takes its place, so nothing is swept, tagged or rebuilt for
//! expiry. A table grows (rehashed, to 80 % full) past 90 % full, and a
//! recycled one is sized for the larger of what the bucket before it holds
//! and what it held itself a ring ago (80 % full, or kept if that is
//! within 10 %), so at steady state no table grows and a remembered event
//! costs 10 to 11 bytes (8.9 in a table grown past 90 %).
//!
//! # Why by time
//! Records arrive in about the order of their event time, so nearly every
//! lookup lands in the newest one or two tables: at 200 000 events/s those
//! are a few megabytes each and stay in the CPU's caches, where one table
//! over the whole horizon (tens to hundreds of MB) would cost a random
//! trip to main memory per event. A fingerprint is the key's 64-bit hash,
//! and a key's home slot comes from it: a new key is taken for a
//! remembered one of its bucket only if their hashes are equal, at n
//! remembered keys a chance of n / 2^64 (1e-14 at 200 000).

/// Remembers events for `horizon_ms` of event time.
pub struct Dedup {
    hasher: ahash::RandomState,
    bucket_ms: i64,
    /// Buckets an event may lie behind the newest one and still be
    /// remembered (`horizon_ms / bucket_ms` rounded up, at most 62).
    horizon_buckets: i64,
    /// Bucket `b` in table `b % BUCKETS`.
    tables: Vec<Table>,
    /// The newest bucket an event fell in.
    latest: i64,
    duplicates: u64,
    /// Tables grown past `MAX_LOAD` (rehashed into new memory).
    grown: u64,
}

/// One bucket's open-addressing table.
#[derive(Clone)]
struct Table {
    /// The bucket it holds (`i64::MIN`: none yet).
    bucket: i64,
    slots: Vec<u64>,
    len: usize,
}

/// Tables in the ring: the horizon's buckets, the newest and one spare.
const BUCKETS: usize = 64;
/// Fewest slots a table has.
const MIN_SLOTS: usize = 16;
/// A table grows past this share of its slots in use, to `SIZED_LOAD`;
/// a recycled table is sized to `SIZED_LOAD` for the bucket before it, but
/// keeps its slots (cleared) when they are within `KEEP_SLACK` of that:
/// a table of megabytes reallocated every bucket would fragment the heap.
/// Every lookup is in cache (the newest tables), so a long probe costs
/// little.
const MAX_LOAD: f64 = 0.9;
const SIZED_LOAD: f64 = 0.8;
const KEEP_SLACK: f64 = 1.1;

impl Table {
    /// The slot a fingerprint starts probing at (fast range reduction).
    fn home(fingerprint: u64, slots: usize) -> usize {
        (((fingerprint >> 32) * slots as u64) >> 32) as usize
    }

    /// Whether it holds bucket `bucket` (a table that never held one has
    /// no slots).
    fn holds(&self, bucket: i64) -> bool {
        self.bucket == bucket && !self.slots.is_empty()
    }

    /// Slots for `len` keys at `SIZED_LOAD`.
    fn sized_for(len: usize) -> usize {
        ((len as f64 / SIZED_LOAD).ceil() as usize).max(MIN_SLOTS)
    }

    /// Inserts a fingerprint known to be absent.
    fn insert_new(slots: &mut [u64], fingerprint: u64) {
        let n = slots.len();
        let mut i = Table::home(fingerprint, n);
        while slots[i] != 0 {
            i = if i + 1 == n { 0 } else { i + 1 };
        }
        slots[i] = fingerprint;
    }

    /// Whether the table holds `fingerprint`; if not, where it goes.
    fn find(&self, fingerprint: u64) -> Result<(), usize> {
        let n = self.slots.len();
        let mut i = Table::home(fingerprint, n);
        loop {
            match self.slots[i] {
                0 => return Err(i),
                s if s == fingerprint => return Ok(()),
                _ => i = if i + 1 == n { 0 } else { i + 1 },
            }
        }
    }

    /// Holds bucket `bucket` from now on, empty, with slots for `expected`
    /// keys.
    fn recycle(&mut self, bucket: i64, expected: usize) {
        let want = Table::sized_for(expected);
        let have = self.slots.len();
        if have >= want && have as f64 <= want as f64 * KEEP_SLACK {
            self.slots.fill(0);
        } else {
            self.slots = vec![0; want];
        }
        self.bucket = bucket;
        self.len = 0;
    }

    /// More slots, rehashed (past `MAX_LOAD`).
    fn grow(&mut self) {
        let mut slots = vec![0u64; Table::sized_for(self.len).max(self.slots.len() + 1)];
        for &f in self.slots.iter().filter(|&&f| f != 0) {
            Table::insert_new(&mut slots, f);
        }
        self.slots = slots;
    }
}

impl Dedup {
    pub fn new(horizon_ms: i64) -> Dedup {
        let horizon_ms = horizon_ms.max(1);
        let span = BUCKETS as i64 - 2;
        let bucket_ms = (horizon_ms + span - 1) / span;
        Dedup {
            hasher: ahash::RandomState::with_seeds(
                0x6865_726d,
                0x6573_6475,
                0x7075_6c69,
                0x6361_7465,
            ),
            bucket_ms,
            // Rounded up: an event is remembered at least the horizon.
            horizon_buckets: (horizon_ms + bucket_ms - 1) / bucket_ms,
            tables: vec![
                Table {
                    bucket: i64::MIN,
                    slots: Vec::new(),
                    len: 0,
                };
                BUCKETS
            ],
            latest: i64::MIN,
            duplicates: 0,
            grown: 0,
        }
    }

    fn bucket(&self, t_ms: i64) -> i64 {
        t_ms.div_euclid(self.bucket_ms)
    }

    fn table_of(bucket: i64) -> usize {
        bucket.rem_euclid(BUCKETS as i64) as usize
    }

    /// What the tables keep of an event (never 0), from its gateway, id and
    /// event time; computed once per record when the look-ahead hints its
    /// slot ([`Dedup::prefetch`]). The hash has fixed keys, so a replay
    /// decides the same.
    pub fn fingerprint(&self, gateway_id: &str, event_id: &str, event_time_ms: i64) -> u64 {
        self.hasher
            .hash_one((gateway_id, event_id, event_time_ms))
            .max(1)
    }

    /// Hints the slot [`Dedup::first_seen_fingerprint`] starts probing at
    /// for this fingerprint of an event at `event_time_ms` (see
    /// [`crate::prefetch`]), if its bucket's table exists yet.
    pub fn prefetch(&self, fingerprint: u64, event_time_ms: i64) {
        let bucket = self.bucket(event_time_ms);
        let table = &self.tables[Dedup::table_of(bucket)];
        if table.holds(bucket) {
            crate::prefetch::value(&table.slots[Table::home(fingerprint, table.slots.len())]);
        }
    }

    /// True the first time an event is seen within the horizon; false for
    /// a duplicate (counted).
    #[cfg(test)]
    pub fn first_seen(&mut self, gateway_id: &str, event_id: &str, event_time_ms: i64) -> bool {
        let fingerprint = self.fingerprint(gateway_id, event_id, event_time_ms);
        self.first_seen_fingerprint(fingerprint, event_time_ms)
    }

    /// [`Dedup::first_seen`] of the event whose [`Dedup::fingerprint`] this
    /// is.
    pub fn first_seen_fingerprint(&mut self, fingerprint: u64, event_time_ms: i64) -> bool {
        debug_assert_ne!(fingerprint, 0, "a fingerprint is never 0");
        let bucket = self.bucket(event_time_ms);
        self.latest = self.latest.max(bucket);
        if bucket < self.latest.saturating_sub(self.horizon_buckets) {
            // Older than the horizon: not remembered (its table, if any,
            // holds a newer bucket now or is about to).
            return true;
        }
        let i = Dedup::table_of(bucket);
        if !self.tables[i].holds(bucket) {
            // Free: the bucket it held is behind the horizon (the ring is
            // longer than the horizon), or it never held one. Sized for
            // the larger of what the bucket before holds (the traffic now)
            // and what it held itself a ring ago (a whole bucket): when
            // gateways' clocks are seconds apart, the bucket before is
            // still filling as this one's first event comes.
            let previous = bucket.wrapping_sub(1);
            let before = &self.tables[Dedup::table_of(previous)];
            let held = self.tables[i].len;
            let expected = if before.holds(previous) {
                before.len.max(held)
            } else {
                held
            };
            self.tables[i].recycle(bucket, expected);
        }
        let table = &mut self.tables[i];
        match table.find(fingerprint) {
            Ok(()) => {
                self.duplicates += 1;
                false
            }
            Err(slot) => {
                table.slots[slot] = fingerprint;
                table.len += 1;
                if table.len as f64 > MAX_LOAD * table.slots.len() as f64 {
                    table.grow();
                    self.grown += 1;
                }
                true
            }
        }
    }

    #[cfg(test)]
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// Events currently remembered.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.tables
            .iter()
            .filter(|t| {
                t.holds(t.bucket) && t.bucket >= self.latest.saturating_sub(self.horizon_buckets)
            })
            .map(|t| t.len)
            .sum()
    }

    /// Bytes the tables hold.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.tables.iter().map(|t| t.slots.len()).sum::<usize>() * std::mem::size_of::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_event_again_within_the_horizon_is_a_duplicate() {
        let mut d = Dedup::new(60_000);
        assert!(d.first_seen("gw", "a", 1_000));
        assert!(d.first_seen("gw", "b", 2_000));
        assert!(!d.first_seen("gw", "a", 1_000));
        assert_eq!(d.duplicates(), 1);
    }

    #[test]
    fn the_key_is_gateway_id_and_time() {
        let mut d = Dedup::new(60_000);
        assert!(d.first_seen("gw-1", "req-7", 1_000));
        assert!(
            d.first_seen("gw-2", "req-7", 1_000),
            "another gateway's local id"
        );
        assert!(d.first_seen("gw-1", "req-7", 1_001), "another time");
        assert!(!d.first_seen("gw-2", "req-7", 1_000));
        assert_eq!(d.duplicates(), 1);
    }

    #[test]
    fn events_expire_after_the_horizon_of_event_time() {
        let mut d = Dedup::new(60_000);
        assert!(d.first_seen("gw", "a", 0));
        assert!(d.first_seen("gw", "b", 61_000));
        assert_eq!(d.len(), 1, "`a` expired");
        assert!(
            d.first_seen("gw", "a", 0),
            "an event older than the horizon counts again"
        );
        assert!(!d.first_seen("gw", "b", 61_000));
        // A late event within the horizon is remembered, in its own table.
        assert!(d.first_seen("gw", "c", 2_000));
        assert!(!d.first_seen("gw", "c", 2_000));
    }

    #[test]
    fn a_jump_past_the_horizon_forgets_everything_before_it() {
        let mut d = Dedup::new(60_000);
        for i in 0..1_000 {
            assert!(d.first_seen("gw", &format!("e{i}"), i * 60));
        }
        assert!(d.first_seen("gw", "later", 10_000_000));
        assert_eq!(d.len(), 1);
        assert!(d.first_seen("gw", "e999", 999 * 60), "forgotten");
        // The tables that held the old buckets are taken by new ones.
        for i in 0..1_000 {
            assert!(d.first_seen("gw", &format!("n{i}"), 10_000_000 + i * 60));
            assert!(!d.first_seen("gw", &format!("n{i}"), 10_000_000 + i * 60));
        }
        assert_eq!(d.len(), 1_001);
    }

    #[test]
    fn a_million_events_cost_at_most_eleven_bytes_each_and_expire() {
        let horizon = 60_000;
        let mut d = Dedup::new(horizon);
        // 20 000 events a second for two horizons; every 100th sent twice.
        let mut dups = 0;
        for i in 0..2_400_000u64 {
            let t = (i / 20) as i64;
            assert!(d.first_seen("gw", &format!("e{i}"), t), "a new event");
            if i % 100 == 0 {
                assert!(!d.first_seen("gw", &format!("e{i}"), t));
                dups += 1;
            }
            if i % 200_000 == 199_999 && t > horizon {
                let live = d.len();
                assert!(
                    (1_150_000..=1_250_000).contains(&live),
                    "about a horizon of events remembered: {live}"
                );
                let per_id = d.bytes() as f64 / live as f64;
                assert!(per_id <= 11.0, "{per_id:.1} bytes per remembered event");
            }
        }
        assert_eq!(d.duplicates(), dups);
        // Sent again: one older than the horizon counts again, a younger
        // one does not.
        assert!(d.first_seen("gw", "e1100000", 55_000), "65 s old");
        assert!(!d.first_seen("gw", "e2399000", 119_950), "50 ms old");
    }

    /// Gateways whose clocks are seconds apart: when a bucket's first event
    /// comes (from the gateway furthest ahead), the bucket before it is
    /// still filling. A table sized for that part grew, rehashing megabytes
    /// into fresh memory, many times a bucket (a 14 % step each).
    #[test]
    fn tables_are_sized_for_a_whole_bucket_when_gateways_clocks_disagree() {
        let horizon = 60_000;
        let mut d = Dedup::new(horizon);
        let (gateways, spread_ms, per_s) = (8i64, 3_500i64, 5_000i64);
        let mut grown_at_steady_state = None;
        for i in 0..(per_s * 150) {
            let arrival = i * 1_000 / per_s;
            let g = i % gateways;
            let t = arrival - g * spread_ms / (gateways - 1);
            assert!(d.first_seen(&format!("gw{g}"), &format!("e{i}"), t));
            if arrival == 2 * horizon {
                grown_at_steady_state.get_or_insert(d.grown);
            }
        }
        let before = grown_at_steady_state.expect("ran past two horizons");
        assert_eq!(d.grown, before, "a table grew at steady state");
        let per_id = d.bytes() as f64 / d.len() as f64;
        assert!(per_id <= 11.0, "{per_id:.1} bytes per remembered event");
    }

    #[test]
    fn any_event_time_is_taken() {
        let mut d = Dedup::new(60_000);
        for t in [i64::MIN, i64::MIN + 1, -1, 0, i64::MAX - 1, i64::MAX] {
            assert!(d.first_seen("gw", "a", t), "{t}");
        }
        let mut d = Dedup::new(1);
        assert!(d.first_seen("gw", "a", i64::MIN));
        assert!(!d.first_seen("gw", "a", i64::MIN));
    }

    #[test]
    fn the_same_input_decides_the_same_way() {
        let run = || {
            let mut d = Dedup::new(10);
            (0..1000)
                .map(|i| d.first_seen("gw", &format!("id-{}", i % 3), i / 4))
                .collect::<Vec<_>>()
        };
        let first = run();
        assert_eq!(first, run());
        assert!(first.contains(&false), "some repeats fall in the horizon");
    }
}
