//! Operator overrides (incident 002's manual mode, incident 004's action channel):
//! pin a channel (drain it, hold a weight, or force it healthy) and freeze a
//! group's weights, each with who, why and an optional expiry.
//!
//! The fleet keeps one desired set, durably, in Redis (`hermes:overrides`,
//! one hash field per channel or group), so an override survives a restart
//! and a takeover and reaches whichever instance owns the channel or writes
//! the group. Every instance reads the set every `service.override_poll_ms`
//! ([`sync`]) into a watch channel; the request loop and the group writers
//! reconcile what they hold with it (idempotent: an override already in
//! force is not applied again). The loop that applies a change raises its
//! OVERRIDE alert, with the actor and the reason in the message.
//!
//! Clearing writes a tombstone (who cleared, and why) that lives
//! `service.override_tombstone_ms`, so the alert of the release names them
//! too; expired overrides and tombstones are removed by whichever instance
//! sees them first (a compare-and-delete, so a newer override set meanwhile
//! is never removed).

use crate::config::Config;
use crate::redis_keys::OVERRIDES_KEY;
use crate::state::{Pin, PinKind};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// What an override does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// A channel: weight 0 whatever its health.
    Drain,
    /// A channel: this health weight factor, in [0, 1].
    Weight { weight: f64 },
    /// A channel: full weight whatever its health (the state machine keeps
    /// running underneath and shows through when the pin goes).
    Healthy,
    /// A group: its weights stay as published (manual mode).
    Freeze,
    /// A tombstone: the override was cleared, by `actor` for `reason`.
    Clear,
}

/// One override as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Override {
    #[serde(flatten)]
    pub action: Action,
    pub reason: String,
    /// Who asked (the client says; the token says they may).
    pub actor: String,
    /// Wall time it was set.
    pub created_ms: i64,
    /// Wall time it lapses (for a pin, also the event time its pin lapses
    /// at); `None` holds until cleared.
    pub expires_ms: Option<i64>,
}

impl Override {
    /// The pin a channel override asks for; `None` for a tombstone.
    pub fn pin(&self) -> Option<Pin> {
        let kind = match self.action {
            Action::Drain => PinKind::Drain,
            Action::Weight { weight } => PinKind::Weight(weight),
            Action::Healthy => PinKind::Weight(1.0),
            Action::Freeze | Action::Clear => return None,
        };
        Some(Pin {
            kind,
            until_ms: self.expires_ms,
        })
    }

    /// Still in force at `now_ms`.
    pub fn live_at(&self, now_ms: i64) -> bool {
        self.expires_ms.is_none_or(|e| e > now_ms)
    }

    /// Who and why, for the OVERRIDE alert's message.
    pub fn note(&self) -> String {
        let what = match &self.action {
            Action::Drain => "drain".to_string(),
            Action::Weight { weight } => format!("hold weight {weight}"),
            Action::Healthy => "force healthy".to_string(),
            Action::Freeze => "freeze".to_string(),
            Action::Clear => "clear".to_string(),
        };
        let until = self
            .expires_ms
            .filter(|_| self.action != Action::Clear)
            .map(|e| format!(", until {}", crate::wall_clock::utc(e)))
            .unwrap_or_default();
        format!("operator {}: {what}{until}: {}", self.actor, self.reason)
    }
}

/// What an override applies to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    Channel(String),
    Group(String),
}

impl Target {
    /// Its field in the Redis hash.
    pub fn field(&self) -> String {
        match self {
            Target::Channel(id) => format!("channel:{id}"),
            Target::Group(id) => format!("group:{id}"),
        }
    }

    fn from_field(field: &str) -> Option<Target> {
        if let Some(id) = field.strip_prefix("channel:") {
            Some(Target::Channel(id.to_string()))
        } else {
            field
                .strip_prefix("group:")
                .map(|id| Target::Group(id.to_string()))
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Channel(id) => write!(f, "channel {id}"),
            Target::Group(id) => write!(f, "group {id}"),
        }
    }
}

/// The fleet's desired overrides, tombstones included.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Overrides {
    pub channels: BTreeMap<String, Override>,
    pub groups: BTreeMap<String, Override>,
}

impl Overrides {
    /// From the stored hash; an unreadable field is logged and skipped.
    pub fn from_fields(fields: impl IntoIterator<Item = (String, String)>) -> Overrides {
        let mut out = Overrides::default();
        for (field, json) in fields {
            let (Some(target), Ok(o)) = (
                Target::from_field(&field),
                serde_json::from_str::<Override>(&json),
            ) else {
                tracing::warn!(%field, "unreadable operator override ignored");
                continue;
            };
            match target {
                Target::Channel(id) => out.channels.insert(id, o),
                Target::Group(id) => out.groups.insert(id, o),
            };
        }
        out
    }

