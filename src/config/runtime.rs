//! Restart-only settings: what `hermes run` connects to and its loops'
//! timers (`[kafka]`, `[redis]`, `[service]`). Clients, topics, listeners
//! and loops are built from them at start, so a reload never changes them.

use super::Issues;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The restart-only part of a config file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Runtime {
    pub kafka: KafkaConfig,
    pub redis: RedisConfig,
    pub service: ServiceConfig,
}

impl Runtime {
    /// The sections of `edited` that differ from this running runtime:
    /// they take effect at the next restart.
    pub fn changed_in(&self, edited: &Runtime) -> Vec<&'static str> {
        let mut changed = Vec::new();
        if edited.kafka != self.kafka {
            changed.push("kafka");
        }
        if edited.redis != self.redis {
            changed.push("redis");
        }
        if edited.service != self.service {
            changed.push("service");
        }
        changed
    }
}

/// Kafka connection and topics. `properties` pass through to librdkafka
/// verbatim (security.protocol, sasl.*, ssl.*, ...); their values are never
/// logged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// Bootstrap servers, `host:port[,host:port...]`. Empty: `hermes run`
    /// refuses to start (the embedded demo needs none).
    pub brokers: String,
    /// Consumer group of the request topic (channels are sharded by key).
    pub group_id: String,
    /// The gateways' request events (Avro, key = channel id): one engine
    /// per partition, so a channel's events must all land on one partition.
    pub request_topic: String,
    /// Every action Hermes takes, as an Avro alert event keyed by channel
    /// (the route group for group-wide alerts).
    pub alert_topic: String,
    /// Records Hermes could not use, with their original bytes and a
    /// `reason` header.
    pub dead_letter_topic: String,
    /// Low-volume topic keyed by route group: per-channel health from the
    /// partition owners to the one writer of each group (every instance
    /// reads all of it; see `service::groups`).
    pub health_topic: String,
    /// The consumer group's session timeout: how long an instance that
    /// stopped answering keeps its partitions before they move.
    pub session_timeout_ms: i64,
    /// How often each request loop tells the group coordinator it is alive.
    /// A rebalance reaches a member only in the answer to its next
    /// heartbeat, and a cooperative rebalance needs every member twice
    /// (revoke, then assign): a moved partition waits for up to two of
    /// these before its new owner even starts rebuilding it. At most a
    /// third of `session_timeout_ms`.
    pub heartbeat_interval_ms: i64,
    /// Static membership (Kafka's `group.instance.id`, KIP-345): a name
    /// this instance keeps across restarts, unique in the group; request
    /// loop `n` joins as `<name>-<n>`. A member that stops keeps its
    /// partitions for `session_timeout_ms` instead of handing them over
    /// at once: restarted within it (a rolling restart, a crash the
    /// supervisor restarts), it gets them back with no rebalance, and the
    /// other instances' partitions never move. Stopped for good, its
    /// partitions move once the session times out. `HERMES_GROUP_INSTANCE_ID`
    /// overrides it (a StatefulSet's pod name through the downward API).
    /// Empty: dynamic membership, partitions handed over at every stop.
    pub group_instance_id: String,
    /// Schema Registry base URL (`http://` or `https://host:port[/path]`)
    /// for Confluent-framed records; empty: plain datums only.
    pub schema_registry_url: String,
    /// Basic auth for the registry (Confluent Cloud: an API key and
    /// secret). The password may come from `HERMES_SCHEMA_REGISTRY_PASSWORD`
    /// instead of the file; it never appears in a log line.
    pub schema_registry_username: String,
    /// The basic-auth password (see `schema_registry_username`).
    pub schema_registry_password: String,
    /// A bearer token instead of basic auth (or `HERMES_SCHEMA_REGISTRY_TOKEN`).
    pub schema_registry_token: String,
    /// How long the registry's "no such schema" is believed before the id
    /// is asked again (records with it are dead-lettered meanwhile).
    pub schema_registry_missing_ttl_ms: i64,
    /// How alerts are framed on the alert topic: `confluent` (magic byte,
    /// the schema id registered under `<alert_topic>-value`, then the
    /// datum: what Kafka Connect, ksqlDB, Flink and every registry-aware
    /// consumer read), `plain` (a bare datum of `schemas/alert_event.avsc`,
    /// for registry-less setups), or `auto`: confluent when a registry is
    /// configured, else plain.
    pub alert_wire_format: crate::codec::WireFormat,
    /// Create missing topics at start (off: most clusters create topics
    /// with their own tooling; `/readyz` names the missing ones either way).
    pub create_topics: bool,
    /// Partitions of the request topic when Hermes creates it (the
    /// parallelism of the consumer group); the others get 3.
    pub request_partitions: i32,
    /// Replication factor of created topics; -1: the broker's default.
    pub replication_factor: i32,
    /// Extra librdkafka properties for every client (security settings).
    pub properties: BTreeMap<String, String>,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            brokers: String::new(),
            group_id: "hermes".into(),
            request_topic: "hermes.requests".into(),
            alert_topic: "hermes.alerts".into(),
            dead_letter_topic: "hermes.dead-letters".into(),
            health_topic: "hermes.health".into(),
            session_timeout_ms: 10_000,
            heartbeat_interval_ms: 1_000,
            group_instance_id: String::new(),
            schema_registry_url: String::new(),
            schema_registry_username: String::new(),
            schema_registry_password: String::new(),
            schema_registry_token: String::new(),
            schema_registry_missing_ttl_ms: 60_000,
            alert_wire_format: crate::codec::WireFormat::Auto,
            create_topics: false,
            request_partitions: 12,
            replication_factor: -1,
            properties: BTreeMap::new(),
        }
    }
}

