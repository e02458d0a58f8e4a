//! A dependency away or restarted: Redis down, empty or over TLS,
//! a broker late, restarted or gone at stop; nothing good is lost.

use crate::fixtures::*;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[test]
fn redis_down_for_ten_seconds_hermes_keeps_consuming_and_republishes() {
    let mut stack = Stack::start(TOPICS);
    let hermes = start_hermes(&stack, "a", 5000);
    let gw = Gateway::start(&stack.kafka.bootstrap(), 40);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let client = hermes::client::WeightClient::start(
        &stack.redis.url(),
        "chat",
        hermes::client::ClientOptions {
            refresh_interval: Duration::from_millis(500),
            ..Default::default()
        },
    )
    .unwrap();
    let t0 = Instant::now();
    while client.table().is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "no snapshot:\n{}",
            hermes.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let before = client.status();
    let consumed_before = hermes.metric("hermes_events_consumed_total").unwrap();

    stack.redis.kill();
    let down = Instant::now();
    let mut served = 0;
    while down.elapsed() < Duration::from_secs(10) {
        // The gateway keeps routing by its last snapshot.
        assert!(client.table().is_some());
        served += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let consumed_during = hermes.metric("hermes_events_consumed_total").unwrap();
    assert!(
        consumed_during > consumed_before + 1_000.0,
        "kept consuming while Redis was down: {consumed_before} -> {consumed_during}"
    );
    let age = client.status().snapshot_age_ms.unwrap_or(0);
    assert!(
        age >= 9_000,
        "the client reports the snapshot's age ({age} ms)"
    );

    stack.redis.restart(); // empty: no persistence
    let up = Instant::now();
    loop {
        let st = client.status();
        if st.snapshot_age_ms.is_some_and(|a| a < 5_000)
            && st.since_last_read_ms.is_some_and(|r| r < 2_000)
        {
            break;
        }
        assert!(
            up.elapsed() < Duration::from_secs(30),
            "not republished after Redis came back: {st:?}\n{}",
            hermes.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "served the last snapshot {served} times over 10 s; republished {:?} after Redis returned; before {before:?}, after {:?}",
        up.elapsed(),
        client.status()
    );
    assert!(
        hermes
            .metric("hermes_snapshot_failures_total")
            .unwrap_or(0.0)
            > 0.0
    );
    drop(gw);
}

/// docs/decisions.md#safety-rails: dependencies come and go. Hermes started before its
/// broker keeps running, says on `/readyz` why it is not ready, logs the
/// outage once rather than per retry, and becomes ready and consumes once
/// the broker is up.
#[test]
fn a_broker_that_comes_up_after_hermes_is_waited_for_and_readiness_says_why() {
    let scratch = Scratch::new("service");
    let redis = RedisServer::start();
    let broker_port = free_port();
    let http = free_port();
    let cfg = config(
        &format!("127.0.0.1:{broker_port}"),
        &redis.url(),
        http,
        5000,
    );
    let mut hermes = Hermes::start(scratch.dir(), "early", &cfg, http);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let not_ready = |h: &Hermes| h.get("/readyz").filter(|b| b.starts_with("not ready"));
    assert!(
        rt.block_on(support::eventually(Duration::from_secs(20), || {
            not_ready(&hermes).is_some_and(|b| b.contains("kafka") || b.contains("health_topic"))
        })),
        "readiness should name the broker:\n{:?}\n{}",
        hermes.get("/readyz"),
        hermes.log_tail()
    );
    // Ten seconds without a broker: still alive, still answering.
    std::thread::sleep(Duration::from_secs(10));
    assert!(
        hermes.child.try_wait().unwrap().is_none(),
        "hermes exited without a broker:\n{}",
        hermes.log_tail()
    );
    assert_eq!(hermes.get("/healthz").as_deref(), Some("ok\n"));
    assert!(not_ready(&hermes).is_some());
    let log = std::fs::read_to_string(&hermes.log).unwrap_or_default();
    let outage_lines = log
        .lines()
        .filter(|l| l.contains("dependency unavailable"))
        .count();
    assert!(
        outage_lines <= 6,
        "the outage is logged per change, not per retry ({outage_lines} lines):\n{}",
        hermes.log_tail()
    );
    // The broker comes up where Hermes was told to look.
    let kafka = Tansu::start_on(broker_port, TOPICS);
    let gw = Gateway::start(&kafka.bootstrap(), 40);
    assert!(
        rt.block_on(support::eventually(Duration::from_secs(90), || {
            hermes.get("/readyz").as_deref() == Some("ready\n")
                && hermes.metric("hermes_events_consumed_total").unwrap_or(0.0) > 0.0
        })),
        "not ready after the broker came up:\n{:?}\n{}",
        hermes.get("/readyz"),
        hermes.log_tail()
    );
    drop(gw);
    hermes.kill();
}

/// docs/operating.md#tested-against-a-real-broker-and-redis: the broker is SIGKILLed mid-stream
/// and comes back 15 s later on its data. While it is away `/readyz` says
/// so and event time does not move on (the gateways queue their events);
/// once it is back every event is applied exactly once, none too late, and
/// a drain still reaches Redis.
#[test]
fn a_broker_restarted_mid_stream_loses_nothing_and_weights_keep_flowing() {
    let mut stack = Stack::start(TOPICS);
    let mut hermes = start_hermes(&stack, "a", 5000);
    let log = SnapshotLog::start(&stack.redis.url());
    let mut gw = Gateway::start(&stack.kafka.bootstrap(), 40);
    first_snapshot(&log, &[&hermes]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert!(
        rt.block_on(support::eventually(Duration::from_secs(60), || {
            hermes.get("/readyz").as_deref() == Some("ready\n")
        }))
    );

    stack.kafka.stop();
    let down = Instant::now();
    let mut why = None;
    while why.is_none() && down.elapsed() < Duration::from_secs(15) {
        why = hermes
            .get("/readyz")
            .filter(|b| b.starts_with("not ready") && b.contains("kafka"));
        std::thread::sleep(Duration::from_millis(200));
    }
    let noticed = down.elapsed();
    let why = why.unwrap_or_else(|| {
        panic!(
            "readiness did not name the broker: {:?}\n{}",
            hermes.get("/readyz"),
            hermes.log_tail()
        )
    });
    std::thread::sleep(Duration::from_secs(15).saturating_sub(down.elapsed()));
    assert!(hermes.child.try_wait().unwrap().is_none(), "hermes exited");
    let sent_while_down = gw.sent.load(Ordering::Relaxed);

    stack.kafka.resume();
    let up = Instant::now();
    assert!(
        rt.block_on(support::eventually(Duration::from_secs(90), || {
            hermes.get("/readyz").as_deref() == Some("ready\n")
        })),
        "not ready after the broker returned: {:?}\n{}",
        hermes.get("/readyz"),
        hermes.log_tail()
    );
    let ready_after = up.elapsed();

    gw.set("free-a", FAILING);
    let drained = wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(60),
        "free-a drained after the broker returned",
        |s| free_state(s) == "DRAINED" && free_weight(s) == 0.0,
    );
    gw.stop();
    let sent = gw.sent.load(Ordering::Relaxed);
    let (applied, late, dup, dead) = wait_all_applied(&hermes, sent, Duration::from_secs(90));
    assert_no_regression(&log.all());
    eprintln!(
        "broker down 15 s: readiness said so after {noticed:?} ({}); ready {ready_after:?} after it returned; \
         free-a drained {drained:?} after failing; sent {sent} ({sent_while_down} by the outage's end), \
         applied {applied}, too late {late}, duplicates {dup}, dead-lettered {dead}",
        why.trim().replace('\n', " | ")
    );
}

/// docs/operating.md#tested-against-a-real-broker-and-redis: Redis restarts twice under a
/// running Hermes: first with its append-only file (the epoch and the last
/// weights are still there), then with nothing (Hermes writes its epoch and
/// the whole snapshot again). A gateway reading throughout never sees a
/// snapshot older than one it saw, and the drained channel stays drained.
#[test]
fn redis_restarted_with_its_data_or_empty_brings_back_epoch_and_weights() {
    let mut stack = Stack::start_with(TOPICS, RedisServer::start_persistent);
    let hermes = start_hermes(&stack, "a", 120_000);
    let log = SnapshotLog::start(&stack.redis.url());
    let gw = Gateway::start(&stack.kafka.bootstrap(), 40);
    gw.set("free-a", FAILING);
    wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(90),
        "free-a drained",
        |s| free_state(s) == "DRAINED",
    );
    gw.set("free-a", HEALTHY);
    let before = log.latest().unwrap();
    let epoch_of = |r: &RedisServer| -> Option<u64> {
        let c = redis::Client::open(r.url()).ok()?;
        let mut c = c.get_connection_with_timeout(Duration::from_secs(1)).ok()?;
        redis::cmd("GET")
            .arg(hermes::publish::epoch_key("chat"))
            .query::<Option<u64>>(&mut c)
            .ok()?
    };
    let epoch = epoch_of(&stack.redis).expect("an epoch in Redis");

    for (how, wipe) in [("with its AOF", false), ("empty", true)] {
        stack.redis.kill();
        if wipe {
            stack.redis.wipe();
        }
        std::thread::sleep(Duration::from_secs(5));
        let down_ms = wall_ms();
        stack.redis.restart();
        let up = Instant::now();
        let fresh = wait_for(
            &log,
            &[&hermes],
            Duration::from_secs(30),
            "a snapshot written after Redis returned",
            |s| s.heartbeat_ms > down_ms,
        );
        let now = log.latest().unwrap();
        assert_eq!(free_state(&now), "DRAINED", "after a restart {how}");
        assert_eq!(now.epoch, before.epoch, "the same writer, the same epoch");
        assert_eq!(
            epoch_of(&stack.redis),
            Some(epoch),
            "the epoch key is back after a restart {how}"
        );
        eprintln!(
            "Redis restarted {how}: fresh snapshot v{}.{} {fresh:?} after it returned ({:?} since restart)",
            now.epoch,
            now.version,
            up.elapsed()
        );
    }
    let all = log.all();
    assert_no_regression(&all);
    drop(gw);
}

/// docs/operating.md#tested-against-a-real-broker-and-redis: Hermes and a gateway's weight client
/// reach Redis over `rediss://` as an ACL user allowed only Hermes' keys and
/// the commands it uses (the default user is off); the test makes its own
/// self-signed certificate and trusts it through `SSL_CERT_FILE`.
#[test]
fn weights_flow_over_tls_to_a_redis_acl_user() {
    let mut ca = std::path::PathBuf::new();
    let stack = Stack::start_with(TOPICS, || {
        let (redis, cert) = RedisServer::start_tls(&[
            "user default off",
            "user hermes on >hermes-secret ~hermes:* &hermes:* -@all +@read +@write +@scripting +@connection +publish +subscribe +scan",
        ]);
        ca = cert;
        redis
    });
    let (kafka, redis) = (&stack.kafka, &stack.redis);
    let url = format!("rediss://hermes:hermes-secret@127.0.0.1:{}/", redis.port);
    let port = free_port();
    let cfg = config(&kafka.bootstrap(), &url, port, 5000);
    let ca = ca.display().to_string();
    let hermes = Hermes::start_env(stack.dir(), "tls", &cfg, port, &[("SSL_CERT_FILE", &ca)]);
    // This process's Redis clients trust the test's CA for as long as the
    // test runs; the tests after it (and the processes they start) see the
    // variable as it was: the certificate goes with this test's Redis.
    let _trust = EnvVar::set("SSL_CERT_FILE", &ca);
    let log = SnapshotLog::start(&url);
    let gw = Gateway::start(&kafka.bootstrap(), 40);
    wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(90),
        "a first snapshot over TLS",
        |s| free_weight(s) > 0.0,
    );
    gw.set("free-a", FAILING);
    let drained = wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(60),
        "free-a drained over TLS",
        |s| free_state(s) == "DRAINED",
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let client =
        hermes::client::WeightClient::start(&url, "chat", Default::default()).expect("client");
    assert!(
        rt.block_on(support::eventually(Duration::from_secs(10), || {
            client.table().is_some()
        })),
        "the weight client reads over TLS: {:?}",
        client.status()
    );
    let plain = redis::Client::open(format!("redis://127.0.0.1:{}/", redis.port))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(2))
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
    assert!(plain.is_err(), "plain TCP must not be served: {plain:?}");
    assert_eq!(
        hermes
            .metric("hermes_snapshot_failures_total")
            .unwrap_or(0.0),
        0.0,
        "no write was refused by the ACL:\n{}",
        hermes.log_tail()
    );
    eprintln!("over rediss:// as an ACL user: free-a drained {drained:?} after failing");
    drop(gw);
}

