//! Schema Registry client: writer schemas of Confluent-framed records by id
//! (`GET /schemas/ids/{id}`), fetched once and cached in the codec's
//! [`SchemaCache`].
//!
//! `ureq` over `http://` or `https://` (native-tls: the system OpenSSL),
//! with basic auth or a bearer token. It runs on the request thread, once
//! per unknown id, never per record. Three answers, kept apart because
//! they call for different actions (SPEC §5a: a dependency outage delays,
//! it never discards):
//! - the schema: cached for good;
//! - "no such schema" (404): believed for `schema_registry_missing_ttl_ms`,
//!   and records with that id are dead-lettered meanwhile;
//! - anything else (unreachable, timeout, 5xx, 401): an error; the request
//!   loop pauses the partition at that record and asks again after a
//!   backoff, so nothing is dead-lettered because the registry was down.

use crate::codec::SchemaCache;
use crate::config::KafkaConfig;
use std::time::{Duration, Instant};

pub struct Registry {
    agent: ureq::Agent,
    /// The base URL without a trailing slash.
    base: String,
    /// The `Authorization` header value, if any.
    auth: Option<String>,
    pub cache: SchemaCache,
    /// Ids the registry answered 404 for, and until when that is believed.
    missing: ahash::AHashMap<u32, Instant>,
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
            missing: ahash::AHashMap::new(),
            missing_ttl: Duration::from_millis(k.schema_registry_missing_ttl_ms.max(0) as u64),
        })
    }

    /// The registry's base URL, for logs (it carries no secret: credentials
    /// travel in a header).
    pub fn url(&self) -> &str {
        &self.base
    }

    /// Fetches and caches schema `id`. Err: the registry could not be asked
    /// or did not answer usefully (retry later; never a reason to discard).
    pub fn fetch(&mut self, id: u32) -> Result<Lookup, String> {
        if let Some(until) = self.missing.get(&id) {
            if Instant::now() < *until {
                return Ok(Lookup::Missing);
            }
            self.missing.remove(&id);
        }
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
            Err(ureq::Error::Status(404, _)) => {
                self.missing.insert(id, Instant::now() + self.missing_ttl);
                return Ok(Lookup::Missing);
            }
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
        match self.cache.insert_json(id, &body.schema) {
            Ok(()) => Ok(Lookup::Found),
            Err(e) => {
                tracing::warn!(schema_id = id, error = %e, "registry schema does not parse");
                self.missing.insert(id, Instant::now() + self.missing_ttl);
                Ok(Lookup::Missing)
            }
        }
    }
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
