use super::*;

#[test]
fn a_file_splits_into_the_policy_and_the_frozen_runtime() {
    let text = format!(
        "{MINIMAL}\n[kafka]\nalert_topic = \"a\"\n[service]\nheartbeat_ms = 7000\n[schedule]\ngroup_warmup_ms = 9000\n"
    );
    let file = ConfigFile::from_toml(&text).unwrap();
    assert_eq!(file.runtime.kafka.alert_topic, "a");
    assert_eq!(file.runtime.service.heartbeat_ms, 7000);
    assert_eq!(file.policy.schedule.group_warmup_ms, 9000);
    assert_eq!(Config::from_toml(&text).unwrap(), file.policy);
    // A reload names the restart-only sections an edit touched.
    let running = file.runtime.clone();
    let mut edited = running.clone();
    edited.kafka.alert_topic = "elsewhere".into();
    edited.service.heartbeat_ms += 1;
    assert_eq!(running.changed_in(&edited), ["kafka", "service"]);
    assert!(running.changed_in(&running).is_empty());
    // The warm-up is planning policy now, no longer a [service] timer: the
    // old place is read for one release, with a warning naming the new key.
    let old = format!("{MINIMAL}\n[service]\ngroup_warmup_ms = 9000\n");
    let f = ConfigFile::from_toml(&old).unwrap();
    assert_eq!(f.policy.schedule.group_warmup_ms, 9000);
    assert_eq!(f.warnings.len(), 1);
    assert!(
        f.warnings[0].contains("read as schedule.group_warmup_ms"),
        "{:?}",
        f.warnings
    );
    let both = format!(
        "{MINIMAL}\n[service]\ngroup_warmup_ms = 9000\n[schedule]\ngroup_warmup_ms = 7000\n"
    );
    let f = ConfigFile::from_toml(&both).unwrap();
    assert_eq!(f.policy.schedule.group_warmup_ms, 7000);
    assert!(f.warnings[0].contains("ignored"), "{:?}", f.warnings);
    // A mistake elsewhere in such a file still names its line.
    let bad = format!("{MINIMAL}\n[service]\ngroup_warmup_ms = 9000\n[engine]\nslice_ms = -5\n");
    let e = ConfigFile::from_toml(&bad).unwrap_err().to_string();
    assert!(e.contains("engine.slice_ms (line"), "{e}");
}

const MINIMAL: &str = r#"
[[groups]]
id = "chat"
[[groups.channels]]
id = "free-a"
tier = "free"
capacity_rps = 20
[[groups.channels]]
id = "paid-a"
tier = "paid"
price_per_1k_tokens = 0.5
capacity_rps = 40
"#;

#[test]
fn minimal_config_gets_seed_defaults_and_tier_layers() {
    let c = Config::from_toml(MINIMAL).unwrap();
    let free = &c.groups[0].channels[0];
    let paid = &c.groups[0].channels[1];
    assert_eq!(free.initial_weight, 0.3);
    assert_eq!(paid.initial_weight, 0.7);
    assert_eq!(free.policy.states.consecutive_failures, 4);
    assert_eq!(paid.policy.states.consecutive_failures, 5);
    assert_eq!(
        paid.policy
            .signals
            .get(crate::signals::SignalKind::P99Latency)
            .normal,
        2000.0
    );
    assert_eq!(
        free.policy
            .signals
            .get(crate::signals::SignalKind::P99Latency)
            .normal,
        1500.0
    );
    assert_eq!(paid.policy.states.at_risk_enter, 0.45);
    assert_eq!(c.engine.outcome_window, 100);
}

#[test]
fn the_example_config_is_valid() {
    let text = include_str!("../../hermes.example.toml");
    Config::from_toml(text).unwrap();
}

#[test]
fn the_compose_config_is_valid() {
    let c = ConfigFile::from_toml(include_str!("../../compose/config/hermes.toml")).unwrap();
    assert_eq!(c.runtime.kafka.brokers, "kafka:9092");
    assert!(c.runtime.redis.url.starts_with("redis://redis:"));
}

#[test]
fn service_settings_are_validated_with_their_keys() {
    let text = format!(
        "{MINIMAL}\n[kafka]\nalert_topic = \"hermes.requests\"\n[service]\nhttp_listen = \"nowhere\"\ncommit_interval_ms = 0\n"
    );
    let e = Config::from_toml(&text).unwrap_err().to_string();
    for key in [
        "kafka.alert_topic",
        "service.http_listen",
        "service.commit_interval_ms",
    ] {
        assert!(e.contains(key), "{key} missing in: {e}");
    }
}

