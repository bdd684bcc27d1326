//! The background half of rotation: seal the full segment on every replica
//! (Q required), fold it into the directory with one CAS, then delete its
//! fragments.

use std::sync::Arc;

use tokio::sync::oneshot;

use crate::codec::FramedSegment;
use crate::ids::{RecordIndex, SegmentId};
use crate::log::config::LogConfig;
use crate::log::error::LogError;
use crate::log::maintenance::delete_segments_in_background;
use crate::log::metrics;
use crate::log::offload::offload;
use crate::log::quorum::quorum;
use crate::log::replica::Replica;
use crate::log::retry::backoff_delay;
use crate::log::seal::{PreparedSeal, write_seal};
use crate::log::transitions::{Ownership, fold};
use crate::register::{Manifest, ManifestStore, SealDigest, transform};

/// The register after a successful fold.
#[derive(Debug)]
pub struct Rotated {
    /// The register as the fold left it.
    pub manifest: Manifest,
    /// Some replica lacks the sealed object: repair should run now.
    pub degraded: bool,
}

/// Seals `full` (the committed fragments' frames) and folds it, making the
/// active segment (starting at `new_base`) the tail and registering
/// `new_pending`. Retries until it succeeds or is fenced; the outcome goes
/// to `done`.
pub async fn seal_and_fold(
    replicas: Vec<Replica>,
    register: Arc<dyn ManifestStore>,
    config: LogConfig,
    ownership: Ownership,
    (full, digest): (FramedSegment, SealDigest),
    (new_base, new_pending): (RecordIndex, SegmentId),
    done: oneshot::Sender<Result<Rotated, LogError>>,
) {
    let started = tokio::time::Instant::now();
    let segment = full.id;
    let seal = match offload(move || PreparedSeal::framed(full, digest)).await {
        Ok(seal) => seal,
        Err(error) => {
            let _ = done.send(Err(error));
            return;
        }
    };
    let prepared = started.elapsed();
    let backoff = (config.retry_backoff_min, config.retry_backoff_max);
    let mut attempt = 0;
    let outcome = loop {
        attempt += 1;
        match attempt_once(
            &replicas,
            register.as_ref(),
            &config,
            ownership,
            &seal,
            new_base,
            new_pending,
        )
        .await
        {
            Ok(rotated) => break Ok(rotated),
            Err(
                error @ (LogError::Fenced(_) | LogError::Manifest(_) | LogError::Corrupt { .. }),
            ) => {
                break Err(error);
            }
            Err(error) => {
                metrics::seal_finished(false, false);
                tracing::warn!(%segment, %error, attempt, "sealing failed; retrying");
                tokio::time::sleep(backoff_delay(attempt, backoff.0, backoff.1)).await;
            }
        }
    };
    if outcome.is_ok() {
        tracing::info!(
            %segment,
            bytes = seal.len(),
            prepare_ms = prepared.as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            "sealed and folded"
        );
        delete_segments_in_background(replicas, vec![segment]);
    }
    let _ = done.send(outcome);
}

async fn attempt_once(
    replicas: &[Replica],
    register: &dyn ManifestStore,
    config: &LogConfig,
    ownership: Ownership,
    seal: &PreparedSeal,
    new_base: RecordIndex,
    new_pending: SegmentId,
) -> Result<Rotated, LogError> {
    let backoff = (config.retry_backoff_min, config.retry_backoff_max);
    let grace = config.lane_stall_timeout;
    let report = write_seal(replicas, seal, quorum(replicas.len()), backoff, grace).await?;
    if report.degraded() {
        tracing::warn!(segment = %seal.sealed.entry.id, failed = ?report.failed, "degraded seal; repair will re-copy");
    }
    let committed = transform(register, config.register_rounds, |current| {
        Ok::<_, LogError>(fold(
            current,
            ownership,
            seal.sealed,
            new_base,
            new_pending,
        )?)
    })
    .await?;
    metrics::seal_finished(true, report.degraded());
    Ok(Rotated {
        manifest: committed.manifest,
        degraded: report.degraded(),
    })
}
