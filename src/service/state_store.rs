//! Durable state-machine state, so a channel DRAINED before a crash is still
//! DRAINED after the takeover.
//!
//! One Redis hash per group, `hermes:{GROUP}:state` (same hash tag as the
//! weights), field = channel id, value = JSON `{saved_at_ms, machine}`.
//! Writes go through a script that keeps the newest by event time, so a
//! late write from an instance that lost the partition cannot roll a newer
//! owner's state back. Writes are queued and coalesced per channel (latest
//! wins) on a background task that retries with backoff while Redis is
//! down; the consumer never waits for them.
//!
//! A machine is written when it changes, so a Redis that comes back empty
//! (restarted without persistence, flushed) would hold no state until each
//! channel next changed, and a takeover then would restore nothing: the
//! incident history, relapse multiplier included, forgotten. A watcher
//! checks once per evaluation interval that the dataset still carries
//! [`DATASET_KEY`]; when it does not, it sets it and bumps
//! [`StateStore::generation`], and every request loop saves all of its
//! channels again at their next evaluation.

use crate::backoff::Backoff;
use crate::publish::redact_url;
pub use crate::redis_keys::state_key;
use crate::redis_keys::{DATASET_KEY, KEEP_NEWEST_LUA};
use crate::state::StateMachine;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// What is stored per channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedState {
    /// Event time (partition watermark) the machine reflects.
    pub saved_at_ms: i64,
    pub machine: StateMachine,
}

/// One queued write.
#[derive(Debug, Clone)]
pub struct StateWrite {
    pub group: String,
    pub channel: String,
    pub state: SavedState,
}

/// Handle to the background writer.
#[derive(Clone)]
pub struct StateStore {
    tx: mpsc::UnboundedSender<StateWrite>,
    client: redis::Client,
    url_for_logs: String,
    /// Bumped each time the dataset was found without [`DATASET_KEY`].
    generation: Arc<AtomicU64>,
}

async fn connect(client: &redis::Client) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    let cfg = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(2)));
    client
        .get_multiplexed_async_connection_with_config(&cfg)
        .await
}

impl StateStore {
    /// Starts the writer task, and the watcher that checks the dataset
    /// every `check_every` (the evaluation interval), on the current
    /// runtime. `instance` is written into the dataset's mark.
    pub fn start(url: &str, instance: &str, check_every: Duration) -> anyhow::Result<StateStore> {
        let client = redis::Client::open(url)
            .map_err(|e| anyhow::anyhow!("bad redis url {}: {e}", redact_url(url)))?;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(writer(client.clone(), rx, redact_url(url)));
        let generation = Arc::new(AtomicU64::new(0));
        tokio::spawn(watch_dataset(
            client.clone(),
            instance.to_string(),
            check_every,
            generation.clone(),
        ));
        Ok(StateStore {
            tx,
            client,
            url_for_logs: redact_url(url),
            generation,
        })
    }

    /// How many times the dataset was found without Hermes' mark (Redis
    /// came back empty): a request loop that saw a lower number saves every
    /// channel's state again.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// Queues a write (never blocks).
    pub fn save(&self, w: StateWrite) {
        let _ = self.tx.send(w);
    }

    /// Every saved channel state of `groups`, on one connection, the
    /// groups' reads pipelined: a rebuild reads every configured group, and
    /// a connection and a round trip per group cost 1-2 s at 2 000 groups.
    pub async fn load(&self, groups: &[&str]) -> anyhow::Result<BTreeMap<String, SavedState>> {
        let mut conn = connect(&self.client)
            .await
            .map_err(|e| anyhow::anyhow!("redis {}: {e}", self.url_for_logs))?;
        read_saved(&mut conn, groups)
            .await
            .map_err(|e| anyhow::anyhow!("redis {}: {e}", self.url_for_logs))
    }
}