    /// Whether the group's weights should be frozen at `now_ms`.
    pub fn frozen(&self, group: &str, now_ms: i64) -> bool {
        self.groups
            .get(group)
            .is_some_and(|o| o.action == Action::Freeze && o.live_at(now_ms))
    }

    /// Every entry, with its target.
    pub fn entries(&self) -> impl Iterator<Item = (Target, &Override)> {
        self.channels
            .iter()
            .map(|(id, o)| (Target::Channel(id.clone()), o))
            .chain(
                self.groups
                    .iter()
                    .map(|(id, o)| (Target::Group(id.clone()), o)),
            )
    }
}

/// An override as a client asks for it.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Request {
    #[serde(flatten)]
    pub action: Action,
    pub reason: String,
    pub actor: String,
    /// Lapses after this many seconds; absent: until cleared.
    #[serde(default)]
    pub for_s: Option<u64>,
}

/// Why a request was refused (the API answers 400 or 404 with it).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Refused {
    #[error("{0}")]
    Invalid(String),
    #[error("{0} is not in the config")]
    Unknown(Target),
}

impl Request {
    /// The override to store, after checking it against the config.
    pub fn validate(
        &self,
        target: &Target,
        cfg: &Config,
        now_ms: i64,
    ) -> Result<Override, Refused> {
        let invalid = |m: &str| Err(Refused::Invalid(m.to_string()));
        if self.reason.trim().is_empty() {
            return invalid("a reason is required (it goes into the OVERRIDE alert)");
        }
        if self.actor.trim().is_empty() {
            return invalid("an actor is required (who asked; it goes into the OVERRIDE alert)");
        }
        if self.for_s == Some(0) {
            return invalid("for_s must be positive");
        }
        match (&self.action, target) {
            (Action::Clear, _) => return invalid("clear with DELETE, not as an action"),
            (Action::Freeze, Target::Channel(_)) => {
                return invalid("freeze applies to a group, not a channel")
            }
            (Action::Drain | Action::Weight { .. } | Action::Healthy, Target::Group(_)) => {
                return invalid("drain, weight and healthy apply to a channel, not a group")
            }
            (Action::Weight { weight }, _) if !(0.0..=1.0).contains(weight) => {
                return invalid("weight must be within [0, 1]")
            }
            _ => {}
        }
        let known = match target {
            Target::Channel(id) => cfg.channels().any(|c| &c.id == id),
            Target::Group(id) => cfg.groups.iter().any(|g| &g.id == id),
        };
        if !known {
            return Err(Refused::Unknown(target.clone()));
        }
        Ok(Override {
            action: self.action.clone(),
            reason: self.reason.trim().to_string(),
            actor: self.actor.trim().to_string(),
            created_ms: now_ms,
            expires_ms: self
                .for_s
                .map(|s| now_ms.saturating_add((s as i64).saturating_mul(1000))),
        })
    }
}

/// Where the desired set lives.
pub enum Store {
    /// `hermes:overrides` in Redis (`hermes run`).
    Redis(redis::Client),
    /// In process (the embedded demo without Redis, and tests).
    InProcess(Mutex<BTreeMap<String, String>>),
}

/// Deletes a field only if it still holds the value that was read (so a
/// newer override written meanwhile is kept). `KEYS[1]`: the hash; `ARGV`:
/// field, expected JSON.
const DELETE_IF_SAME_LUA: &str = r#"
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"#;

impl Store {
    pub fn redis(url: &str) -> anyhow::Result<Store> {
        Ok(Store::Redis(redis::Client::open(url).map_err(|e| {
            anyhow::anyhow!("bad redis url {}: {e}", crate::publish::redact_url(url))
        })?))
    }