#[test]
fn channel_override_touches_one_key() {
    let text =
        format!("{MINIMAL}\n[groups.channels.policy.signals.p99_latency_ms]\nnormal = 900.0\n");
    let c = Config::from_toml(&text).unwrap();
    let paid = &c.groups[0].channels[1];
    assert_eq!(
        paid.policy
            .signals
            .get(crate::signals::SignalKind::P99Latency)
            .normal,
        900.0
    );
    assert_eq!(
        paid.policy
            .signals
            .get(crate::signals::SignalKind::P99Latency)
            .degraded,
        6000.0
    );
}

/// The issues as `key: reason`, without the line each key is on
/// (`a_range_error_names_its_line` checks those).
fn issues(text: &str) -> Vec<String> {
    Config::from_toml(text)
        .unwrap_err()
        .issues
        .iter()
        .map(|i| {
            let key = i.key.split(" (line ").next().unwrap_or(&i.key);
            format!("{key}: {}", i.reason)
        })
        .collect()
}

#[test]
fn errors_name_the_offending_key() {
    let bad = MINIMAL.replace("capacity_rps = 40", "capacity_rps = -1")
        + "\n[policy.states]\nat_risk_exit = 0.5\ncooldown_ms = -5\n";
    let all = issues(&bad);
    let joined = all.join("\n");
    assert!(
        joined.contains("groups[0] (chat).channels[1] (paid-a).capacity_rps"),
        "{joined}"
    );
    assert!(joined.contains("policy.states.at_risk_exit: must be below at_risk_enter"));
    assert!(
        !joined.contains("tiers.paid.policy.states.at_risk_exit"),
        "reported once: {joined}"
    );
    assert!(joined.contains("policy.states.cooldown_ms: must be a positive duration"));
}

#[test]
fn unknown_keys_and_crossed_bounds_are_refused() {
    let all = issues(&format!("{MINIMAL}\n[engine]\nslise_ms = 5\n"));
    assert!(
        all[0].contains("unknown key `slise_ms`; did you mean `slice_ms`?"),
        "{all:?}"
    );

    let all = issues(&format!(
        "{MINIMAL}\n[policy.signals.error_rate]\nweight = -1.0\nnormal = 0.05\ndegraded = 0.05\nmin_samples = 0\n"
    ));
    let joined = all.join("\n");
    assert!(joined.contains("signals.error_rate.weight: must be a finite number >= 0"));
    assert!(all.iter().all(|i| !i.starts_with("tiers.paid")), "{all:?}");
    assert!(joined.contains("signals.error_rate: normal and degraded bounds are equal"));
    assert!(joined.contains("signals.error_rate.min_samples"));
}

#[test]
fn duplicate_channels_and_empty_groups_are_refused() {
    let text = format!(
        "{MINIMAL}\n[[groups]]\nid = \"other\"\n[[groups.channels]]\nid = \"free-a\"\ntier = \"free\"\ncapacity_rps = 1\n[[groups]]\nid = \"empty\"\n"
    );
    let joined = issues(&text).join("\n");
    assert!(joined.contains("groups[1] (other).channels[0] (free-a).id: duplicate channel id"));
    assert!(joined.contains("groups[2] (empty).channels: a group needs at least one channel"));
}

#[test]
fn all_zero_weights_are_refused() {
    let mut text = MINIMAL.to_string();
    for (name, _) in HealthPolicy::default().signals.entries() {
        text.push_str(&format!("[policy.signals.{name}]\nweight = 0.0\n"));
    }
    let joined = issues(&text).join("\n");
    assert!(
        joined.contains("policy.signals: every signal weight is 0"),
        "{joined}"
    );
}

#[test]
fn recovery_schedule_must_reach_full_weight() {
    let text = format!(
        "{MINIMAL}\n[[policy.states.recovery_steps]]\nuntil = 0.5\nstep = 0.1\nevery_ms = 1000\n"
    );
    let joined = issues(&text).join("\n");
    assert!(joined.contains("recovery_steps: the last step must reach until = 1.0"));
}

