//! The gateway-side client: reads a group's weight snapshot, keeps it fresh,
//! and picks a channel for a request in O(1).
//!
//! A background task reads the snapshot with one `GET` at start, again on
//! every `PUBLISH` to the group's change channel, and every
//! `refresh_interval` in case a message was missed. Each good read is parsed
//! into a [`RoutingTable`] (one Vose alias table per traffic class) and
//! swapped in atomically behind an `Arc`; readers never block writers for
//! longer than a pointer copy. A snapshot older (by epoch, then version) than
//! the current one is ignored. While Redis is unreachable the task retries
//! with backoff and the last table keeps serving (fail static);
//! [`WeightClient::status`] reports its age so the gateway can alarm.

use crate::publish::{changed_channel, redact_url, snapshot_key, WeightSnapshot};
use crate::routing::RoutingTable;
use futures_util::StreamExt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// How fresh the client's view is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientStatus {
    /// Version and epoch of the table in use, if any.
    pub version: Option<u64>,
    pub epoch: Option<u64>,
    /// Milliseconds since the writer's last heartbeat (wall time).
    pub snapshot_age_ms: Option<i64>,
    /// Milliseconds since the client last reached Redis.
    pub since_last_read_ms: Option<i64>,
    /// Failed reads so far.
    pub read_errors: u64,
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
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            refresh_interval: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
            max_backoff: Duration::from_secs(5),
        }
    }
}

use crate::wall_clock::now_ms as wall_ms;

struct Shared {
    table: RwLock<Option<Arc<RoutingTable>>>,
    last_read_ms: AtomicI64,
    read_errors: AtomicU64,
}

impl Shared {
    /// Swaps in a newer snapshot; ignores older ones (by epoch, version).
    fn offer(&self, snap: WeightSnapshot) {
        let table = Arc::new(RoutingTable::new(snap));
        let mut guard = match self.table.write() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let newer = guard
            .as_ref()
            .is_none_or(|cur| !table.snapshot.is_older_than(&cur.snapshot));
        if newer {
            *guard = Some(table);
        }
    }
}

/// A gateway's handle on one group's weights. Cheap to clone.
#[derive(Clone)]
pub struct WeightClient {
    shared: Arc<Shared>,
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
            table: RwLock::new(None),
            last_read_ms: AtomicI64::new(0),
            read_errors: AtomicU64::new(0),
        });
        let task = tokio::spawn(run(
            client,
            group.to_string(),
            opts,
            shared.clone(),
            redact_url(url),
        ));
        Ok(WeightClient {
            shared,
            task: Arc::new(task),
        })
    }

    /// The table in use (the last good snapshot), if any.
    pub fn table(&self) -> Option<Arc<RoutingTable>> {
        match self.shared.table.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Freshness of the view.
    pub fn status(&self) -> ClientStatus {
        let now = wall_ms();
        let table = self.table();
        let last = self.shared.last_read_ms.load(Ordering::Relaxed);
        ClientStatus {
            version: table.as_ref().map(|t| t.snapshot.version),
            epoch: table.as_ref().map(|t| t.snapshot.epoch),
            snapshot_age_ms: table.as_ref().map(|t| now - t.snapshot.heartbeat_ms),
            since_last_read_ms: (last > 0).then(|| now - last),
            read_errors: self.shared.read_errors.load(Ordering::Relaxed),
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
    if let Some(raw) = raw {
        match serde_json::from_str::<WeightSnapshot>(&raw) {
            Ok(snap) => shared.offer(snap),
            // A snapshot this client cannot parse must not replace a good one.
            Err(e) => return Err(format!("undecodable snapshot at {key}: {e}")),
        }
    }
    Ok(())
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
    let mut backoff = Duration::from_millis(100);
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
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(opts.max_backoff);
    }
}
