//! The control API's client (`service::http`), for `hermes ctl`.
//!
//! Every change goes to one instance over HTTP with the bearer token; that
//! instance stores it in Redis (`hermes:overrides`) and every instance picks
//! it up within `service.override_poll_ms`, so any instance will do. The
//! request is blocking (`ureq`, already the registry client): one call, then
//! the process ends.

use hermes::service::overrides::{Action, Request};
use std::time::Duration;

/// Where the API is and who is asking.
pub struct Client {
    /// `http://HOST:PORT` of an instance's `service.http_listen`.
    pub url: String,
    /// The control token; `None`: only reads are possible.
    pub token: Option<String>,
    /// Who asks (goes into the OVERRIDE alert).
    pub actor: String,
    agent: ureq::Agent,
}

/// What went wrong, said so a person can act on it.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("{url}: {status} {reason}")]
    Refused {
        url: String,
        status: u16,
        reason: String,
    },
    #[error(
        "{source} (is `hermes run` serving its control API at {url}? see service.http_listen)"
    )]
    Unreachable {
        url: String,
        #[source]
        source: Box<ureq::Error>,
    },
    #[error("{0}")]
    Usage(String),
}

/// A duration as operators write it, with its unit: `90s`, `30m`, `2h`,
/// `1d`, `1h 30m`. A bare number is refused: `--for 30` could mean seconds
/// or minutes, and a pin that lapses 59 minutes early is an incident.
pub fn parse_duration_s(text: &str) -> Result<u64, CtlError> {
    let t = text.trim();
    if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit()) {
        return Err(CtlError::Usage(format!(
            "`{text}` needs a unit: {t}s, {t}m, {t}h or {t}d"
        )));
    }
    let d = humantime::parse_duration(t).map_err(|e| {
        CtlError::Usage(format!(
            "`{text}` is not a duration (e.g. 90s, 30m, 2h, 1d): {e}"
        ))
    })?;
    if d.as_secs() == 0 {
        return Err(CtlError::Usage(
            "a duration must be at least a second".into(),
        ));
    }
    Ok(d.as_secs())
}

impl Client {
    pub fn new(url: &str, token: Option<String>, actor: String) -> Client {
        Client {
            url: url.trim_end_matches('/').to_string(),
            token,
            actor,
            agent: ureq::AgentBuilder::new()
                .timeout(Duration::from_secs(10))
                .build(),
        }
    }

    fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<serde_json::Value, CtlError> {
        let url = format!("{}{path}", self.url);
        let mut req = self.agent.request(method, &url);
        if let Some(t) = &self.token {
            req = req.set("Authorization", &format!("Bearer {t}"));
        }
        let answer = match body {
            Some(b) => req
                .set("Content-Type", "application/json")
                .send_string(&b.to_string()),
            None => req.call(),
        };
        match answer {
            Ok(r) => Ok(r
                .into_string()
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or(serde_json::Value::Null)),
            Err(ureq::Error::Status(status, r)) => {
                let text = r.into_string().unwrap_or_default();
                let reason = serde_json::from_str::<serde_json::Value>(&text)
                    .ok()
                    .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
                    .unwrap_or(text);
                Err(CtlError::Refused {
                    url,
                    status,
                    reason,
                })
            }
            Err(e) => Err(CtlError::Unreachable {
                url,
                source: Box::new(e),
            }),
        }
    }

    fn needs_token(&self) -> Result<(), CtlError> {
        if self.token.is_none() {
            return Err(CtlError::Usage(
                "a change needs the control token: --token or HERMES_CONTROL_TOKEN".into(),
            ));
        }
        Ok(())
    }

    /// Pins a channel, or freezes a group (`Action::Freeze`).
    pub fn set(
        &self,
        target: &str,
        id: &str,
        action: Action,
        reason: &str,
        for_s: Option<u64>,
    ) -> Result<serde_json::Value, CtlError> {
        self.needs_token()?;
        let req = Request {
            action,
            reason: reason.to_string(),
            actor: self.actor.clone(),
            for_s,
        };
        let body = serde_json::to_value(&req).map_err(|e| CtlError::Usage(e.to_string()))?;
        self.send(
            "PUT",
            &format!("/v1/overrides/{target}/{}", encode(id)),
            Some(body),
        )
    }

