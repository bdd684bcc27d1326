//! Verify (scrub): read every object of every replica, check every checksum
//! and the directory's chain, and report per replica.

use std::collections::BTreeMap;

use serde::Serialize;

use super::classify::{ObjectClass, classify};
use super::repair::retained_entries;
use super::{Maintenance, Progress};
use crate::codec::Fragment;
use crate::ids::{FragmentIndex, SegmentId};
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
    /// Active-segment fragments another replica holds and this one lacks,
    /// by key, with their record range.
    pub missing_fragments: Vec<String>,
}

impl ReplicaReport {
    /// Whether anything on this replica is missing from the directory,
    /// damaged or unreadable: what repair heals (orphans are garbage, not
    /// damage).
    pub fn has_problems(&self) -> bool {
        !(self.missing.is_empty() && self.corrupt.is_empty() && self.errors.is_empty())
    }

    /// Whether this replica lacks active-segment fragments a peer holds:
    /// under-replicated, which repair does not heal (the next rotation or
    /// recovery seals what a quorum holds onto every replica).
    pub fn lacks_fragments(&self) -> bool {
        !self.missing_fragments.is_empty()
    }
}

/// What verify found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifyReport {
    /// Sealed segments the directory retains.
    pub sealed_segments: usize,
    /// Per replica.
    pub replicas: Vec<ReplicaReport>,
    /// Runs of active-segment records held by fewer replicas than a quorum.
    pub below_quorum: Vec<BelowQuorum>,
}

/// Records in the active segments that fewer than a quorum of replicas hold.
/// The next recovery cannot tell them from a write that was never
/// acknowledged, and does not keep them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BelowQuorum {
    /// The segment.
    pub segment: String,
    /// The first record of the run.
    pub first_record: u64,
    /// The last record of the run (inclusive).
    pub last_record: u64,
    /// Replicas holding them.
    pub copies: usize,
    /// Replicas in all.
    pub replicas: usize,
}

impl std::fmt::Display for BelowQuorum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "records {}-{} of segment {} on {} of {} replicas: fewer than a quorum, \
             the next recovery will not keep them",
            self.first_record, self.last_record, self.segment, self.copies, self.replicas
        )
    }
}

impl VerifyReport {
    /// Whether every replica is free of missing, corrupt or unreadable
    /// objects, and every active record is held by a quorum.
    pub fn is_healthy(&self) -> bool {
        self.replicas
            .iter()
            .all(|r| !r.has_problems() && !r.lacks_fragments())
            && self.below_quorum.is_empty()
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
            below_quorum: Vec::new(),
        };
        progress.begin(
            "verifying replicas",
            (self.replicas.len() * (retained.len() + 1)) as u64,
        );
        let mut actives = Vec::new();
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
            let active = check_active(replica, &manifest, &mut replica_report).await;
            check_listing(replica, &manifest, &mut replica_report).await;
            progress.advance(1);
            report.replicas.push(replica_report);
            actives.push(active);
        }
        compare_active(&actives, &mut report);
        progress.end();
        Ok(report)
    }
}

/// What one replica holds at one position of an active segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// A data fragment with these records (first, count).
    Data(u64, u64),
    /// A fence, a damaged copy or one that could not be read.
    Other,
}

/// The positions one replica holds in the active segments.
type Active = BTreeMap<(SegmentId, u64), Held>;

/// Every fragment of the tail and pending segments must decode; returns what
/// the replica holds there, for [`compare_active`].
async fn check_active(
    replica: &Replica,
    manifest: &Manifest,
    report: &mut ReplicaReport,
) -> Active {
    let segments: Vec<SegmentId> = std::iter::once(manifest.tail)
        .chain(manifest.pending)
        .collect();
    let mut active = Active::new();
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
            let held = match replica.read_fragment(segment, index).await {
                Ok(Some(Ok(fragment))) if fragment.is_fence() => {
                    report.fences += 1;
                    Held::Other
                }
                Ok(Some(Ok(Fragment::Data { first, records, .. }))) => {
                    report.healthy += 1;
                    Held::Data(first.0, records.len() as u64)
                }
                Ok(Some(Ok(Fragment::Fence { .. }))) => Held::Other,
                Ok(Some(Err(error))) => {
                    report.corrupt.push(format!("{key}: {error}"));
                    Held::Other
                }
                Ok(None) => continue,
                Err(error) => {
                    report.errors.push(format!("{key}: {error}"));
                    Held::Other
                }
            };
            active.insert((segment, index.0), held);
        }
    }
    active
}

/// Compares the replicas' active segments: a data fragment one replica holds
/// and another has nothing at is missing there, and records that fewer than
/// a quorum hold are reported in runs. (A writer's newest fragments are in
/// flight while it runs, so verify beside a live writer may report them.)
fn compare_active(actives: &[Active], report: &mut VerifyReport) {
    let replicas = actives.len();
    let needed = crate::log::quorum::quorum(replicas);
    let mut positions: BTreeMap<(SegmentId, u64), (u64, u64, usize)> = BTreeMap::new();
    for active in actives {
        for (position, held) in active {
            if let Held::Data(first, count) = held {
                positions.entry(*position).or_insert((*first, *count, 0)).2 += 1;
            }
        }
    }
    for (position, (first, count, copies)) in &positions {
        let last = first + count.saturating_sub(1);
        for (active, replica) in actives.iter().zip(&mut report.replicas) {
            if !active.contains_key(position) {
                let key = fragment_key(position.0, FragmentIndex(position.1));
                let detail =
                    format!("{key} (records {first}-{last}, on {copies} of {replicas} replicas)");
                replica.missing_fragments.push(detail);
            }
        }
        if *copies >= needed {
            continue;
        }
        match report.below_quorum.last_mut() {
            Some(run)
                if run.segment == position.0.to_string()
                    && run.copies == *copies
                    && run.last_record + 1 == *first =>
            {
                run.last_record = last;
            }
            _ => report.below_quorum.push(BelowQuorum {
                segment: position.0.to_string(),
                first_record: *first,
                last_record: last,
                copies: *copies,
                replicas,
            }),
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
