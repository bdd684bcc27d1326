//! The register's invariants (listed in docs/overview.md, The manifest
//! register), as one pure function checked on every decode and before every
//! write.

use super::manifest::directory_bytes;
use super::{Manifest, ManifestError};
use crate::ids::{Epoch, OwnerId, RecordIndex, SegmentId};

/// Largest accepted per-replica fragment window.
pub const MAX_WINDOW: u32 = 64;

/// The window of new logs (`chorus log init`, `chorus serve`'s first start).
/// With paced cuts a record waits about round trip / (2 × window) for a
/// slot: 16 brings a 3-replica log's median within 1.03–1.045× of one store
/// request per record from 1,000 to 30,000 records/s on 10 ms replicas,
/// where 8 gave 1.04–1.10× (and 8 had given 14 % more closed-loop appends/s
/// than 4). Under heavy-tailed latency more, smaller fragments in flight
/// cost about a millisecond of median (acknowledgements are in order).
/// Recovery fences up to `window` positions per replica, so it also bounds
/// that work. A log keeps the window it was created with.
pub const DEFAULT_WINDOW: u32 = 16;

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

#[cfg(test)]
mod tests {
    //! One case per invariant: each violation is refused by `validate` (and so
    //! by encoding) with an error naming the offending field.

    use super::*;
    use crate::register::manifest::tests::{assert_field, entry, replicas, rich, seg};
    use crate::register::{DirectoryEntry, Seal, SealDigest};

    /// Asserts `manifest` violates an invariant about `field`, both when
    /// validated and when encoded for a write.
    #[track_caller]
    fn refused(manifest: &Manifest, field: &str) -> String {
        assert_field(manifest.to_fields(), field);
        assert_field(validate(manifest), field).to_string()
    }

    fn with(change: impl FnOnce(&mut Manifest)) -> Manifest {
        let mut manifest = rich();
        change(&mut manifest);
        manifest
    }

    fn initial_with(change: impl FnOnce(&mut Manifest)) -> Manifest {
        let mut manifest = Manifest::initial(replicas(3), 4);
        change(&mut manifest);
        manifest
    }

    #[test]
    fn fixtures_are_valid() {
        validate(&rich()).unwrap();
        for n in [1, 3, 5] {
            validate(&Manifest::initial(replicas(n), 1)).unwrap();
            validate(&Manifest::initial(replicas(n), MAX_WINDOW)).unwrap();
        }
    }

    #[test]
    fn replica_count_must_be_one_three_or_five() {
        for n in [0, 2, 4, 6, 7] {
            let message = refused(&with(|m| m.replicas = replicas(n)), "chorus.replicas");
            assert!(message.contains(&format!("{n} replicas")), "{message}");
        }
    }

    #[test]
    fn duplicate_replica_is_refused() {
        let mut list = replicas(3);
        list[2] = list[0].clone();
        let message = refused(&with(|m| m.replicas = list), "chorus.replicas");
        assert!(message.contains("listed twice"), "{message}");
        let mut list = replicas(5);
        list[4] = list[3].clone();
        refused(&with(|m| m.replicas = list), "chorus.replicas");
    }

    #[test]
    fn empty_replica_identity_is_refused() {
        let mut list = replicas(3);
        list[1] = String::new();
        let message = refused(&with(|m| m.replicas = list), "chorus.replicas");
        assert!(message.contains("replica 1 is empty"), "{message}");
    }

    #[test]
    fn window_must_be_within_bounds() {
        for window in [0, MAX_WINDOW + 1, u32::MAX] {
            let message = refused(&with(|m| m.window = window), "chorus.window");
            assert!(message.contains(&window.to_string()), "{message}");
        }
        assert_eq!(MAX_WINDOW, 64);
        validate(&with(|m| m.window = 1)).unwrap();
        validate(&with(|m| m.window = 64)).unwrap();
    }

    #[test]
    fn owner_without_epoch_is_refused() {
        let message = refused(&initial_with(|m| m.owner = OwnerId(1)), "chorus.owner");
        assert!(message.contains("epoch is 0"), "{message}");
    }

