//! Schema Registry client: writer schemas of Confluent-framed records by id
//! (`GET /schemas/ids/{id}`), fetched once per instance (its request loops
//! share what they fetched) and cached in each loop's codec
//! [`SchemaCache`].
//!
//! `ureq` over `http://` or `https://` (native-tls: the system OpenSSL),
//! with basic auth or a bearer token. It runs on the request thread, once
//! per unknown id, never per record. Three answers, kept apart because
//! they call for different actions (docs/decisions.md#safety-rails: a dependency outage delays,
//! it never discards):
//! - the schema: cached for good;
//! - "no such schema" (404): believed for `schema_registry_missing_ttl_ms`,
//!   and records with that id are dead-lettered meanwhile;
//! - anything else (unreachable, timeout, 5xx, 401): an error; the request
//!   loop pauses the partition at that record and asks again after a
//!   backoff, so nothing is dead-lettered because the registry was down.

use crate::codec::SchemaCache;
use crate::config::KafkaConfig;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What an instance's request loops learned from the registry, shared so
/// that the registry is asked once per instance and id, not once per loop.
pub type FetchedSchemas = Arc<Mutex<Fetched>>;

/// The registry's answers so far.
#[derive(Debug, Default)]
pub struct Fetched {
    /// Writer schemas (their JSON), by id.
    schemas: ahash::AHashMap<u32, String>,
    /// Ids the registry answered 404 for (or whose schema does not parse),
    /// and until when that is believed.
    missing: ahash::AHashMap<u32, Instant>,
}

pub struct Registry {
    agent: ureq::Agent,
    /// The base URL without a trailing slash.
    base: String,
    /// The `Authorization` header value, if any.
    auth: Option<String>,
    pub cache: SchemaCache,
    /// What the instance's request loops fetched so far.
    fetched: FetchedSchemas,
    missing_ttl: Duration,
}

/// What the registry said about an id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The schema is cached now.
    Found,
    /// The registry does not know the id (or its schema does not parse).
    Missing,
}

/// Why a schema was not registered.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The registry refused the schema (incompatible with the subject's
    /// history, or invalid): retrying cannot help.
    #[error("schema registry refused the schema: {0}")]
    Refused(String),
    /// The registry could not be asked or did not answer: retry.
    #[error("schema registry unavailable: {0}")]
    Unavailable(String),
}

