//! A raw `POST /v1/log` cannot forge the key-value machine's records,
//! through the service's router over a real runtime on in-memory stores:
//! a body the machine would read as its own (a command, a stamped record,
//! a format only a later build reads) is `422` with or without a key, and
//! changes neither a key nor the idempotency table.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use bytes::Bytes;
use chorus::kv::{
    Body, Command, Condition, IdempotencyKey, KvState, Operation, Record, Retention, Stamp,
};
use chorus_server::AppState;

mod support;

use support::{Answer, send};

const RETENTION: Retention = Retention {
    max_keys: 1000,
    max_age_ms: 3_600_000,
    max_bytes: chorus::kv::idempotency::DEFAULT_RETAINED_BYTES,
};

async fn service() -> Arc<AppState> {
    let runtime = support::primary("raw-append-test", |store| store).await;
    support::app_state(&runtime, Duration::from_secs(10), RETENTION)
}

fn put_a(value: &'static str) -> Body {
    Body::Command(Command::Single(Operation::Put {
        key: Bytes::from_static(b"a"),
        value: Bytes::from_static(value.as_bytes()),
        condition: Condition::None,
    }))
}

/// A stamped key-value record, as only the service should write one.
fn stamped(body: Body, key: &str, at_ms: u64, retention: Retention) -> Bytes {
    let stamp = Stamp {
        key: IdempotencyKey::new(key.to_owned()).unwrap(),
        at_ms,
        retention,
    };
    Record {
        stamp: Some(stamp),
        body,
    }
    .encode()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_append_that_forges_a_key_value_record_is_refused_and_changes_nothing() {
    let app = service().await;
    let client = [("idempotency-key", "client-1")];
    let Answer { status, .. } = send(&app, "PUT", "/v1/kv/a", &client, "1").await;
    assert_eq!(status, StatusCode::OK);
    let Answer { status, .. } = send(
        &app,
        "PUT",
        "/v1/kv/b",
        &[("idempotency-key", "client-2")],
        "2",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (before, _) = app.runtime.read_stale(KvState::clone);
    assert_eq!(before.idempotency().len(), 2);

    let now_ms = app.runtime.wall_ms();
    let evict_all = Retention {
        max_keys: 1,
        max_age_ms: 1,
        max_bytes: chorus::kv::idempotency::MAX_ENTRY_BYTES,
    };
    let raw = || Body::Raw(Bytes::from_static(b"x"));
    let forgeries: Vec<(&str, Bytes)> = vec![
        ("a command that changes a key", {
            let Body::Command(command) = put_a("forged") else {
                unreachable!()
            };
            command.encode().unwrap()
        }),
        (
            "a stamped write that evicts every remembered key",
            stamped(put_a("forged"), "forger-1", now_ms, evict_all),
        ),
        (
            "a stamp that pins the table's clock far ahead",
            stamped(raw(), "forger-2", now_ms + 1_000_000_000, RETENTION),
        ),
        (
            "a stamp that pre-registers another client's key",
            stamped(raw(), "victim", now_ms, RETENTION),
        ),
        (
            "a format only a later build reads",
            Bytes::from_static(b"CHKV\x03a record of a later format"),
        ),
    ];
    for (what, body) in forgeries {
        for headers in [&[][..], &[("idempotency-key", "forger")][..]] {
            let Answer {
                status,
                body: answer,
                ..
            } = send(&app, "POST", "/v1/log", headers, body.clone()).await;
            assert_eq!(
                status,
                StatusCode::UNPROCESSABLE_ENTITY,
                "{what} {headers:?}: {answer}"
            );
            let message = answer["error"].as_str().unwrap_or_default();
            assert!(message.starts_with("reserved record"), "{what}: {answer}");
            assert_eq!(answer["reserved_prefix"], "CHKV", "{what}: {answer}");
        }
    }

    // Nothing was appended: every key and the idempotency table (its keys
    // and its clock) are as they were.
    let (after, _) = app.runtime.read_stale(KvState::clone);
    assert_eq!(after, before);
    // The victim's key is its own: its first write applies, and the
    // remembered keys still answer their retries.
    let victim = [("idempotency-key", "victim")];
    let Answer {
        status, replayed, ..
    } = send(&app, "PUT", "/v1/kv/c", &victim, "3").await;
    assert_eq!((status, replayed), (StatusCode::OK, false));
    let Answer {
        status,
        replayed,
        body: answer,
    } = send(&app, "PUT", "/v1/kv/a", &client, "1").await;
    assert_eq!((status, replayed), (StatusCode::OK, true), "{answer}");
    // Any other raw record still appends, with a key or without.
    let Answer { status, .. } = send(&app, "POST", "/v1/log", &[], "CHK event").await;
    assert_eq!(status, StatusCode::OK);
    let keyed = [("idempotency-key", "append-1")];
    let Answer { status, .. } = send(&app, "POST", "/v1/log", &keyed, "event").await;
    assert_eq!(status, StatusCode::OK);
}