/// Every saved channel state of `groups` on `conn`, in one pipeline (the
/// service's restore and `hermes status` read them alike); an unreadable
/// one is left out with a warning.
pub(crate) async fn read_saved(
    conn: &mut impl redis::aio::ConnectionLike,
    groups: &[&str],
) -> redis::RedisResult<BTreeMap<String, SavedState>> {
    let mut pipe = redis::pipe();
    for g in groups {
        pipe.cmd("HGETALL").arg(state_key(g));
    }
    let raw: Vec<HashMap<String, String>> = pipe.query_async(conn).await?;
    let mut out = BTreeMap::new();
    for (group, raw) in groups.iter().zip(raw) {
        parse_saved(group, raw, &mut out);
    }
    Ok(out)
}

/// A group's hash of saved states into `out`; an unreadable one is left
/// out with a warning.
fn parse_saved(group: &str, raw: HashMap<String, String>, out: &mut BTreeMap<String, SavedState>) {
    for (channel, json) in raw {
        match serde_json::from_str::<SavedState>(&json) {
            Ok(s) => {
                out.insert(channel, s);
            }
            Err(e) => tracing::warn!(group, channel, error = %e, "unreadable saved state ignored"),
        }
    }
}

async fn writer(client: redis::Client, mut rx: mpsc::UnboundedReceiver<StateWrite>, url: String) {
    let script = redis::Script::new(KEEP_NEWEST_LUA);
    let mut pending: BTreeMap<(String, String), SavedState> = BTreeMap::new();
    let mut conn: Option<redis::aio::MultiplexedConnection> = None;
    let mut backoff = Backoff::SHORT;
    loop {
        if pending.is_empty() {
            match rx.recv().await {
                Some(w) => {
                    pending.insert((w.group, w.channel), w.state);
                }
                None => return,
            }
        }
        while let Ok(w) = rx.try_recv() {
            pending.insert((w.group, w.channel), w.state);
        }
        if conn.is_none() {
            match connect(&client).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    tracing::warn!(redis = %url, error = %e, queued = pending.len(), "state store unreachable; retrying");
                    tokio::time::sleep(backoff.next_delay()).await;
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        let mut failed = false;
        while let Some(((group, channel), state)) = pending.pop_first() {
            let json = match serde_json::to_string(&state) {
                Ok(j) => j,
                Err(_) => continue,
            };
            let r: redis::RedisResult<i64> = script
                .key(state_key(&group))
                .arg(&channel)
                .arg(state.saved_at_ms)
                .arg(json)
                .invoke_async(c)
                .await;
            if let Err(e) = r {
                tracing::warn!(redis = %url, error = %e, "state write failed; retrying");
                pending.entry((group, channel)).or_insert(state);
                failed = true;
                break;
            }
        }
        if failed {
            conn = None;
            tokio::time::sleep(backoff.next_delay()).await;
        } else {
            backoff.reset();
        }
    }
}

/// Checks every `every` that the dataset carries [`DATASET_KEY`]; marks it
/// and bumps `generation` when it does not (at the first check too: a
/// dataset this instance has not seen marked may have lost what it saved).
async fn watch_dataset(
    client: redis::Client,
    instance: String,
    every: Duration,
    generation: Arc<AtomicU64>,
) {
    let mut conn: Option<redis::aio::MultiplexedConnection> = None;
    // A connection that just broke is retried soon: Redis restarting is
    // when the dataset is most likely to have been lost.
    let soon = every.min(Duration::from_millis(250));
    loop {
        let mut next = every;
        if conn.is_none() {
            conn = connect(&client).await.ok();
            if conn.is_none() {
                next = soon;
            }
        }
        if let Some(c) = conn.as_mut() {
            let mark = format!("{instance} {}", crate::wall_clock::now_ms());
            // SET NX: answers OK only when the mark was missing.
            let set: redis::RedisResult<Option<String>> = redis::cmd("SET")
                .arg(DATASET_KEY)
                .arg(mark)
                .arg("NX")
                .query_async(c)
                .await;
            match set {
                Ok(Some(_)) => {
                    let g = generation.fetch_add(1, Ordering::Relaxed) + 1;
                    if g > 1 {
                        tracing::warn!(
                            "Redis holds no Hermes state (it came back empty or was flushed): \
                             saving every channel's state again"
                        );
                    }
                }
                Ok(None) => {}
                // The writer reports Redis being away; this only retries.
                Err(_) => {
                    conn = None;
                    next = soon;
                }
            }
        }
        tokio::time::sleep(next).await;
    }
}
