//! Verify (scrub): read every object of every replica, check every checksum
//! and the directory's chain, and report per replica.

use serde::Serialize;

use super::classify::{ObjectClass, classify};
use super::repair::retained_entries;
use super::{Maintenance, Progress};
use crate::ids::SegmentId;
use crate::log::error::LogError;
use crate::log::layout::{SEALED_PREFIX, SEGMENTS_PREFIX, fragment_key};
use crate::log::replica::{Replica, SealedCopy};
use crate::register::Manifest;

/// The state of one checked object on one replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ObjectState {
    /// Present and valid.
    Healthy,
    /// Named by the register but absent.
    Missing,
    /// Present but failing its checksum or its directory entry.
    Corrupt,
    /// Belongs to nothing live (the sweep deletes it).
    Orphan,
}

/// What verify found on one replica.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplicaReport {
    /// Position in the replica list.
    pub position: usize,
    /// The store's name.
    pub store: String,
    /// Valid sealed copies and active fragments.
    pub healthy: usize,
    /// Missing sealed copies, by key.
    pub missing: Vec<String>,
    /// Damaged objects, by key, with why.
    pub corrupt: Vec<String>,
    /// Orphans, by key.
    pub orphans: Vec<String>,
    /// Fences (kept forever; not a problem).
    pub fences: usize,
    /// Objects of tombstones awaiting deletion (not a problem).
    pub tombstones: usize,
    /// Objects that could not be read, with why.
    pub errors: Vec<String>,
}

impl ReplicaReport {
    /// Whether anything on this replica needs attention (orphans do not: they
    /// are garbage, not damage).
    pub fn has_problems(&self) -> bool {
        !(self.missing.is_empty() && self.corrupt.is_empty() && self.errors.is_empty())
    }
}

/// What verify found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifyReport {
    /// Sealed segments the directory retains.
    pub sealed_segments: usize,
    /// Per replica.
    pub replicas: Vec<ReplicaReport>,
}

impl VerifyReport {
    /// Whether every replica is free of missing, corrupt or unreadable objects.
    pub fn is_healthy(&self) -> bool {
        self.replicas.iter().all(|r| !r.has_problems())
    }
}

impl Maintenance {
    /// Reads and checks every object of every replica. The register itself is
    /// validated on read (its chain invariants); each sealed copy must hold
    /// exactly its directory entry's records.
    pub async fn verify(&self, progress: &dyn Progress) -> Result<VerifyReport, LogError> {
        let manifest = self.manifest().await?;
        let retained = retained_entries(&manifest);
        let mut report = VerifyReport {
            sealed_segments: retained.len(),
            replicas: Vec::new(),
        };
        progress.begin(
            "verifying replicas",
            (self.replicas.len() * (retained.len() + 1)) as u64,
        );
        for replica in &self.replicas {
            let mut replica_report = ReplicaReport {
                position: replica.position,
                store: replica.store.name().to_owned(),
                ..ReplicaReport::default()
            };
            for (entry, end) in &retained {
                let key = crate::log::layout::sealed_key(entry.id, entry.crc32c);
                match replica.inspect_sealed(entry, *end).await {
                    Ok(SealedCopy::Healthy(_)) => replica_report.healthy += 1,
                    Ok(SealedCopy::Missing) => replica_report.missing.push(key),
                    Ok(SealedCopy::Corrupt { detail, .. }) => {
                        replica_report.corrupt.push(format!("{key}: {detail}"))
                    }
                    Err(error) => replica_report.errors.push(format!("{key}: {error}")),
                }
                progress.advance(1);
            }
            check_active(replica, &manifest, &mut replica_report).await;
            check_listing(replica, &manifest, &mut replica_report).await;
            progress.advance(1);
            report.replicas.push(replica_report);
        }
        progress.end();
        Ok(report)
    }
}

/// Every fragment of the tail and pending segments must decode.
async fn check_active(replica: &Replica, manifest: &Manifest, report: &mut ReplicaReport) {
    let segments: Vec<SegmentId> = std::iter::once(manifest.tail)
        .chain(manifest.pending)
        .collect();
    for segment in segments {
        let present = match replica.list_fragments(segment).await {
            Ok(present) => present,
            Err(error) => {
                report.errors.push(format!("listing {segment}: {error}"));
                continue;
            }
        };
        for index in present {
            let key = fragment_key(segment, index);
            match replica.read_fragment(segment, index).await {
                Ok(Some(Ok(fragment))) if fragment.is_fence() => report.fences += 1,
                Ok(Some(Ok(_))) => report.healthy += 1,
                Ok(Some(Err(error))) => report.corrupt.push(format!("{key}: {error}")),
                Ok(None) => {}
                Err(error) => report.errors.push(format!("{key}: {error}")),
            }
        }
    }
}

/// Classifies everything else under the log prefixes.
async fn check_listing(replica: &Replica, manifest: &Manifest, report: &mut ReplicaReport) {
    for prefix in [SEGMENTS_PREFIX, SEALED_PREFIX] {
        let listed = match replica.store.list(prefix).await {
            Ok(listed) => listed,
            Err(error) => {
                report.errors.push(format!("listing {prefix}: {error}"));
                continue;
            }
        };
        for meta in listed {
            match classify(manifest, &meta.key, meta.size) {
                ObjectClass::Orphan => report.orphans.push(meta.key),
                ObjectClass::Fence => report.fences += 1,
                ObjectClass::Tombstone => report.tombstones += 1,
                ObjectClass::Active | ObjectClass::Sealed | ObjectClass::Foreign => {}
            }
        }
    }
}
