//! Instances come and go: a killed owner taken over, a paused one
//! fenced on resume, a channel whose events span two owners.

use crate::fixtures::*;
use hermes::alert::{AlertEvent, AlertKind};
use rdkafka::message::Message;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The state of `channel` if this instance's engines evaluate it (from its
/// `/metrics`); Err if the instance did not answer.
fn owns(h: &Hermes, channel: &str) -> Result<Option<String>, ()> {
    let text = h.get("/metrics").ok_or(())?;
    let prefix = format!("hermes_channel_state{{group=\"chat\",channel=\"{channel}\",state=\"");
    // One-hot: the state whose line reads 1.
    Ok(text
        .lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .find_map(|rest| {
            let (state, value) = rest.split_once("\"} ")?;
            (value.trim().parse::<f64>().ok()? == 1.0).then(|| state.to_string())
        }))
}

/// Each request loop's group membership on `h`: (rebalances it took part
/// in, steady now), from `hermes_consumer_rebalances_total` and
/// `hermes_consumer_group_steady`, by lane.
fn membership(h: &Hermes) -> Vec<(f64, bool)> {
    let text = h.get("/metrics").unwrap_or_default();
    let by_lane = |name: &str| -> std::collections::BTreeMap<String, f64> {
        text.lines()
            .filter_map(|l| l.strip_prefix(name)?.strip_prefix("{lane=\""))
            .filter_map(|rest| {
                let (lane, value) = rest.split_once("\"} ")?;
                Some((lane.to_string(), value.trim().parse().ok()?))
            })
            .collect()
    };
    let rebalances = by_lane("hermes_consumer_rebalances_total");
    let steady = by_lane("hermes_consumer_group_steady");
    rebalances
        .iter()
        .map(|(lane, n)| (*n, steady.get(lane) == Some(&1.0)))
        .collect()
}

/// An instance with one request loop (`service.request_threads = 1`): the
/// group is the two instances the tests reason about. With a loop per core
/// (four members on this machine) tansu's coordinator, loaded by the other
/// service tests running beside these, went through rebalance storms (77
/// rebalances in 89 s) that moved free-a's partition after the test had
/// chosen the instance holding it. Loops sharing an instance's partitions
/// are tested in `pipeline` and `dependencies`.
fn start_member(stack: &Stack, name: &str, cooldown_ms: i64) -> Hermes {
    stack.hermes(name, |brokers, redis, port| {
        config_with(brokers, redis, port, cooldown_ms, "request_threads = 1")
    })
}

