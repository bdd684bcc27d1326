//! The Chorus key-value service: an HTTP API (axum) over a
//! [`Runtime`] running the key-value machine.
//!
//! Handlers are thin: parse and validate, call the runtime once, map the
//! result; every error is one [`ApiError`] with a JSON body.
//! Every answer that reflects the state carries `X-Chorus-Index`: the index
//! below which every record is reflected, so a client can read its own
//! writes and resume a watch. See docs/api.md for the routes.
#![warn(missing_docs)]

pub mod auth;
pub mod deadline;
pub mod encoding;
pub mod error;
pub mod front;
pub mod guard;
pub mod kv;
pub mod limits;
pub mod listener;
pub mod send_timeout;
pub mod status;
pub mod stream;
pub mod tls;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderName, StatusCode};
use axum::middleware;
use axum::routing::{any, get, post, put};
use bytes::Bytes;
use chorus::kv::KvState;
use chorus::runtime::Runtime;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::watch;

use error::ApiError;

/// The header naming the index an answer reflects.
pub const INDEX_HEADER: HeaderName = HeaderName::from_static("x-chorus-index");
/// The header naming the store revision an answer reflects.
pub const REVISION_HEADER: HeaderName = HeaderName::from_static("x-chorus-revision");

/// How the service treats requests.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Bearer token every route but `/healthz` requires; `None`: no auth.
    pub token: Option<String>,
    /// Largest request body; larger is `413`. Values are further bounded by
    /// the log's `max_record_bytes`.
    pub max_body_bytes: usize,
    /// Bound on a request until its answer starts (`503` after).
    pub request_timeout: Duration,
    /// Bounds on connections: how many at once, header read time, an
    /// answer without progress, drain.
    pub connections: listener::ConnectionLimits,
    /// Bounds on the memory of reads and streams: open streams, log pages.
    pub memory: limits::MemoryLimits,
    /// This instance's URL as clients reach it (shown in status).
    pub advertise_url: Option<String>,
    /// Whether `/readyz` is 200 on a caught-up standby too.
    pub ready_as_standby: bool,
    /// How long idempotency keys are remembered, written into every keyed
    /// record (so replicas agree whatever their own settings).
    pub idempotency: chorus::kv::Retention,
    /// The space quota of the state, shared with the etcd API: a write that
    /// would take the state to it, or that adds data while the NOSPACE alarm
    /// is raised, is refused (`507`).
    pub quota_bytes: usize,
}

/// What every handler shares.
pub struct AppState {
    /// The runtime serving the key-value machine.
    pub runtime: Arc<Runtime<KvState>>,
    /// Request handling settings.
    pub config: ServiceConfig,
    /// Renders `/metrics`; `None` when no recorder was installed here.
    pub metrics: Option<PrometheusHandle>,
    /// Turns true at shutdown, which ends the event streams.
    pub shutdown: watch::Receiver<bool>,
    /// The places for streams and log pages that `config.memory` allows.
    pub permits: limits::Permits,
    /// The request metrics' handles, found once per series.
    pub request_metrics: front::RequestMetrics,
}

impl AppState {
    /// The state of a service running `runtime` as `config` says; the
    /// permits come from `config.memory`.
    pub fn new(
        runtime: Arc<Runtime<KvState>>,
        config: ServiceConfig,
        metrics: Option<PrometheusHandle>,
        shutdown: watch::Receiver<bool>,
    ) -> AppState {
        let segment_bytes = runtime.config().log.max_segment_bytes;
        let permits = limits::Permits::new(config.memory, segment_bytes);
        AppState {
            runtime,
            config,
            metrics,
            shutdown,
            permits,
            request_metrics: front::RequestMetrics::default(),
        }
    }
}

/// The service's routes and layers.
pub fn router(app: Arc<AppState>) -> Router {
    let body_limit = app.config.max_body_bytes;
    Router::new()
        .route("/v1/kv", get(kv::list))
        .route("/v1/kv:batch", post(kv::batch))
        .route("/v1/kv/watch", get(stream::watch))
        .route("/v1/kv/", any(kv::empty_key))
        .route(
            "/v1/kv/{*key}",
            put(kv::put).get(kv::get).delete(kv::delete),
        )
        .route("/v1/log", post(stream::append_log).get(stream::read_log))
        .route("/v1/status", get(status::status))
        .route("/readyz", get(status::ready))
        .route("/metrics", get(status::metrics))
        .route(front::HEALTH_ROUTE, get(status::health))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&app),
            front::front,
        ))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(app)
}

/// A request body, or the error its rejection deserves (413 over the limit).
pub fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        let status = rejection.status();
        let message = rejection.body_text();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(format!("request body too large: {message}"))
        } else {
            ApiError::new(status, message)
        }
    })
}

/// Serves `app` on `listener` within its connection limits until
/// `shutdown` resolves, then finishes the requests in flight for at most
/// the shutdown grace (event streams end when `AppState::shutdown` turns).
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = app.config.connections;
    listener::serve(listener, router(app), limits, None, shutdown).await
}

/// [`serve`] over TLS: every connection is a TLS session on `tls` (see
/// [`tls::TlsMaterial::server_config`]), whose handshake counts against
/// the connection limits and the header read timeout.
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    app: Arc<AppState>,
    tls: Arc<tokio_rustls::rustls::ServerConfig>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = app.config.connections;
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    listener::serve(listener, router(app), limits, Some(acceptor), shutdown).await
}

/// Installs the Prometheus recorder as the process's `metrics` recorder, so
/// every `chorus_*` metric of the library and the service is rendered at
/// `/metrics`, and keeps its histograms trimmed in the background.
pub fn install_metrics_recorder() -> Result<PrometheusHandle, String> {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}