#[test]
fn parse_errors_name_the_section_the_key_and_its_line() {
    let unknown = "[engine]\nslice_ms = 5000\nbogus_key = 3\n\n[[groups]]\nid = \"chat\"\n";
    let e = Config::from_toml(unknown).unwrap_err().to_string();
    assert!(e.contains("engine.bogus_key (line 3)"), "{e}");
    let typed = "[engine]\nslice_ms = \"five\"\n";
    let e = Config::from_toml(typed).unwrap_err().to_string();
    assert!(e.contains("engine.slice_ms (line 2)"), "{e}");
    let nested = "[[groups]]\nid = \"chat\"\n[[groups.channels]]\nid = \"a\"\ntier = \"free\"\ncapacity_rps = 10\nwat = 1\n";
    let e = Config::from_toml(nested).unwrap_err().to_string();
    assert!(
        e.contains("groups[0] (chat).channels[0] (a).wat (line 7)"),
        "{e}"
    );
}

#[test]
fn slice_digests_panes_and_evaluation_phases_are_validated() {
    for (engine, key) in [
        ("evaluation_phases = 0", "engine.evaluation_phases"),
        ("evaluation_phases = 3", "engine.evaluation_phases"),
        ("slice_tdigest_size = 5", "engine.slice_tdigest_size"),
        ("slice_tdigest_size = 200", "engine.slice_tdigest_size"),
        ("pane_tdigest_size = 5", "engine.pane_tdigest_size"),
        ("pane_tdigest_size = 200", "engine.pane_tdigest_size"),
        ("pane_ms = 7000", "engine.pane_ms"),
        ("pane_ms = 0", "engine.pane_ms"),
        ("pane_ms = 600000", "engine.pane_ms"),
    ] {
        let text = format!("{MINIMAL}\n[engine]\n{engine}\n");
        let e = Config::from_toml(&text).unwrap_err().to_string();
        assert!(e.contains(key), "{engine}: {e}");
    }
    let ok = format!(
        "{MINIMAL}\n[engine]\nevaluation_phases = 10\nslice_tdigest_size = 100\npane_ms = 5000\n"
    );
    let cfg = Config::from_toml(&ok).unwrap();
    assert_eq!(cfg.engine.evaluation_phases, 10);
    assert_eq!(cfg.engine.ring_shape().pane_slices, 1);
    // Unset, a pane is one short window, whatever the window shape (the
    // demo's 1 s slices and 15 s long window included).
    let short = format!(
        "{MINIMAL}\n[engine]\nslice_ms = 1000\nevaluation_interval_ms = 1000\nevaluation_phases = 10\nshort_window_ms = 5000\nlong_window_ms = 15000\nallowed_lateness_ms = 2000\n"
    );
    let cfg = Config::from_toml(&short).unwrap();
    assert_eq!(cfg.engine.ring_shape().pane_slices, 5);
}

#[test]
fn a_retired_key_is_refused_with_the_way_forward() {
    let err = ConfigFile::from_toml(
        "[policy.states]\noscillation_max_changes = 4\n[[groups]]\nid = \"g\"\n",
    )
    .unwrap_err();
    assert!(
        err.issues.iter().any(|i| i
            .reason
            .contains("removed: OSCILLATION is raised by relapses")),
        "{err}"
    );
    // Any other unknown key lists the known keys when none is close.
    let err = ConfigFile::from_toml("[service]\nwat = 1\n").unwrap_err();
    assert!(err.issues[0].reason.contains("known here: `"), "{err}");
}