impl Registry {
    /// A client for `kafka.schema_registry_url` (validated by the config).
    /// Secrets may come from `HERMES_SCHEMA_REGISTRY_PASSWORD` and
    /// `HERMES_SCHEMA_REGISTRY_TOKEN`.
    pub fn new(k: &KafkaConfig) -> anyhow::Result<Registry> {
        let env = |name: &str, configured: &str| {
            std::env::var(name)
                .ok()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| configured.to_string())
        };
        let password = env(
            "HERMES_SCHEMA_REGISTRY_PASSWORD",
            &k.schema_registry_password,
        );
        let token = env("HERMES_SCHEMA_REGISTRY_TOKEN", &k.schema_registry_token);
        let auth = if !token.is_empty() {
            Some(format!("Bearer {token}"))
        } else if !k.schema_registry_username.is_empty() {
            use base64::Engine as _;
            let pair = format!("{}:{password}", k.schema_registry_username);
            Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            ))
        } else {
            None
        };
        let tls = native_tls::TlsConnector::new()
            .map_err(|e| anyhow::anyhow!("schema registry TLS: {e}"))?;
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(3))
            .timeout(Duration::from_secs(5))
            .tls_connector(std::sync::Arc::new(tls))
            .build();
        Ok(Registry {
            agent,
            base: k.schema_registry_url.trim_end_matches('/').to_string(),
            auth,
            cache: SchemaCache::default(),
            fetched: FetchedSchemas::default(),
            missing_ttl: Duration::from_millis(k.schema_registry_missing_ttl_ms.max(0) as u64),
        })
    }

    /// Shares what it fetches with the instance's other request loops.
    pub fn sharing(mut self, fetched: FetchedSchemas) -> Registry {
        self.fetched = fetched;
        self
    }

    /// The registry's base URL, for logs (it carries no secret: credentials
    /// travel in a header).
    pub fn url(&self) -> &str {
        &self.base
    }

    /// Registers `schema_json` under `subject` (TopicNameStrategy:
    /// `<topic>-value`) and returns its id. Idempotent: a schema the subject
    /// already holds answers its existing id. The registry refuses a schema
    /// its compatibility level forbids (409): that is an error to fix, not
    /// to retry.
    pub fn register(&self, subject: &str, schema_json: &str) -> Result<u32, RegisterError> {
        let body = serde_json::json!({ "schema": schema_json, "schemaType": "AVRO" }).to_string();
        let mut req = self
            .agent
            .post(&format!("{}/subjects/{subject}/versions", self.base))
            .set("Content-Type", "application/vnd.schemaregistry.v1+json")
            .set(
                "Accept",
                "application/vnd.schemaregistry.v1+json, application/json",
            );
        if let Some(a) = &self.auth {
            req = req.set("Authorization", a);
        }
        let resp = match req.send_string(&body) {
            Ok(r) => r,
            Err(ureq::Error::Status(code @ (409 | 422), r)) => {
                return Err(RegisterError::Refused(format!(
                    "HTTP {code}: {}",
                    r.into_string().unwrap_or_default()
                )))
            }
            Err(ureq::Error::Status(code, _)) => {
                return Err(RegisterError::Unavailable(format!("HTTP {code}")))
            }
            Err(e) => return Err(RegisterError::Unavailable(e.to_string())),
        };
        #[derive(serde::Deserialize)]
        struct Registered {
            id: u32,
        }
        let text = resp
            .into_string()
            .map_err(|e| RegisterError::Unavailable(format!("reading the body: {e}")))?;
        serde_json::from_str::<Registered>(&text)
            .map(|r| r.id)
            .map_err(|e| RegisterError::Unavailable(format!("unexpected body {text:?}: {e}")))
    }

    /// Fetches and caches schema `id`. Err: the registry could not be asked
    /// or did not answer usefully (retry later; never a reason to discard).
    ///
    /// One loop asks at a time (the shared answers stay locked while it
    /// does): two loops meeting the same new id ask once. This runs once
    /// per unknown id, not per record, so the wait is rare and short.
    pub fn fetch(&mut self, id: u32) -> Result<Lookup, String> {
        let fetched = self.fetched.clone();
        let mut fetched = crate::service::lock(&fetched);
        if let Some(until) = fetched.missing.get(&id) {
            if Instant::now() < *until {
                return Ok(Lookup::Missing);
            }
            fetched.missing.remove(&id);
        }
        let schema = match fetched.schemas.get(&id) {
            Some(known) => known.clone(),
            None => match self.ask(id)? {
                Some(schema) => schema,
                None => {
                    fetched
                        .missing
                        .insert(id, Instant::now() + self.missing_ttl);
                    return Ok(Lookup::Missing);
                }
            },
        };
        match self.cache.insert_json(id, &schema) {
            Ok(()) => {
                fetched.schemas.insert(id, schema);
                Ok(Lookup::Found)
            }
            Err(e) => {
                tracing::warn!(schema_id = id, error = %e, "registry schema does not parse");
                fetched
                    .missing
                    .insert(id, Instant::now() + self.missing_ttl);
                Ok(Lookup::Missing)
            }
        }
    }

    /// `GET /schemas/ids/{id}`: the schema's JSON, or None for a 404.
    fn ask(&self, id: u32) -> Result<Option<String>, String> {
        let mut req = self
            .agent
            .get(&format!("{}/schemas/ids/{id}", self.base))
            .set(
                "Accept",
                "application/vnd.schemaregistry.v1+json, application/json",
            );
        if let Some(a) = &self.auth {
            req = req.set("Authorization", a);
        }
        let resp = match req.call() {
            Ok(r) => r,
            Err(ureq::Error::Status(404, _)) => return Ok(None),
            Err(ureq::Error::Status(code, _)) => {
                return Err(format!("schema registry answered HTTP {code}"))
            }
            Err(e) => return Err(format!("schema registry: {e}")),
        };
        #[derive(serde::Deserialize)]
        struct Body {
            schema: String,
        }
        let text = resp
            .into_string()
            .map_err(|e| format!("schema registry: reading the body: {e}"))?;
        let body: Body = serde_json::from_str(&text)
            .map_err(|e| format!("schema registry: unexpected body: {e}"))?;
        Ok(Some(body.schema))
    }
}

