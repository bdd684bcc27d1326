//! What every request goes through around its handler, as one middleware:
//! request metrics, its debug-level span and log line, a JSON body for
//! every error response, the framing checks, bearer-token auth and the
//! request timeout.
//!
//! One layer rather than one per concern: each layer costs a clone of the
//! service stack below it and boxed allocations per request, and under load
//! these were a measurable share of the service's CPU (docs/BENCHMARKS.md,
//! "Where a put's CPU goes").

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Instant;

use axum::Json;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics::{Counter, Histogram};
use tracing::Instrument;

use crate::error;
use crate::{AppState, auth, deadline, guard};

/// The one route that answers without a token: a liveness probe.
pub const HEALTH_ROUTE: &str = "/healthz";

/// Runs `request` through the checks and its handler, and counts it.
///
/// In order: the framing checks (before anything reads the body), auth
/// (every matched route but [`HEALTH_ROUTE`]; a path no route matches is
/// `404` to anyone), then the handler under the request timeout. Every
/// error response without a JSON body gets one, and every answer is
/// counted by route, method and status, and logged at debug level: a `503`
/// is an answer, not a fault (a standby, an uncertain lease, backpressure).
pub async fn front(State(app): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().cloned();
    let method = method_label(request.method());
    let started = Instant::now();
    let span = tracing::debug_span!("request", method, uri = %request.uri());
    let refusal = guard::framing_error(&request, app.config.max_body_bytes).or_else(|| {
        let protected = route
            .as_ref()
            .is_some_and(|route| route.as_str() != HEALTH_ROUTE);
        protected
            .then(|| auth::refusal(app.config.token.as_deref(), &request))
            .flatten()
    });
    let response = match refusal {
        Some(error) => error.into_response(),
        None => {
            deadline::bound(app.config.request_timeout, request, next)
                .instrument(span.clone())
                .await
        }
    };
    let response = with_json_body(response).await;
    let route = route.as_ref().map_or(UNMATCHED_ROUTE, MatchedPath::as_str);
    let series = app.request_metrics.series(route, method, response.status());
    let seconds = started.elapsed().as_secs_f64();
    series.requests.increment(1);
    series.seconds.record(seconds);
    tracing::debug!(parent: &span, status = response.status().as_u16(), seconds, "answered");
    response
}

/// The route label of a request no route matched.
pub const UNMATCHED_ROUTE: &str = "unmatched";

/// The handles of the request metrics, by route, method and status.
///
/// Registering a labelled metric builds its key (three label strings) and
/// looks it up in the recorder's registry, which cost a few per cent of the
/// service's CPU per request; the handles found once are kept here. The
/// series are bounded: routes are the router's patterns (or
/// [`UNMATCHED_ROUTE`]), methods those [`method_label`] names, statuses
/// the codes the service answers with.
#[derive(Default)]
pub struct RequestMetrics {
    routes: RwLock<HashMap<Box<str>, Vec<Arc<Series>>>>,
}

/// One series' handles.
struct Series {
    method: &'static str,
    status: StatusCode,
    requests: Counter,
    seconds: Histogram,
}

impl RequestMetrics {
    /// The handles of `route`, `method` and `status`, registered with the
    /// process's recorder on first use.
    fn series(&self, route: &str, method: &'static str, status: StatusCode) -> Arc<Series> {
        let find = |routes: &HashMap<Box<str>, Vec<Arc<Series>>>| {
            routes.get(route).and_then(|series| {
                series
                    .iter()
                    .find(|series| series.method == method && series.status == status)
                    .cloned()
            })
        };
        if let Some(series) = find(&self.routes.read().unwrap_or_else(PoisonError::into_inner)) {
            return series;
        }
        let mut routes = self.routes.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(series) = find(&routes) {
            return series;
        }
        let labels = [
            ("route", route.to_owned()),
            ("method", method.to_owned()),
            ("status", status.as_str().to_owned()),
        ];
        let series = Arc::new(Series {
            method,
            status,
            requests: metrics::counter!("chorus_http_requests_total", &labels),
            seconds: metrics::histogram!("chorus_http_request_seconds", &labels),
        });
        routes
            .entry(route.into())
            .or_default()
            .push(Arc::clone(&series));
        series
    }
}

