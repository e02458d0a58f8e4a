//! The embedded demo end to end on librdkafka's in-process mock cluster:
//! events through Kafka into the engine, garbage to the dead-letter topic,
//! decodable alerts on the alert topic, weights back to the gateways.

use hermes::demo::{run, DemoOptions};
use hermes::sim::scenario::Scenario;

const SCENARIO: &str = r#"
name = "demo-hard-down"
duration_s = 60
seed = 3
[gateway]
probe_interval_s = 2
[[channels]]
id = "free-a"
tier = "free"
capacity_rps = 30
[[channels.faults]]
# After the first snapshot (about 6 s in): the gateways see a healthy table
# first, then the drain, published the moment it is decided.
start_s = 9
end_s = 60
refuse_all = true
[[channels]]
id = "paid-a"
tier = "paid"
price_per_1k_tokens = 0.6
capacity_rps = 60
[[traffic]]
class = "core"
rps = 20
[[traffic]]
class = "batch"
rps = 10

# Windows of seconds, so the service warms up and publishes within the run.
[config.engine]
slice_ms = 1000
short_window_ms = 5000
long_window_ms = 15000
evaluation_interval_ms = 1000
allowed_lateness_ms = 2000
[config.schedule]
group_warmup_ms = 3000
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_flow_through_kafka_and_a_dead_channel_is_drained() {
    let summary = run(DemoOptions {
        scenario: Scenario::from_toml(SCENARIO).unwrap(),
        seconds: 14,
        redis_url: None,
        redraw: false,
        show_status: false,
        garbage_every: 50,
        http_listen: None,
        http_bound: None,
        commands: Vec::new(),
        config_path: None,
    })
    .await
    .unwrap();

    assert!(summary.produced > 200, "{summary:?}");
    // Nothing lost: every record was applied or dead-lettered, and every
    // garbage record was dead-lettered with its reason.
    assert_eq!(
        summary.consumed,
        summary.produced + summary.garbage_sent,
        "{summary:?}"
    );
    assert_eq!(
        summary.applied + summary.dead_lettered + summary.too_late + summary.duplicates,
        summary.consumed,
        "{summary:?}"
    );
    assert!(summary.garbage_sent > 0);
    assert_eq!(summary.dead_lettered, summary.garbage_sent);
    // Both request loops committed before either left the group.
    assert_eq!(summary.uncommitted_at_stop, 0, "{summary:?}");
    assert_eq!(summary.dead_letters_read_back, summary.dead_lettered);

    // The refusing channel was drained (fast path) and stays drained
    // within its cool-down; the alert topic carries decodable transitions.
    assert_eq!(summary.final_states["free-a"], "DRAINED", "{summary:?}");
    assert_eq!(summary.final_states["paid-a"], "HEALTHY");
    assert_eq!(summary.alerts_read_back, summary.alerts_produced);
    assert!(summary
        .transitions_read_back
        .iter()
        .any(|(c, _, to)| c == "free-a" && to == "DRAINED"));
    // The drain changed the published weights.
    assert!(
        summary.snapshot_versions.len() >= 2,
        "{:?}",
        summary.snapshot_versions
    );
}

/// Operator overrides reach the loop that carries them out: a drain reaches
/// the partition engine that carries the channel, a freeze the group's
/// writer, and each is recorded once as an OVERRIDE alert on the alert topic
/// naming the operator and their reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_overrides_reach_the_engines_and_the_writer() {
    use hermes::service::overrides::{Action, Request, Target};
    let req = |action, reason: &str| Request {
        action,
        reason: reason.into(),
        actor: "alice@sre".into(),
        for_s: None,
    };
    let summary = run(DemoOptions {
        scenario: Scenario::from_toml(SCENARIO).unwrap(),
        seconds: 12,
        redis_url: None,
        redraw: false,
        show_status: false,
        garbage_every: 0,
        http_listen: None,
        http_bound: None,
        commands: vec![
            (
                7,
                Target::Channel("paid-a".into()),
                req(Action::Drain, "vendor maintenance INC-7"),
            ),
            (
                9,
                Target::Group("chat".into()),
                req(Action::Freeze, "incident freeze"),
            ),
        ],
        config_path: None,
    })
    .await
    .unwrap();
    let overrides = &summary.overrides_read_back;
    assert!(
        overrides.iter().any(|(who, why, msg)| who == "paid-a"
            && why.contains("pin")
            && msg.contains("alice@sre")
            && msg.contains("vendor maintenance INC-7")),
        "{overrides:?}"
    );
    assert!(
        overrides.iter().any(|(who, why, msg)| who == "chat"
            && why == "manual_mode(on=true)"
            && msg.contains("alice@sre")
            && msg.contains("incident freeze")),
        "{overrides:?}"
    );
    assert_eq!(overrides.len(), 2, "each override once: {overrides:?}");
}
