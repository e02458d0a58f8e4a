//! A weight snapshot made ready for routing: one Vose alias table per
//! traffic class, O(1) picks from uniform numbers the caller draws. Pure:
//! the gateway client (`client`) and the simulated gateways (`sim`) route
//! through this same type.

use crate::event::TrafficClass;
use crate::publish::{ClassWeights, WeightSnapshot};
use std::collections::{BTreeMap, BTreeSet};

/// A gateway's own table for a group, used until its first snapshot
/// arrives: traffic class (UPPERCASE as on the wire, or `*` for every class
/// not named) → channel id → weight.
pub type StaticWeights = BTreeMap<String, BTreeMap<String, f64>>;

/// Walker/Vose alias table: O(n) to build, O(1) to sample.
#[derive(Debug, Clone)]
struct AliasTable {
    channels: Vec<String>,
    prob: Vec<f64>,
    alias: Vec<usize>,
}

impl AliasTable {
    fn new(weights: &[(String, f64)]) -> Option<AliasTable> {
        let positive: Vec<&(String, f64)> = weights
            .iter()
            .filter(|(_, w)| *w > 0.0 && w.is_finite())
            .collect();
        let total: f64 = positive.iter().map(|(_, w)| w).sum();
        if positive.is_empty() || total <= 0.0 {
            return None;
        }
        let n = positive.len();
        let mut scaled: Vec<f64> = positive.iter().map(|(_, w)| w / total * n as f64).collect();
        let mut prob = vec![0.0; n];
        let mut alias = vec![0; n];
        let (mut small, mut large): (Vec<usize>, Vec<usize>) =
            (0..n).partition(|i| scaled[*i] < 1.0);
        // Peek both stacks before popping: popping `small` while `large` is
        // empty would drop an entry (float error can leave a last "large"
        // entry at 0.999…, moving it to `small` with nothing left to pair).
        while let (Some(&s), Some(&l)) = (small.last(), large.last()) {
            small.pop();
            prob[s] = scaled[s];
            alias[s] = l;
            scaled[l] -= 1.0 - scaled[s];
            if scaled[l] < 1.0 {
                large.pop();
                small.push(l);
            }
        }
        for i in small.into_iter().chain(large) {
            prob[i] = 1.0;
        }
        Some(AliasTable {
            channels: positive.iter().map(|(c, _)| c.clone()).collect(),
            prob,
            alias,
        })
    }

    fn sample(&self, u1: f64, u2: f64) -> &str {
        let n = self.channels.len();
        let i = ((u1 * n as f64) as usize).min(n - 1);
        let j = if u2 < self.prob[i] { i } else { self.alias[i] };
        &self.channels[j]
    }
}

/// What to do with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick<'a> {
    Channel(&'a str),
    /// Shed (or queue) it: capacity is short for this class.
    Shed,
    /// Nothing to route to: no snapshot yet, or the class has no channel.
    NoRoute,
}

/// A snapshot ready for O(1) picks.
#[derive(Debug, Clone)]
pub struct RoutingTable {
    pub snapshot: WeightSnapshot,
    classes: [Option<AliasTable>; 4],
    shed: [f64; 4],
}

impl RoutingTable {
    pub fn new(snapshot: WeightSnapshot) -> RoutingTable {
        RoutingTable::restricted(snapshot, None)
    }

    /// A table that picks only among `known` channels (those the gateway
    /// can reach): a weight on any other channel is left out and the rest
    /// renormalised; a class left with none has no route.
    pub fn restricted(snapshot: WeightSnapshot, known: Option<&BTreeSet<String>>) -> RoutingTable {
        let mut classes: [Option<AliasTable>; 4] = Default::default();
        let mut shed = [0.0; 4];
        for class in TrafficClass::ALL {
            if let Some(c) = snapshot.classes.get(class.as_str()) {
                let w: Vec<(String, f64)> = c
                    .weights
                    .iter()
                    .filter(|(k, _)| known.is_none_or(|known| known.contains(*k)))
                    .map(|(k, v)| (k.clone(), *v))
                    .collect();
                classes[class.index()] = AliasTable::new(&w);
                shed[class.index()] = c.shed.clamp(0.0, 1.0);
            }
        }
        RoutingTable {
            snapshot,
            classes,
            shed,
        }
    }

    /// The gateway's static table as a routing table (epoch 0, which no
    /// snapshot Hermes writes has; no shed share), or `None` when `table`
    /// names no class.
    pub fn from_static(
        group: &str,
        table: &StaticWeights,
        known: Option<&BTreeSet<String>>,
    ) -> Option<RoutingTable> {
        if table.is_empty() {
            return None;
        }
        let classes = TrafficClass::ALL
            .iter()
            .filter_map(|c| {
                let w = table.get(c.as_str()).or_else(|| table.get("*"))?;
                Some((
                    c.as_str().to_string(),
                    ClassWeights {
                        weights: w.clone(),
                        shed: 0.0,
                    },
                ))
            })
            .collect();
        let snapshot = WeightSnapshot {
            group: group.to_string(),
            version: 0,
            epoch: 0,
            computed_at_ms: 0,
            heartbeat_ms: 0,
            manual: false,
            panic_since_ms: None,
            projected_spend_per_hour: 0.0,
            classes,
            channels: BTreeMap::new(),
        };
        Some(RoutingTable::restricted(snapshot, known))
    }