/// Two instances that split the three partitions between them, once the
/// group has settled: the request loop of each is a steady member, the
/// split holds, and neither took part in a rebalance for `SETTLED`.
fn split_pair(stack: &Stack, cooldown_ms: i64) -> (Hermes, Hermes, Vec<i32>, Vec<i32>) {
    const SETTLED: Duration = Duration::from_secs(6);
    let loops = 1;
    let a = start_member(stack, "a", cooldown_ms);
    let t0 = Instant::now();
    wait_assigned_all(&a, Duration::from_secs(60));
    let b = start_member(stack, "b", cooldown_ms);
    let mut last: Option<(Vec<i32>, Vec<i32>, f64)> = None;
    let mut since = Instant::now();
    loop {
        let (x, y) = (assigned(&a), assigned(&b));
        let (ma, mb) = (membership(&a), membership(&b));
        let split = !x.is_empty()
            && !y.is_empty()
            && x.len() + y.len() == 3
            && x.iter().all(|p| !y.contains(p));
        let steady = ma.len() == loops
            && mb.len() == loops
            && ma.iter().chain(&mb).all(|(_, steady)| *steady);
        let rebalances: f64 = ma.iter().chain(&mb).map(|(n, _)| n).sum();
        let now = (x.clone(), y.clone(), rebalances);
        if !(split && steady) || last.as_ref() != Some(&now) {
            since = Instant::now();
        }
        last = (split && steady).then_some(now);
        if last.is_some() && since.elapsed() >= SETTLED {
            eprintln!(
                "split after {:?}: a {x:?}, b {y:?}, {rebalances} rebalances in all",
                t0.elapsed()
            );
            return (a, b, x, y);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(150),
            "the group did not settle on a split ({x:?} / {y:?}; a's loops {ma:?}, b's {mb:?}):\n{}\n{}",
            a.log_tail(),
            b.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Two instances split the partitions; the one that owns the drained free
/// channel is SIGKILLed.
///
/// tansu 0.6's group coordinator strands the partitions of a SIGKILLed
/// group *leader* for good (the group stays in its forming state waiting for
/// the dead leader's SyncGroup; see docs/operating.md's notes on tansu), so the
/// test makes `a` the leader (it joins first and alone) and kills `b`, a
/// plain member. Apache Kafka re-elects a leader, so either would do there.
#[test]
fn a_killed_instance_is_taken_over_and_the_drained_channel_stays_drained() {
    let stack = Stack::start(TOPICS);
    // A long cool-down: free-a must still be DRAINED after the takeover, and
    // only restored state can know that (its events are healthy again).
    let cooldown = 120_000;
    let t0 = Instant::now();
    let (a, mut b, pa_set, pb_set) = split_pair(&stack, cooldown);
    eprintln!("split: a {pa_set:?}, b {pb_set:?}");
    // free-a lives on one of b's partitions, the paid channels on the rest.
    let mut others = pa_set.iter().chain(pb_set.iter().skip(1)).copied().cycle();
    let mapping: Mapping = vec![
        ("free-a", pb_set[0]),
        ("paid-a", others.next().unwrap()),
        ("paid-b", others.next().unwrap()),
    ];
    let log = SnapshotLog::start(&stack.redis.url());
    let gw = Gateway::start_with(&stack.kafka.bootstrap(), 40, mapping);
    first_snapshot(&log, &[&a, &b]);

    gw.set("free-a", FAILING);
    wait_for(
        &log,
        &[&a, &b],
        Duration::from_secs(30),
        "free-a drained",
        |s| free_state(s) == "DRAINED" && free_weight(s) == 0.0,
    );
    let drained_at = log.all().len() - 1;
    gw.set("free-a", HEALTHY);
    std::thread::sleep(Duration::from_secs(3));

    // The kill needs `b` as free-a's only owner. tansu's coordinator is not
    // sticky: in the rebalances that follow a join it may move free-a's
    // partition to `a` and back, and it has handed one partition to both
    // members for a second (each then reports free-a; Hermes' writer fence
    // refuses the older writer's snapshot meanwhile). Wait that out.
    loop {
        let (on_b, on_a) = (owns(&b, "free-a"), owns(&a, "free-a"));
        if on_b == Ok(Some("DRAINED".into())) && on_a == Ok(None) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "b is not free-a's only owner: b {on_b:?}, a {on_a:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (victim, survivor) = (&mut b, &a);
    let killed_ms = wall_ms();
    victim.kill(); // SIGKILL
    let t_kill = Instant::now();
    while owns(survivor, "free-a") != Ok(Some("DRAINED".into())) {
        assert!(
            t_kill.elapsed() < Duration::from_secs(60),
            "no takeover (free-a on the survivor: {:?}):\n{}",
            owns(survivor, "free-a"),
            survivor.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // DRAINED: restored state, not re-derived from the healthy events.
    let took_over = t_kill.elapsed();
    // The survivor writes the group (a new epoch if it was the victim's).
    let fresh = wait_for(
        &log,
        &[survivor],
        Duration::from_secs(60),
        "a snapshot written after the kill",
        |s| s.heartbeat_ms > killed_ms + 1_000,
    );
    std::thread::sleep(Duration::from_secs(10));
    // The survivor is now the only instance, so it writes the group, and
    // what Redis holds is fresh.
    assert!(
        survivor
            .get("/metrics")
            .is_some_and(|m| m.contains("hermes_group_snapshot_version{group=\"chat\"")),
        "the survivor writes the group:\n{}",
        survivor.get("/status").unwrap_or_default()
    );
    let latest = log.latest().unwrap();
    assert!(
        wall_ms() - latest.heartbeat_ms < 5_000,
        "fresh heartbeat: {latest:?}"
    );
    eprintln!(
        "takeover of free-a's partition {took_over:?} after SIGKILL; fresh snapshot after {fresh:?}; {} events produced",
        gw.sent.load(Ordering::Relaxed)
    );

    let survivor_log = std::fs::read_to_string(&survivor.log).unwrap_or_default();
    for l in survivor_log.lines().filter(|l| {
        [
            "writing this group",
            "partition assigned",
            "revoked",
            "restored",
        ]
        .iter()
        .any(|k| l.contains(k))
    }) {
        eprintln!("survivor: {l}");
    }
    let all = log.all();
    assert_no_regression(&all);
    for s in &all[drained_at..] {
        assert_eq!(free_state(s), "DRAINED", "v{}.{}", s.epoch, s.version);
        assert_eq!(free_weight(s), 0.0, "v{}.{}", s.epoch, s.version);
    }
    eprintln!(
        "snapshots seen: {:?}",
        all.iter().map(|s| (s.epoch, s.version)).collect::<Vec<_>>()
    );
    drop(gw);
}

/// docs/operating.md#tested-against-a-real-broker-and-redis: a member instance is SIGSTOPped
/// past the session timeout while it owns the drained channel. The other
/// takes its partitions over (and the group's writing, with a newer epoch
/// when it was the writer); when the paused one is SIGCONTed, whatever it
/// had in flight is fenced, it rejoins, and it raises no alert for channels
/// it no longer owns.
#[test]
fn a_paused_instance_is_fenced_on_resume_and_raises_no_stale_alert() {
    let stack = Stack::start(TOPICS);
    let t0 = Instant::now();
    let (a, b, pa, pb) = split_pair(&stack, 120_000);
    let mapping: Mapping = vec![
        ("free-a", pb[0]),
        ("paid-a", pa[0]),
        ("paid-b", *pb.get(1).unwrap_or(&pa[0])),
    ];
    let log = SnapshotLog::start(&stack.redis.url());
    let gw = Gateway::start_with(&stack.kafka.bootstrap(), 40, mapping);
    gw.set("free-a", FAILING);
    wait_for(
        &log,
        &[&a, &b],
        Duration::from_secs(90),
        "free-a drained",
        |s| free_state(s) == "DRAINED",
    );
    gw.set("free-a", HEALTHY);
    let drained = Instant::now();
    while owns(&b, "free-a") != Ok(Some("DRAINED".into())) {
        assert!(
            drained.elapsed() < Duration::from_secs(60),
            "b does not report free-a DRAINED {:?} after the start: partitions a {:?}, b {:?} \
             (free-a on {}); loops' (rebalances, steady) a {:?}, b {:?}:\n{}\n{}",
            t0.elapsed(),
            assigned(&a),
            assigned(&b),
            pb[0],
            membership(&a),
            membership(&b),
            a.log_tail(),
            b.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let b_pid = b.child.id().to_string();
    let signal = |sig: &str| {
        assert!(std::process::Command::new("kill")
            .args([sig, &b_pid])
            .status()
            .unwrap()
            .success())
    };
    signal("-STOP");
    let paused_ms = wall_ms();
    let paused = Instant::now();
    while owns(&a, "free-a") != Ok(Some("DRAINED".into())) {
        assert!(
            paused.elapsed() < Duration::from_secs(90),
            "no takeover of the paused instance's partitions:\n{}",
            a.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let took_over = paused.elapsed();
    // Well past the 6 s session timeout, and past a heartbeat of its own.
    std::thread::sleep(Duration::from_secs(20).saturating_sub(paused.elapsed()));
    signal("-CONT");
    let resumed_ms = wall_ms();
    let resumed = Instant::now();
    let rejoined = loop {
        let (x, y) = (assigned(&a), assigned(&b));
        if !y.is_empty() && x.len() + y.len() == 3 && x.iter().all(|p| !y.contains(p)) {
            break resumed.elapsed();
        }
        assert!(
            resumed.elapsed() < Duration::from_secs(120),
            "b did not rejoin ({x:?} / {y:?}):\n{}",
            b.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    std::thread::sleep(Duration::from_secs(10));
    let all = log.all();
    assert_no_regression(&all);
    for s in all.iter().filter(|s| s.heartbeat_ms > paused_ms) {
        assert_eq!(free_state(s), "DRAINED", "v{}.{}", s.epoch, s.version);
    }
    // The alerts on the topic, in order: free-a's transitions form one
    // chain (each starts where the previous one ended; a paused owner
    // speaking again for a channel it lost would break it or repeat a
    // step), and no alert is there twice.
    let alerts: Vec<(i64, AlertEvent)> = read_topic(&stack.kafka.bootstrap(), "hermes.alerts", 1)
        .iter()
        .filter_map(|m| {
            let at = m.timestamp().to_millis().unwrap_or(0);
            Some((at, AlertEvent::from_record(m.payload()?).ok()?))
        })
        .collect();
    let chain: Vec<(&str, &str, i64)> = alerts
        .iter()
        .filter(|(_, a)| {
            a.kind == AlertKind::Transition && a.channel_id.as_deref() == Some("free-a")
        })
        .map(|(at, a)| {
            (
                a.from_state.as_deref().unwrap_or(""),
                a.to_state.as_deref().unwrap_or(""),
                *at,
            )
        })
        .collect();
    for w in chain.windows(2) {
        assert_eq!(w[0].1, w[1].0, "free-a's transitions break: {chain:?}");
    }
    let mut ids: Vec<&str> = alerts.iter().map(|(_, a)| a.alert_id.as_str()).collect();
    let n = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), n, "an alert twice on the topic");
    let after_resume = alerts.iter().filter(|(at, _)| *at > resumed_ms).count();
    let refused = b
        .metric("hermes_snapshots_refused_stale_total")
        .unwrap_or(0.0);
    // When the paused instance wrote the group, the taker bumped the epoch:
    // every snapshot written since the pause is from a newer writer, and the
    // paused one's late writes could only be refused.
    let b_wrote = pb.contains(&hermes::board::writer_partition("chat", 3));
    if b_wrote {
        let before = all
            .iter()
            .filter(|s| s.heartbeat_ms < paused_ms)
            .map(|s| s.epoch)
            .max();
        let after = all
            .iter()
            .filter(|s| s.heartbeat_ms > paused_ms + 7_000)
            .map(|s| s.epoch)
            .min();
        assert!(
            after > before,
            "a newer epoch after the takeover: {before:?} -> {after:?}"
        );
    }
    eprintln!(
        "paused b: a took free-a over in {took_over:?}; b rejoined {rejoined:?} after SIGCONT; \
         {} snapshots seen, {} alerts on the topic ({after_resume} after the resume), \
         free-a's transitions {chain:?}; b wrote the group: {b_wrote}, its writes refused as stale: {refused}",
        all.len(),
        alerts.len()
    );
    drop(gw);
}

/// docs/integration.md#producing-events: one gateway sends free-a's events to
/// partition 0 and another to partition 1 (different partitioners): the
/// group's writer names the channel and both partitions in a
/// PARTITION_SPLIT alert (once) and in `hermes_channel_split_partitions`.
#[test]
fn a_channel_split_over_two_partitions_is_named_in_an_alert_and_a_metric() {
    let stack = Stack::start(TOPICS);
    let hermes = start_hermes(&stack, "a", 5000);
    let mapping: Mapping = vec![("free-a", 0), ("free-a", 1), ("paid-a", 1), ("paid-b", 2)];
    let _gw = Gateway::start_with(&stack.kafka.bootstrap(), 40, mapping);
    let series =
        "hermes_channel_split_partitions{group=\"chat\",channel=\"free-a\",partitions=\"0,1\"}";
    let t0 = Instant::now();
    while hermes.metric(series).is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "no split metric:\n{}\n{}",
            hermes
                .get("/metrics")
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("split"))
                .collect::<Vec<_>>()
                .join("\n"),
            hermes.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let noticed = t0.elapsed();
    assert_eq!(hermes.metric(series), Some(2.0));
    // Only free-a is split.
    let metrics = hermes.get("/metrics").unwrap_or_default();
    assert_eq!(
        metrics
            .lines()
            .filter(|l| l.starts_with("hermes_channel_split_partitions{"))
            .count(),
        1,
        "{metrics}"
    );
    std::thread::sleep(Duration::from_secs(3));
    let splits: Vec<AlertEvent> = read_topic(&stack.kafka.bootstrap(), "hermes.alerts", 1)
        .iter()
        .filter_map(|m| AlertEvent::from_record(m.payload()?).ok())
        .filter(|a| a.kind == AlertKind::PartitionSplit)
        .collect();
    assert_eq!(splits.len(), 1, "one alert per period: {splits:?}");
    assert_eq!(splits[0].channel_id.as_deref(), Some("free-a"));
    assert_eq!(splits[0].reason, "partitions=0,1");
    eprintln!(
        "split channel named {noticed:?} after the gateways started: {}",
        splits[0].message
    );
}
