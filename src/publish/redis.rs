//! The Redis side of publishing: the fenced write and heartbeats.
//!
//! The adapter owns its retries: each write is attempted with exponential
//! backoff up to `max_attempts`, and every error says whether retrying can
//! help (a connection or timeout error can; a script or encoding error
//! cannot). While Redis is down nothing is lost that matters: the next write
//! carries the whole current snapshot (fail static: gateways keep the last
//! one they read).

use super::{
    changed_channel, epoch_key, redact_url, snapshot_key, WeightSnapshot, WriteOutcome,
    FENCED_WRITE_LUA, TAKE_EPOCH_LUA,
};
use std::time::Duration;

/// Why a write failed.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("redis unreachable or timed out: {0}")]
    Unavailable(String),
    #[error("redis refused the write: {0}")]
    Refused(String),
    #[error("cannot encode the snapshot: {0}")]
    Encode(String),
}

impl PublishError {
    /// Whether retrying later can help.
    pub fn is_retryable(&self) -> bool {
        matches!(self, PublishError::Unavailable(_))
    }
}

fn classify(e: redis::RedisError) -> PublishError {
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        PublishError::Unavailable(e.to_string())
    } else {
        PublishError::Refused(e.to_string())
    }
}

/// Publisher settings.
#[derive(Debug, Clone)]
pub struct PublisherOptions {
    /// Per-command response timeout.
    pub response_timeout: Duration,
    /// Connection timeout.
    pub connect_timeout: Duration,
    /// Attempts per write (1 = no retry).
    pub max_attempts: u32,
    /// First backoff; doubles per attempt.
    pub backoff: Duration,
}

impl Default for PublisherOptions {
    fn default() -> Self {
        PublisherOptions {
            response_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            max_attempts: 3,
            backoff: Duration::from_millis(100),
        }
    }
}

/// Writes snapshots through the fenced script.
pub struct RedisPublisher {
    client: redis::Client,
    conn: Option<redis::aio::MultiplexedConnection>,
    script: redis::Script,
    take_epoch_script: redis::Script,
    opts: PublisherOptions,
    url_for_logs: String,
}

impl RedisPublisher {
    /// Parses the URL; connects lazily on the first write (so a publisher can
    /// be created while Redis is down).
    pub fn new(url: &str, opts: PublisherOptions) -> Result<RedisPublisher, PublishError> {
        let client = redis::Client::open(url)
            .map_err(|e| PublishError::Refused(format!("bad redis url: {e}")))?;
        Ok(RedisPublisher {
            client,
            conn: None,
            script: redis::Script::new(FENCED_WRITE_LUA),
            take_epoch_script: redis::Script::new(TAKE_EPOCH_LUA),
            opts,
            url_for_logs: redact_url(url),
        })
    }

    async fn connection(&mut self) -> Result<redis::aio::MultiplexedConnection, PublishError> {
        if let Some(c) = &self.conn {
            return Ok(c.clone());
        }
        let cfg = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.opts.connect_timeout))
            .set_response_timeout(Some(self.opts.response_timeout));
        let c = self
            .client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await
            .map_err(classify)?;
        self.conn = Some(c.clone());
        Ok(c)
    }

    async fn write_once(
        &mut self,
        snap: &WeightSnapshot,
        json: &str,
    ) -> Result<WriteOutcome, PublishError> {
        let mut conn = self.connection().await?;
        let reply: Result<(String, u64, u64), _> = self
            .script
            .key(snapshot_key(&snap.group))
            .key(epoch_key(&snap.group))
            .arg(snap.epoch)
            .arg(snap.version)
            .arg(snap.heartbeat_ms)
            .arg(json)
            .arg(changed_channel(&snap.group))
            .invoke_async(&mut conn)
            .await;
        match reply {
            Ok((outcome, e, v)) => WriteOutcome::from_reply(&outcome, e, v).ok_or_else(|| {
                PublishError::Refused(format!("unexpected script reply `{outcome}`"))
            }),
            Err(e) => {
                let err = classify(e);
                if err.is_retryable() {
                    // Reconnect on the next attempt.
                    self.conn = None;
                }
                Err(err)
            }
        }
    }

    /// Takes the next writer epoch of a group ([`TAKE_EPOCH_LUA`]) and
    /// reads the stored snapshot, so a new writer fences every older one at
    /// once (the write script refuses epochs below the taken one) and
    /// continues its version numbers.
    pub async fn take_epoch(
        &mut self,
        group: &str,
    ) -> Result<(u64, Option<WeightSnapshot>), PublishError> {
        let mut conn = self.connection().await?;
        let r: Result<(u64, Option<String>), _> = self
            .take_epoch_script
            .key(epoch_key(group))
            .key(snapshot_key(group))
            .arg(crate::wall_clock::now_ms().max(1))
            .invoke_async(&mut conn)
            .await;
        match r {
            Ok((epoch, stored)) => Ok((epoch, stored.and_then(|s| serde_json::from_str(&s).ok()))),
            Err(e) => {
                let err = classify(e);
                if err.is_retryable() {
                    self.conn = None;
                }
                Err(err)
            }
        }
    }

    /// Writes a snapshot (a new version, or the same one with a newer
    /// heartbeat), retrying transient failures with backoff.
    pub async fn write(&mut self, snap: &WeightSnapshot) -> Result<WriteOutcome, PublishError> {
        let json = serde_json::to_string(snap).map_err(|e| PublishError::Encode(e.to_string()))?;
        // Doubling per attempt; `max_attempts` bounds it.
        let mut delay = crate::backoff::Backoff::new(self.opts.backoff, Duration::MAX);
        let mut attempt = 1;
        loop {
            match self.write_once(snap, &json).await {
                Ok(outcome) => {
                    if let WriteOutcome::Stale {
                        stored_epoch,
                        stored_version,
                    } = outcome
                    {
                        tracing::warn!(
                            group = %snap.group, epoch = snap.epoch, version = snap.version,
                            stored_epoch, stored_version,
                            "snapshot write refused: a newer writer owns this group"
                        );
                    }
                    return Ok(outcome);
                }
                Err(e) if e.is_retryable() && attempt < self.opts.max_attempts => {
                    tracing::debug!(redis = %self.url_for_logs, attempt, error = %e, "retrying snapshot write");
                    tokio::time::sleep(delay.next_delay()).await;
                    attempt += 1;
                }
                Err(e) => {
                    tracing::warn!(redis = %self.url_for_logs, group = %snap.group, error = %e, "snapshot write failed");
                    return Err(e);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_urls_are_accepted_and_passwords_stay_out_of_errors() {
        // rediss:// needs the TLS build (native-tls over the system OpenSSL).
        assert!(
            RedisPublisher::new("rediss://:s3cret@127.0.0.1:1/", PublisherOptions::default())
                .is_ok()
        );
        let e = RedisPublisher::new("bogus://:s3cret@host/", PublisherOptions::default())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(!e.contains("s3cret"), "{e}");
    }
}