    #[test]
    fn epoch_without_owner_is_refused() {
        let message = refused(&with(|m| m.owner = OwnerId::NONE), "chorus.owner");
        assert!(message.contains("missing for epoch 7"), "{message}");
        refused(&initial_with(|m| m.epoch = Epoch(1)), "chorus.owner");
    }

    #[test]
    fn tail_named_by_an_ungranted_epoch_is_refused() {
        refused(&with(|m| m.tail = seg(8, 0)), "chorus.tail_id");
        refused(&initial_with(|m| m.tail = seg(1, 0)), "chorus.tail_id");
    }

    #[test]
    fn pending_named_by_an_ungranted_epoch_is_refused() {
        refused(&with(|m| m.pending = Some(seg(8, 0))), "chorus.pending_id");
        refused(
            &initial_with(|m| m.pending = Some(seg(1, 0))),
            "chorus.pending_id",
        );
    }

    #[test]
    fn pending_must_sort_after_the_tail() {
        let message = refused(&with(|m| m.pending = Some(m.tail)), "chorus.pending_id");
        assert!(message.contains("does not sort after tail"), "{message}");
        refused(&with(|m| m.pending = Some(seg(7, 0))), "chorus.pending_id");
        refused(&with(|m| m.pending = Some(seg(6, 9))), "chorus.pending_id");
        validate(&with(|m| m.pending = None)).unwrap();
    }

    #[test]
    fn tail_must_sort_after_the_directory() {
        // The tail may not be (or precede) a sealed segment.
        let message = refused(&with(|m| m.tail = seg(7, 0)), "chorus.tail_id");
        assert!(message.contains("directory entry"), "{message}");
        refused(
            &with(|m| {
                m.tail = seg(3, 5);
                m.pending = Some(seg(7, 1));
            }),
            "chorus.tail_id",
        );
    }

    #[test]
    fn directory_bases_must_strictly_increase() {
        let message = refused(
            &with(|m| m.segments[1].base = RecordIndex(0)),
            "chorus.segments",
        );
        assert!(message.contains("base of entry 1"), "{message}");
        refused(
            &with(|m| {
                m.segments[2].base = RecordIndex(90);
                m.seal.as_mut().unwrap().base = RecordIndex(90);
            }),
            "chorus.segments",
        );
    }

    #[test]
    fn directory_ids_must_strictly_increase() {
        let message = refused(&with(|m| m.segments[1].id = seg(2, 0)), "chorus.segments");
        assert!(message.contains("id of entry 1"), "{message}");
        refused(&with(|m| m.segments[1].id = seg(1, 9)), "chorus.segments");
    }

    #[test]
    fn last_directory_base_must_be_below_tail_base() {
        let message = refused(&with(|m| m.tail_base = RecordIndex(250)), "chorus.segments");
        assert!(message.contains("not below tail_base"), "{message}");
        refused(&with(|m| m.tail_base = RecordIndex(200)), "chorus.segments");
    }

    #[test]
    fn seal_must_match_the_last_entry() {
        let message = refused(
            &with(|m| m.seal.as_mut().unwrap().id = seg(3, 5)),
            "chorus.seal_id",
        );
        assert!(message.contains("last entry"), "{message}");
        refused(
            &with(|m| m.seal.as_mut().unwrap().base = RecordIndex(100)),
            "chorus.seal_id",
        );
        refused(
            &with(|m| m.seal.as_mut().unwrap().base = RecordIndex(251)),
            "chorus.seal_id",
        );
    }

    #[test]
    fn seal_without_directory_is_refused() {
        let seal = Seal {
            id: seg(0, 0),
            base: RecordIndex(0),
            digest: SealDigest::Blake3([1; 32]),
        };
        let message = refused(&initial_with(|m| m.seal = Some(seal)), "chorus.seal_id");
        assert!(message.contains("directory is empty"), "{message}");
    }

    #[test]
    fn directory_without_seal_is_refused() {
        let message = refused(&with(|m| m.seal = None), "chorus.seal_id");
        assert!(message.contains("directory is not"), "{message}");
    }

