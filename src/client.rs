//! The gateway-side client: reads a group's weight snapshot, keeps it fresh,
//! and picks a channel for a request in O(1).
//!
//! A background task reads the snapshot with one `GET` at start, again on
//! every `PUBLISH` to the group's change channel, and every
//! `refresh_interval` in case a message was missed. Each good read is parsed
//! into a [`RoutingTable`] (one Vose alias table per traffic class) and
//! swapped in atomically behind an `Arc`; readers never block writers for
//! longer than a pointer copy. A snapshot older (by epoch, then version) than
//! the current one is ignored, and so is one that does not parse or whose
//! weights are out of range. While Redis is unreachable the task retries
//! with backoff and the last table keeps serving (fail static); until a
//! first snapshot arrives the gateway's static table serves.
//! [`WeightClient::status`] reports its age so the gateway can alarm.
//!
//! [`SnapshotView`] is that algorithm without I/O; the conformance cases in
//! `schemas/conformance/` run against it and against the Python client.

use crate::backoff::Backoff;
use crate::publish::{changed_channel, redact_url, snapshot_key, WeightSnapshot};
use crate::routing::{RoutingTable, StaticWeights};
use futures_util::StreamExt;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// How fresh the client's view is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientStatus {
    /// Version and epoch of the snapshot in use, if any.
    pub version: Option<u64>,
    pub epoch: Option<u64>,
    /// Milliseconds since the writer's last heartbeat (wall time).
    pub snapshot_age_ms: Option<i64>,
    /// Milliseconds since the client last reached Redis.
    pub since_last_read_ms: Option<i64>,
    /// Failed reads so far.
    pub read_errors: u64,
    /// Snapshots refused (unparsable or out of range) so far.
    pub rejected: u64,
    /// No snapshot, or its heartbeat older than `stale_after`: alarm
    /// (routing goes on by the last snapshot, or the static table).
    pub stale: bool,
}

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Re-read this often even without a change message.
    pub refresh_interval: Duration,
    /// Per-command timeout.
    pub timeout: Duration,
    /// Longest backoff between reconnects.
    pub max_backoff: Duration,
    /// A snapshot whose heartbeat is older than this is stale (three of the
    /// writer's 10 s heartbeats by default).
    pub stale_after: Duration,
    /// What to route by until the group's first snapshot (empty: nothing).
    pub static_weights: StaticWeights,
    /// The channels this gateway can reach; weights on others are ignored
    /// (`None`: every channel the snapshot names).
    pub known_channels: Option<BTreeSet<String>>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            refresh_interval: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
            max_backoff: Duration::from_secs(5),
            stale_after: Duration::from_secs(30),
            static_weights: StaticWeights::new(),
            known_channels: None,
        }
    }
}

use crate::wall_clock::now_ms as wall_ms;

/// The reader's state without I/O: the newest good snapshot and the static
/// table behind it.
#[derive(Debug, Clone)]
pub struct SnapshotView {
    current: Option<Arc<RoutingTable>>,
    fallback: Option<Arc<RoutingTable>>,
    known: Option<BTreeSet<String>>,
    /// Snapshots refused so far.
    pub rejected: u64,
}

impl SnapshotView {
    pub fn new(
        group: &str,
        static_weights: &StaticWeights,
        known: Option<BTreeSet<String>>,
    ) -> Self {
        SnapshotView {
            current: None,
            fallback: RoutingTable::from_static(group, static_weights, known.as_ref())
                .map(Arc::new),
            known,
            rejected: 0,
        }
    }

    /// What one read returned (`None`: the key does not exist). Returns
    /// whether the table in use changed; an error (the snapshot is refused,
    /// the last good one stays) says why.
    pub fn offer(&mut self, raw: Option<&str>) -> Result<bool, String> {
        let Some(raw) = raw else { return Ok(false) };
        let snap = serde_json::from_str::<WeightSnapshot>(raw)
            .map_err(|e| e.to_string())
            .and_then(|s| s.check().map(|()| s));
        let snap = match snap {
            Ok(s) => s,
            Err(e) => {
                self.rejected += 1;
                return Err(e);
            }
        };
        if let Some(cur) = &self.current {
            let same = (snap.epoch, snap.version, snap.heartbeat_ms)
                == (
                    cur.snapshot.epoch,
                    cur.snapshot.version,
                    cur.snapshot.heartbeat_ms,
                );
            if snap.is_older_than(&cur.snapshot) || same {
                return Ok(false);
            }
        }
        self.current = Some(Arc::new(RoutingTable::restricted(
            snap,
            self.known.as_ref(),
        )));
        Ok(true)
    }

    /// The table to route by: the last good snapshot whatever its age
    /// (stale beats empty), else the static table.
    pub fn table(&self) -> Option<Arc<RoutingTable>> {
        self.current.clone().or_else(|| self.fallback.clone())
    }

    /// The last good snapshot, if any.
    pub fn snapshot(&self) -> Option<&WeightSnapshot> {
        self.current.as_deref().map(|t| &t.snapshot)
    }

