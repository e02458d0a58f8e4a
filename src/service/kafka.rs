//! Kafka plumbing shared by the service's loops: client configs with the
//! security pass-through, an output producer that tracks deliveries (offsets
//! are committed only after everything produced for them was acknowledged),
//! and log-safe rendering of settings.

use super::metrics::Metrics;
use crate::config::KafkaConfig;
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;
use rdkafka::Message;
use std::sync::Arc;
use std::time::Duration;

/// Property names whose values are secrets (never logged).
fn is_secret(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    ["password", "secret", "jaas", "token", "key", "credential"]
        .iter()
        .any(|s| k.contains(s))
}

/// The pass-through properties as they may appear in logs.
pub fn loggable_properties(kafka: &KafkaConfig) -> String {
    kafka
        .properties
        .iter()
        .map(|(k, v)| {
            if is_secret(k) {
                format!("{k}=***")
            } else {
                format!("{k}={v}")
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A client config with the brokers and every pass-through property.
pub fn client_config(kafka: &KafkaConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &kafka.brokers);
    for (k, v) in &kafka.properties {
        c.set(k, v);
    }
    c
}

/// librdkafka's global errors and log lines, each logged once per minute per
/// kind: a broker that is down raises `AllBrokersDown` and a failed connect
/// on every retry (hundreds of lines in seconds), which says nothing new
/// after the first. Readiness (`/readyz`) carries the state meanwhile.
#[derive(Default)]
pub struct QuietLog {
    last: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
}

impl QuietLog {
    /// Whether a line of this kind is due (not logged within the minute).
    fn due(&self, kind: &str) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        match last.get(kind) {
            Some(at) if now.duration_since(*at) < Duration::from_secs(60) => false,
            _ => {
                last.insert(kind.to_string(), now);
                true
            }
        }
    }

    /// For `ClientContext::error`: by error code.
    pub fn error(&self, client: &str, error: &rdkafka::error::KafkaError, reason: &str) {
        let kind = format!("{client}/{:?}", error.rdkafka_error_code());
        if self.due(&kind) {
            tracing::error!(client, %error, reason, "librdkafka error (repeats are logged once a minute)");
        }
    }

    /// For `ClientContext::log`: warnings and worse by facility, the rest at
    /// debug.
    pub fn log(&self, client: &str, level: rdkafka::config::RDKafkaLogLevel, fac: &str, msg: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error | L::Warning => {
                if self.due(&format!("{client}/{fac}")) {
                    tracing::warn!(
                        client,
                        facility = fac,
                        "librdkafka: {msg} (repeats are logged once a minute)"
                    );
                }
            }
            _ => tracing::debug!(client, facility = fac, "librdkafka: {msg}"),
        }
    }
}

/// A plain client or consumer context that logs through [`QuietLog`].
#[derive(Default)]
pub struct QuietContext {
    pub name: &'static str,
    quiet: QuietLog,
}

impl QuietContext {
    pub fn named(name: &'static str) -> QuietContext {
        QuietContext {
            name,
            quiet: QuietLog::default(),
        }
    }
}

impl ClientContext for QuietContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, msg: &str) {
        self.quiet.log(self.name, level, fac, msg)
    }
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        self.quiet.error(self.name, &error, reason)
    }
}

impl rdkafka::consumer::ConsumerContext for QuietContext {}

/// Counts acknowledgements into the service's metrics; a failure is logged
/// with its topic (the payload is not logged: it may be a gateway's data).
pub struct DeliveryTracker {
    pub metrics: Arc<Metrics>,
    /// Topic whose records are best effort (health reports: the next one
    /// replaces them); failures elsewhere (alerts, dead letters) are ones
    /// offsets depend on.
    pub best_effort_topic: String,
    pub quiet: QuietLog,
}

impl ClientContext for DeliveryTracker {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, msg: &str) {
        self.quiet.log("producer", level, fac, msg)
    }
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        self.quiet.error("producer", &error, reason)
    }
}

impl ProducerContext for DeliveryTracker {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let m = &self.metrics;
        match result {
            Ok(_) => Metrics::inc(&m.outputs_delivered),
            Err((e, rec)) if rec.topic() == self.best_effort_topic => {
                Metrics::inc(&m.health_reports_undelivered);
                tracing::warn!(topic = rec.topic(), error = %e, "health report not delivered (the next one replaces it)");
            }
            Err((e, rec)) => {
                Metrics::inc(&m.outputs_undelivered);
                tracing::error!(topic = rec.topic(), error = %e, "output record not delivered");
            }
        }
    }
}

/// The producer for alerts, dead letters and health reports.
pub type OutputProducer = ThreadedProducer<DeliveryTracker>;

pub fn output_producer(
    kafka: &KafkaConfig,
    metrics: Arc<Metrics>,
) -> anyhow::Result<OutputProducer> {
    let p = client_config(kafka)
        .set("linger.ms", "5")
        .set("enable.idempotence", "true")
        .create_with_context(DeliveryTracker {
            metrics,
            best_effort_topic: kafka.health_topic.clone(),
            quiet: QuietLog::default(),
        })?;
    Ok(p)
}

/// How long [`send`] waits for room in a full local queue (the broker
/// away): past it the record is not enqueued and nothing is committed.
const QUEUE_FULL_PATIENCE: Duration = Duration::from_secs(30);