    /// Clears a channel's pin or a group's freeze.
    pub fn clear(
        &self,
        target: &str,
        id: &str,
        reason: &str,
    ) -> Result<serde_json::Value, CtlError> {
        self.needs_token()?;
        let body = serde_json::json!({ "actor": self.actor, "reason": reason });
        self.send(
            "DELETE",
            &format!("/v1/overrides/{target}/{}", encode(id)),
            Some(body),
        )
    }

    /// The overrides in force (and recent clears), as stored.
    pub fn list(&self) -> Result<serde_json::Value, CtlError> {
        self.send("GET", "/v1/overrides", None)
    }
}

/// A path segment: ids are config names, but a `/` or space must not
/// change the route.
fn encode(id: &str) -> String {
    let mut out = String::new();
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `hermes ctl list` as a table for people.
pub fn render_list(v: &serde_json::Value) -> String {
    use hermes::present::{Align::Left, Table};
    let mut table = Table::new(&[
        ("TARGET", Left),
        ("ID", Left),
        ("ACTION", Left),
        ("BY", Left),
        ("UNTIL", Left),
        ("REASON", Left),
    ]);
    for (kind, key) in [("channel", "channels"), ("group", "groups")] {
        let Some(map) = v.get(key).and_then(|m| m.as_object()) else {
            continue;
        };
        for (id, o) in map {
            let action = match o.get("action").and_then(|a| a.as_str()) {
                Some("weight") => format!(
                    "weight {}",
                    o.get("weight").and_then(|w| w.as_f64()).unwrap_or(f64::NAN)
                ),
                Some("clear") => "cleared".to_string(),
                Some(a) => a.to_string(),
                None => "?".to_string(),
            };
            let until = o
                .get("expires_ms")
                .and_then(|e| e.as_i64())
                .map_or("until cleared".to_string(), hermes::wall_clock::utc);
            let s = |k: &str| o.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
            table.row([
                kind.to_string(),
                id.clone(),
                action,
                s("actor"),
                until,
                s("reason"),
            ]);
        }
    }
    let empty = table.is_empty();
    let mut out = table.render();
    if empty {
        out.push_str("(no overrides)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_operators_write_them() {
        assert_eq!(parse_duration_s("30m").unwrap(), 1_800);
        assert_eq!(parse_duration_s("90s").unwrap(), 90);
        assert_eq!(parse_duration_s("1h 30m").unwrap(), 5_400);
        let bare = parse_duration_s("30").unwrap_err().to_string();
        assert!(
            bare.contains("needs a unit") && bare.contains("30m"),
            "{bare}"
        );
        assert_eq!(parse_duration_s("2h").unwrap(), 7_200);
        assert_eq!(parse_duration_s("1d").unwrap(), 86_400);
        assert!(parse_duration_s("0s").is_err());
        assert!(parse_duration_s("5x").is_err());
        assert!(parse_duration_s("soon").is_err());
    }

    #[test]
    fn ids_cannot_change_the_route() {
        assert_eq!(encode("free-a"), "free-a");
        assert_eq!(encode("a/b c"), "a%2Fb%20c");
    }

    #[test]
    fn the_list_names_who_why_and_until_when() {
        let v = serde_json::json!({
            "channels": {"free-a": {"action": "drain", "actor": "alice", "reason": "INC-7", "created_ms": 0, "expires_ms": 1_796_136_000_000i64}},
            "groups": {"chat": {"action": "freeze", "actor": "bob", "reason": "deploy", "created_ms": 0, "expires_ms": null}}
        });
        let t = render_list(&v);
        assert!(
            t.contains("free-a") && t.contains("alice") && t.contains("INC-7"),
            "{t}"
        );
        assert!(t.contains("2026-12-01T14:40:00Z"), "{t}");
        assert!(t.contains("until cleared") && t.contains("freeze"), "{t}");
        assert!(render_list(&serde_json::json!({})).contains("no overrides"));
    }
}
