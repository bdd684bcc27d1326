//! A key list is rendered outside the runtime's state lock, through the
//! service's router over a real runtime on in-memory stores: while a large
//! list page renders, `/readyz` (which takes that lock, as every apply and
//! every write's admission do) keeps answering. Rendered under the lock
//! (its items built and serialized there), the page stalls it for a large
//! part of the request, and the test fails; measured on a loaded 2-core
//! machine in a debug build: a 5.3 s wait in a 13 s list, against 80 ms in
//! a 9 s list as the code stands. Building only the items' JSON values
//! under the lock, without serializing them, costs too little next to the
//! serialization (about 0.1 s) to tell from scheduling noise.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body as HttpBody;
use axum::http::{Request, StatusCode};
use bytes::Bytes;
use chorus::kv::{Command, Condition, KvState, Operation, Retention};
use chorus_server::{AppState, router};
use tower::ServiceExt;

mod support;

/// Keys listed; each value is near the log's largest record.
const KEYS: usize = 32;
const VALUE_BYTES: usize = 900 << 10;
/// Lists measured: the test fails only if every one of them stalled, so a
/// probe thread the loaded machine once left unscheduled cannot fail it.
const ATTEMPTS: usize = 3;

async fn service() -> Arc<AppState> {
    let runtime = support::primary("list-lock-test", |store| store).await;
    let app = support::app_state(&runtime, Duration::from_secs(60), Retention::default());
    for key in 0..KEYS {
        // Not UTF-8, so each value renders as base64: the render is the
        // bulk of the request.
        let value: Vec<u8> = (0..VALUE_BYTES)
            .map(|i| (i * 7 + key) as u8 | 0x80)
            .collect();
        let command = Command::Single(Operation::Put {
            key: Bytes::from(format!("big/{key:03}")),
            value: Bytes::from(value),
            condition: Condition::None,
        });
        let record = command.encode().unwrap();
        runtime
            .write(|_: &KvState| Ok::<_, std::convert::Infallible>(record))
            .await
            .unwrap();
    }
    app
}

fn get(path: &str) -> Request<HttpBody> {
    Request::builder()
        .uri(path)
        .header("host", "test")
        .body(HttpBody::empty())
        .unwrap()
}

/// Asks `/readyz` in a loop on a thread of its own until `stop`; answers
/// the longest wait for one answer.
fn probe_readyz(app: Arc<AppState>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Duration> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut longest = Duration::ZERO;
        let mut last = Instant::now();
        while !stop.load(Ordering::Acquire) {
            // Any answer counts: a stalled lock can also cost the lease its
            // refresh, and /readyz then answers 503.
            let answer = runtime.block_on(router(Arc::clone(&app)).oneshot(get("/readyz")));
            answer.unwrap();
            longest = longest.max(last.elapsed());
            last = Instant::now();
        }
        longest.max(last.elapsed())
    })
}

/// Lists every key once while `/readyz` is probed; answers how long the
/// list took and the longest `/readyz` wait meanwhile.
async fn list_while_probing(app: &Arc<AppState>) -> (Duration, Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    let probe = probe_readyz(Arc::clone(app), Arc::clone(&stop));
    let started = Instant::now();
    let response = router(Arc::clone(app))
        .oneshot(get(&format!("/v1/kv?prefix=big/&limit={KEYS}")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    let took = started.elapsed();
    stop.store(true, Ordering::Release);
    let longest = probe.join().unwrap();
    assert!(body.len() > VALUE_BYTES, "{} bytes", body.len());
    (took, longest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_keeps_answering_while_a_large_list_renders() {
    let app = service().await;
    let mut seen = Vec::new();
    for _ in 0..ATTEMPTS {
        let (took, longest) = list_while_probing(&app).await;
        seen.push((took, longest));
        // Held for the render, the lock would keep /readyz waiting for
        // most of the request; outside it, for a brief clone of the page.
        if longest < took / 4 {
            return;
        }
    }
    panic!(
        "/readyz stalled while a list rendered, in every attempt (list took, longest wait): {seen:?}"
    );
}
