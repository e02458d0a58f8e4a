//! The instance's HTTP endpoint, on axum:
//!
//! | method and path | answers |
//! |---|---|
//! | `GET /metrics` | Prometheus text format 0.0.4 (`prometheus-client`) |
//! | `GET /status` | this instance's channels and groups, as `hermes status` shows the fleet (`?format=json` for JSON) |
//! | `GET /healthz` | 200 while the process answers |
//! | `GET /readyz` | 200, or 503 with every reason it is not ready |
//! | `GET /v1/overrides` | the operators' overrides in force (JSON) |
//! | `PUT /v1/overrides/channels/{id}` | pin a channel: `{"action": "drain" \| "healthy" \| "weight", "weight": w, "reason", "actor", "for_s"}` |
//! | `PUT /v1/overrides/groups/{id}` | freeze a group: `{"action": "freeze", "reason", "actor", "for_s"}` |
//! | `DELETE /v1/overrides/{channels\|groups}/{id}` | clear: `{"reason", "actor"}` |
//!
//! Every change needs `Authorization: Bearer <service.control_token>`; with
//! no token configured, changes are refused (403). Reads need none: the
//! listener binds loopback by default.

use super::metrics::Metrics;
use super::overrides::{Control, Refused, Request, Target};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use std::sync::Arc;

/// What the endpoint serves from.
#[derive(Clone)]
pub struct Api {
    pub metrics: Arc<Metrics>,
    pub control: Arc<Control>,
    /// The control token in force; `None`: changes are refused.
    pub token: Option<String>,
}

/// The routes (also for tests, without a socket).
pub fn router(api: Api) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .route("/", get(status))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/v1/overrides", get(list))
        .route(
            "/v1/overrides/channels/{id}",
            put(pin_channel).delete(clear_channel),
        )
        .route(
            "/v1/overrides/groups/{id}",
            put(freeze_group).delete(clear_group),
        )
        .with_state(api)
}

/// Serves until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, api: Api) {
    if let Err(e) = axum::serve(listener, router(api)).await {
        tracing::error!(error = %e, "the HTTP endpoint stopped");
    }
}

async fn metrics(State(api): State<Api>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        )],
        api.metrics.render_prometheus(),
    )
        .into_response()
}

#[derive(serde::Deserialize)]
struct StatusQuery {
    format: Option<String>,
}

async fn status(State(api): State<Api>, Query(q): Query<StatusQuery>) -> Response {
    let view = api.metrics.status_view(&api.control.current());
    match q.format.as_deref() {
        Some("json") => Json(view).into_response(),
        None | Some("text") => view.render().into_response(),
        Some(other) => (
            StatusCode::BAD_REQUEST,
            format!("unknown format `{other}`: text or json\n"),
        )
            .into_response(),
    }
}

async fn readyz(State(api): State<Api>) -> Response {
    match api.metrics.readiness.check() {
        Ok(()) => "ready\n".into_response(),
        Err(reasons) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready:\n{}\n", reasons.join("\n")),
        )
            .into_response(),
    }
}

async fn list(State(api): State<Api>) -> Response {
    Json(api.control.current().as_ref().clone()).into_response()
}

/// An error answer: a status and a one-line JSON reason.
fn refuse(status: StatusCode, why: impl std::fmt::Display) -> Response {
    (
        status,
        Json(serde_json::json!({ "error": why.to_string() })),
    )
        .into_response()
}

/// Compares in time independent of where the first difference is
/// (`subtle`'s comparison, which the optimizer cannot turn into an early
/// exit); only the length may show.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

/// `None` when the request may change overrides; the refusal otherwise.
fn authorize(api: &Api, headers: &HeaderMap) -> Option<Response> {
    let Some(token) = &api.token else {
        return Some(refuse(
            StatusCode::FORBIDDEN,
            "the control API is off: set service.control_token or HERMES_CONTROL_TOKEN",
        ));
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(g) if same_secret(g.trim().as_bytes(), token.as_bytes()) => None,
        _ => {
            let mut r = refuse(
                StatusCode::UNAUTHORIZED,
                "a bearer token is required (Authorization: Bearer <service.control_token>)",
            );
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, "Bearer".parse().expect("static"));
            Some(r)
        }
    }
}

async fn set(api: Api, headers: HeaderMap, target: Target, req: Request) -> Response {
    if let Some(refused) = authorize(&api, &headers) {
        return refused;
    }
    match api.control.set(target, &req).await {
        Ok(Ok(o)) => Json(o).into_response(),
        Ok(Err(e @ Refused::Unknown(_))) => refuse(StatusCode::NOT_FOUND, e),
        Ok(Err(e)) => refuse(StatusCode::BAD_REQUEST, e),
        Err(e) => refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the override store did not answer: {e}"),
        ),
    }
}

/// Who clears, and why.
#[derive(serde::Deserialize)]
struct ClearRequest {
    actor: String,
    reason: String,
}

async fn clear(api: Api, headers: HeaderMap, target: Target, req: ClearRequest) -> Response {
    if let Some(refused) = authorize(&api, &headers) {
        return refused;
    }
    if req.actor.trim().is_empty() || req.reason.trim().is_empty() {
        return refuse(
            StatusCode::BAD_REQUEST,
            "an actor and a reason are required (they go into the OVERRIDE alert)",
        );
    }
    match api
        .control
        .clear(target.clone(), req.actor.trim(), req.reason.trim())
        .await
    {
        Ok(true) => Json(serde_json::json!({ "cleared": target.field() })).into_response(),
        Ok(false) => refuse(
            StatusCode::NOT_FOUND,
            format!("no override in force for {target}"),
        ),
        Err(e) => refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the override store did not answer: {e}"),
        ),
    }
}

