//! `/v1/status`, `/healthz`, `/readyz` and `/metrics`.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chorus::runtime::{ReplicaHealth, Role, RuntimeStatus};
use serde_json::{Map, Value, json};

use crate::AppState;

/// `GET /v1/status`: role, indices, lease, HEAD, the register's view of the
/// log, the snapshot schedule and the last boot's phases.
pub async fn status(State(app): State<Arc<AppState>>) -> Response {
    let status = app.runtime.status();
    let wall_ms = app.runtime.wall_ms();
    let mut body = runtime_json(&status, wall_ms);
    body.insert("ready".into(), is_ready(&app, &status).into());
    body.insert(
        "advertise_url".into(),
        app.config.advertise_url.clone().into(),
    );
    body.insert("idempotency".into(), idempotency_json(&app, wall_ms));
    body.insert("register".into(), register_json(&app).await);
    Json(Value::Object(body)).into_response()
}

/// The idempotency retention this process writes into keyed records, and
/// the table as applied here: how many keys, and the oldest.
fn idempotency_json(app: &AppState, wall_ms: u64) -> Value {
    let retention = app.config.idempotency;
    let ((keys, bytes, oldest), _) = app.runtime.read_stale(|state| {
        let table = state.idempotency();
        let oldest = table
            .oldest()
            .map(|(_, remembered)| (remembered.index.0, remembered.recorded_ms));
        (table.len(), table.bytes(), oldest)
    });
    json!({
        "retain_keys": retention.max_keys,
        "retain_age_secs": retention.max_age_ms / 1000,
        "retain_bytes": retention.max_bytes,
        "keys": keys,
        "bytes": bytes,
        "oldest_index": oldest.map(|(index, _)| index),
        "oldest_age_ms": oldest.map(|(_, recorded_ms)| wall_ms.saturating_sub(recorded_ms)),
    })
}

fn runtime_json(status: &RuntimeStatus, wall_ms: u64) -> Map<String, Value> {
    let millis = |duration: Duration| duration.as_millis() as u64;
    let writer = status.writer.as_ref().map(|writer| {
        json!({
            "epoch": writer.epoch.0,
            "next_index": writer.next_index.0,
            "inflight_records": writer.inflight_records,
            "inflight_bytes": writer.inflight_bytes,
        })
    });
    let lease = status.lease.as_ref().map(|lease| {
        json!({
            "holder": lease.holder_id.as_str(),
            "incarnation": lease.incarnation.map(|i| i.to_string()),
            "term": lease.term.0,
            "generation": lease.generation.0,
            "released": lease.released,
            "expires_in_ms": millis(lease.expires_in(wall_ms)),
        })
    });
    let head = status.head.as_ref().map(|head| {
        json!({
            "sequence": head.publication_sequence.0,
            "wal_index": head.wal_index.0,
            "key": head.snapshot_key(),
            "size_bytes": head.payload_size_bytes,
            "age_ms": wall_ms.saturating_sub(head.updated_at_ms),
        })
    });
    let phases: Map<String, Value> = status
        .phases
        .iter()
        .map(|(phase, elapsed)| (phase.as_str().to_owned(), millis(*elapsed).into()))
        .collect();
    let fields = json!({
        "role": status.role.as_str(),
        "holder": status.holder.as_str(),
        "incarnation": status.incarnation.to_string(),
        "applied_index": status.applied_index.0,
        "writer": writer,
        "lease": lease,
        "lease_remaining_ms": status.lease_remaining.map(millis),
        "head": head,
        "last_snapshot_index": status.last_snapshot_index.map(|index| index.0),
        "snapshot_schedule": {
            "every_records": status.snapshot_every_records,
            "min_log_percent": status.snapshot_min_log_percent,
            "interval_secs": status.snapshot_interval.as_secs(),
        },
        "caught_up": status.caught_up,
        "epoch": status.epoch.map(|epoch| epoch.0),
        "replayed_records": status.replayed_records,
        "boot_phases_ms": phases,
        "last_error": status.last_error,
    });
    match fields {
        Value::Object(map) => map,
        _ => unreachable!("json! of an object"),
    }
}

/// The register's view (epoch, floor, end of the sealed directory) and each
/// replica's health and lag behind the others in the active segment, as the
/// runtime last observed them (`age_ms` ago; refreshed at most once a second).
async fn register_json(app: &AppState) -> Value {
    let observed = app.runtime.log_view().await;
    let age_ms = observed.age.as_millis() as u64;
    match observed.view {
        Ok(view) => json!({
            "name": view.register,
            "epoch": view.epoch.0,
            "floor": view.floor.0,
            "tail_base": view.tail_base.0,
            "directory_entries": view.directory_entries,
            "quorum": view.quorum,
            "replicas": view.replicas.iter().map(replica_json).collect::<Vec<_>>(),
            "age_ms": age_ms,
        }),
        Err(error) => json!({ "error": error, "age_ms": age_ms }),
    }
}

fn replica_json(replica: &ReplicaHealth) -> Value {
    match &replica.tail_fragments {
        Ok(count) => json!({
            "replica": replica.replica,
            "healthy": true,
            "tail_fragments": count,
            "lag_fragments": replica.lag_fragments,
        }),
        Err(error) => json!({ "replica": replica.replica, "healthy": false, "error": error }),
    }
}

/// `GET /healthz`: the process answers (no auth).
pub async fn health(State(app): State<Arc<AppState>>) -> Response {
    let role = app.runtime.status().role;
    Json(json!({ "status": "ok", "role": role.as_str() })).into_response()
}

/// `GET /readyz`: 200 on a primary sure of its lease, or (with
/// `ready_as_standby`) on a caught-up standby; 503 otherwise.
pub async fn ready(State(app): State<Arc<AppState>>) -> Response {
    let status = app.runtime.status();
    let ready = is_ready(&app, &status);
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({ "ready": ready, "role": status.role.as_str() });
    (code, Json(body)).into_response()
}

fn is_ready(app: &AppState, status: &RuntimeStatus) -> bool {
    match status.role {
        Role::Primary => app.runtime.is_primary_and_sure(),
        Role::Standby => app.config.ready_as_standby && status.caught_up,
        Role::Booting | Role::Stopped => false,
    }
}

/// `GET /metrics`: Prometheus text format.
pub async fn metrics(State(app): State<Arc<AppState>>) -> Response {
    let text = app
        .metrics
        .as_ref()
        .map_or_else(String::new, |handle| handle.render());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
