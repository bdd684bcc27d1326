//! A primary runtime over fresh in-memory stores, and the service state a
//! router over it shares: what the router-level tests start from.

#[path = "../../../chorus/tests/support/memory_runtime.rs"]
mod memory_runtime;

use std::sync::Arc;
use std::time::Duration;

use axum::http::{Request, StatusCode};
use chorus::kv::{KvState, Retention};
use chorus::runtime::Runtime;
use chorus_server::limits::MemoryLimits;
use chorus_server::listener::ConnectionLimits;
use chorus_server::{AppState, ServiceConfig, router};
#[allow(unused_imports)] // not every test binary waits on its own
pub use memory_runtime::{primary, wait_until};
use serde_json::Value;
use tower::ServiceExt;

/// The service state over `runtime`: no auth, default limits, and the given
/// request timeout and idempotency retention.
#[allow(dead_code)] // not every test binary uses these settings
pub fn app_state(
    runtime: &Arc<Runtime<KvState>>,
    request_timeout: Duration,
    idempotency: Retention,
) -> Arc<AppState> {
    configured_app_state(runtime, |config| {
        config.request_timeout = request_timeout;
        config.idempotency = idempotency;
    })
}

/// The service state over `runtime` with default settings as `configure`
/// changes them.
pub fn configured_app_state(
    runtime: &Arc<Runtime<KvState>>,
    configure: impl FnOnce(&mut ServiceConfig),
) -> Arc<AppState> {
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    let mut config = ServiceConfig {
        token: None,
        max_body_bytes: 1 << 20,
        request_timeout: Duration::from_secs(10),
        advertise_url: None,
        ready_as_standby: false,
        connections: ConnectionLimits::default(),
        memory: MemoryLimits::default(),
        idempotency: Retention::default(),
        quota_bytes: chorus::kv::quota::DEFAULT_QUOTA_BYTES,
    };
    configure(&mut config);
    Arc::new(AppState::new(Arc::clone(runtime), config, None, shutdown))
}

/// An answer: status, whether it was replayed, and the JSON body.
#[derive(Debug)]
#[allow(dead_code)] // not every test binary sends requests this way
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// Whether the answer was replayed for an idempotency key.
    pub replayed: bool,
    /// The JSON body (`null` if it is not JSON).
    pub body: Value,
}

/// Sends a request through the router over `app`.
#[allow(dead_code)] // not every test binary sends requests this way
pub async fn send(
    app: &Arc<AppState>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<axum::body::Body>,
) -> Answer {
    // The service refuses an HTTP/1.1 request without Host, as hyper's clients send one.
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "test");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = router(Arc::clone(app))
        .oneshot(request.body(body.into()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let replayed = response.headers().get("idempotent-replayed").is_some();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Answer {
        status,
        replayed,
        body,
    }
}