impl KafkaConfig {
    /// The static member name of request loop `lane` (see
    /// `group_instance_id`; `HERMES_GROUP_INSTANCE_ID` first), `None` for
    /// dynamic membership; Err when the environment's name is not one
    /// Kafka takes.
    pub fn static_member(&self, lane: usize) -> anyhow::Result<Option<String>> {
        let from_env = std::env::var(GROUP_INSTANCE_ENV)
            .ok()
            .filter(|v| !v.is_empty());
        let name = from_env.as_deref().unwrap_or(&self.group_instance_id);
        if name.is_empty() {
            return Ok(None);
        }
        check_member_name(name).map_err(|why| anyhow::anyhow!("{GROUP_INSTANCE_ENV}: {why}"))?;
        Ok(Some(format!("{name}-{lane}")))
    }

    /// Whether alerts are written Confluent-framed (see `alert_wire_format`).
    pub fn frames_alerts(&self) -> bool {
        match self.alert_wire_format {
            crate::codec::WireFormat::Confluent => true,
            crate::codec::WireFormat::Plain => false,
            crate::codec::WireFormat::Auto => !self.schema_registry_url.is_empty(),
        }
    }

    /// The TopicNameStrategy subject of a topic's values.
    pub fn value_subject(topic: &str) -> String {
        format!("{topic}-value")
    }

    pub(super) fn validate(&self, v: &mut Issues) {
        let topics = [
            ("kafka.request_topic", &self.request_topic),
            ("kafka.alert_topic", &self.alert_topic),
            ("kafka.dead_letter_topic", &self.dead_letter_topic),
            ("kafka.health_topic", &self.health_topic),
        ];
        let mut seen = ahash::AHashSet::new();
        for (k, t) in topics {
            if t.is_empty() {
                v.push(k, "must not be empty");
            } else if !seen.insert(t.as_str()) {
                v.push(k, format!("topic `{t}` is used for two purposes"));
            }
        }
        if self.group_id.is_empty() {
            v.push("kafka.group_id", "must not be empty");
        }
        v.positive_ms("kafka.session_timeout_ms".into(), self.session_timeout_ms);
        v.positive_ms(
            "kafka.heartbeat_interval_ms".into(),
            self.heartbeat_interval_ms,
        );
        if self.heartbeat_interval_ms.saturating_mul(3) > self.session_timeout_ms {
            v.push(
                "kafka.heartbeat_interval_ms",
                format!(
                    "must be at most a third of kafka.session_timeout_ms ({} ms), got {}: \
                     a member that misses two heartbeats would lose its partitions",
                    self.session_timeout_ms, self.heartbeat_interval_ms
                ),
            );
        }
        if let Err(why) = check_member_name(&self.group_instance_id) {
            v.push("kafka.group_instance_id", why);
        }
        let url = &self.schema_registry_url;
        if !url.is_empty() && !url.starts_with("http://") && !url.starts_with("https://") {
            v.push(
                "kafka.schema_registry_url",
                "must be an http:// or https:// URL",
            );
        }
        if !self.schema_registry_token.is_empty() && !self.schema_registry_username.is_empty() {
            v.push(
                "kafka.schema_registry_token",
                "basic auth (schema_registry_username) or a bearer token, not both",
            );
        }
        if self.alert_wire_format == crate::codec::WireFormat::Confluent && url.is_empty() {
            v.push(
                "kafka.alert_wire_format",
                "confluent framing needs kafka.schema_registry_url (the schema id is registered there)",
            );
        }
        if self.request_partitions < 1 {
            v.push("kafka.request_partitions", "must be at least 1");
        }
        if self.replication_factor == 0 || self.replication_factor < -1 {
            v.push(
                "kafka.replication_factor",
                "must be at least 1, or -1 for the broker's default",
            );
        }
        v.positive_ms(
            "kafka.schema_registry_missing_ttl_ms".into(),
            self.schema_registry_missing_ttl_ms,
        );
        for k in self.properties.keys() {
            if matches!(
                k.as_str(),
                "bootstrap.servers"
                    | "group.id"
                    | "enable.auto.commit"
                    | "enable.auto.offset.store"
                    | "group.instance.id"
                    | "session.timeout.ms"
                    | "heartbeat.interval.ms"
            ) {
                v.push(
                    format!("kafka.properties.{k}"),
                    "is managed by Hermes (use the dedicated key, or leave it out)",
                );
            }
        }
    }
}