#[test]
fn every_problem_is_reported_at_once_where_it_was_written() {
    let text = "\
[service]
request_thread = 2

[engine]
slice_ms = -5
evaluation_interval = 5000

[schedule]
max_weight_step = \"big\"

[policy.states]
oscillation_penalty = 2.0

[tiers.fre]
initial_weight = 0.2

[[groups]]
id = \"g\"

[[groups.channels]]
id = \"a\"
tier = \"free\"
capcity = 3

[[groups.channels]]
id = \"b\"
tier = \"paid\"
capacity_rps = 1.0
[groups.channels.policy.states]
cooldown_ms = \"soon\"
";
    let err = ConfigFile::from_toml(text).unwrap_err();
    let got: Vec<String> = err
        .issues
        .iter()
        .map(|i| format!("{}: {}", i.key, i.reason))
        .collect();
    let want = [
        "service.request_thread (line 2): unknown key `request_thread`; did you mean `request_threads`?",
        "engine.slice_ms (line 5): must be a positive duration",
        "engine.evaluation_interval (line 6): unknown key `evaluation_interval`; did you mean `evaluation_interval_ms`?",
        "schedule.max_weight_step (line 9): invalid type: string \"big\"",
        "policy.states.oscillation_penalty (line 12): unknown key `oscillation_penalty`: removed:",
        "tiers.fre (line 14): unknown value `fre`; did you mean `free`?",
        "groups[0] (g).channels[0] (a).capacity_rps (line 20): missing: this key is required",
        "groups[0] (g).channels[0] (a).capcity (line 23): unknown key `capcity`; did you mean `capacity_rps`?",
        "groups[0] (g).channels[1] (b).policy.states.cooldown_ms (line 30): invalid type: string \"soon\"",
    ];
    assert_eq!(got.len(), want.len(), "{got:#?}");
    for (g, w) in got.iter().zip(want) {
        assert!(g.starts_with(w), "{g}\n  wanted {w}");
    }
}

#[test]
fn a_class_table_lists_only_what_it_changes() {
    let cfg = Config::from_toml(&format!(
        "{MINIMAL}\n[traffic_classes.batch]\nmax_score = 0.7\n"
    ))
    .unwrap();
    let batch = cfg.classes.get(crate::event::TrafficClass::Batch);
    let default = ClassPolicies::default();
    assert_eq!(batch.max_score, 0.7);
    assert_eq!(
        batch.priority,
        default.get(crate::event::TrafficClass::Batch).priority
    );
    // An empty table changes nothing; an unknown one is refused.
    let cfg = Config::from_toml(&format!(
        "{MINIMAL}\n[traffic_classes.core]\n[policy.states]\n"
    ))
    .unwrap();
    assert_eq!(cfg.classes, default);
    let all = issues(&format!("{MINIMAL}\n[policy.stats]\n"));
    assert!(
        all.iter()
            .any(|i| i.contains("policy.stats: unknown key `stats`; did you mean `states`?")),
        "{all:?}"
    );
}

#[test]
fn a_range_error_names_its_line() {
    let text = "[engine]\nslice_ms = -5\n\n[[groups]]\nid = \"g\"\n[[groups.channels]]\nid = \"a\"\ntier = \"free\"\ncapacity_rps = 1.0\n[[groups.channels]]\nid = \"b\"\ntier = \"paid\"\ncapacity_rps = -1.0\n[policy.states]\nat_risk_enter = 7.0\n";
    let err = ConfigFile::from_toml(text).unwrap_err().to_string();
    assert!(err.contains("engine.slice_ms (line 2)"), "{err}");
    assert!(
        err.contains("(line 13)"),
        "the second channel's capacity: {err}"
    );
    assert!(err.contains("at_risk_enter (line 15)"), "{err}");
}

