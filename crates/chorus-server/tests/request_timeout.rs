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
use chorus::clock::SystemClock;
use chorus::kv::KvState;
use chorus::lease::{DatabaseKey, HolderId, LeaseConfig, LeaseStore};
use chorus::log::LogStores;
use chorus::register::{DEFAULT_WINDOW, ManifestStore, MemoryRegister, initialize};
use chorus::runtime::{Runtime, RuntimeConfig, RuntimeStores};
use chorus::snapshot::{SnapshotConfig, SnapshotStore};
use chorus_server::limits::MemoryLimits;
use chorus_server::listener::ConnectionLimits;
use chorus_server::{AppState, ServiceConfig, router};
use serde_json::Value;
use tower::ServiceExt;

/// The request timeout under test: far shorter than the replicas' delay.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(300);
/// How long each replica write is held back once the replicas are slowed.
const REPLICA_DELAY: Duration = Duration::from_millis(1500);
/// Bound on every wait (boot, apply): a poll, never a sleep to synchronize.
const PATIENCE: Duration = Duration::from_secs(20);

fn memory(name: &str) -> DynBlobStore {
    let url = format!("memory://request-timeout-{name}-{}", std::process::id())
        .parse()
        .expect("a memory URL");
    chorus::blob::open_store_unprobed(&url).expect("a memory store")
}

/// A primary over three in-memory replicas whose calls `replicas` can slow down.
async fn primary() -> (Arc<Runtime<KvState>>, FaultController) {
    let replicas_faults = FaultController::new(7);
    let replicas: Vec<(String, DynBlobStore)> = (0..3)
        .map(|position| {
            let store: DynBlobStore = Arc::new(FaultyStore::new(
                memory(&format!("r{position}")),
                replicas_faults.clone(),
            ));
            (format!("memory://r{position}"), store)
        })
        .collect();
    let register: Arc<dyn ManifestStore> = Arc::new(MemoryRegister::new());
    let identities = replicas.iter().map(|(name, _)| name.clone()).collect();
    initialize(register.as_ref(), identities, DEFAULT_WINDOW)
        .await
        .expect("a new log");
    let meta = memory("meta");
    let database = DatabaseKey::new("timeout").unwrap();
    let lease = LeaseConfig {
        ttl: Duration::from_secs(10),
        safety_margin: Duration::from_secs(2),
        store_call_timeout: Duration::from_secs(2),
    };
    let stores = RuntimeStores {
        log: LogStores { replicas, register },
        snapshots: SnapshotStore::new(
            meta.clone(),
            database.clone(),
            SnapshotConfig::default(),
            SystemClock::shared(),
        ),
        leases: LeaseStore::new(meta, database, lease, SystemClock::shared()).unwrap(),
    };
    let config = RuntimeConfig::new(HolderId::new("http://test:1").unwrap());
    let runtime = Arc::new(Runtime::start(stores, config).expect("a valid config"));
    wait_until("primary", || runtime.is_primary_and_sure()).await;
    (runtime, replicas_faults)
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not {what} within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn app(runtime: &Arc<Runtime<KvState>>) -> axum::Router {
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    router(Arc::new(AppState::new(
        Arc::clone(runtime),
        ServiceConfig {
            token: None,
            max_body_bytes: 1 << 20,
            request_timeout: REQUEST_TIMEOUT,
            advertise_url: None,
            ready_as_standby: false,
            connections: ConnectionLimits::default(),
            idempotency: chorus::kv::Retention::default(),
            memory: MemoryLimits::default(),
        },
        None,
        shutdown,
    )))
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
