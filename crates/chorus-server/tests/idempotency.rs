//! `Idempotency-Key` on every write route, through the service's router over
//! a real runtime on in-memory stores: a retry is answered the original
//! outcome (200 or 412, same index) and appends nothing; the same key with
//! a different request is 422; concurrent twins apply once; a bad header is
//! 400; the status page reports the retention and the table.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use chorus::kv::Retention;
use chorus_server::AppState;
use serde_json::json;

mod support;

use support::send;

/// A primary over fresh in-memory stores, and the state its router shares.
async fn service() -> Arc<AppState> {
    let runtime = support::primary("idempotency-test", |store| store).await;
    let retention = Retention {
        max_keys: 1000,
        max_age_ms: 3_600_000,
        max_bytes: chorus::kv::idempotency::DEFAULT_RETAINED_BYTES,
    };
    support::app_state(&runtime, Duration::from_secs(10), retention)
}

fn applied(app: &AppState) -> u64 {
    app.runtime.status().applied_index.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_is_answered_the_original_outcome_and_appends_nothing() {
    let app = service().await;
    let key = [("idempotency-key", "put-1")];
    let first = send(&app, "PUT", "/v1/kv/a", &key, "1").await;
    assert_eq!((first.status, first.replayed), (StatusCode::OK, false));
    assert_eq!(first.body, json!({"index": 0, "revision": 2}));
    send(&app, "PUT", "/v1/kv/a", &[], "2").await;
    let end = applied(&app);
    let retry = send(&app, "PUT", "/v1/kv/a", &key, "1").await;
    assert_eq!((retry.status, retry.replayed), (StatusCode::OK, true));
    assert_eq!(retry.body, json!({"index": 0, "revision": 2}));
    assert_eq!(applied(&app), end, "the retry appended a record");
    let (value, _) = app.runtime.read_stale(|state| state.get(b"a").cloned());
    assert_eq!(value.unwrap().value, "2", "the retry applied again");

    // The other routes: a batch, a delete, a raw append.
    let batch = json!({"operations": [{"op": "put", "key": "b", "value": "1", "if_absent": true}]});
    let key = [("idempotency-key", "batch-1")];
    let first = send(&app, "POST", "/v1/kv:batch", &key, batch.to_string()).await;
    let retry = send(&app, "POST", "/v1/kv:batch", &key, batch.to_string()).await;
    assert_eq!(
        (first.status, retry.status),
        (StatusCode::OK, StatusCode::OK)
    );
    assert_eq!((first.body, retry.replayed), (retry.body, true));
    let key = [("idempotency-key", "delete-1")];
    let first = send(&app, "DELETE", "/v1/kv/b", &key, "").await;
    let retry = send(&app, "DELETE", "/v1/kv/b", &key, "").await;
    assert_eq!((first.body, retry.replayed), (retry.body, true));
    let key = [("idempotency-key", "append-1")];
    let first = send(&app, "POST", "/v1/log", &key, "raw event").await;
    let end = applied(&app);
    let retry = send(&app, "POST", "/v1/log", &key, "raw event").await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    assert_eq!((&first.body, retry.replayed), (&retry.body, true));
    assert_eq!(applied(&app), end);

    // A log reader sees the envelope, with the key and the payload.
    let index = first.body["index"].as_u64().unwrap();
    let page = send(
        &app,
        "GET",
        &format!("/v1/log?from={index}&limit=1"),
        &[],
        "",
    )
    .await;
    let record = &page.body["records"][0];
    assert_eq!(record["idempotency_key"], "append-1", "{record}");
    assert_eq!(record["payload"], "raw event", "{record}");
    assert!(record.get("data_b64").is_some(), "{record}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_condition_with_a_key_is_remembered_as_the_same_412() {
    let app = service().await;
    send(&app, "PUT", "/v1/kv/a", &[], "1").await;
    let headers = [("idempotency-key", "cas-1"), ("if-match", "\"7\"")];
    let first = send(&app, "PUT", "/v1/kv/a", &headers, "2").await;
    assert_eq!(first.status, StatusCode::PRECONDITION_FAILED, "{first:?}");
    // Versions are revisions: a was set at revision 2 (by record 0).
    assert_eq!(first.body["current_version"], 2);
    assert_eq!(
        first.body["index"], 1,
        "appended so that the outcome is remembered"
    );
    // The key moves on; the retry is still answered as the first was.
    send(&app, "PUT", "/v1/kv/a", &[], "3").await;
    let retry = send(&app, "PUT", "/v1/kv/a", &headers, "2").await;
    assert_eq!((retry.status, retry.replayed), (first.status, true));
    assert_eq!(retry.body, first.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_with_a_different_request_is_422() {
    let app = service().await;
    let key = ("idempotency-key", "k");
    send(&app, "PUT", "/v1/kv/a", &[key], "1").await;
    let batch = json!({"operations": [{"op": "put", "key": "a", "value": "1"}]});
    type Request<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>, String);
    let reuses: Vec<Request> = vec![
        ("PUT", "/v1/kv/a", vec![key], "other value".into()),
        ("PUT", "/v1/kv/b", vec![key], "1".into()),
        (
            "PUT",
            "/v1/kv/a",
            vec![key, ("if-none-match", "*")],
            "1".into(),
        ),
        ("DELETE", "/v1/kv/a", vec![key], String::new()),
        ("POST", "/v1/kv:batch", vec![key], batch.to_string()),
        ("POST", "/v1/log", vec![key], "1".into()),
    ];
    let end = applied(&app);
    for (method, path, headers, body) in reuses {
        let answer = send(&app, method, path, &headers, body).await;
        assert_eq!(
            answer.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{method} {path}"
        );
        assert_eq!(answer.body["idempotency_key"], "k");
        assert_eq!(answer.body["original_index"], 0);
    }
    assert_eq!(applied(&app), end, "a refused reuse appended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_twins_with_one_key_apply_once() {
    let app = service().await;
    for round in 0..20 {
        let name = format!("twin/{round}");
        let path = format!("/v1/kv/{name}");
        let key = format!("twin-{round}");
        let headers = [("idempotency-key", key.as_str())];
        let (a, b) = tokio::join!(
            send(&app, "PUT", &path, &headers, "v"),
            send(&app, "PUT", &path, &headers, "v"),
        );
        assert_eq!((a.status, b.status), (StatusCode::OK, StatusCode::OK));
        assert_eq!(a.body, b.body, "round {round}: two indices for one write");
        assert!(a.replayed != b.replayed, "round {round}: {a:?} {b:?}");
        let index = a.body["index"].as_u64().unwrap();
        let (entry, _) = app
            .runtime
            .read_stale(|state| state.get(name.as_bytes()).cloned());
        let entry = entry.unwrap();
        assert_eq!(entry.index.0, index, "round {round}: applied twice");
        assert_eq!(
            a.body["revision"], entry.mod_revision,
            "round {round}: the answer's revision is the key's version"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_idempotency_key_is_400_and_appends_nothing() {
    let app = service().await;
    let long = "k".repeat(256);
    for bad in ["", "has space", long.as_str()] {
        let answer = send(&app, "PUT", "/v1/kv/a", &[("idempotency-key", bad)], "1").await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{bad:?}");
        assert!(
            answer.body["error"]
                .as_str()
                .unwrap()
                .starts_with("Idempotency-Key: "),
            "{answer:?}"
        );
    }
    assert_eq!(applied(&app), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_the_retention_and_the_remembered_keys() {
    let app = service().await;
    let status = send(&app, "GET", "/v1/status", &[], "").await.body;
    assert_eq!(
        status["idempotency"],
        json!({"retain_keys": 1000, "retain_age_secs": 3600,
               "retain_bytes": 64 << 20, "keys": 0, "bytes": 0,
               "oldest_index": null, "oldest_age_ms": null})
    );
    send(&app, "PUT", "/v1/kv/x", &[], "1").await;
    send(&app, "PUT", "/v1/kv/a", &[("idempotency-key", "one")], "1").await;
    send(&app, "PUT", "/v1/kv/b", &[("idempotency-key", "two")], "1").await;
    let status = send(&app, "GET", "/v1/status", &[], "").await.body;
    let table = &status["idempotency"];
    assert_eq!(
        (&table["keys"], &table["oldest_index"]),
        (&json!(2), &json!(1))
    );
    // Keys "one" and "two", 3 bytes each, and the fixed cost of each entry.
    let entry_bytes = 3 + chorus::kv::idempotency::ENTRY_OVERHEAD_BYTES;
    assert_eq!(table["bytes"], 2 * entry_bytes, "{table}");
    assert!(table["oldest_age_ms"].as_u64().unwrap() < 60_000, "{table}");
}
