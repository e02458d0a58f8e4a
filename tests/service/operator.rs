//! What an operator does: a drain from the CLI that survives a
//! restart, and the control token that guards it.

use crate::fixtures::*;
use hermes::alert::{AlertEvent, AlertKind};
use hermes::publish::WeightSnapshot;
use rdkafka::message::Message;
use std::time::Duration;

/// docs/operating.md#steering-pins-and-freezes: an operator drains a channel from the CLI, sees it in
/// `hermes status` (from Redis, no instance asked) and on the instance's
/// metrics, the OVERRIDE alert names who and why, the drain holds across a
/// restart of the only instance, and clearing it gives the channel back.
#[test]
fn an_operator_drains_a_channel_from_the_cli_and_it_survives_a_restart() {
    const TOKEN: &str = "test-control-token-0123";
    let stack = Stack::start(TOPICS);
    let port = free_port();
    let cfg = config(&stack.kafka.bootstrap(), &stack.redis.url(), port, 5000).replace(
        "[service]\n",
        &format!("[service]\ncontrol_token = \"{TOKEN}\"\noverride_poll_ms = 500\n"),
    );
    let mut hermes = Hermes::start(stack.dir(), "a", &cfg, port);
    let log = SnapshotLog::start(&stack.redis.url());
    let _gw = Gateway::start(&stack.kafka.bootstrap(), 40);
    first_snapshot(&log, &[&hermes]);
    let url = format!("http://{}", hermes.http);

    // Without the token the change is refused, and says how to give it.
    let (ok, _, err) = hermes_cli(&[
        "ctl", "--url", &url, "pin", "free-a", "--drain", "--reason", "x",
    ]);
    assert!(!ok && err.contains("token"), "{err}");
    let (ok, out, err) = hermes_cli(&[
        "ctl",
        "--url",
        &url,
        "--token",
        TOKEN,
        "--actor",
        "alice",
        "pin",
        "free-a",
        "--drain",
        "--for",
        "30m",
        "--reason",
        "provider incident INC-42",
    ]);
    assert!(ok, "ctl pin: {out}{err}");
    let drained = wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(15),
        "free-a pinned to 0",
        |s| free_weight(s) == 0.0,
    );
    eprintln!("pin to weight 0 in Redis: {drained:?}");
    wait_metric(
        &hermes,
        "hermes_channel_pinned{group=\"chat\",channel=\"free-a\"}",
        1.0,
        Duration::from_secs(10),
    );

    let (ok, listed, err) = hermes_cli(&["ctl", "--url", &url, "list"]);
    assert!(
        ok && listed.contains("alice") && listed.contains("INC-42"),
        "{listed}{err}"
    );
    let (ok, status, err) = hermes_cli(&["status", "--redis", &stack.redis.url()]);
    assert!(ok, "{err}");
    let row = status
        .lines()
        .find(|l| l.starts_with("free-a"))
        .unwrap_or_else(|| panic!("no free-a row:\n{status}"));
    assert!(row.contains("alice") && row.contains("INC-42"), "{status}");
    assert!(row.contains("=0.00"), "its weights are 0: {row}");
    let (ok, json, _) = hermes_cli(&["status", "--redis", &stack.redis.url(), "--json"]);
    let view: serde_json::Value = serde_json::from_str(&json).expect("status --json is JSON");
    assert!(ok && view["groups"][0]["group"] == "chat", "{json}");

    // A restart of the only instance: the pin is read back from Redis and
    // the channel is never given weight again before it is cleared.
    let pinned_epoch = log.latest().unwrap().epoch;
    hermes.terminate();
    let hermes = Hermes::start(stack.dir(), "b", &cfg, port);
    wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(90),
        "a snapshot from the new instance",
        |s| s.epoch > pinned_epoch,
    );
    std::thread::sleep(Duration::from_secs(3));
    let after: Vec<WeightSnapshot> = log
        .all()
        .into_iter()
        .filter(|s| s.epoch > pinned_epoch)
        .collect();
    assert!(
        after.iter().all(|s| free_weight(s) == 0.0),
        "the pin holds across the restart: {:?}",
        after
            .iter()
            .map(|s| (s.version, free_weight(s)))
            .collect::<Vec<_>>()
    );
    wait_metric(
        &hermes,
        "hermes_channel_pinned{group=\"chat\",channel=\"free-a\"}",
        1.0,
        Duration::from_secs(20),
    );

    let (ok, out, err) = hermes_cli(&[
        "ctl",
        "--url",
        &url,
        "--token",
        TOKEN,
        "--actor",
        "bob",
        "unpin",
        "free-a",
        "--reason",
        "provider fixed",
    ]);
    assert!(ok, "ctl unpin: {out}{err}");
    wait_for(
        &log,
        &[&hermes],
        Duration::from_secs(30),
        "free-a back",
        |s| free_weight(s) > 0.0,
    );

    let alerts: Vec<AlertEvent> = read_topic(&stack.kafka.bootstrap(), "hermes.alerts", 2)
        .iter()
        .filter_map(|m| AlertEvent::from_avro(m.payload()?).ok())
        .filter(|a| a.kind == AlertKind::Override && a.channel_id.as_deref() == Some("free-a"))
        .collect();
    let messages: Vec<&str> = alerts.iter().map(|a| a.message.as_str()).collect();
    assert!(
        messages
            .iter()
            .any(|m| m.contains("alice") && m.contains("INC-42")),
        "the pin's OVERRIDE names who and why: {messages:?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("bob") && m.contains("provider fixed")),
        "so does the release: {messages:?}"
    );
}

/// The control token given only through `HERMES_CONTROL_TOKEN` (nothing in
/// the config file): the control API accepts a change carrying it, refuses
/// one carrying another token, and the instance needs no broker for that.
#[test]
fn the_control_token_from_the_environment_guards_changes() {
    const TOKEN: &str = "env-control-token-0123456";
    let scratch = Scratch::new("service");
    let redis = RedisServer::start();
    let dir = scratch.dir();
    let port = free_port();
    // No broker at this address: the control API does not wait for one.
    let cfg = config(
        &format!("127.0.0.1:{}", free_port()),
        &redis.url(),
        port,
        5000,
    );
    assert!(!cfg.contains("control_token"));
    let hermes = Hermes::start_env(dir, "env", &cfg, port, &[("HERMES_CONTROL_TOKEN", TOKEN)]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert!(
        rt.block_on(support::eventually(Duration::from_secs(20), || {
            hermes.get("/healthz").is_some()
        }))
    );
    let url = format!("http://{}", hermes.http);
    let pin = |token: &str| {
        hermes_cli(&[
            "ctl",
            "--url",
            &url,
            "--token",
            token,
            "pin",
            "free-a",
            "--drain",
            "--for",
            "5m",
            "--reason",
            "env token test",
        ])
    };
    let (ok, out, err) = pin("not-the-token-at-all-0000");
    assert!(!ok, "a wrong token is refused: {out}{err}");
    assert!(
        err.contains("401") || err.to_lowercase().contains("token"),
        "{err}"
    );
    let (ok, out, err) = pin(TOKEN);
    assert!(
        ok,
        "the environment's token is accepted: {out}{err}\n{}",
        hermes.log_tail()
    );
    let (ok, out, _) = hermes_cli(&["ctl", "--url", &url, "list"]);
    assert!(ok && out.contains("free-a"), "{out}");
}