/// Enqueues a record, waiting (up to `QUEUE_FULL_PATIENCE`) while the
/// local queue is full. Returns false only if it could not be enqueued at
/// all (the caller must not commit).
pub fn send(producer: &OutputProducer, mut rec: BaseRecord<'_, [u8], [u8]>) -> bool {
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};
    let deadline = std::time::Instant::now() + QUEUE_FULL_PATIENCE;
    // Room comes back as the producer delivers: look again soon, then
    // every 50 ms.
    let mut backoff =
        crate::backoff::Backoff::new(Duration::from_millis(5), Duration::from_millis(50));
    loop {
        match producer.send(rec) {
            Ok(()) => return true,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                if std::time::Instant::now() >= deadline {
                    tracing::error!(
                        topic = r.topic,
                        "output queue full for 30 s; record not enqueued"
                    );
                    return false;
                }
                rec = r;
                std::thread::sleep(backoff.next_delay());
            }
            Err((e, r)) => {
                tracing::error!(topic = r.topic, error = %e, "cannot enqueue output record");
                return false;
            }
        }
    }
}

/// Headers of a dead letter: why, and where it came from.
pub fn dead_letter_headers(kind: &str, reason: &str, partition: i32, offset: i64) -> OwnedHeaders {
    OwnedHeaders::new()
        .insert(Header {
            key: "reason",
            value: Some(reason),
        })
        .insert(Header {
            key: "kind",
            value: Some(kind),
        })
        .insert(Header {
            key: "source.partition",
            value: Some(&partition.to_string()),
        })
        .insert(Header {
            key: "source.offset",
            value: Some(&offset.to_string()),
        })
}

/// Every alert on `topic`, from the beginning of each partition to the high
/// watermark it had when the read began (the alert topic is low-volume;
/// offsets-for-times is not relied on: tansu and the mock cluster cannot be
/// trusted with it). Returns the alerts and how many records did not
/// decode. A plain assignment: no consumer group is joined or committed
/// (`hermes report` reads the alert stream with it).
pub fn read_alerts(
    kafka: &KafkaConfig,
    topic: &str,
    timeout: Duration,
) -> anyhow::Result<(Vec<crate::alert::AlertEvent>, usize)> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let c: BaseConsumer = client_config(kafka)
        .set("group.id", "hermes-report")
        .set("enable.auto.commit", "false")
        .create()?;
    let meta = c.fetch_metadata(Some(topic), timeout)?;
    let partitions: Vec<i32> = meta
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        anyhow::bail!("topic {topic} has no partitions (does it exist?)");
    }
    let mut tpl = rdkafka::TopicPartitionList::new();
    let mut ends = std::collections::BTreeMap::new();
    for p in &partitions {
        let (low, high) = c.fetch_watermarks(topic, *p, timeout)?;
        if high > low {
            tpl.add_partition_offset(topic, *p, rdkafka::Offset::Beginning)?;
            ends.insert(*p, high);
        }
    }
    let (mut alerts, mut undecodable) = (Vec::new(), 0);
    if ends.is_empty() {
        return Ok((alerts, undecodable));
    }
    c.assign(&tpl)?;
    let deadline = std::time::Instant::now() + timeout;
    while !ends.is_empty() {
        if std::time::Instant::now() > deadline {
            anyhow::bail!(
                "reading {topic}: partitions {:?} not read to their end in {timeout:?}",
                ends.keys().collect::<Vec<_>>()
            );
        }
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                match m.payload().map(crate::alert::AlertEvent::from_record) {
                    Some(Ok(a)) => alerts.push(a),
                    _ => undecodable += 1,
                }
                if ends
                    .get(&m.partition())
                    .is_some_and(|end| m.offset() + 1 >= *end)
                {
                    ends.remove(&m.partition());
                }
            }
            Some(Err(e)) => tracing::warn!(error = %e, "reading {topic}"),
            None => {}
        }
    }
    Ok((alerts, undecodable))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn security_settings_pass_through_to_librdkafka() {
        // Built with OpenSSL: SSL and SASL/SCRAM clients can be created (no
        // broker is contacted at creation).
        let mut k = KafkaConfig {
            brokers: "127.0.0.1:1".into(),
            ..KafkaConfig::default()
        };
        for (key, v) in [
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanisms", "SCRAM-SHA-512"),
            ("sasl.username", "hermes"),
            ("sasl.password", "hunter2"),
        ] {
            k.properties.insert(key.into(), v.into());
        }
        let p: Result<rdkafka::producer::BaseProducer, _> = client_config(&k).create();
        assert!(p.is_ok(), "{:?}", p.err());
        // A setting librdkafka does not know is refused with its name.
        k.properties.insert("no.such.setting".into(), "1".into());
        let e = client_config(&k)
            .create::<rdkafka::producer::BaseProducer>()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("no.such.setting"), "{e}");
    }

    #[test]
    fn secrets_never_reach_the_log_rendering() {
        let mut k = KafkaConfig::default();
        k.properties
            .insert("sasl.password".into(), "hunter2".into());
        k.properties
            .insert("ssl.key.password".into(), "s3cret".into());
        k.properties
            .insert("sasl.oauthbearer.client.secret".into(), "x1".into());
        k.properties
            .insert("security.protocol".into(), "SASL_SSL".into());
        let s = loggable_properties(&k);
        assert!(s.contains("security.protocol=SASL_SSL"));
        for secret in ["hunter2", "s3cret", "x1"] {
            assert!(!s.contains(secret), "{s}");
        }
    }
}
