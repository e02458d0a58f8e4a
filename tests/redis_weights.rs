//! Publishing weights to a real Redis and reading them as a gateway would.

mod support;

use hermes::client::{ClientOptions, WeightClient};
use hermes::event::TrafficClass;
use hermes::publish::redis::{PublisherOptions, RedisPublisher};
use hermes::publish::{snapshot_key, ChannelStatus, ClassWeights, WeightSnapshot, WriteOutcome};
use hermes::routing::Pick;
use std::collections::BTreeMap;
use std::time::Duration;
use support::{eventually, RedisServer};

fn snapshot(epoch: u64, version: u64, free_weight: f64) -> WeightSnapshot {
    let mut classes = BTreeMap::new();
    for c in TrafficClass::ALL {
        classes.insert(
            c.as_str().to_string(),
            ClassWeights {
                weights: [
                    ("free-a".to_string(), free_weight),
                    ("paid-a".to_string(), 1.0 - free_weight),
                ]
                .into_iter()
                .collect(),
                shed: 0.0,
            },
        );
    }
    let status = |state: &str| ChannelStatus {
        state: state.into(),
        score: Some(0.1),
        reason: "healthy".into(),
        planned_rps: 1.0,
        signals: Vec::new(),
    };
    WeightSnapshot {
        group: "chat".into(),
        version,
        epoch,
        computed_at_ms: 1,
        heartbeat_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64,
        manual: false,
        panic_since_ms: None,
        projected_spend_per_hour: 0.0,
        classes,
        channels: [
            ("free-a".to_string(), status("HEALTHY")),
            ("paid-a".to_string(), status("HEALTHY")),
        ]
        .into_iter()
        .collect(),
    }
}

fn fast_client() -> ClientOptions {
    ClientOptions {
        refresh_interval: Duration::from_millis(500),
        timeout: Duration::from_millis(500),
        max_backoff: Duration::from_millis(300),
        ..ClientOptions::default()
    }
}

#[tokio::test]
async fn gateways_read_what_hermes_publishes_and_pick_by_weight() {
    let redis = RedisServer::start();
    let mut publisher = RedisPublisher::new(&redis.url(), PublisherOptions::default()).unwrap();
    assert_eq!(
        publisher.write(&snapshot(1, 1, 0.3)).await.unwrap(),
        WriteOutcome::Written
    );

    let client = WeightClient::start(&redis.url(), "chat", fast_client()).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || client.status().version
            == Some(1))
        .await
    );
    let table = client.table().unwrap();
    let mut free = 0;
    let n = 100;
    for i in 0..n {
        for j in 0..n {
            let (u1, u2) = ((i as f64 + 0.5) / n as f64, (j as f64 + 0.5) / n as f64);
            if table.pick(TrafficClass::Core, 0.99, u1, u2) == Pick::Channel("free-a") {
                free += 1;
            }
        }
    }
    let share = free as f64 / (n * n) as f64;
    assert!((share - 0.3).abs() < 0.01, "free-a share {share}");

    // A new version reaches the gateway through PUBLISH.
    assert_eq!(
        publisher.write(&snapshot(1, 2, 0.0)).await.unwrap(),
        WriteOutcome::Written
    );
    assert!(
        eventually(Duration::from_secs(5), || client.status().version
            == Some(2))
        .await
    );
    let table = client.table().unwrap();
    assert_eq!(
        table.pick(TrafficClass::Interactive, 0.5, 0.01, 0.01),
        Pick::Channel("paid-a")
    );
}

