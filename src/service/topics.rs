//! Hermes' four topics: checked at start, created when asked to.
//!
//! Until every topic exists, `/readyz` names the missing ones (a missing
//! topic is a clear reason, not a silent stall) and the check repeats with
//! backoff; a broker that cannot be asked is the `kafka` dependency's
//! business. With `kafka.create_topics = true` (off by default: most
//! clusters create topics through their own tooling) the missing ones are
//! created with the configured partitions and replication: the request
//! topic with `kafka.request_partitions`, the others with 3; the health
//! topic keeps an hour (reports older than a window are useless), dead
//! letters a week (time to look at them), alerts the broker's default.

use super::kafka::{self, QuietContext};
use super::metrics::{Dependency, Metrics};
use crate::config::KafkaConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::types::RDKafkaErrorCode;
use std::time::Duration;

/// One topic Hermes uses, and how it would create it.
#[derive(Debug, Clone, PartialEq)]
pub struct TopicSpec {
    pub name: String,
    pub partitions: i32,
    /// Topic-level configs set on creation.
    pub config: Vec<(&'static str, &'static str)>,
}

/// The four topics of `k`, with how each would be created.
pub fn specs(k: &KafkaConfig) -> Vec<TopicSpec> {
    let spec = |name: &str, partitions: i32, config: Vec<(&'static str, &'static str)>| TopicSpec {
        name: name.to_string(),
        partitions,
        config,
    };
    vec![
        spec(&k.request_topic, k.request_partitions, vec![]),
        spec(&k.alert_topic, 3, vec![]),
        spec(&k.dead_letter_topic, 3, vec![("retention.ms", "604800000")]),
        spec(&k.health_topic, 3, vec![("retention.ms", "3600000")]),
    ]
}

/// Checks (and with `create_topics`, creates) the topics until they all
/// exist, reporting what is missing as a readiness problem. Returns when
/// they do, or when asked to stop.
pub async fn ensure(
    k: KafkaConfig,
    metrics: std::sync::Arc<Metrics>,
    stop: tokio_util::sync::CancellationToken,
) {
    let admin: AdminClient<QuietContext> = match kafka::client_config(&k)
        .create_with_context(QuietContext::named("admin"))
    {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, "cannot create the Kafka admin client; topics are not checked");
            return;
        }
    };
    let target = k.brokers.clone();
    let mut backoff = crate::backoff::Backoff::LONG;
    while !stop.is_cancelled() {
        let missing = tokio::task::block_in_place(|| missing_topics(&admin, &k));
        match missing {
            Ok(m) if m.is_empty() => {
                metrics.readiness.set(Dependency::Topics, &target, None);
                return;
            }
            Ok(m) if k.create_topics => {
                create(&admin, &k, &m).await;
                let names: Vec<&str> = m.iter().map(|s| s.name.as_str()).collect();
                let problem = format!("creating missing topics: {}", names.join(", "));
                metrics
                    .readiness
                    .set(Dependency::Topics, &target, Some(problem));
            }
            Ok(m) => {
                let names: Vec<&str> = m.iter().map(|s| s.name.as_str()).collect();
                let problem = format!(
                    "missing topics: {} (create them, or set kafka.create_topics = true)",
                    names.join(", ")
                );
                metrics
                    .readiness
                    .set(Dependency::Topics, &target, Some(problem));
            }
            // The broker cannot be asked: readiness says so through `kafka`.
            Err(e) => tracing::debug!(error = %e, "topics not checked yet"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(backoff.next_delay()) => {}
        }
    }
}

fn missing_topics(
    admin: &AdminClient<QuietContext>,
    k: &KafkaConfig,
) -> Result<Vec<TopicSpec>, rdkafka::error::KafkaError> {
    let md = admin.inner().fetch_metadata(None, Duration::from_secs(5))?;
    let present: Vec<&str> = md
        .topics()
        .iter()
        .filter(|t| t.error().is_none() && !t.partitions().is_empty())
        .map(|t| t.name())
        .collect();
    Ok(specs(k)
        .into_iter()
        .filter(|s| !present.contains(&s.name.as_str()))
        .collect())
}

async fn create(admin: &AdminClient<QuietContext>, k: &KafkaConfig, missing: &[TopicSpec]) {
    let topics: Vec<NewTopic<'_>> = missing
        .iter()
        .map(|s| {
            let mut t = NewTopic::new(
                &s.name,
                s.partitions,
                TopicReplication::Fixed(k.replication_factor),
            );
            for (key, value) in &s.config {
                t = t.set(key, value);
            }
            t
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    match admin.create_topics(&topics, &opts).await {
        Ok(results) => {
            for r in results {
                match r {
                    Ok(name) => tracing::info!(topic = %name, "topic created"),
                    Err((name, RDKafkaErrorCode::TopicAlreadyExists)) => {
                        tracing::debug!(topic = %name, "topic created by someone else meanwhile")
                    }
                    Err((name, code)) => {
                        tracing::warn!(topic = %name, error = ?code, "topic not created; retrying")
                    }
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "creating topics failed; retrying"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_four_topics_with_their_retention() {
        let k = KafkaConfig::default();
        let s = specs(&k);
        let names: Vec<&str> = s.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "hermes.requests",
                "hermes.alerts",
                "hermes.dead-letters",
                "hermes.health"
            ]
        );
        assert_eq!(s[0].partitions, k.request_partitions);
        assert_eq!(s[3].config, [("retention.ms", "3600000")]);
    }
}