    async fn conn(client: &redis::Client) -> anyhow::Result<redis::aio::MultiplexedConnection> {
        let cfg = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(2)));
        Ok(client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await?)
    }

    /// Every stored field (raw JSON).
    pub async fn fields(&self) -> anyhow::Result<BTreeMap<String, String>> {
        match self {
            Store::Redis(client) => {
                let mut c = Self::conn(client).await?;
                Ok(redis::cmd("HGETALL")
                    .arg(OVERRIDES_KEY)
                    .query_async(&mut c)
                    .await?)
            }
            Store::InProcess(m) => Ok(m.lock().unwrap_or_else(|p| p.into_inner()).clone()),
        }
    }

    pub async fn put(&self, target: &Target, o: &Override) -> anyhow::Result<()> {
        let json = serde_json::to_string(o)?;
        match self {
            Store::Redis(client) => {
                let mut c = Self::conn(client).await?;
                let _: i64 = redis::cmd("HSET")
                    .arg(OVERRIDES_KEY)
                    .arg(target.field())
                    .arg(json)
                    .query_async(&mut c)
                    .await?;
            }
            Store::InProcess(m) => {
                m.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(target.field(), json);
            }
        }
        Ok(())
    }

    /// Removes `field` if it still holds `json`.
    async fn remove_if_same(&self, field: &str, json: &str) -> anyhow::Result<()> {
        match self {
            Store::Redis(client) => {
                let mut c = Self::conn(client).await?;
                let _: i64 = redis::Script::new(DELETE_IF_SAME_LUA)
                    .key(OVERRIDES_KEY)
                    .arg(field)
                    .arg(json)
                    .invoke_async(&mut c)
                    .await?;
            }
            Store::InProcess(m) => {
                let mut m = m.lock().unwrap_or_else(|p| p.into_inner());
                if m.get(field).map(String::as_str) == Some(json) {
                    m.remove(field);
                }
            }
        }
        Ok(())
    }
}

/// The control side: set, clear and list overrides, and the desired set
/// the loops reconcile with.
pub struct Control {
    store: Store,
    desired: watch::Sender<Arc<Overrides>>,
    cfg: watch::Receiver<Arc<Config>>,
    /// How long a clear's tombstone lives (`service.override_tombstone_ms`).
    tombstone_ms: i64,
}

impl Control {
    pub fn new(store: Store, cfg: watch::Receiver<Arc<Config>>, tombstone_ms: i64) -> Control {
        let (desired, _) = watch::channel(Arc::new(Overrides::default()));
        Control {
            store,
            desired,
            cfg,
            tombstone_ms,
        }
    }

    /// The desired set, for a loop to reconcile with.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Overrides>> {
        self.desired.subscribe()
    }

    /// The desired set as last read.
    pub fn current(&self) -> Arc<Overrides> {
        self.desired.borrow().clone()
    }

    /// Stores an override, then refreshes this instance's desired set (the
    /// other instances see it at their next poll).
    pub async fn set(
        &self,
        target: Target,
        req: &Request,
    ) -> anyhow::Result<Result<Override, Refused>> {
        let now = crate::wall_clock::now_ms();
        let cfg = self.cfg.borrow().clone();
        let o = match req.validate(&target, &cfg, now) {
            Ok(o) => o,
            Err(refused) => return Ok(Err(refused)),
        };
        self.store.put(&target, &o).await?;
        tracing::info!(%target, actor = %o.actor, reason = %o.reason, action = ?o.action, "operator override stored");
        self.refresh().await?;
        Ok(Ok(o))
    }

    /// Clears an override: a tombstone naming who cleared it and why
    /// replaces it. `Ok(false)` when there was nothing in force to clear.
    pub async fn clear(&self, target: Target, actor: &str, reason: &str) -> anyhow::Result<bool> {
        let now = crate::wall_clock::now_ms();
        self.refresh().await?;
        let current = self.current();
        let held = current
            .entries()
            .any(|(t, o)| t == target && o.action != Action::Clear && o.live_at(now));
        if !held {
            return Ok(false);
        }
        let tombstone = Override {
            action: Action::Clear,
            reason: reason.to_string(),
            actor: actor.to_string(),
            created_ms: now,
            expires_ms: Some(now + self.tombstone_ms),
        };
        self.store.put(&target, &tombstone).await?;
        tracing::info!(%target, %actor, %reason, "operator override cleared");
        self.refresh().await?;
        Ok(true)
    }

    /// Reads the stored set, removes what has lapsed, and hands the rest to
    /// the loops if it changed.
    pub async fn refresh(&self) -> anyhow::Result<()> {
        let now = crate::wall_clock::now_ms();
        let fields = self.store.fields().await?;
        let mut live = Vec::new();
        for (field, json) in fields {
            // An override past its expiry, or a tombstone past its life.
            let lapsed = serde_json::from_str::<Override>(&json)
                .ok()
                .is_some_and(|o| !o.live_at(now));
            if lapsed {
                self.store.remove_if_same(&field, &json).await?;
            } else {
                live.push((field, json));
            }
        }
        let next = Overrides::from_fields(live);
        self.desired.send_if_modified(|cur| {
            if **cur == next {
                false
            } else {
                *cur = Arc::new(next);
                true
            }
        });
        Ok(())
    }
}

