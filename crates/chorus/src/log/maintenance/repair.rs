//! Repair: every sealed segment present and checksum-valid on every replica.
//! A missing copy is created and a damaged one replaced (by CAS on the damaged
//! object's version: the only overwrite the protocol allows) from a healthy
//! replica's bytes.

use bytes::Bytes;

use super::{Maintenance, Progress, failed};
use crate::blob::BlobError;
use crate::log::error::LogError;
use crate::log::layout::sealed_key;
use crate::log::replica::{Replica, SealedCopy};
use crate::register::{DirectoryEntry, Manifest};

/// What a repair pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepairReport {
    /// Sealed copies checked.
    pub checked: usize,
    /// Missing copies created.
    pub restored: usize,
    /// Damaged copies replaced.
    pub replaced: usize,
    /// Copies that could not be checked or repaired, with why.
    pub failures: Vec<String>,
}

impl Maintenance {
    /// Checks every retained sealed segment on every replica and heals what is
    /// missing or damaged. Failures are reported, not returned: a later pass
    /// retries them.
    pub async fn repair(&self, progress: &dyn Progress) -> Result<RepairReport, LogError> {
        let manifest = self.manifest().await?;
        let mut report = RepairReport::default();
        let retained = retained_entries(&manifest);
        progress.begin(
            "repairing sealed segments",
            (retained.len() * self.replicas.len()) as u64,
        );
        for (entry, end) in retained {
            self.repair_entry(&entry, end, &mut report, progress).await;
        }
        progress.end();
        metrics::counter!("chorus_repair_restored_total").increment(report.restored as u64);
        metrics::counter!("chorus_repair_replaced_total").increment(report.replaced as u64);
        Ok(report)
    }

    async fn repair_entry(
        &self,
        entry: &DirectoryEntry,
        end: crate::ids::RecordIndex,
        report: &mut RepairReport,
        progress: &dyn Progress,
    ) {
        let mut copies = Vec::with_capacity(self.replicas.len());
        for replica in &self.replicas {
            copies.push(replica.inspect_sealed(entry, end).await);
        }
        let healthy = copies.iter().find_map(|copy| match copy {
            Ok(SealedCopy::Healthy(bytes)) => Some(bytes.clone()),
            _ => None,
        });
        let needs_writes = copies
            .iter()
            .any(|copy| !matches!(copy, Ok(SealedCopy::Healthy(_))));
        // A truncation may have raised the floor past this entry since the
        // pass read the register; healing it then would re-create a copy
        // the truncation deletes.
        if needs_writes && !self.still_retained(entry).await {
            progress.advance(copies.len() as u64);
            return;
        }
        let mut restored = Vec::new();
        for (replica, copy) in self.replicas.iter().zip(copies) {
            progress.advance(1);
            report.checked += 1;
            let outcome = match (copy, &healthy) {
                (Ok(SealedCopy::Healthy(_)), _) => continue,
                (Err(error), _) => Err(error.to_string()),
                (Ok(_), None) => Err(format!("no replica has a healthy copy of {}", entry.id)),
                (Ok(SealedCopy::Missing), Some(bytes)) => restore(replica, entry, bytes.clone())
                    .await
                    .map(|()| restored.push(replica)),
                (Ok(SealedCopy::Corrupt { version, detail }), Some(bytes)) => {
                    tracing::warn!(?replica, segment = %entry.id, %detail, "replacing damaged sealed copy");
                    replace(replica, entry, &version, bytes.clone())
                        .await
                        .map(|()| report.replaced += 1)
                }
            };
            if let Err(error) = outcome {
                failed(
                    "repair",
                    &format!("{replica:?}: segment {}: {error}", entry.id),
                );
                report.failures.push(format!(
                    "replica {}: segment {}: {error}",
                    replica.position, entry.id
                ));
            }
        }
        // A truncation that raised the floor after the check above deletes
        // what it finds, but may have passed a replica before our copy
        // landed: take back what nobody will name or delete again.
        if !restored.is_empty() && !self.still_retained(entry).await {
            for replica in restored {
                let key = sealed_key(entry.id, entry.crc32c);
                if let Err(error) = replica.store.delete(&key).await {
                    failed("repair", &format!("{replica:?}: {key}: {error}"));
                }
            }
            return;
        }
        report.restored += restored.len();
    }

    /// Whether `entry` is still in the directory above the floor. An
    /// unreadable register counts as retained: the write is the safe side,
    /// since a copy of a retained entry is never wrong.
    async fn still_retained(&self, entry: &DirectoryEntry) -> bool {
        match self.manifest().await {
            Ok(manifest) => retained_entries(&manifest)
                .iter()
                .any(|(retained, _)| retained == entry),
            Err(_) => true,
        }
    }
}

/// Directory entries still above the floor, with their ends.
pub(super) fn retained_entries(
    manifest: &Manifest,
) -> Vec<(DirectoryEntry, crate::ids::RecordIndex)> {
    manifest
        .segments
        .iter()
        .enumerate()
        .filter(|(position, _)| !manifest.is_tombstone(*position))
        .map(|(position, entry)| (*entry, manifest.entry_end(position)))
        .collect()
}

async fn restore(replica: &Replica, entry: &DirectoryEntry, bytes: Bytes) -> Result<(), String> {
    replica
        .write_sealed(entry, bytes.into())
        .await
        .map_err(|error| format!("{error:?}"))
}

async fn replace(
    replica: &Replica,
    entry: &DirectoryEntry,
    damaged: &crate::blob::Version,
    bytes: Bytes,
) -> Result<(), String> {
    let key = sealed_key(entry.id, entry.crc32c);
    match replica.store.update(&key, damaged, bytes).await {
        Ok(_) => Ok(()),
        // Someone else replaced (or deleted) it first; the next pass re-checks.
        Err(BlobError::Conflict { .. }) => Ok(()),
        Err(error) => Err(error.to_string()),
    }
}