/// Overrides `kafka.group_instance_id` when set and not empty.
pub const GROUP_INSTANCE_ENV: &str = "HERMES_GROUP_INSTANCE_ID";

/// A static member name Kafka takes (its legal characters, with room for
/// the loop's suffix); empty is allowed (no static membership).
fn check_member_name(name: &str) -> Result<(), String> {
    if name.len() > 200 {
        return Err("must be at most 200 characters".into());
    }
    match name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        Some(c) => Err(format!(
            "may hold only ASCII letters, digits, `.`, `_` and `-` (found {c:?})"
        )),
        None => Ok(()),
    }
}

/// Redis connection. AUTH goes in the URL (`redis://user:pass@host:port`);
/// the password is redacted in every log line.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port[/db]`, or `rediss://` for TLS.
    pub url: String,
}

/// Timers of the service shell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServiceConfig {
    /// How often an unchanged snapshot's `heartbeat_ms` is refreshed.
    pub heartbeat_ms: i64,
    /// Duplicate event ids are ignored within this much event time. At
    /// least `engine.allowed_lateness_ms`: a copy older than that behind
    /// the newest event is refused as too late anyway, so remembering ids
    /// longer only costs memory (10–11 bytes an event held); the default
    /// is twice the default lateness, a margin for traffic the engine
    /// refuses moving the partition's newest event time ahead of what it
    /// admitted.
    pub dedup_horizon_ms: i64,
    /// Offsets are committed this often (after outputs were delivered).
    pub commit_interval_ms: i64,
    /// The config file is checked for changes this often (0: never).
    pub reload_check_ms: i64,
    /// Prometheus `/metrics` and the `/status` view; empty: off.
    pub http_listen: String,
    /// A partition without events for this long (wall time) advances its
    /// event time to `wall clock - engine.allowed_lateness_ms`, so ticks,
    /// cool-downs and the silent-channel alarm still run.
    pub idle_advance_ms: i64,
    /// After the broker was unreachable, no idle partition advances its
    /// event time for this long: the gateways' producers reconnect
    /// (librdkafka backs off up to 10 s) and deliver what they queued
    /// during the outage, and an advance before that would make all of it
    /// too late.
    pub outage_grace_ms: i64,
    /// A request record larger than this is dead-lettered as `oversize`
    /// without being decoded: an event is a few hundred bytes, and a
    /// multi-megabyte string in one would be copied and hashed for nothing.
    pub max_record_bytes: u32,
    /// Request loops per instance; 0 (the default): one per core. Each runs
    /// on its own thread and is a member of the consumer group with
    /// partitions of its own (a partition's events stay in order on one
    /// thread); more than the partitions an instance gets leaves the extra
    /// loops idle.
    pub request_threads: u32,
    /// The bearer token the control API (`hermes ctl`) requires for every
    /// change; empty: changes are refused. The environment variable
    /// `HERMES_CONTROL_TOKEN` takes precedence (keep secrets out of files).
    pub control_token: String,
    /// A file whose first line is the control token (a mounted secret), so
    /// the token is in neither the config nor the environment. Read at
    /// start; `HERMES_CONTROL_TOKEN` still takes precedence. Set this or
    /// `control_token`, not both.
    pub control_token_file: String,
    /// Every instance re-reads the operators' overrides from Redis this
    /// often: an override set through one instance reaches the owner of its
    /// channel or group within it.
    pub override_poll_ms: i64,
    /// A cleared override leaves a tombstone (who cleared it, and why) for
    /// this long, so the instance that releases it can say so.
    pub override_tombstone_ms: i64,
}