/// SIGTERM while no broker is reachable: the instance stops at once rather
/// than when the broker is back. Its last commit is synchronous, and the
/// loops wait for each other before leaving the group; with the coordinator
/// gone the commit fails at once (0.2–0.3 s from SIGTERM to exit here). The
/// 25 s bound only catches a hang.
#[test]
fn a_stop_while_the_broker_is_away_does_not_wait_for_it() {
    let mut stack = Stack::start(TOPICS);
    let mut hermes = start_hermes(&stack, "a", 5000);
    wait_assigned_all(&hermes, Duration::from_secs(90));
    let mut gw = Gateway::start(&stack.kafka.bootstrap(), 20);
    std::thread::sleep(Duration::from_secs(5));
    gw.stop();
    std::thread::sleep(Duration::from_secs(2));
    stack.kafka.stop();
    // Longer than two statistics reports: the instance knows the broker is
    // gone.
    std::thread::sleep(Duration::from_secs(4));
    let t = Instant::now();
    hermes.terminate();
    let took = t.elapsed();
    eprintln!("stopped {took:?} after SIGTERM with the broker away");
    assert!(
        took < Duration::from_secs(25),
        "the stop waited {took:?} for the broker\n{}",
        hermes.log_tail()
    );
}

/// The saved machine of a channel of group `chat`, straight from Redis.
fn saved_machine(
    redis: &RedisServer,
    channel: &str,
) -> Option<hermes::service::state_store::SavedState> {
    let c = redis::Client::open(redis.url()).ok()?;
    let mut c = c.get_connection_with_timeout(Duration::from_secs(1)).ok()?;
    let json: Option<String> = redis::cmd("HGET")
        .arg(hermes::service::state_store::state_key("chat"))
        .arg(channel)
        .query(&mut c)
        .ok()?;
    serde_json::from_str(&json?).ok()
}

