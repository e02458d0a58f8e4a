//! The edges of an incident: a drained channel's probation while
//! its partition is busy, and silence told from a drain.

use crate::fixtures::*;
use hermes::alert::{AlertEvent, AlertKind};
use rdkafka::message::Message;
use std::time::Duration;

/// A channel drained, then silent (its gateways route around it), alone on
/// its partition: while the instance's other partitions stay busy, that
/// partition's event time still moves on (judged on its own fetch report),
/// so the cool-down elapses and the channel gets its probation.
#[test]
fn a_drained_channel_alone_on_its_partition_gets_its_probation_while_others_are_busy() {
    let stack = Stack::start(TOPICS);
    let port = free_port();
    let cfg = config(&stack.kafka.bootstrap(), &stack.redis.url(), port, 5000);
    let hermes = Hermes::start(stack.dir(), "a", &cfg, port);
    let log = SnapshotLog::start(&stack.redis.url());
    let gw = Gateway::start(&stack.kafka.bootstrap(), 40);
    first_snapshot(&log, &[&hermes]);
    gw.set("free-a", FAILING);
    wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(30),
        "free-a drained",
        |s| free_state(s) == "DRAINED",
    );
    gw.set("free-a", SILENT);
    wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(60),
        "free-a on probation after its 5 s cool-down",
        |s| free_state(s) == "OBSERVING",
    );
    drop(gw);
}

/// docs/decisions.md#alerts-and-pages: nobody is paged for what Hermes did
/// itself. free-a is drained, gets nothing through its cool-down (the
/// gateways route around it), and traffic again when its weight comes
/// back: no SILENT_CHANNEL. Then its gateway stops sending while it has
/// full weight: one SILENT_CHANNEL, within the silence threshold.
#[test]
fn a_drain_and_its_re_admission_are_not_silence_and_a_gateway_that_stops_is() {
    let stack = Stack::start(TOPICS);
    let hermes = start_hermes(&stack, "a", 5000);
    let log = SnapshotLog::start(&stack.redis.url());
    let gw = Gateway::start(&stack.kafka.bootstrap(), 40);
    first_snapshot(&log, &[&hermes]);
    through_a_probation(&gw, &log, &[&hermes], HEALTHY);
    wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(60),
        "free-a back at full weight",
        |s| free_state(s) == "HEALTHY",
    );
    let readmitted_ms = wall_ms();
    // Its traffic fills the long view (30 s) at full weight.
    std::thread::sleep(Duration::from_secs(20));
    let stopped_ms = wall_ms();
    gw.set("free-a", SILENT);
    std::thread::sleep(Duration::from_secs(20));
    let silences: Vec<AlertEvent> = read_topic(&stack.kafka.bootstrap(), "hermes.alerts", 1)
        .iter()
        .filter_map(|m| AlertEvent::from_record(m.payload()?).ok())
        .filter(|a| a.kind == AlertKind::SilentChannel)
        .collect();
    for a in &silences {
        eprintln!("{} {:?} {}", a.event_time_ms, a.channel_id, a.message);
    }
    assert!(
        silences.iter().all(|a| a.event_time_ms >= stopped_ms),
        "a silence alarm before the gateway stopped (re-admitted at {readmitted_ms}): {silences:?}"
    );
    assert_eq!(silences.len(), 1, "{silences:?}");
    let a = &silences[0];
    assert_eq!(a.channel_id.as_deref(), Some("free-a"));
    let after = a.event_time_ms - stopped_ms;
    assert!(
        (10_000..=15_000).contains(&after),
        "noticed {after} ms after the stop"
    );
    eprintln!(
        "silence noticed {after} ms after the gateway stopped; none for the drain and re-admission"
    );
    drop(gw);
}
