//! Schema Registry client: writer schemas of Confluent-framed records by id
//! (`GET /schemas/ids/{id}`), fetched once and cached in the codec's
//! [`SchemaCache`]. Plain `http://` only, blocking with timeouts: it runs on
//! the consumer thread, once per unknown id, never per record.

use crate::codec::SchemaCache;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

pub struct Registry {
    host_port: String,
    host: String,
    base_path: String,
    pub cache: SchemaCache,
    /// Ids the registry answered 404 for (dead-lettered without asking again).
    missing: ahash::AHashSet<u32>,
}

impl Registry {
    /// `url` like `http://registry:8081` (validated by the config).
    pub fn new(url: &str) -> Registry {
        let rest = url.trim_start_matches("http://");
        let (host_port, path) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let host = host_port.split(':').next().unwrap_or(host_port).to_string();
        let host_port = if host_port.contains(':') {
            host_port.to_string()
        } else {
            format!("{host_port}:80")
        };
        Registry {
            host_port,
            host,
            base_path: path.to_string(),
            cache: SchemaCache::default(),
            missing: ahash::AHashSet::new(),
        }
    }

    /// Fetches and caches schema `id`. Ok(false): the registry does not know
    /// it. Err: the registry could not be asked (retry later).
    pub fn fetch(&mut self, id: u32) -> Result<bool, String> {
        if self.missing.contains(&id) {
            return Ok(false);
        }
        let addr = self
            .host_port
            .to_socket_addrs()
            .map_err(|e| format!("schema registry address: {e}"))?
            .next()
            .ok_or("schema registry address resolves to nothing")?;
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3))
            .map_err(|e| format!("schema registry: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok();
        s.set_write_timeout(Some(Duration::from_secs(5))).ok();
        let req = format!(
            "GET {}/schemas/ids/{id} HTTP/1.0\r\nHost: {}\r\nAccept: application/vnd.schemaregistry.v1+json, application/json\r\n\r\n",
            self.base_path, self.host
        );
        s.write_all(req.as_bytes())
            .map_err(|e| format!("schema registry: {e}"))?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp)
            .map_err(|e| format!("schema registry: {e}"))?;
        let text = String::from_utf8_lossy(&resp);
        let (head, body) = text
            .split_once("\r\n\r\n")
            .ok_or("schema registry: malformed HTTP response")?;
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or("schema registry: malformed status line")?;
        match status {
            200 => {}
            404 => {
                self.missing.insert(id);
                return Ok(false);
            }
            other => return Err(format!("schema registry answered HTTP {other}")),
        }
        #[derive(serde::Deserialize)]
        struct Body {
            schema: String,
        }
        let b: Body = serde_json::from_str(body)
            .map_err(|e| format!("schema registry: unexpected body: {e}"))?;
        match self.cache.insert_json(id, &b.schema) {
            Ok(()) => Ok(true),
            Err(e) => {
                tracing::warn!(schema_id = id, error = %e, "registry schema does not parse");
                self.missing.insert(id);
                Ok(false)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A one-shot registry answering `status` with `body`.
    fn serve_once(status: &'static str, body: String) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = l.accept() {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf);
                let _ = write!(
                    s,
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n\r\n{body}"
                );
            }
        });
        format!("http://{addr}")
    }

    #[test]
    fn fetches_and_caches_a_schema_by_id() {
        let schema = include_str!("../../schemas/request_event.avsc");
        let body = serde_json::json!({ "schema": schema }).to_string();
        let mut r = Registry::new(&serve_once("200 OK", body));
        assert_eq!(r.fetch(7), Ok(true));
        use crate::codec::SchemaLookup;
        assert!(r.cache.writer_schema(7).is_some());
    }

    #[test]
    fn an_unknown_id_is_remembered_as_missing() {
        let mut r = Registry::new(&serve_once("404 Not Found", "{}".into()));
        assert_eq!(r.fetch(9), Ok(false));
        assert_eq!(
            r.fetch(9),
            Ok(false),
            "no second request (the server is gone)"
        );
    }

    #[test]
    fn an_unreachable_registry_is_an_error_to_retry() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        drop(l);
        assert!(Registry::new(&url).fetch(1).is_err());
    }
}