async fn pin_channel(
    State(api): State<Api>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(req): Json<Request>,
) -> Response {
    set(api, headers, Target::Channel(id), req).await
}

async fn freeze_group(
    State(api): State<Api>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(req): Json<Request>,
) -> Response {
    set(api, headers, Target::Group(id), req).await
}

async fn clear_channel(
    State(api): State<Api>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(req): Json<ClearRequest>,
) -> Response {
    clear(api, headers, Target::Channel(id), req).await
}

async fn clear_group(
    State(api): State<Api>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(req): Json<ClearRequest>,
) -> Response {
    clear(api, headers, Target::Group(id), req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Tier};
    use crate::service::overrides::Store;
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A served API on a loopback port, with `token` as the control token.
    async fn api(token: Option<&str>) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
        let cfg = Config::single_group(
            "chat",
            &[
                ("free-a", Tier::Free, 0.0, 50.0),
                ("paid-a", Tier::Paid, 1.0, 100.0),
            ],
        );
        let (_tx, rx) = tokio::sync::watch::channel(Arc::new(cfg));
        let control = Control::new(Store::InProcess(Mutex::new(BTreeMap::new())), rx, 60_000);
        let api = Api {
            metrics: Arc::new(Metrics::default()),
            control: Arc::new(control),
            token: token.map(str::to_string),
        };
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        (addr, tokio::spawn(serve(l, api)))
    }

    /// One HTTP/1.1 exchange, written in two parts (a split request head
    /// must still be read whole); returns (status code, body).
    async fn call(
        addr: std::net::SocketAddr,
        method: &str,
        path: &str,
        auth: Option<&str>,
        body: &str,
    ) -> (u16, String) {
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let auth = auth
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let (a, b) = head.split_at(7);
        c.write_all(a.as_bytes()).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        c.write_all(b.as_bytes()).await.unwrap();
        c.write_all(body.as_bytes()).await.unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).await.unwrap();
        let code = out[9..12].parse().unwrap();
        let body = out
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        (code, body)
    }

    const DRAIN: &str =
        r#"{"action":"drain","reason":"provider incident","actor":"alice","for_s":1800}"#;

    #[tokio::test]
    async fn reads_answer_with_or_without_a_query_and_other_methods_are_refused() {
        let (addr, server) = api(None).await;
        let (code, body) = call(addr, "GET", "/metrics", None, "").await;
        assert_eq!(code, 200);
        assert!(body.contains("hermes_events_consumed_total 0"), "{body}");
        assert_eq!(call(addr, "GET", "/metrics?x=1", None, "").await.0, 200);
        assert_eq!(call(addr, "POST", "/metrics", None, "").await.0, 405);
        assert_eq!(call(addr, "GET", "/healthz", None, "").await.0, 200);
        let (code, body) = call(addr, "GET", "/status?format=json", None, "").await;
        assert_eq!(code, 200);
        assert!(
            serde_json::from_str::<serde_json::Value>(&body).is_ok(),
            "{body}"
        );
        assert_eq!(
            call(addr, "GET", "/status?format=yaml", None, "").await.0,
            400
        );
        assert_eq!(call(addr, "GET", "/nope", None, "").await.0, 404);
        server.abort();
    }

    #[tokio::test]
    async fn changes_need_the_token_and_are_checked_against_the_config() {
        let (addr, server) = api(None).await;
        let (code, body) = call(
            addr,
            "PUT",
            "/v1/overrides/channels/free-a",
            Some("whatever-token-1234"),
            DRAIN,
        )
        .await;
        assert_eq!(
            code, 403,
            "no token configured: the control API is off ({body})"
        );
        server.abort();

        let token = "s3cret-token-for-tests";
        let (addr, server) = api(Some(token)).await;
        let put = "/v1/overrides/channels/free-a";
        assert_eq!(call(addr, "PUT", put, None, DRAIN).await.0, 401);
        assert_eq!(
            call(addr, "PUT", put, Some("wrong-token-000000000"), DRAIN)
                .await
                .0,
            401
        );
        assert_eq!(
            call(
                addr,
                "PUT",
                "/v1/overrides/channels/nope",
                Some(token),
                DRAIN
            )
            .await
            .0,
            404
        );
        let no_reason = r#"{"action":"drain","reason":"","actor":"alice"}"#;
        assert_eq!(call(addr, "PUT", put, Some(token), no_reason).await.0, 400);
        assert_eq!(
            call(addr, "PUT", put, Some(token), "not json").await.0 / 100,
            4
        );
        let (code, body) = call(addr, "PUT", put, Some(token), DRAIN).await;
        assert_eq!(code, 200, "{body}");
        let (_, list) = call(addr, "GET", "/v1/overrides", None, "").await;
        assert!(
            list.contains("provider incident") && list.contains("alice"),
            "{list}"
        );
        let clear = r#"{"actor":"bob","reason":"fixed"}"#;
        assert_eq!(call(addr, "DELETE", put, None, clear).await.0, 401);
        assert_eq!(call(addr, "DELETE", put, Some(token), clear).await.0, 200);
        assert_eq!(
            call(addr, "DELETE", put, Some(token), clear).await.0,
            404,
            "nothing left to clear"
        );
        server.abort();
    }
}
