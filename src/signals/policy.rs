//! Each signal's policy (weight, normal and degraded bounds, minimum
//! samples) and the table of them, read from config by signal name.

use super::{SignalKind, POLICY_KEYS, SIGNALS, SIGNAL_COUNT};
use serde::{Deserialize, Serialize};

/// One signal's contribution: it maps linearly from 0 at `normal` to 1 at
/// `degraded` (either direction: for output tokens lower is worse), is
/// clamped, and is multiplied by `weight`. A signal with fewer than
/// `min_samples` samples does not vote.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalPolicy {
    pub weight: f64,
    pub normal: f64,
    pub degraded: f64,
    pub min_samples: u32,
}

pub(super) const fn sig(weight: f64, normal: f64, degraded: f64, min_samples: u32) -> SignalPolicy {
    SignalPolicy {
        weight,
        normal,
        degraded,
        min_samples,
    }
}

/// Every signal's policy (config `signals.<name>`, defaults from
/// [`SIGNALS`]) and two settings. The five with docs/decisions.md#score-and-states seed weights (P99,
/// error rate, retry rate, truncation, output-token median) sum to 1.0 on
/// their own; the others add detection paths the seeds asked for. The score
/// is clamped to 1.
#[derive(Debug, Clone, PartialEq)]
pub struct SignalPolicies {
    /// Per signal, in [`SignalKind`] order.
    pub by_kind: [SignalPolicy; SIGNAL_COUNT],
    /// How much a client 4xx counts toward `error_rate` (docs/decisions.md#signals: lightly).
    pub client_error_weight: f64,
    /// `bad_outcome_rate` is scored at its Wilson lower bound this many
    /// standard deviations (one-sided) under the measured share: measured
    /// over a minute of a free channel's traffic (~200 attempts) a 2 % line
    /// reads 7 % about once a day, and alone at the degraded bound that
    /// signal drains. 1.0 still reads 10 % over 200 attempts as 8 %.
    pub bad_outcome_confidence_z: f64,
    /// Every other rate signal (error rate, the last outcomes, 429s,
    /// retries, each kind of bad answer, ...) is scored at its Wilson lower
    /// bound this many standard deviations under the measured share: its
    /// evidence is weighed by its sample count (docs/decisions.md#safety-rails). Three errors in
    /// the 60 attempts a channel at 0.2 requests/s makes in five minutes
    /// read 5 %, the paid error bound's top, and a 1 % line shows that in
    /// about 2 % of five-minute windows, several times a day; read at its
    /// lower bound it scores a sixth of that.
    /// On a busy channel the bound is the measured share within a point.
    pub rate_confidence_z: f64,
    /// Below this many samples both bounds widen: `z` grows as
    /// `sqrt(confidence_full_samples / n)`. A day holds about 290
    /// five-minute windows, so a bound that trips once in a few hundred
    /// windows trips daily; at a fixed `z` that rate rises as the evidence
    /// thins (at 60 attempts and a true 2 %, 5 failures come once in about
    /// 130 windows), and a sparse channel is judged on just such windows.
    /// With the bound widening, channels at 0.2 requests/s with 1 % errors
    /// are left alone on all ten seeds of the `sparse-healthy-day` drill,
    /// while a busy channel is read as before.
    pub confidence_full_samples: u32,
}

impl Default for SignalPolicies {
    fn default() -> Self {
        SignalPolicies {
            by_kind: SIGNALS.map(|d| d.default),
            client_error_weight: 0.1,
            bad_outcome_confidence_z: 1.0,
            rate_confidence_z: 1.0,
            confidence_full_samples: 100,
        }
    }
}

impl SignalPolicies {
    /// `z` as applied to a bound over `n` samples (see
    /// `confidence_full_samples`).
    pub fn z_at(&self, z: f64, n: u32) -> f64 {
        let full = self.confidence_full_samples as f64;
        if n == 0 || (n as f64) >= full {
            z
        } else {
            z * (full / n as f64).sqrt()
        }
    }

    pub fn get(&self, kind: SignalKind) -> &SignalPolicy {
        &self.by_kind[kind as usize]
    }

    pub fn get_mut(&mut self, kind: SignalKind) -> &mut SignalPolicy {
        &mut self.by_kind[kind as usize]
    }

    /// Every signal policy with its config key, in table order.
    pub fn entries(&self) -> [(&'static str, &SignalPolicy); SIGNAL_COUNT] {
        std::array::from_fn(|i| (SIGNALS[i].name, &self.by_kind[i]))
    }
}

impl Serialize for SignalPolicies {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(SIGNAL_COUNT + 4))?;
        for (name, p) in self.entries() {
            m.serialize_entry(name, p)?;
        }
        m.serialize_entry("client_error_weight", &self.client_error_weight)?;
        m.serialize_entry("bad_outcome_confidence_z", &self.bad_outcome_confidence_z)?;
        m.serialize_entry("rate_confidence_z", &self.rate_confidence_z)?;
        m.serialize_entry("confidence_full_samples", &self.confidence_full_samples)?;
        m.end()
    }
}

impl<'de> Deserialize<'de> for SignalPolicies {
    /// A table keyed by signal name; a signal left out keeps its default, an
    /// unknown key is an error naming the known ones.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = SignalPolicies;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a table of signal policies")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = SignalPolicies::default();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "client_error_weight" => out.client_error_weight = map.next_value()?,
                        "bad_outcome_confidence_z" => {
                            out.bad_outcome_confidence_z = map.next_value()?
                        }
                        "rate_confidence_z" => out.rate_confidence_z = map.next_value()?,
                        "confidence_full_samples" => {
                            out.confidence_full_samples = map.next_value()?
                        }
                        name => match SIGNALS.iter().position(|d| d.name == name) {
                            Some(i) => out.by_kind[i] = map.next_value()?,
                            None => return Err(serde::de::Error::unknown_field(name, POLICY_KEYS)),
                        },
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_map(Visitor)
    }
}
