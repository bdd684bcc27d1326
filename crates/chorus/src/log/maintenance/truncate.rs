//! Truncation: the floor is committed by CAS **before** anything is deleted;
//! then sealed objects and leftover fragments of segments wholly below the
//! floor are deleted on every replica; an entry leaves the directory only once
//! its objects are gone from every replica (a tombstone until then).

use super::{Maintenance, Progress, delete_fragments, failed};
use crate::ids::{RecordIndex, SegmentId};
use crate::log::error::LogError;
use crate::log::layout::sealed_key;
use crate::log::transitions::{raise_trunc, remove_entries};
use crate::register::{DirectoryEntry, Manifest, transform};

/// What a truncation pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TruncateReport {
    /// The committed floor after the pass.
    pub floor: RecordIndex,
    /// Directory entries removed (deleted from every replica).
    pub removed: Vec<SegmentId>,
    /// Tombstones left for a later pass (some replica failed, or an earlier
    /// tombstone is still present: entries leave the directory in order).
    pub tombstones: Vec<SegmentId>,
    /// Delete requests that succeeded (a key already gone counts too, so a
    /// tombstone swept again counts again).
    pub deleted_objects: usize,
}

impl Maintenance {
    /// Raises the floor to `floor` (which must not exceed `end`, the first index
    /// not known to be durable) and deletes what lies wholly below it. A lower
    /// floor than the committed one is an error; the same floor sweeps
    /// tombstones left by earlier passes without raising anything.
    pub async fn truncate_before(
        &self,
        floor: RecordIndex,
        end: RecordIndex,
        progress: &dyn Progress,
    ) -> Result<TruncateReport, LogError> {
        if floor > end {
            return Err(LogError::InvalidFloor {
                requested: floor,
                reason: format!("beyond the durable end {end}"),
            });
        }
        let committed = transform(self.register.as_ref(), self.rounds, |current| {
            raise_trunc(current, floor).map_err(|lower| LogError::InvalidFloor {
                requested: floor,
                reason: format!("below the committed floor {}", lower.committed),
            })
        })
        .await?;
        self.sweep_tombstones(&committed.manifest, progress).await
    }

    /// Deletes the objects of every tombstone and drops the entries that are
    /// gone from every replica.
    pub async fn sweep_tombstones(
        &self,
        manifest: &Manifest,
        progress: &dyn Progress,
    ) -> Result<TruncateReport, LogError> {
        let tombstones: Vec<DirectoryEntry> = manifest
            .segments
            .iter()
            .enumerate()
            .filter(|(position, _)| manifest.is_tombstone(*position))
            .map(|(_, entry)| *entry)
            .collect();
        let mut report = TruncateReport {
            floor: manifest.trunc,
            ..TruncateReport::default()
        };
        progress.begin(
            "deleting truncated segments",
            (tombstones.len() * self.replicas.len()) as u64,
        );
        for entry in &tombstones {
            match self.delete_everywhere(entry, progress).await {
                Some(deleted) => {
                    report.removed.push(entry.id);
                    report.deleted_objects += deleted;
                }
                None => report.tombstones.push(entry.id),
            }
        }
        progress.end();
        if !report.removed.is_empty() {
            let removed = report.removed.clone();
            let committed = transform(self.register.as_ref(), self.rounds, |current| {
                Ok::<_, LogError>(remove_entries(current, &removed))
            })
            .await?;
            // Entries behind a tombstone that is still somewhere stay in the
            // directory (only a leading run leaves it); a later pass drops them.
            let still_named =
                |id: &SegmentId| committed.manifest.segments.iter().any(|e| e.id == *id);
            report.removed.retain(|id| !still_named(id));
            report.tombstones = tombstones
                .iter()
                .map(|entry| entry.id)
                .filter(|id| !report.removed.contains(id))
                .collect();
        }
        metrics::counter!("chorus_truncated_segments_total").increment(report.removed.len() as u64);
        Ok(report)
    }

    /// Deletes a tombstone's sealed object and leftover fragments on every
    /// replica; `None` if some replica failed.
    async fn delete_everywhere(
        &self,
        entry: &DirectoryEntry,
        progress: &dyn Progress,
    ) -> Option<usize> {
        let key = sealed_key(entry.id, entry.crc32c);
        let mut deleted = 0;
        let mut complete = true;
        for replica in &self.replicas {
            let outcome = async {
                replica.store.delete(&key).await?;
                delete_fragments(replica, entry.id).await
            }
            .await;
            match outcome {
                Ok(fragments) => deleted += 1 + fragments,
                Err(error) => {
                    failed("truncate", &format!("{replica:?}: {key}: {error}"));
                    complete = false;
                }
            }
            progress.advance(1);
        }
        complete.then_some(deleted)
    }
}
