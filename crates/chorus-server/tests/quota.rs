//! The space quota on the HTTP API, through the service's router over a
//! real runtime on in-memory stores: a write that would take the state to
//! the quota is `507` and appends nothing; while the NOSPACE alarm is raised
//! (as the etcd API raises it), every write that adds data is `507`, and
//! deletes, reads and replays of remembered requests still work.

use std::convert::Infallible;
use std::sync::Arc;

use axum::http::StatusCode;
use chorus::kv::EtcdCommand;
use chorus::kv::etcd::{AlarmAction, AlarmMember, AlarmRequest, AlarmType};
use chorus::kv::quota::PUT_OVERHEAD_BYTES;
use chorus_server::AppState;
use serde_json::json;

mod support;

use support::send;

const QUOTA: usize = 3000;

async fn service(name: &str) -> Arc<AppState> {
    let runtime = support::primary(name, |store| store).await;
    support::configured_app_state(&runtime, |config| config.quota_bytes = QUOTA)
}

fn applied(app: &AppState) -> u64 {
    app.runtime.status().applied_index.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_over_the_quota_is_refused_and_appends_nothing() {
    let app = service("quota-over").await;
    let value = "v".repeat(1000);
    let first = send(&app, "PUT", "/v1/kv/a", &[], value.clone()).await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    let end = applied(&app);
    // Held: 1 + 1000 bytes and the history; the next put costs 256 + 1 + 2000.
    let over = send(&app, "PUT", "/v1/kv/b", &[], "w".repeat(2000)).await;
    assert_eq!(over.status, StatusCode::INSUFFICIENT_STORAGE, "{over:?}");
    let message = over.body["error"].as_str().unwrap();
    assert!(message.contains("space quota"), "{message}");
    assert!(message.contains("--quota-backend-bytes"), "{message}");
    let (used, _) = app.runtime.read_stale(|state| state.space_bytes());
    assert!(used > 1001, "keys, values and history: {used}");
    assert_eq!(over.body["used_bytes"], json!(used));
    assert_eq!(over.body["cost_bytes"], json!(PUT_OVERHEAD_BYTES + 2001));
    assert_eq!(over.body["quota_bytes"], json!(QUOTA));
    // A batch is charged all of its puts; a keyed write is checked too.
    let batch = json!({"operations": [
        {"op": "put", "key": "c", "value": "x".repeat(800)},
        {"op": "put", "key": "d", "value": "x".repeat(800)},
    ]});
    let refused = send(&app, "POST", "/v1/kv:batch", &[], batch.to_string()).await;
    assert_eq!(
        refused.status,
        StatusCode::INSUFFICIENT_STORAGE,
        "{refused:?}"
    );
    let keyed = [("idempotency-key", "big-1")];
    let refused = send(&app, "PUT", "/v1/kv/e", &keyed, "y".repeat(2000)).await;
    assert_eq!(
        refused.status,
        StatusCode::INSUFFICIENT_STORAGE,
        "{refused:?}"
    );
    assert_eq!(applied(&app), end, "a refused write was appended");
    // What fits is written; a delete costs nothing.
    let fits = send(&app, "PUT", "/v1/kv/f", &[], "z".repeat(100)).await;
    assert_eq!(fits.status, StatusCode::OK, "{fits:?}");
    let deleted = send(&app, "DELETE", "/v1/kv/a", &[], "").await;
    assert_eq!(deleted.status, StatusCode::OK, "{deleted:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nospace_alarm_refuses_writes_that_add_data() {
    let app = service("quota-alarm").await;
    let keyed = [("idempotency-key", "put-1")];
    let first = send(&app, "PUT", "/v1/kv/a", &keyed, "1").await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    let alarm = EtcdCommand::Alarm(AlarmRequest {
        action: AlarmAction::Activate,
        member: AlarmMember {
            member_id: 1,
            alarm: AlarmType::NoSpace,
        },
    });
    app.runtime
        .write(|_| Ok::<_, Infallible>(alarm.encode()))
        .await
        .unwrap();
    let end = applied(&app);

    let refused = send(&app, "PUT", "/v1/kv/b", &[], "2").await;
    assert_eq!(
        refused.status,
        StatusCode::INSUFFICIENT_STORAGE,
        "{refused:?}"
    );
    let message = refused.body["error"].as_str().unwrap();
    assert!(message.contains("NOSPACE alarm is raised"), "{message}");
    assert!(message.contains("etcdctl alarm disarm"), "{message}");
    assert_eq!(applied(&app), end, "a refused write was appended");
    // A remembered request is answered again: nothing new is appended.
    let retry = send(&app, "PUT", "/v1/kv/a", &keyed, "1").await;
    assert_eq!((retry.status, retry.replayed), (StatusCode::OK, true));
    // Reads and deletes go on.
    let read = send(&app, "GET", "/v1/kv/a", &[], "").await;
    assert_eq!(read.status, StatusCode::OK, "{read:?}");
    let deleted = send(&app, "DELETE", "/v1/kv/a", &[], "").await;
    assert_eq!(deleted.status, StatusCode::OK, "{deleted:?}");
}
