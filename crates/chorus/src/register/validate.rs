//! The register's invariants (DESIGN 3.4), as one pure function checked on
//! every decode and before every write.

use super::manifest::directory_bytes;
use super::{Manifest, ManifestError};
use crate::ids::{Epoch, OwnerId, RecordIndex, SegmentId};

/// Largest accepted per-replica fragment window.
pub const MAX_WINDOW: u32 = 64;

/// Checks every invariant of `manifest`; the error names the first offending field.
pub fn validate(manifest: &Manifest) -> Result<(), ManifestError> {
    validate_replicas(&manifest.replicas)?;
    validate_window(manifest.window)?;
    validate_owner(manifest.epoch, manifest.owner)?;
    validate_segment_ids(manifest)?;
    validate_directory(manifest)?;
    validate_seal(manifest)?;
    validate_trunc(manifest)
}

/// Checks that the encoded directory fits the backend's capacity.
pub fn check_directory_capacity(
    manifest: &Manifest,
    max_bytes: usize,
) -> Result<(), ManifestError> {
    let bytes = directory_bytes(&manifest.segments);
    if bytes > max_bytes {
        return Err(ManifestError::invalid(
            "chorus.segments",
            format!("directory of {bytes} bytes exceeds the register's capacity of {max_bytes}"),
        ));
    }
    Ok(())
}

fn validate_replicas(replicas: &[String]) -> Result<(), ManifestError> {
    let field = "chorus.replicas";
    if ![1, 3, 5].contains(&replicas.len()) {
        return Err(ManifestError::invalid(
            field,
            format!("{} replicas; must be 1, 3 or 5", replicas.len()),
        ));
    }
    for (position, replica) in replicas.iter().enumerate() {
        if replica.is_empty() {
            return Err(ManifestError::invalid(
                field,
                format!("replica {position} is empty"),
            ));
        }
        if replicas[..position].contains(replica) {
            return Err(ManifestError::invalid(
                field,
                format!("replica {position} {replica:?} is listed twice"),
            ));
        }
    }
    Ok(())
}

fn validate_window(window: u32) -> Result<(), ManifestError> {
    if !(1..=MAX_WINDOW).contains(&window) {
        return Err(ManifestError::invalid(
            "chorus.window",
            format!("{window} is outside 1..={MAX_WINDOW}"),
        ));
    }
    Ok(())
}

fn validate_owner(epoch: Epoch, owner: OwnerId) -> Result<(), ManifestError> {
    match (epoch == Epoch::NONE, owner == OwnerId::NONE) {
        (true, false) => Err(ManifestError::invalid(
            "chorus.owner",
            "set while epoch is 0",
        )),
        (false, true) => Err(ManifestError::invalid(
            "chorus.owner",
            format!("missing for epoch {epoch}"),
        )),
        _ => Ok(()),
    }
}

/// Segment ids sort by creation: directory entries, then the tail, then the
/// pending segment, all named by epochs that have been granted.
fn validate_segment_ids(manifest: &Manifest) -> Result<(), ManifestError> {
    let named_by_granted_epoch = |id: SegmentId| id.epoch <= manifest.epoch;
    if !named_by_granted_epoch(manifest.tail) {
        return Err(ManifestError::invalid(
            "chorus.tail_id",
            format!("{} names an epoch above {}", manifest.tail, manifest.epoch),
        ));
    }
    if let Some(pending) = manifest.pending {
        if !named_by_granted_epoch(pending) {
            return Err(ManifestError::invalid(
                "chorus.pending_id",
                format!("{pending} names an epoch above {}", manifest.epoch),
            ));
        }
        if pending <= manifest.tail {
            return Err(ManifestError::invalid(
                "chorus.pending_id",
                format!("{pending} does not sort after tail {}", manifest.tail),
            ));
        }
    }
    if let Some(last) = manifest.segments.last()
        && last.id >= manifest.tail
    {
        return Err(ManifestError::invalid(
            "chorus.tail_id",
            format!(
                "{} does not sort after directory entry {}",
                manifest.tail, last.id
            ),
        ));
    }
    Ok(())
}

/// Bases and ids strictly increase, and every entry ends before `tail_base`
/// (sealed segments are never empty).
fn validate_directory(manifest: &Manifest) -> Result<(), ManifestError> {
    let field = "chorus.segments";
    for (position, pair) in manifest.segments.windows(2).enumerate() {
        if pair[1].base <= pair[0].base {
            return Err(ManifestError::invalid(
                field,
                format!("base of entry {} does not increase", position + 1),
            ));
        }
        if pair[1].id <= pair[0].id {
            return Err(ManifestError::invalid(
                field,
                format!("id of entry {} does not increase", position + 1),
            ));
        }
    }
    if let Some(last) = manifest.segments.last()
        && last.base >= manifest.tail_base
    {
        return Err(ManifestError::invalid(
            field,
            format!(
                "last entry base {} is not below tail_base {}",
                last.base, manifest.tail_base
            ),
        ));
    }
    Ok(())
}

/// The seal fields describe the directory's last entry, and exist iff it does.
fn validate_seal(manifest: &Manifest) -> Result<(), ManifestError> {
    match (manifest.seal, manifest.segments.last()) {
        (None, None) => Ok(()),
        (Some(seal), Some(last)) if seal.id == last.id && seal.base == last.base => Ok(()),
        (Some(_), Some(_)) => Err(ManifestError::invalid(
            "chorus.seal_id",
            "does not match the directory's last entry",
        )),
        (Some(_), None) => Err(ManifestError::invalid(
            "chorus.seal_id",
            "set while the directory is empty",
        )),
        (None, Some(_)) => Err(ManifestError::invalid(
            "chorus.seal_id",
            "empty while the directory is not",
        )),
    }
}

/// Nothing at or above the floor may be missing: the lowest retained index
/// (first entry's base, else `tail_base`) must not exceed `trunc`.
fn validate_trunc(manifest: &Manifest) -> Result<(), ManifestError> {
    let lowest: RecordIndex = manifest
        .segments
        .first()
        .map_or(manifest.tail_base, |first| first.base);
    if lowest > manifest.trunc {
        return Err(ManifestError::invalid(
            "chorus.trunc",
            format!(
                "floor {} is below the lowest retained index {lowest}",
                manifest.trunc
            ),
        ));
    }
    Ok(())
}

/// Checks that the replica list a process was configured with is exactly the
/// one the register is bound to: same count, same order, no duplicates.
pub fn check_binding(bound: &[String], given: &[String]) -> Result<(), ManifestError> {
    let field = "chorus.replicas";
    validate_replicas(given)?;
    if bound.len() != given.len() {
        return Err(ManifestError::invalid(
            field,
            format!(
                "register is bound to {} replicas but {} were given; the replica list cannot change",
                bound.len(),
                given.len()
            ),
        ));
    }
    if let Some(position) = (0..bound.len()).find(|i| bound[*i] != given[*i]) {
        return Err(ManifestError::invalid(
            field,
            format!(
                "replica {position} is bound to {:?} but {:?} was given; the replica list cannot change",
                bound[position], given[position]
            ),
        ));
    }
    Ok(())
}