/// docs/operating.md: Redis comes back empty. Within an evaluation or two
/// every channel's state is saved again, so a Hermes restart after it
/// restores the incident history: free-a relapsed after its re-admission,
/// and its next cool-down keeps the relapse multiplier (a forgotten
/// history would give the base 5 s).
#[test]
fn state_redis_lost_is_saved_again_and_a_restart_keeps_the_relapse_multiplier() {
    let mut stack = Stack::start(TOPICS);
    let base = 5_000;
    let mut a = start_hermes(&stack, "a", base);
    let log = SnapshotLog::start(&stack.redis.url());
    let gw = Gateway::start(&stack.kafka.bootstrap(), 40);
    first_snapshot(&log, &[&a]);
    // A relapse after re-admission: failing again while recovering.
    through_a_probation(&gw, &log, &[&a], FAILING);
    wait_for(
        &log,
        &[&a],
        Duration::from_secs(60),
        "free-a relapsed",
        |s| free_state(s) == "DRAINED",
    );
    gw.set("free-a", SILENT);
    let relapsed = (0..100)
        .find_map(|_| {
            let s = saved_machine(&stack.redis, "free-a").filter(|s| cooldown_ms(s).is_some());
            if s.is_none() {
                std::thread::sleep(Duration::from_millis(100));
            }
            s
        })
        .expect("the relapsed machine saved");
    let first = cooldown_ms(&relapsed).unwrap();
    eprintln!("relapse cool-down before Redis was emptied: {first} ms");

    stack.redis.kill();
    stack.redis.restart();
    let back = Instant::now();
    let resaved = loop {
        if let Some(s) = saved_machine(&stack.redis, "free-a") {
            break s;
        }
        assert!(
            back.elapsed() < Duration::from_secs(15),
            "state not saved again 15 s after Redis came back empty:\n{}",
            a.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let resave_took = back.elapsed();
    assert_eq!(cooldown_ms(&resaved), Some(first), "the same machine");

    // A restart now: the new instance restores every channel.
    a.terminate();
    let b = start_hermes(&stack, "b", base);
    let restored = Instant::now();
    loop {
        let text = std::fs::read_to_string(&b.log).unwrap_or_default();
        let rebuilt: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("partition rebuilding"))
            .collect();
        if rebuilt.len() >= 3 {
            // Every partition restores every saved channel of the group.
            for l in &rebuilt {
                assert!(l.contains("restored=3"), "{l}");
            }
            break;
        }
        assert!(
            restored.elapsed() < Duration::from_secs(60),
            "free-a not restored:\n{}",
            b.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // free-a serves its cool-down, passes its probation and relapses
    // again: the next cool-down carries both relapses.
    wait_for(
        &log,
        &[&b],
        Duration::from_secs(120),
        "free-a on probation",
        |s| free_state(s) == "OBSERVING",
    );
    gw.set("free-a", HEALTHY);
    wait_for(
        &log,
        &[&b],
        Duration::from_secs(60),
        "free-a recovering",
        |s| free_state(s) == "RECOVERING",
    );
    gw.set("free-a", FAILING);
    wait_for(
        &log,
        &[&b],
        Duration::from_secs(60),
        "free-a relapsed again",
        |s| free_state(s) == "DRAINED",
    );
    let second = (0..100)
        .find_map(|_| {
            let s = saved_machine(&stack.redis, "free-a").and_then(|s| cooldown_ms(&s));
            if s.is_none_or(|c| c <= first) {
                std::thread::sleep(Duration::from_millis(100));
                return None;
            }
            s
        })
        .expect("a longer cool-down after the second relapse");
    eprintln!(
        "state saved again {resave_took:?} after Redis came back empty; cool-downs {first} ms, \
         then {second} ms after the restart (base {base} ms)"
    );
    assert!(second >= 4 * base, "{second} ms");
    drop(gw);
}
