//! Log maintenance (docs/protocol.md, Maintenance): truncation, repair, the
//! orphan sweep and verification. None of it runs on the append path: a live
//! writer runs it in a background task, and the CLI runs it against a log with
//! or without a writer. Every step is safe beside a live writer and beside
//! other maintenance runs.

mod classify;
mod progress;
mod rebuild;
mod repair;
mod sweep;
mod truncate;
mod verify;

use std::sync::Arc;

pub use classify::{ObjectClass, classify};
pub use progress::{NoProgress, Progress};
pub use rebuild::{
    ActiveFound, Evidence, RebuildError, SealedFound, gather_evidence, plan_register,
};
pub use repair::RepairReport;
pub use sweep::SweepReport;
pub use truncate::TruncateReport;
pub use verify::{BelowQuorum, ObjectState, ReplicaReport, VerifyReport};

use super::LogStores;
use super::error::LogError;
use super::layout::{SEALED_PREFIX, SEGMENTS_PREFIX, segment_prefix};
use super::replica::Replica;
use futures::StreamExt;

use crate::blob::{BlobError, DynBlobStore};
use crate::codec::FRAGMENT_HEADER_BYTES;
use crate::ids::SegmentId;
use crate::register::{DEFAULT_MAX_ROUNDS, Manifest, ManifestStore};

/// Runs maintenance against one log.
#[derive(Debug, Clone)]
pub struct Maintenance {
    replicas: Vec<Replica>,
    register: Arc<dyn ManifestStore>,
    rounds: u32,
}

impl Maintenance {
    /// Maintenance of the log in `stores`.
    pub fn new(stores: &LogStores) -> Maintenance {
        Maintenance {
            replicas: stores.replicas(),
            register: Arc::clone(&stores.register),
            rounds: DEFAULT_MAX_ROUNDS,
        }
    }

    pub(crate) fn from_parts(
        replicas: Vec<Replica>,
        register: Arc<dyn ManifestStore>,
        rounds: u32,
    ) -> Maintenance {
        Maintenance {
            replicas,
            register,
            rounds,
        }
    }

    /// The register's current record.
    pub async fn manifest(&self) -> Result<Manifest, LogError> {
        let current = self
            .register
            .read()
            .await?
            .ok_or_else(|| LogError::Transition("register not initialized".into()))?;
        Ok(Manifest::from_fields(&current.fields)?)
    }
}

/// The first object of the log's own layout (a fragment, fence or sealed
/// segment) in `store`, if any: whether a replica already holds a log, before
/// a new register is bound to it.
pub async fn first_log_object(store: &DynBlobStore) -> Result<Option<String>, BlobError> {
    for prefix in [SEGMENTS_PREFIX, SEALED_PREFIX] {
        if let Some(object) = store.list(prefix).await?.into_iter().next() {
            return Ok(Some(object.key));
        }
    }
    Ok(None)
}

/// Deletes every fragment of `segments` on every replica, in a background task.
/// Best effort: failures are logged, and the orphan sweep collects leftovers.
pub fn delete_segments_in_background(replicas: Vec<Replica>, segments: Vec<SegmentId>) {
    tokio::spawn(async move {
        for replica in &replicas {
            for segment in &segments {
                if let Err(error) = delete_fragments(replica, *segment).await {
                    tracing::warn!(?replica, %segment, %error, "could not delete old fragments");
                }
            }
        }
    });
}

/// Deletes the data fragments of `segment` on `replica`; returns how many.
///
/// Fences are never deleted: a fence keeps a superseded writer from ever
/// completing its position, and that writer may still be running. They are
/// header-only objects, recognised by size without reading them.
async fn delete_fragments(replica: &Replica, segment: SegmentId) -> Result<usize, BlobError> {
    let listed = replica.store.list(&segment_prefix(segment)).await?;
    let data: Vec<_> = listed
        .iter()
        .filter(|meta| meta.size != FRAGMENT_HEADER_BYTES as u64)
        .collect();
    let keys = data.iter().map(|meta| meta.key.clone()).collect();
    for (_, outcome) in delete_all(&replica.store, keys).await {
        outcome?;
    }
    Ok(data.len())
}

/// Deletions in flight per replica during clean-up.
const DELETE_CONCURRENCY: usize = 16;

/// Deletes `keys` with bounded concurrency; returns each key's outcome.
async fn delete_all(
    store: &DynBlobStore,
    keys: Vec<String>,
) -> Vec<(String, Result<(), BlobError>)> {
    futures::stream::iter(keys)
        .map(|key| async move {
            let outcome = store.delete(&key).await;
            (key, outcome)
        })
        .buffer_unordered(DELETE_CONCURRENCY)
        .collect()
        .await
}

/// Counts a maintenance failure; maintenance errors are logged and counted,
/// never propagated to appends.
pub(crate) fn failed(task: &'static str, error: &dyn std::fmt::Display) {
    metrics::counter!("chorus_maintenance_errors_total", "task" => task).increment(1);
    tracing::warn!(task, %error, "maintenance step failed");
}