#[test]
fn the_control_token_may_come_from_a_file() {
    let dir = std::env::temp_dir().join(format!("hermes-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("token");
    std::fs::write(&good, "from-a-mounted-secret-0001\nignored\n").unwrap();
    let short = dir.join("short");
    std::fs::write(&short, "abc\n").unwrap();
    let with = |extra: &str| format!("{MINIMAL}\n[service]\n{extra}\n");
    let f = ConfigFile::from_toml(&with(&format!(
        "control_token_file = {:?}",
        good.display().to_string()
    )))
    .unwrap();
    if std::env::var_os(CONTROL_TOKEN_ENV).is_none() {
        assert_eq!(
            f.runtime.service.control_token().as_deref(),
            Some("from-a-mounted-secret-0001")
        );
    }
    let e = ConfigFile::from_toml(&with(&format!(
        "control_token_file = {:?}",
        short.display().to_string()
    )))
    .unwrap_err()
    .to_string();
    assert!(e.contains("at least 16 characters"), "{e}");
    let e = ConfigFile::from_toml(&with("control_token_file = \"/nonexistent/token\""))
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot read /nonexistent/token"), "{e}");
    let e = ConfigFile::from_toml(&with(&format!(
        "control_token = \"0123456789abcdef0\"\ncontrol_token_file = {:?}",
        good.display().to_string()
    )))
    .unwrap_err()
    .to_string();
    assert!(e.contains("not both"), "{e}");
}

#[test]
fn the_http_listener_is_on_loopback_unless_configured() {
    let f = ConfigFile::from_toml(MINIMAL).unwrap();
    let addr: std::net::SocketAddr = f.runtime.service.http_listen.parse().unwrap();
    assert!(addr.ip().is_loopback(), "{addr}");
}

#[test]
fn request_threads_zero_means_one_per_core_and_is_bounded() {
    let with =
        |n: &str| ConfigFile::from_toml(&format!("{MINIMAL}\n[service]\nrequest_threads = {n}\n"));
    assert_eq!(with("2").unwrap().runtime.service.request_loops(), 2);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(with("0").unwrap().runtime.service.request_loops(), cores);
    let e = with("1000").unwrap_err().to_string();
    assert!(e.contains("service.request_threads"), "{e}");
}

#[test]
fn a_static_member_name_is_checked_and_each_request_loop_gets_its_own() {
    let named = |name: &str| format!("{MINIMAL}\n[kafka]\ngroup_instance_id = \"{name}\"\n");
    let file = ConfigFile::from_toml(&named("hermes-0")).unwrap();
    if std::env::var_os(GROUP_INSTANCE_ENV).is_none() {
        let k = &file.runtime.kafka;
        assert_eq!(k.static_member(0).unwrap().as_deref(), Some("hermes-0-0"));
        assert_eq!(k.static_member(3).unwrap().as_deref(), Some("hermes-0-3"));
        // Unset: dynamic membership.
        let plain = ConfigFile::from_toml(MINIMAL).unwrap();
        assert_eq!(plain.runtime.kafka.static_member(0).unwrap(), None);
    }
    let e = ConfigFile::from_toml(&named("pod 1"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("kafka.group_instance_id"), "{e}");
    let e = ConfigFile::from_toml(&named(&"x".repeat(201)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("at most 200"), "{e}");
    // Not through the pass-through properties: one name for every loop
    // would fence them off one another.
    let raw = format!("{MINIMAL}\n[kafka.properties]\n\"group.instance.id\" = \"a\"\n");
    let e = ConfigFile::from_toml(&raw).unwrap_err().to_string();
    assert!(e.contains("kafka.properties.group.instance.id"), "{e}");
}

#[test]
fn the_duplicate_horizon_covers_the_allowed_lateness() {
    let text = |dedup: i64, lateness: i64| {
        format!(
            "{MINIMAL}\n[service]\ndedup_horizon_ms = {dedup}\n[engine]\nallowed_lateness_ms = {lateness}\n"
        )
    };
    assert!(ConfigFile::from_toml(&text(10_000, 10_000)).is_ok());
    let e = ConfigFile::from_toml(&text(5_000, 10_000))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("service.dedup_horizon_ms") && e.contains("allowed_lateness_ms (10000 ms)"),
        "{e}"
    );
    // The defaults hold together.
    let d = ConfigFile::from_toml(MINIMAL).unwrap();
    assert!(d.runtime.service.dedup_horizon_ms >= d.policy.engine.allowed_lateness_ms);
}

#[test]
fn the_heartbeat_fits_the_session_three_times() {
    let text = |session: i64, heartbeat: i64| {
        format!(
            "{MINIMAL}\n[kafka]\nsession_timeout_ms = {session}\nheartbeat_interval_ms = {heartbeat}\n"
        )
    };
    assert!(ConfigFile::from_toml(&text(3_000, 1_000)).is_ok());
    let e = ConfigFile::from_toml(&text(2_000, 1_000))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("kafka.heartbeat_interval_ms") && e.contains("session_timeout_ms (2000 ms)"),
        "{e}"
    );
    let e = ConfigFile::from_toml(&text(10_000, 0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("kafka.heartbeat_interval_ms"), "{e}");
    // librdkafka's own keys for them are refused: Hermes sets both.
    for key in ["session.timeout.ms", "heartbeat.interval.ms"] {
        let raw = format!("{MINIMAL}\n[kafka.properties]\n\"{key}\" = \"3000\"\n");
        let e = ConfigFile::from_toml(&raw).unwrap_err().to_string();
        assert!(e.contains(&format!("kafka.properties.{key}")), "{e}");
    }
    let d = ConfigFile::from_toml(MINIMAL).unwrap();
    assert!(d.runtime.kafka.heartbeat_interval_ms * 3 <= d.runtime.kafka.session_timeout_ms);
}
