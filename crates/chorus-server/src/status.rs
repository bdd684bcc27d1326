//! `/v1/status`, `/healthz`, `/readyz` and `/metrics`.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chorus::ids::SegmentId;
use chorus::log::LogStores;
use chorus::log::layout::segment_prefix;
use chorus::log::maintenance::Maintenance;
use chorus::runtime::{Role, RuntimeStatus};
use serde_json::{Map, Value, json};

use crate::AppState;

/// `GET /v1/status`: role, indices, lease, HEAD, the register's view of the
/// log, the snapshot schedule and the last boot's phases.
pub async fn status(State(app): State<Arc<AppState>>) -> Response {
    let status = app.runtime.status();
    let wall_ms = app.runtime.stores().leases.clock().wall_ms();
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
    let ((keys, oldest), _) = app.runtime.read_stale(|state| {
        let table = state.idempotency();
        let oldest = table
            .oldest()
            .map(|(_, remembered)| (remembered.index.0, remembered.recorded_ms));
        (table.len(), oldest)
    });
    json!({
        "retain_keys": retention.max_keys,
        "retain_age_secs": retention.max_age_ms / 1000,
        "keys": keys,
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
        "applied_index": status.applied_index.0,
        "writer": writer,
        "lease": lease,
        "lease_remaining_ms": status.lease_remaining.map(millis),
        "head": head,
        "last_snapshot_index": status.last_snapshot_index.map(|index| index.0),
        "snapshot_schedule": {
            "every_records": status.snapshot_every_records,
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
/// replica's health and lag behind the others in the active segment.
async fn register_json(app: &AppState) -> Value {
    let stores = &app.runtime.stores().log;
    let maintenance = Maintenance::new(stores);
    match maintenance.manifest().await {
        Ok(manifest) => json!({
            "name": stores.register.name(),
            "epoch": manifest.epoch.0,
            "floor": manifest.trunc.0,
            "tail_base": manifest.tail_base.0,
            "directory_entries": manifest.segments.len(),
            "quorum": manifest.quorum(),
            "replicas": replicas_json(stores, manifest.tail).await,
        }),
        Err(error) => json!({ "error": error.to_string() }),
    }
}

/// How long the status page waits for one replica's listing.
const REPLICA_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Per replica: whether it answers a listing of the active segment, how many
/// fragments it holds there, and how many fewer than the fullest replica.
async fn replicas_json(stores: &LogStores, tail: SegmentId) -> Vec<Value> {
    let prefix = segment_prefix(tail);
    let listings = futures::future::join_all(stores.replicas.iter().map(|(_, store)| {
        let prefix = prefix.clone();
        async move { tokio::time::timeout(REPLICA_CHECK_TIMEOUT, store.list(&prefix)).await }
    }))
    .await;
    let counts: Vec<Option<usize>> = listings
        .iter()
        .map(|listed| match listed {
            Ok(Ok(objects)) => Some(objects.len()),
            _ => None,
        })
        .collect();
    let fullest = counts.iter().flatten().max().copied().unwrap_or(0);
    stores
        .replicas
        .iter()
        .zip(listings.iter().zip(&counts))
        .map(|((identity, _), (listed, count))| match (listed, count) {
            (_, Some(count)) => json!({
                "replica": identity,
                "healthy": true,
                "tail_fragments": count,
                "lag_fragments": fullest - count,
            }),
            (Ok(Err(error)), None) => {
                json!({ "replica": identity, "healthy": false, "error": error.to_string() })
            }
            (_, None) => json!({
                "replica": identity,
                "healthy": false,
                "error": format!("no answer within {REPLICA_CHECK_TIMEOUT:?}"),
            }),
        })
        .collect()
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