/// Where the control token comes from when the file has none.
pub const CONTROL_TOKEN_ENV: &str = "HERMES_CONTROL_TOKEN";

/// The shortest control token accepted.
const MIN_TOKEN_CHARS: usize = 16;

impl ServiceConfig {
    /// The control token in force: the environment's, else the token
    /// file's first line, else the config's; `None` when none is set (the
    /// control API refuses changes).
    pub fn control_token(&self) -> Option<String> {
        std::env::var(CONTROL_TOKEN_ENV)
            .ok()
            .filter(|t| !t.is_empty())
            .or_else(|| {
                (!self.control_token_file.is_empty())
                    .then(|| read_token_file(&self.control_token_file).ok())
                    .flatten()
            })
            .or_else(|| Some(self.control_token.clone()).filter(|t| !t.is_empty()))
    }
}

/// A token file's first line, trimmed.
fn read_token_file(path: &str) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    Ok(text.lines().next().unwrap_or("").trim().to_string())
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            heartbeat_ms: 10_000,
            dedup_horizon_ms: 20_000,
            commit_interval_ms: 1_000,
            reload_check_ms: 5_000,
            http_listen: "127.0.0.1:9464".into(),
            idle_advance_ms: 5_000,
            outage_grace_ms: 30_000,
            max_record_bytes: 65_536,
            request_threads: 0,
            control_token: String::new(),
            control_token_file: String::new(),
            override_poll_ms: 1_000,
            override_tombstone_ms: 600_000,
        }
    }
}

impl ServiceConfig {
    pub(super) fn validate(&self, v: &mut Issues) {
        for (k, x) in [
            ("heartbeat_ms", self.heartbeat_ms),
            ("dedup_horizon_ms", self.dedup_horizon_ms),
            ("commit_interval_ms", self.commit_interval_ms),
            ("idle_advance_ms", self.idle_advance_ms),
            ("outage_grace_ms", self.outage_grace_ms),
            ("override_poll_ms", self.override_poll_ms),
            ("override_tombstone_ms", self.override_tombstone_ms),
        ] {
            v.positive_ms(format!("service.{k}"), x);
        }
        if self.max_record_bytes < 1_024 {
            v.push(
                "service.max_record_bytes",
                "must be at least 1024 (an event with long ids needs a few hundred bytes)",
            );
        }
        let short = |t: &str| !t.is_empty() && t.chars().count() < MIN_TOKEN_CHARS;
        let too_short =
            format!("must be at least {MIN_TOKEN_CHARS} characters (it guards pins and freezes)");
        if short(&self.control_token) {
            v.push("service.control_token", too_short.clone());
        }
        if !self.control_token_file.is_empty() {
            if !self.control_token.is_empty() {
                v.push(
                    "service.control_token_file",
                    "set this or service.control_token, not both",
                );
            }
            match read_token_file(&self.control_token_file) {
                Ok(t) if t.is_empty() => v.push(
                    "service.control_token_file",
                    format!("{}: the first line is empty", self.control_token_file),
                ),
                Ok(t) if short(&t) => v.push(
                    "service.control_token_file",
                    format!("{}: the token {too_short}", self.control_token_file),
                ),
                Ok(_) => {}
                Err(e) => v.push("service.control_token_file", e),
            }
        }
        if self.reload_check_ms < 0 {
            v.push("service.reload_check_ms", "must be >= 0 (0 turns it off)");
        }
        if self.request_threads > 256 {
            v.push(
                "service.request_threads",
                "must be at most 256 (0: one per core)",
            );
        }
        if !self.http_listen.is_empty() && self.http_listen.parse::<std::net::SocketAddr>().is_err()
        {
            v.push(
                "service.http_listen",
                format!("`{}` is not an ip:port address", self.http_listen),
            );
        }
    }
}

impl ServiceConfig {
    /// The request loops to run: `request_threads`, or one per core for 0.
    pub fn request_loops(&self) -> usize {
        match self.request_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n as usize,
        }
    }
}
