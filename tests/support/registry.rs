//! A Schema Registry on a loopback port: enough of the Confluent REST API
//! for Hermes and registry-aware clients (register, look up by id), with an
//! outage switch.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A Schema Registry that knows one id (`GET /schemas/ids/{id}`), and
/// remembers which ids were asked for.
pub struct FakeRegistry {
    pub url: String,
    asked: Arc<Mutex<Vec<u32>>>,
    /// While set, every request gets 503 (a registry outage).
    down: Arc<AtomicBool>,
    /// (subject, schema, id) of every registration, in order.
    pub registered: Arc<Mutex<Vec<(String, String, u32)>>>,
}

impl FakeRegistry {
    pub const KNOWN_ID: u32 = 7;
    /// Registered schemas get ids from here on.
    pub const FIRST_REGISTERED_ID: u32 = 100;

    pub fn start() -> FakeRegistry {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let asked = Arc::new(Mutex::new(Vec::new()));
        let registered = Arc::new(Mutex::new(Vec::<(String, String, u32)>::new()));
        let (a, reg) = (asked.clone(), registered.clone());
        let down = Arc::new(AtomicBool::new(false));
        let is_down = down.clone();
        std::thread::spawn(move || {
            for mut s in l.incoming().flatten() {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let split = head
                    .windows(4)
                    .position(|w| w == b"\r\n\r\n")
                    .map_or(head.len(), |p| p + 4);
                let req = String::from_utf8_lossy(&head[..split]).to_string();
                let mut body = head[split..].to_vec();
                let length: usize = req
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                while body.len() < length {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => body.extend_from_slice(&buf[..n]),
                    }
                }
                if is_down.load(Ordering::Relaxed) {
                    let _ = write!(
                        s,
                        "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n"
                    );
                    continue;
                }
                let mut words = req.split_whitespace();
                let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
                let path = path.split('?').next().unwrap_or("");
                let reply = |s: &mut std::net::TcpStream, code: &str, body: String| {
                    let _ = write!(
                        s,
                        "HTTP/1.1 {code}\r\ncontent-type: application/vnd.schemaregistry.v1+json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                };
                if method == "POST" {
                    // POST /subjects/{subject}/versions {"schema": "..."}
                    let subject = path
                        .strip_prefix("/subjects/")
                        .and_then(|p| p.strip_suffix("/versions"))
                        .unwrap_or("")
                        .to_string();
                    let schema = serde_json::from_slice::<serde_json::Value>(&body)
                        .ok()
                        .and_then(|v| v["schema"].as_str().map(str::to_string))
                        .unwrap_or_default();
                    let mut r = reg.lock().unwrap();
                    let id = r
                        .iter()
                        .find(|(_, sch, _)| *sch == schema)
                        .map(|x| x.2)
                        .unwrap_or(Self::FIRST_REGISTERED_ID + r.len() as u32);
                    r.push((subject, schema, id));
                    reply(
                        &mut s,
                        "200 OK",
                        serde_json::json!({ "id": id }).to_string(),
                    );
                    continue;
                }
                // GET /schemas/ids/{id}
                let id: u32 = path
                    .strip_prefix("/schemas/ids/")
                    .and_then(|x| x.split('/').next())
                    .and_then(|x| x.parse().ok())
                    .unwrap_or(0);
                a.lock().unwrap().push(id);
                let known = if id == Self::KNOWN_ID {
                    Some(include_str!("../../schemas/request_event.avsc").to_string())
                } else {
                    reg.lock()
                        .unwrap()
                        .iter()
                        .find(|x| x.2 == id)
                        .map(|x| x.1.clone())
                };
                match known {
                    Some(schema) => reply(
                        &mut s,
                        "200 OK",
                        serde_json::json!({ "schema": schema }).to_string(),
                    ),
                    None => reply(
                        &mut s,
                        "404 Not Found",
                        "{\"error_code\":40403}".to_string(),
                    ),
                }
            }
        });
        FakeRegistry {
            url,
            asked,
            registered,
            down,
        }
    }

    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::Relaxed);
    }

    pub fn requests(&self) -> Vec<u32> {
        let mut v = self.asked.lock().unwrap().clone();
        v.sort();
        v
    }
}