/// What `hermes run` registered at start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Registered {
    /// The alert schema's id under `<alert_topic>-value`, when alerts are
    /// framed (`kafka.alert_wire_format`).
    pub alert_schema_id: Option<u32>,
}

/// Registers both schemas under their TopicNameStrategy subjects before the
/// loops start, when alerts are to be framed: `<alert_topic>-value` (the id
/// every alert carries) and `<request_topic>-value` (what gateways frame
/// their events with; registering it also verifies that the registry's
/// history of that subject accepts this build's schema). A registry that is
/// down delays the start (retried with backoff, 1 s doubling to 30 s, while
/// `/readyz` names it); one that refuses a schema stops it with the reason.
pub async fn register_schemas(
    kafka: &KafkaConfig,
    metrics: &super::metrics::Metrics,
    stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<Registered> {
    use super::metrics::Dependency;
    if !kafka.frames_alerts() {
        return Ok(Registered::default());
    }
    let registry = std::sync::Arc::new(Registry::new(kafka)?);
    let subjects = [
        (
            KafkaConfig::value_subject(&kafka.alert_topic),
            crate::codec::ALERT_EVENT_SCHEMA_JSON,
        ),
        (
            KafkaConfig::value_subject(&kafka.request_topic),
            crate::codec::REQUEST_EVENT_SCHEMA_JSON,
        ),
    ];
    let mut ids = Vec::new();
    for (subject, schema) in subjects {
        let mut backoff = crate::backoff::Backoff::LONG;
        loop {
            let r = registry.clone();
            let sub = subject.clone();
            let answer = tokio::task::spawn_blocking(move || r.register(&sub, schema)).await?;
            match answer {
                Ok(id) => {
                    tracing::info!(%subject, schema_id = id, registry = %registry.url(), "schema registered");
                    metrics
                        .readiness
                        .set(Dependency::SchemaRegistry, registry.url(), None);
                    ids.push(id);
                    break;
                }
                Err(e @ RegisterError::Refused(_)) => {
                    anyhow::bail!("registering {subject} at {}: {e}", registry.url())
                }
                Err(e) => {
                    metrics.readiness.set(
                        Dependency::SchemaRegistry,
                        registry.url(),
                        Some(e.to_string()),
                    );
                    tracing::warn!(%subject, error = %e, retry_in_s = backoff.peek().as_secs(), "schema not registered yet");
                    tokio::select! {
                        _ = stop.cancelled() => anyhow::bail!("stopped before {subject} was registered"),
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
            }
        }
    }
    Ok(Registered {
        alert_schema_id: ids.first().copied(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    /// A registry answering `status` with `body` to each of `n` requests,
    /// and the request heads it saw.
    fn serve(
        n: usize,
        status: &'static str,
        body: String,
    ) -> (String, std::sync::mpsc::Receiver<String>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for _ in 0..n {
                let Ok((mut s, _)) = l.accept() else { return };
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(k) => head.extend_from_slice(&buf[..k]),
                    }
                }
                let _ = tx.send(String::from_utf8_lossy(&head).to_string());
                let _ = write!(
                    s,
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        (format!("http://{addr}"), rx)
    }

    fn kafka(url: &str) -> KafkaConfig {
        KafkaConfig {
            schema_registry_url: url.into(),
            ..KafkaConfig::default()
        }
    }

    #[test]
    fn fetches_and_caches_a_schema_by_id_with_basic_auth() {
        let schema = include_str!("../../schemas/request_event.avsc");
        let body = serde_json::json!({ "schema": schema }).to_string();
        let (url, heads) = serve(1, "200 OK", body);
        let mut k = kafka(&url);
        k.schema_registry_username = "key".into();
        k.schema_registry_password = "secret".into();
        let mut r = Registry::new(&k).unwrap();
        assert_eq!(r.fetch(7), Ok(Lookup::Found));
        use crate::codec::SchemaLookup;
        assert!(r.cache.writer_schema(7).is_some());
        let head = heads.recv().unwrap();
        assert!(head.starts_with("GET /schemas/ids/7 "), "{head}");
        // base64("key:secret")
        assert!(
            head.contains("Authorization: Basic a2V5OnNlY3JldA=="),
            "{head}"
        );
    }

    #[test]
    fn an_instance_asks_once_for_all_its_request_loops() {
        let schema = include_str!("../../schemas/request_event.avsc");
        let body = serde_json::json!({ "schema": schema }).to_string();
        let (url, heads) = serve(2, "200 OK", body);
        let shared = FetchedSchemas::default();
        let k = kafka(&url);
        let mut lane0 = Registry::new(&k).unwrap().sharing(shared.clone());
        let mut lane1 = Registry::new(&k).unwrap().sharing(shared);
        assert_eq!(lane0.fetch(7), Ok(Lookup::Found));
        assert_eq!(lane1.fetch(7), Ok(Lookup::Found));
        use crate::codec::SchemaLookup;
        assert!(lane1.cache.writer_schema(7).is_some());
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(heads.try_iter().count(), 1, "asked once");
    }

    #[test]
    fn loops_meeting_an_unknown_id_at_once_ask_once() {
        let (url, heads) = serve(8, "404 Not Found", "{\"error_code\":40403}".into());
        let shared = FetchedSchemas::default();
        let k = kafka(&url);
        let lanes: Vec<_> = (0..4)
            .map(|_| {
                let mut lane = Registry::new(&k).unwrap().sharing(shared.clone());
                std::thread::spawn(move || lane.fetch(12345))
            })
            .collect();
        for lane in lanes {
            assert_eq!(lane.join().unwrap(), Ok(Lookup::Missing));
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(heads.try_iter().count(), 1, "a 404 is shared too");
    }

    #[test]
    fn a_missing_id_is_believed_for_its_ttl_then_asked_again() {
        let (url, heads) = serve(2, "404 Not Found", "{\"error_code\":40403}".into());
        let mut k = kafka(&url);
        k.schema_registry_missing_ttl_ms = 200;
        let mut r = Registry::new(&k).unwrap();
        assert_eq!(r.fetch(9), Ok(Lookup::Missing));
        assert_eq!(r.fetch(9), Ok(Lookup::Missing), "believed: not asked");
        assert_eq!(heads.try_iter().count(), 1);
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(r.fetch(9), Ok(Lookup::Missing));
        assert!(heads.recv_timeout(Duration::from_secs(2)).is_ok());
    }

    #[test]
    fn unreachable_or_failing_is_an_error_to_retry_never_missing() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        drop(l);
        assert!(Registry::new(&kafka(&url)).unwrap().fetch(1).is_err());
        let (url, _) = serve(1, "503 Service Unavailable", "{}".into());
        let mut k = kafka(&url);
        k.schema_registry_token = "t".into();
        let e = Registry::new(&k).unwrap().fetch(1).unwrap_err();
        assert!(e.contains("503"), "{e}");
    }
}