    /// Whether this is the gateway's static table rather than a snapshot.
    pub fn is_static(&self) -> bool {
        self.snapshot.epoch == 0
    }

    /// The channel to name in the event a gateway emits for a request of
    /// `class` it did not send (`dispatch` SHED or NO_CHANNEL, see
    /// `schemas/request_event.avsc`): the class's weighted pick ignoring the
    /// shed share, or, when no channel has weight, one of the snapshot's
    /// channels picked uniformly by `u1`. `None` only for a snapshot with no
    /// channel at all.
    pub fn unsent_channel(&self, class: TrafficClass, u1: f64, u2: f64) -> Option<&str> {
        if let Some(t) = &self.classes[class.index()] {
            return Some(t.sample(u1, u2));
        }
        let n = self.snapshot.channels.len();
        let i = ((u1 * n as f64) as usize).min(n.checked_sub(1)?);
        self.snapshot.channels.keys().nth(i).map(String::as_str)
    }

    /// Picks a channel for a request of `class`, from three uniform numbers
    /// in [0, 1) supplied by the caller (its own RNG: this type holds none).
    /// A gateway reports what it does not send (`Shed`, `NoRoute`) with
    /// [`RoutingTable::unsent_channel`], so Hermes measures demand.
    pub fn pick(&self, class: TrafficClass, u_shed: f64, u1: f64, u2: f64) -> Pick<'_> {
        if u_shed < self.shed[class.index()] {
            return Pick::Shed;
        }
        match &self.classes[class.index()] {
            Some(t) => Pick::Channel(t.sample(u1, u2)),
            None => Pick::NoRoute,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alias_sampling_matches_the_weights() {
        let w = vec![
            ("a".to_string(), 0.1),
            ("b".to_string(), 0.6),
            ("c".to_string(), 0.3),
            ("d".to_string(), 0.0),
        ];
        let t = AliasTable::new(&w).unwrap();
        let mut counts = std::collections::BTreeMap::new();
        let n = 200;
        // A regular grid over [0,1)² integrates the sampler exactly.
        for i in 0..n {
            for j in 0..n {
                let c = t.sample((i as f64 + 0.5) / n as f64, (j as f64 + 0.5) / n as f64);
                *counts.entry(c.to_string()).or_insert(0) += 1;
            }
        }
        let total = (n * n) as f64;
        assert!((counts["a"] as f64 / total - 0.1).abs() < 0.01);
        assert!((counts["b"] as f64 / total - 0.6).abs() < 0.01);
        assert!((counts["c"] as f64 / total - 0.3).abs() < 0.01);
        assert!(!counts.contains_key("d"), "zero weight is never picked");
        assert!(AliasTable::new(&[("x".into(), 0.0)]).is_none());
    }

    #[test]
    fn an_unsent_request_names_a_channel_of_its_group() {
        let json = r#"{"group":"chat","version":3,"epoch":1,"computed_at_ms":1,"heartbeat_ms":1,
            "manual":false,"projected_spend_per_hour":0.0,
            "classes":{"CORE":{"weights":{"paid-a":1.0},"shed":0.5},
                       "BATCH":{"weights":{"paid-a":0.0,"free-a":0.0},"shed":1.0}},
            "channels":{"free-a":{"state":"DRAINED","score":0.9,"reason":"drained","planned_rps":0.0},
                        "paid-a":{"state":"HEALTHY","score":0.1,"reason":"healthy","planned_rps":5.0}}}"#;
        let t = RoutingTable::new(serde_json::from_str(json).unwrap());
        assert_eq!(t.pick(TrafficClass::Core, 0.1, 0.5, 0.5), Pick::Shed);
        assert_eq!(
            t.unsent_channel(TrafficClass::Core, 0.9, 0.9),
            Some("paid-a")
        );
        // No weighted channel: any channel of the snapshot, by u1.
        assert_eq!(t.pick(TrafficClass::Batch, 0.99, 0.5, 0.5), Pick::Shed);
        assert_eq!(
            t.unsent_channel(TrafficClass::Batch, 0.1, 0.0),
            Some("free-a")
        );
        assert_eq!(
            t.unsent_channel(TrafficClass::Batch, 0.9, 0.0),
            Some("paid-a")
        );
        assert_eq!(
            t.pick(TrafficClass::Interactive, 0.99, 0.5, 0.5),
            Pick::NoRoute
        );
        assert!(t
            .unsent_channel(TrafficClass::Interactive, 0.5, 0.5)
            .is_some());
    }

    #[test]
    fn float_error_never_drops_an_entry() {
        // 0.3 / 0.7 leaves the second entry at 0.999… after pairing.
        for (a, b) in [(0.3, 0.7), (0.1, 0.9), (1.0 / 3.0, 2.0 / 3.0), (0.15, 0.85)] {
            let t = AliasTable::new(&[("a".to_string(), a), ("b".to_string(), b)]).unwrap();
            let n = 400;
            let mut hits = 0;
            for i in 0..n {
                for j in 0..n {
                    hits += (t.sample((i as f64 + 0.5) / n as f64, (j as f64 + 0.5) / n as f64)
                        == "a") as u32;
                }
            }
            let share = hits as f64 / (n * n) as f64;
            assert!((share - a).abs() < 0.005, "{a}/{b}: share of a {share}");
        }
    }
}