#[tokio::test]
async fn a_stale_writer_is_refused_by_the_script() {
    let redis = RedisServer::start();
    let mut newer = RedisPublisher::new(&redis.url(), PublisherOptions::default()).unwrap();
    let mut zombie = RedisPublisher::new(&redis.url(), PublisherOptions::default()).unwrap();
    assert_eq!(
        newer.write(&snapshot(2, 5, 0.3)).await.unwrap(),
        WriteOutcome::Written
    );

    // Older epoch, even with a higher version: refused (by the epoch key
    // the newer writer's write left, before the snapshot is even read).
    assert_eq!(
        zombie.write(&snapshot(1, 9, 0.9)).await.unwrap(),
        WriteOutcome::Stale {
            stored_epoch: 2,
            stored_version: 0
        }
    );
    // Same epoch, older version: refused.
    assert_eq!(
        zombie.write(&snapshot(2, 4, 0.9)).await.unwrap(),
        WriteOutcome::Stale {
            stored_epoch: 2,
            stored_version: 5
        }
    );
    // Same version, newer heartbeat: refreshed, not announced.
    let mut beat = snapshot(2, 5, 0.3);
    beat.heartbeat_ms += 10_000;
    assert_eq!(newer.write(&beat).await.unwrap(), WriteOutcome::Heartbeat);
    assert_eq!(newer.write(&beat).await.unwrap(), WriteOutcome::Unchanged);

    let stored: String = {
        let c = redis::Client::open(redis.url()).unwrap();
        let mut conn = c.get_multiplexed_async_connection().await.unwrap();
        redis::cmd("GET")
            .arg(snapshot_key("chat"))
            .query_async(&mut conn)
            .await
            .unwrap()
    };
    let stored: WeightSnapshot = serde_json::from_str(&stored).unwrap();
    assert_eq!(
        (stored.epoch, stored.version, stored.heartbeat_ms),
        (2, 5, beat.heartbeat_ms)
    );
    assert!((stored.classes["CORE"].weights["free-a"] - 0.3).abs() < 1e-12);
    // No TTL: stale beats empty.
    let c = redis::Client::open(redis.url()).unwrap();
    let mut conn = c.get_multiplexed_async_connection().await.unwrap();
    let ttl: i64 = redis::cmd("TTL")
        .arg(snapshot_key("chat"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(ttl, -1);
}

#[tokio::test]
async fn redis_down_the_gateway_keeps_its_last_snapshot() {
    let mut redis = RedisServer::start();
    let mut publisher = RedisPublisher::new(
        &redis.url(),
        PublisherOptions {
            max_attempts: 2,
            backoff: Duration::from_millis(50),
            ..PublisherOptions::default()
        },
    )
    .unwrap();
    publisher.write(&snapshot(1, 1, 0.3)).await.unwrap();
    let client = WeightClient::start(&redis.url(), "chat", fast_client()).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || client.status().version
            == Some(1))
        .await
    );

    redis.kill();
    let err = publisher.write(&snapshot(1, 2, 0.5)).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    // Meanwhile the gateway serves the last snapshot and knows it is aging.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let status = client.status();
    assert_eq!(status.version, Some(1));
    assert!(status.since_last_read_ms.unwrap() >= 1000, "{status:?}");
    assert!(status.read_errors >= 1);
    assert_eq!(
        client
            .table()
            .unwrap()
            .pick(TrafficClass::Core, 0.9, 0.01, 0.01),
        Pick::Channel("free-a")
    );

    // Redis is back (empty: no persistence): Hermes republishes, the gateway follows.
    redis.restart();
    let mut ok = false;
    for _ in 0..50 {
        if publisher.write(&snapshot(1, 2, 0.5)).await.is_ok() {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok, "publisher reconnects");
    assert!(
        eventually(Duration::from_secs(10), || client.status().version
            == Some(2))
        .await
    );
}

/// Fencing holds from the moment a new writer takes the epoch, before it
/// publishes anything (a zombie's write in that window used to land).
#[tokio::test]
async fn a_writer_is_fenced_as_soon_as_a_newer_one_takes_the_epoch() {
    let redis = RedisServer::start();
    let mut old = RedisPublisher::new(&redis.url(), PublisherOptions::default()).unwrap();
    let mut new = RedisPublisher::new(&redis.url(), PublisherOptions::default()).unwrap();
    let (e_old, _) = old.take_epoch("chat").await.unwrap();
    assert_eq!(
        old.write(&snapshot(e_old, 1, 0.3)).await.unwrap(),
        WriteOutcome::Written
    );
    let (e_new, stored) = new.take_epoch("chat").await.unwrap();
    assert_eq!(e_new, e_old + 1);
    assert_eq!(stored.map(|s| s.version), Some(1));
    // The new writer is still warming up and has written nothing.
    assert_eq!(
        old.write(&snapshot(e_old, 2, 0.9)).await.unwrap(),
        WriteOutcome::Stale {
            stored_epoch: e_new,
            stored_version: 0
        }
    );
    assert_eq!(
        new.write(&snapshot(e_new, 2, 0.5)).await.unwrap(),
        WriteOutcome::Written
    );
}

/// Redis loses its data and a different writer takes over: the epoch does
/// not restart at 1 (gateways that saw a higher one would refuse every
/// snapshot), so every gateway adopts the new writer's snapshots within one
/// refresh.
#[tokio::test]
async fn after_redis_loses_its_data_gateways_follow_the_next_writer() {
    let mut redis = RedisServer::start();
    let opts = PublisherOptions {
        max_attempts: 2,
        backoff: Duration::from_millis(50),
        ..PublisherOptions::default()
    };
    let mut first = RedisPublisher::new(&redis.url(), opts.clone()).unwrap();
    // Several takeovers in the first dataset.
    for _ in 0..2 {
        first.take_epoch("chat").await.unwrap();
    }
    let (e1, _) = first.take_epoch("chat").await.unwrap();
    assert!(
        e1 > 1_000_000_000_000,
        "a fresh dataset starts at the wall clock: {e1}"
    );
    first.write(&snapshot(e1, 40, 0.3)).await.unwrap();
    let clients: Vec<WeightClient> = (0..3)
        .map(|_| WeightClient::start(&redis.url(), "chat", fast_client()).unwrap())
        .collect();
    for c in &clients {
        assert!(eventually(Duration::from_secs(5), || c.status().epoch == Some(e1)).await);
    }

    redis.kill();
    redis.restart(); // empty: no persistence
    let mut second = RedisPublisher::new(&redis.url(), opts).unwrap();
    let mut taken = None;
    for _ in 0..50 {
        if let Ok(t) = second.take_epoch("chat").await {
            taken = Some(t);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (e2, stored) = taken.expect("Redis is back");
    assert!(stored.is_none(), "the data is gone");
    assert!(e2 > e1, "epoch went backwards: {e2} after {e1}");
    second.write(&snapshot(e2, 1, 0.7)).await.unwrap();
    // One refresh is 500 ms here; allow reconnect backoff on top.
    for c in &clients {
        assert!(
            eventually(Duration::from_secs(3), || c.status().epoch == Some(e2)).await,
            "{:?}",
            c.status()
        );
        assert_eq!(c.status().version, Some(1));
    }
}

/// Redis comes back empty under a writer that keeps its epoch: its next
/// write puts the epoch key back, so a writer older than it (paused through
/// the outage) is refused again instead of writing into the empty key.
#[tokio::test]
async fn after_redis_loses_its_data_the_writers_next_write_restores_its_fence() {
    let mut redis = RedisServer::start();
    let opts = PublisherOptions {
        max_attempts: 2,
        backoff: Duration::from_millis(50),
        ..PublisherOptions::default()
    };
    let mut zombie = RedisPublisher::new(&redis.url(), opts.clone()).unwrap();
    let (e_old, _) = zombie.take_epoch("chat").await.unwrap();
    let mut writer = RedisPublisher::new(&redis.url(), opts).unwrap();
    let (e, _) = writer.take_epoch("chat").await.unwrap();
    assert!(e > e_old);
    writer.write(&snapshot(e, 7, 0.3)).await.unwrap();

    redis.kill();
    redis.restart(); // empty
    let mut written = None;
    for _ in 0..50 {
        if let Ok(o) = writer.write(&snapshot(e, 8, 0.3)).await {
            written = Some(o);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(written, Some(WriteOutcome::Written));
    let client = redis::Client::open(redis.url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let stored: Option<u64> = redis::cmd("GET")
        .arg(hermes::publish::epoch_key("chat"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(stored, Some(e), "the writer's epoch is back");
    assert_eq!(
        zombie.write(&snapshot(e_old, 99, 0.9)).await.unwrap(),
        WriteOutcome::Stale {
            stored_epoch: e,
            stored_version: 0
        }
    );
}