    #[test]
    fn trunc_below_the_lowest_retained_index_is_refused() {
        // With a directory, the lowest retained index is the first entry's base.
        let low = with(|m| {
            m.segments.remove(0);
            m.trunc = RecordIndex(99);
        });
        let message = refused(&low, "chorus.trunc");
        assert!(message.contains("lowest retained index 100"), "{message}");
        // Without one, it is tail_base.
        refused(
            &initial_with(|m| {
                m.tail_base = RecordIndex(10);
                m.trunc = RecordIndex(9);
            }),
            "chorus.trunc",
        );
        // At the lowest retained index, and anywhere above it, is fine.
        validate(&with(|m| {
            m.segments.remove(0);
            m.trunc = RecordIndex(100);
        }))
        .unwrap();
        validate(&with(|m| m.trunc = RecordIndex(u64::MAX))).unwrap();
    }

    #[test]
    fn directory_over_capacity_is_refused() {
        let manifest = rich();
        let bytes = manifest.to_fields().unwrap()["chorus.segments"].len();
        check_directory_capacity(&manifest, bytes).unwrap();
        check_directory_capacity(&manifest, usize::MAX).unwrap();
        let error = assert_field(
            check_directory_capacity(&manifest, bytes - 1),
            "chorus.segments",
        );
        let message = error.to_string();
        assert!(
            message.contains(&format!("directory of {bytes} bytes")),
            "{message}"
        );
        assert!(
            message.contains(&format!("capacity of {}", bytes - 1)),
            "{message}"
        );
        // An empty directory fits any capacity.
        check_directory_capacity(&Manifest::initial(replicas(1), 1), 0).unwrap();
        let one: Vec<DirectoryEntry> = vec![entry(seg(0, 0), 0, 0)];
        let sealed = Manifest {
            seal: Some(Seal {
                id: one[0].id,
                base: one[0].base,
                digest: SealDigest::Blake3([0; 32]),
            }),
            segments: one,
            tail: seg(0, 1),
            pending: Some(seg(0, 2)),
            tail_base: RecordIndex(1),
            ..Manifest::initial(replicas(1), 1)
        };
        validate(&sealed).unwrap();
        assert_field(check_directory_capacity(&sealed, 0), "chorus.segments");
    }

    #[test]
    fn binding_accepts_exactly_the_bound_list() {
        for n in [1, 3, 5] {
            check_binding(&replicas(n), &replicas(n)).unwrap();
        }
    }

    #[test]
    fn binding_refuses_another_count() {
        let error = assert_field(check_binding(&replicas(3), &replicas(5)), "chorus.replicas");
        let message = error.to_string();
        assert!(
            message.contains("bound to 3 replicas but 5 were given"),
            "{message}"
        );
        assert_field(check_binding(&replicas(3), &replicas(1)), "chorus.replicas");
    }

    #[test]
    fn binding_refuses_another_order_or_identity() {
        let bound = replicas(3);
        let mut swapped = bound.clone();
        swapped.swap(0, 1);
        let message = assert_field(check_binding(&bound, &swapped), "chorus.replicas").to_string();
        assert!(message.contains("replica 0 is bound to"), "{message}");
        let mut renamed = bound.clone();
        renamed[2] = "s3://elsewhere/log".to_owned();
        let message = assert_field(check_binding(&bound, &renamed), "chorus.replicas").to_string();
        assert!(message.contains("replica 2"), "{message}");
        assert!(message.contains("s3://elsewhere/log"), "{message}");
    }

    #[test]
    fn binding_refuses_an_invalid_given_list() {
        let bound = replicas(3);
        let mut duplicated = bound.clone();
        duplicated[1] = duplicated[0].clone();
        let message =
            assert_field(check_binding(&bound, &duplicated), "chorus.replicas").to_string();
        assert!(message.contains("listed twice"), "{message}");
        assert_field(check_binding(&bound, &replicas(2)), "chorus.replicas");
        assert_field(check_binding(&bound, &[]), "chorus.replicas");
    }
}