    /// No snapshot, or its heartbeat older than `stale_after_ms` at `now_ms`.
    pub fn is_stale(&self, now_ms: i64, stale_after_ms: i64) -> bool {
        self.snapshot()
            .is_none_or(|s| now_ms - s.heartbeat_ms > stale_after_ms)
    }
}

struct Shared {
    view: RwLock<SnapshotView>,
    last_read_ms: AtomicI64,
    read_errors: AtomicU64,
}

impl Shared {
    fn view(&self) -> std::sync::RwLockReadGuard<'_, SnapshotView> {
        self.view.read().unwrap_or_else(|p| p.into_inner())
    }

    fn offer(&self, raw: Option<&str>) -> Result<bool, String> {
        let mut view = self.view.write().unwrap_or_else(|p| p.into_inner());
        view.offer(raw)
    }
}

/// A gateway's handle on one group's weights. Cheap to clone.
#[derive(Clone)]
pub struct WeightClient {
    shared: Arc<Shared>,
    stale_after_ms: i64,
    task: Arc<tokio::task::JoinHandle<()>>,
}

impl Drop for WeightClient {
    fn drop(&mut self) {
        if Arc::strong_count(&self.task) == 1 {
            self.task.abort();
        }
    }
}

impl WeightClient {
    /// Starts the background reader for `group`. Returns at once; the first
    /// table arrives as soon as Redis answers (see [`WeightClient::table`]).
    pub fn start(url: &str, group: &str, opts: ClientOptions) -> Result<WeightClient, String> {
        let client = redis::Client::open(url)
            .map_err(|e| format!("bad redis url {}: {e}", redact_url(url)))?;
        let shared = Arc::new(Shared {
            view: RwLock::new(SnapshotView::new(
                group,
                &opts.static_weights,
                opts.known_channels.clone(),
            )),
            last_read_ms: AtomicI64::new(0),
            read_errors: AtomicU64::new(0),
        });
        let stale_after_ms = opts.stale_after.as_millis() as i64;
        let task = tokio::spawn(run(
            client,
            group.to_string(),
            opts,
            shared.clone(),
            redact_url(url),
        ));
        Ok(WeightClient {
            shared,
            stale_after_ms,
            task: Arc::new(task),
        })
    }

    /// The table in use: the last good snapshot, else the static table
    /// (`None` before a first snapshot when no static table was given).
    pub fn table(&self) -> Option<Arc<RoutingTable>> {
        self.shared.view().table()
    }

    /// Freshness of the view.
    pub fn status(&self) -> ClientStatus {
        let now = wall_ms();
        let view = self.shared.view();
        let snap = view.snapshot();
        let last = self.shared.last_read_ms.load(Ordering::Relaxed);
        ClientStatus {
            version: snap.map(|s| s.version),
            epoch: snap.map(|s| s.epoch),
            snapshot_age_ms: snap.map(|s| now - s.heartbeat_ms),
            since_last_read_ms: (last > 0).then(|| now - last),
            read_errors: self.shared.read_errors.load(Ordering::Relaxed),
            rejected: view.rejected,
            stale: view.is_stale(now, self.stale_after_ms),
        }
    }
}

async fn read_once(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    shared: &Shared,
) -> Result<(), String> {
    let raw: Option<String> = redis::cmd("GET")
        .arg(key)
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    shared.last_read_ms.store(wall_ms(), Ordering::Relaxed);
    // A snapshot this client cannot use must not replace a good one.
    shared
        .offer(raw.as_deref())
        .map(|_| ())
        .map_err(|e| format!("refused snapshot at {key}: {e}"))
}

/// The reader loop: connect, subscribe, read; on any error back off and
/// start over, keeping the last table.
async fn run(
    client: redis::Client,
    group: String,
    opts: ClientOptions,
    shared: Arc<Shared>,
    url: String,
) {
    let key = snapshot_key(&group);
    let channel = changed_channel(&group);
    let mut backoff = Backoff::SHORT.capped(opts.max_backoff);
    loop {
        let session = async {
            let cfg = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(opts.timeout))
                .set_response_timeout(Some(opts.timeout));
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&cfg)
                .await
                .map_err(|e| e.to_string())?;
            let mut pubsub = tokio::time::timeout(opts.timeout, client.get_async_pubsub())
                .await
                .map_err(|_| "pubsub connect timed out".to_string())?
                .map_err(|e| e.to_string())?;
            pubsub
                .subscribe(&channel)
                .await
                .map_err(|e| e.to_string())?;
            read_once(&mut conn, &key, &shared).await?;
            backoff.reset();
            let mut messages = pubsub.into_on_message();
            let mut tick = tokio::time::interval(opts.refresh_interval);
            tick.tick().await;
            loop {
                tokio::select! {
                    msg = messages.next() => {
                        if msg.is_none() {
                            return Err::<(), String>("subscription closed".into());
                        }
                        read_once(&mut conn, &key, &shared).await?;
                    }
                    _ = tick.tick() => read_once(&mut conn, &key, &shared).await?,
                }
            }
        };
        if let Err(e) = session.await {
            shared.read_errors.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(redis = %url, group = %group, error = %e, "weight client lost redis; serving the last snapshot");
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}