/// Gives an error response a JSON body if it has none, including those no
/// handler wrote: unknown routes, wrong methods, malformed queries.
async fn with_json_body(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 4096).await.unwrap_or_default();
    let mut error = error::reason_body(status);
    if !text.is_empty() {
        error["error"] = String::from_utf8_lossy(&text).trim().to_owned().into();
    }
    let mut rebuilt = (status, Json(error)).into_response();
    for (name, value) in parts.headers.iter() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            rebuilt.headers_mut().insert(name.clone(), value.clone());
        }
    }
    rebuilt
}

/// The metric label of a request method: one of the methods HTTP defines,
/// else `other`, so invented methods cannot create series without bound.
pub fn method_label(method: &Method) -> &'static str {
    const KNOWN: [Method; 9] = [
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
        Method::OPTIONS,
        Method::TRACE,
        Method::CONNECT,
    ];
    KNOWN
        .iter()
        .find(|known| *known == method)
        .map_or("other", Method::as_str)
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::*;
    use crate::error::ApiError;

    /// A plain-text answer, as axum writes one with no handler behind it.
    fn bare(status: StatusCode, text: &'static str) -> Response {
        (status, text).into_response()
    }

    #[test]
    fn a_series_is_registered_once_and_found_after() {
        let metrics = RequestMetrics::default();
        let put = metrics.series("/v1/kv/{*key}", "PUT", StatusCode::OK);
        let again = metrics.series("/v1/kv/{*key}", "PUT", StatusCode::OK);
        assert!(Arc::ptr_eq(&put, &again));
        let others = [
            metrics.series("/v1/kv/{*key}", "PUT", StatusCode::CONFLICT),
            metrics.series("/v1/kv/{*key}", "GET", StatusCode::OK),
            metrics.series(UNMATCHED_ROUTE, "PUT", StatusCode::OK),
        ];
        for other in &others {
            assert!(!Arc::ptr_eq(&put, other));
        }
        let routes = metrics.routes.read().unwrap();
        assert_eq!(routes.len(), 2);
        assert_eq!(routes["/v1/kv/{*key}"].len(), 3);
    }

    #[test]
    fn method_labels_are_the_known_methods_or_other() {
        for method in ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"] {
            let parsed = Method::from_bytes(method.as_bytes()).unwrap();
            assert_eq!(method_label(&parsed), method);
        }
        for invented in ["INVENTED1", "get", "PROPFIND", "X"] {
            let parsed = Method::from_bytes(invented.as_bytes()).unwrap();
            assert_eq!(method_label(&parsed), "other", "{invented}");
        }
    }

    #[tokio::test]
    async fn an_error_without_a_json_body_gets_one_and_keeps_its_headers() {
        let mut plain = bare(StatusCode::METHOD_NOT_ALLOWED, "no such method here\n");
        plain
            .headers_mut()
            .insert(header::ALLOW, "GET,PUT".parse().unwrap());
        let rebuilt = with_json_body(plain).await;
        assert_eq!(rebuilt.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(rebuilt.headers()[header::ALLOW], "GET,PUT");
        assert_eq!(rebuilt.headers()[header::CONTENT_TYPE], "application/json");
        let body = axum::body::to_bytes(rebuilt.into_body(), 4096)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"], "no such method here");
    }

    #[tokio::test]
    async fn success_and_json_errors_pass_unchanged() {
        let ok = with_json_body(bare(StatusCode::OK, "value")).await;
        let body = axum::body::to_bytes(ok.into_body(), 4096).await.unwrap();
        assert_eq!(&body[..], b"value");
        let json = ApiError::bad_request("already json").into_response();
        let passed = with_json_body(json).await;
        let body = axum::body::to_bytes(passed.into_body(), 4096)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"], "already json");
    }
}
