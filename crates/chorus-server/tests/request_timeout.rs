//! The request timeout of a write whose record was admitted: the service
//! runs over in-memory replicas that are slowed down past the timeout, so
//! the record commits only after its request was answered. The answer must
//! say so (`may_have_committed: true`), as the documented JSON 503 with
//! `Retry-After`, and the record must indeed apply afterwards.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use chorus::blob::{DynBlobStore, Fault, FaultController, FaultRule, FaultyStore, OpSet};
use chorus::kv::KvState;
use chorus::runtime::Runtime;
use chorus_server::router;
use serde_json::Value;
use tower::ServiceExt;

/// The request timeout under test: far shorter than the replicas' delay.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(300);
/// How long each replica write is held back once the replicas are slowed.
const REPLICA_DELAY: Duration = Duration::from_millis(1500);
mod support;

use support::wait_until;

/// A primary over three in-memory replicas whose calls `replicas` can slow down.
async fn primary() -> (Arc<Runtime<KvState>>, FaultController) {
    let faults = FaultController::new(7);
    let wrap = |store| -> DynBlobStore { Arc::new(FaultyStore::new(store, faults.clone())) };
    let runtime = support::primary("timeout", wrap).await;
    (runtime, faults)
}

fn app(runtime: &Arc<Runtime<KvState>>) -> axum::Router {
    router(support::app_state(
        runtime,
        REQUEST_TIMEOUT,
        chorus::kv::Retention::default(),
    ))
}

async fn send(
    app: &axum::Router,
    method: &str,
    path: &str,
    body: &str,
) -> (StatusCode, Option<String>, Value) {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, "test")
        .body(Body::from(body.to_owned()))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let retry = response
        .headers()
        .get(header::RETRY_AFTER)
        .map(|value| value.to_str().unwrap().to_owned());
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {status} {bytes:?}"));
    (status, retry, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_write_that_was_admitted_may_have_committed_and_does() {
    let (runtime, replicas) = primary().await;
    let app = app(&runtime);
    let (status, _, body) = send(&app, "PUT", "/v1/kv/fast", "1").await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let slow = replicas.add(FaultRule::new(Fault::Delay(REPLICA_DELAY)).ops(OpSet::WRITES));
    for (method, path) in [("PUT", "/v1/kv/slow"), ("POST", "/v1/log")] {
        let (status, retry, body) = send(&app, method, path, "2").await;
        assert_eq!(
            status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{method} {path}: {body}"
        );
        assert!(retry.is_some(), "{method} {path}: no Retry-After");
        assert_eq!(body["may_have_committed"], true, "{method} {path}: {body}");
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .starts_with("request timeout"),
            "{body}"
        );
    }
    // A read that times out makes no claim about commits.
    replicas.remove(slow);

    // The abandoned write was admitted, and it does apply.
    wait_until("the timed-out put applied", || {
        runtime.read_stale(|state| state.get(b"slow").is_some()).0
    })
    .await;
    runtime.shutdown().await.expect("a clean shutdown");
}
