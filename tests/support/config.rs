//! The Hermes config the tests against a real broker run with: one group of
//! three channels (`free-a`, `paid-a`, `paid-b`) and windows of seconds
//! instead of minutes, so a test sees a whole incident. Each test sets what
//! it needs on top (a registry, the free tier's cool-down, extra keys).

/// A test's Hermes config; [`TestConfig::text`] writes it.
pub struct TestConfig<'a> {
    pub brokers: &'a str,
    pub redis: &'a str,
    pub http_port: u16,
    /// `kafka.schema_registry_url`; none: plain datums.
    pub registry: Option<&'a str>,
    /// The free tier's base cool-down.
    pub free_cooldown_ms: i64,
    /// The free tier's cool-down cap; none: the default.
    pub free_max_cooldown_ms: Option<i64>,
    /// More `[kafka]`, `[service]` and `[engine]` lines.
    pub kafka_extra: String,
    pub service_extra: &'a str,
    pub engine_extra: &'a str,
}

impl<'a> TestConfig<'a> {
    pub fn new(brokers: &'a str, redis: &'a str, http_port: u16) -> TestConfig<'a> {
        TestConfig {
            brokers,
            redis,
            http_port,
            registry: None,
            free_cooldown_ms: 10_000,
            free_max_cooldown_ms: None,
            kafka_extra: String::new(),
            service_extra: "",
            engine_extra: "",
        }
    }

    pub fn text(&self) -> String {
        let TestConfig {
            brokers,
            redis,
            http_port,
            free_cooldown_ms,
            ..
        } = self;
        let registry = self
            .registry
            .map(|url| format!("schema_registry_url = \"{url}\"\n"))
            .unwrap_or_default();
        let max_cooldown = self
            .free_max_cooldown_ms
            .map(|ms| format!("max_cooldown_ms = {ms}\n"))
            .unwrap_or_default();
        let (kafka_extra, service_extra, engine_extra) =
            (&self.kafka_extra, self.service_extra, self.engine_extra);
        format!(
            r#"
[kafka]
brokers = "{brokers}"
session_timeout_ms = 6000
{registry}{kafka_extra}

[redis]
url = "{redis}"

[schedule]
group_warmup_ms = 5000

[service]
heartbeat_ms = 2000
commit_interval_ms = 500
http_listen = "127.0.0.1:{http_port}"
idle_advance_ms = 3000
{service_extra}

# Windows of seconds instead of minutes, so a test sees a whole incident.
[engine]
slice_ms = 1000
short_window_ms = 10000
long_window_ms = 30000
evaluation_interval_ms = 1000
allowed_lateness_ms = 2000
{engine_extra}

# Cool-downs and probations of seconds, not minutes.
[tiers.free.policy.states]
cooldown_ms = {free_cooldown_ms}
{max_cooldown}probation_min_samples = 20
observe_passes = 2

[[tiers.free.policy.states.recovery_steps]]
until = 1.0
step = 0.5
every_ms = 2000

[[groups]]
id = "chat"

[[groups.channels]]
id = "free-a"
tier = "free"
price_per_1k_tokens = 0.0
capacity_rps = 100.0

[[groups.channels]]
id = "paid-a"
tier = "paid"
price_per_1k_tokens = 0.5
capacity_rps = 100.0

[[groups.channels]]
id = "paid-b"
tier = "paid"
price_per_1k_tokens = 0.6
capacity_rps = 100.0
"#
        )
    }
}