/// Keeps this instance's desired set fresh: every `every`, until `stop`. A
/// store that does not answer keeps the last set (fail static) and is
/// retried next time.
pub async fn sync(
    control: Arc<Control>,
    every: Duration,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        match control.refresh().await {
            Ok(()) => {
                if failing {
                    tracing::info!("operator overrides readable again");
                }
                failing = false;
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "operator overrides unreadable; the last set stays in force");
                }
                failing = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Tier;

    fn cfg() -> Config {
        Config::single_group(
            "chat",
            &[
                ("free-a", Tier::Free, 0.0, 50.0),
                ("paid-a", Tier::Paid, 1.0, 100.0),
            ],
        )
    }

    fn req(action: Action) -> Request {
        Request {
            action,
            reason: "provider incident".into(),
            actor: "alice".into(),
            for_s: Some(1800),
        }
    }

    #[test]
    fn requests_are_checked_against_the_target_and_the_config() {
        let c = cfg();
        let ch = Target::Channel("free-a".into());
        let g = Target::Group("chat".into());
        let o = req(Action::Drain).validate(&ch, &c, 1_000).unwrap();
        assert_eq!(o.expires_ms, Some(1_000 + 1_800_000));
        assert_eq!(
            o.pin(),
            Some(Pin {
                kind: PinKind::Drain,
                until_ms: Some(1_801_000)
            })
        );
        assert!(req(Action::Freeze).validate(&g, &c, 0).is_ok());
        assert!(req(Action::Freeze).validate(&ch, &c, 0).is_err());
        assert!(req(Action::Drain).validate(&g, &c, 0).is_err());
        assert!(req(Action::Weight { weight: 1.5 })
            .validate(&ch, &c, 0)
            .is_err());
        assert!(req(Action::Clear).validate(&ch, &c, 0).is_err());
        assert_eq!(
            req(Action::Drain).validate(&Target::Channel("nope".into()), &c, 0),
            Err(Refused::Unknown(Target::Channel("nope".into())))
        );
        let mut r = req(Action::Drain);
        r.reason = " ".into();
        assert!(r.validate(&ch, &c, 0).is_err());
        let mut r = req(Action::Drain);
        r.actor.clear();
        assert!(r.validate(&ch, &c, 0).is_err());
    }

    #[test]
    fn the_stored_form_round_trips_and_names_who_and_why() {
        let o = req(Action::Weight { weight: 0.25 })
            .validate(&Target::Channel("paid-a".into()), &cfg(), 0)
            .unwrap();
        let json = serde_json::to_string(&o).unwrap();
        assert!(json.contains("\"action\":\"weight\""), "{json}");
        let set = Overrides::from_fields([
            ("channel:paid-a".to_string(), json),
            ("group:chat".to_string(), "not json".to_string()),
        ]);
        assert_eq!(set.channels["paid-a"], o);
        assert!(set.groups.is_empty(), "the unreadable field is skipped");
        let note = o.note();
        assert!(
            note.contains("alice") && note.contains("provider incident"),
            "{note}"
        );
        assert!(note.contains("hold weight 0.25"), "{note}");
    }

    #[tokio::test]
    async fn clear_leaves_a_tombstone_and_lapsed_entries_are_removed() {
        let (_tx, rx) = watch::channel(Arc::new(cfg()));
        let control = Control::new(Store::InProcess(Mutex::new(BTreeMap::new())), rx, 60_000);
        let mut seen = control.subscribe();
        let ch = Target::Channel("free-a".into());
        control
            .set(ch.clone(), &req(Action::Drain))
            .await
            .unwrap()
            .unwrap();
        assert!(seen.has_changed().unwrap());
        assert_eq!(
            seen.borrow_and_update().channels["free-a"].action,
            Action::Drain
        );
        assert!(control
            .clear(ch.clone(), "bob", "provider fixed")
            .await
            .unwrap());
        let now = control.current();
        assert_eq!(now.channels["free-a"].action, Action::Clear);
        assert_eq!(now.channels["free-a"].actor, "bob");
        assert!(now.channels["free-a"].pin().is_none());
        // Nothing left in force: a second clear is a no-op.
        assert!(!control.clear(ch.clone(), "bob", "again").await.unwrap());
        // A lapsed override is removed from the store at the next refresh.
        let mut lapsed = req(Action::Freeze)
            .validate(&Target::Group("chat".into()), &cfg(), 0)
            .unwrap();
        lapsed.expires_ms = Some(1);
        control
            .store
            .put(&Target::Group("chat".into()), &lapsed)
            .await
            .unwrap();
        control.refresh().await.unwrap();
        assert!(control.current().groups.is_empty());
        assert!(!control
            .store
            .fields()
            .await
            .unwrap()
            .contains_key("group:chat"));
    }
}
