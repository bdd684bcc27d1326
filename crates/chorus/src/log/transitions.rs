//! The register transitions of the log, as pure functions from the current
//! record to a [`Step`] (docs/overview.md, The manifest register). Each first
//! asks "is this already applied?", so the CAS loop can re-run it after a lost
//! response. Writer-owned transitions refuse with [`Fenced`] once a newer epoch
//! exists.

use crate::ids::{Epoch, OwnerId, RecordIndex, SegmentId};
use crate::register::{DirectoryEntry, Manifest, Seal, SealDigest, Step};

/// A newer writer holds the register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("fenced: epoch={ours} superseded by epoch={current}")]
pub struct Fenced {
    /// Our epoch.
    pub ours: Epoch,
    /// The register's epoch.
    pub current: Epoch,
}

/// The identity a writer holds the register with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ownership {
    /// The claimed epoch.
    pub epoch: Epoch,
    /// This incarnation's id.
    pub owner: OwnerId,
}

impl Ownership {
    /// `Ok` iff the register is still ours.
    pub fn check(&self, current: &Manifest) -> Result<(), Fenced> {
        if current.epoch == self.epoch && current.owner == self.owner {
            Ok(())
        } else {
            Err(Fenced {
                ours: self.epoch,
                current: current.epoch,
            })
        }
    }
}

/// A segment sealed into the directory, with its seal digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealedEntry {
    /// The directory entry.
    pub entry: DirectoryEntry,
    /// The sealed object's digest.
    pub digest: SealDigest,
}

impl SealedEntry {
    fn seal(&self) -> Seal {
        Seal {
            id: self.entry.id,
            base: self.entry.base,
            digest: self.digest,
        }
    }
}

/// Claims the next epoch for `owner` (a fresh random id, so "already applied"
/// means "the register names our owner").
pub fn claim(current: &Manifest, owner: OwnerId) -> Result<Step, EpochExhausted> {
    if current.owner == owner {
        return Ok(Step::Done);
    }
    let mut next = current.clone();
    next.epoch = current.epoch.next().ok_or(EpochExhausted)?;
    next.owner = owner;
    Ok(Step::Write(next))
}

/// No epoch is left to claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("epoch space exhausted")]
pub struct EpochExhausted;

/// What a recovery commits: the segments it sealed, and the fresh tail and
/// pending segments of its epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    /// The tail and pending segment ids that recovery read (and fenced).
    pub recovered_from: (SegmentId, Option<SegmentId>),
    /// Sealed candidates, in base order (zero, one or two).
    pub sealed: Vec<SealedEntry>,
    /// The new active segment.
    pub tail: SegmentId,
    /// Its successor.
    pub pending: SegmentId,
    /// The recovered end: the new tail's first index.
    pub tail_base: RecordIndex,
}

/// Commits a recovery view, guarded by our epoch.
pub fn commit_view(current: &Manifest, ours: Ownership, view: &View) -> Result<Step, Fenced> {
    ours.check(current)?;
    if current.tail == view.tail {
        return Ok(Step::Done);
    }
    assert_eq!(
        (current.tail, current.pending),
        view.recovered_from,
        "the register changed under a recovery that holds the epoch"
    );
    let mut next = current.clone();
    for sealed in &view.sealed {
        next.segments.push(sealed.entry);
        next.seal = Some(sealed.seal());
    }
    next.tail = view.tail;
    next.pending = Some(view.pending);
    next.tail_base = view.tail_base;
    Ok(Step::Write(next))
}

/// Folds the sealed former tail into the directory, makes the pending segment
/// (already active in memory) the tail, and registers a fresh pending id.
pub fn fold(
    current: &Manifest,
    ours: Ownership,
    sealed: SealedEntry,
    new_tail_base: RecordIndex,
    new_pending: SegmentId,
) -> Result<Step, Fenced> {
    ours.check(current)?;
    // Only we move the tail while we hold the epoch: if it is no longer the
    // segment we sealed, our fold applied (even if maintenance has since
    // removed its directory entry).
    if current.tail != sealed.entry.id {
        return Ok(Step::Done);
    }
    let new_tail = current
        .pending
        .expect("a writer rotates only into a registered pending segment");
    let mut next = current.clone();
    next.segments.push(sealed.entry);
    next.seal = Some(sealed.seal());
    next.tail = new_tail;
    next.tail_base = new_tail_base;
    next.pending = Some(new_pending);
    Ok(Step::Write(next))
}

/// Asked for a floor below the committed one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("truncation floor may only rise: requested={requested} committed={committed}")]
pub struct LowerFloor {
    /// The floor asked for.
    pub requested: RecordIndex,
    /// The committed floor.
    pub committed: RecordIndex,
}

/// Raises the truncation floor to `floor` (monotonic; no epoch check, so
/// maintenance can run beside a live writer). Already applied if the floor is
/// there; a lower floor than the committed one is an error.
pub fn raise_trunc(current: &Manifest, floor: RecordIndex) -> Result<Step, LowerFloor> {
    if floor < current.trunc {
        return Err(LowerFloor {
            requested: floor,
            committed: current.trunc,
        });
    }
    if floor == current.trunc {
        return Ok(Step::Done);
    }
    let mut next = current.clone();
    next.trunc = floor;
    Ok(Step::Write(next))
}

/// Removes the directory entries `removed` (tombstones whose objects are gone
/// from every replica), but only as a leading run: each entry ends where the
/// next begins, so dropping one from the middle would silently stretch the
/// range of the tombstone before it. An entry behind a tombstone that still
/// has objects waits for a later pass. Entries above the floor are never
/// removed; the seal fields follow the new last entry, or clear with the
/// directory.
pub fn remove_entries(current: &Manifest, removed: &[SegmentId]) -> Step {
    let leading = current
        .segments
        .iter()
        .enumerate()
        .take_while(|(position, entry)| {
            removed.contains(&entry.id) && current.is_tombstone(*position)
        })
        .count();
    if leading == 0 {
        return Step::Done;
    }
    let mut next = current.clone();
    next.segments.drain(..leading);
    if next.segments.is_empty() {
        next.seal = None;
    }
    // Entries are only removed from the front, so a non-empty directory keeps
    // its last entry and its seal.
    Step::Write(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::register::validate;

    fn manifest() -> Manifest {
        Manifest::initial(vec!["a".into(), "b".into(), "c".into()], 4)
    }

    fn claimed(owner: OwnerId) -> Manifest {
        match claim(&manifest(), owner).unwrap() {
            Step::Write(next) => next,
            Step::Done => panic!("fresh claim applied"),
        }
    }

    #[test]
    fn claim_takes_the_next_epoch_once() {
        let owner = OwnerId(7);
        let next = claimed(owner);
        assert_eq!((next.epoch, next.owner), (Epoch(1), owner));
        validate(&next).unwrap();
        assert_eq!(claim(&next, owner).unwrap(), Step::Done);
        let Step::Write(again) = claim(&next, OwnerId(8)).unwrap() else {
            panic!()
        };
        assert_eq!(again.epoch, Epoch(2));
    }

    fn entry(epoch: u64, counter: u32, base: u64) -> SealedEntry {
        SealedEntry {
            entry: DirectoryEntry {
                id: SegmentId::new(Epoch(epoch), counter),
                base: RecordIndex(base),
                crc32c: 0xabcd,
            },
            digest: SealDigest::Blake3([1; 32]),
        }
    }

    #[test]
    fn commit_view_applies_once_and_is_fenced_by_a_newer_epoch() {
        let owner = OwnerId(7);
        let current = claimed(owner);
        let ours = Ownership {
            epoch: Epoch(1),
            owner,
        };
        let view = View {
            recovered_from: (current.tail, current.pending),
            sealed: vec![entry(0, 0, 0), entry(0, 1, 10)],
            tail: SegmentId::new(Epoch(1), 0),
            pending: SegmentId::new(Epoch(1), 1),
            tail_base: RecordIndex(25),
        };
        let Step::Write(next) = commit_view(&current, ours, &view).unwrap() else {
            panic!()
        };
        validate(&next).unwrap();
        assert_eq!(next.segments.len(), 2);
        assert_eq!(next.seal.unwrap().id, SegmentId::new(Epoch(0), 1));
        assert_eq!(commit_view(&next, ours, &view).unwrap(), Step::Done);
        let Step::Write(newer) = claim(&next, OwnerId(9)).unwrap() else {
            panic!()
        };
        assert_eq!(
            commit_view(&newer, ours, &view),
            Err(Fenced {
                ours: Epoch(1),
                current: Epoch(2)
            })
        );
    }

    #[test]
    fn fold_advances_the_tail_once() {
        let owner = OwnerId(7);
        let ours = Ownership {
            epoch: Epoch(1),
            owner,
        };
        let mut current = claimed(owner);
        current.tail = SegmentId::new(Epoch(1), 0);
        current.pending = Some(SegmentId::new(Epoch(1), 1));
        let sealed = entry(1, 0, 0);
        let new_pending = SegmentId::new(Epoch(1), 2);
        let Step::Write(next) = fold(&current, ours, sealed, RecordIndex(40), new_pending).unwrap()
        else {
            panic!()
        };
        validate(&next).unwrap();
        assert_eq!(next.tail, SegmentId::new(Epoch(1), 1));
        assert_eq!(next.pending, Some(new_pending));
        assert_eq!(next.tail_base, RecordIndex(40));
        assert_eq!(
            fold(&next, ours, sealed, RecordIndex(40), new_pending).unwrap(),
            Step::Done
        );
        let stale = Ownership {
            epoch: Epoch(1),
            owner: OwnerId(1),
        };
        assert!(fold(&current, stale, sealed, RecordIndex(40), new_pending).is_err());
    }

    fn with_directory() -> Manifest {
        let owner = OwnerId(7);
        let mut m = claimed(owner);
        m.segments = vec![entry(0, 0, 0).entry, entry(0, 1, 10).entry];
        m.seal = Some(entry(0, 1, 10).seal());
        m.tail = SegmentId::new(Epoch(1), 0);
        m.pending = Some(SegmentId::new(Epoch(1), 1));
        m.tail_base = RecordIndex(20);
        validate(&m).unwrap();
        m
    }

    #[test]
    fn the_floor_only_rises() {
        let m = with_directory();
        let Step::Write(raised) = raise_trunc(&m, RecordIndex(12)).unwrap() else {
            panic!()
        };
        assert_eq!(raised.trunc, RecordIndex(12));
        validate(&raised).unwrap();
        assert_eq!(raise_trunc(&raised, RecordIndex(12)).unwrap(), Step::Done);
        assert_eq!(
            raise_trunc(&raised, RecordIndex(11)),
            Err(LowerFloor {
                requested: RecordIndex(11),
                committed: RecordIndex(12)
            })
        );
    }

    #[test]
    fn only_tombstones_are_removed_and_the_seal_follows() {
        let m = with_directory();
        let Step::Write(raised) = raise_trunc(&m, RecordIndex(12)).unwrap() else {
            panic!()
        };
        let first = raised.segments[0].id;
        let second = raised.segments[1].id;
        // The second entry [10, 20) still holds retained records.
        let Step::Write(next) = remove_entries(&raised, &[first, second]) else {
            panic!()
        };
        assert_eq!(next.segments.len(), 1);
        assert_eq!(next.seal.unwrap().id, second);
        validate(&next).unwrap();
        assert_eq!(remove_entries(&next, &[first]), Step::Done);
        let Step::Write(all) = raise_trunc(&next, RecordIndex(20)).unwrap() else {
            panic!()
        };
        let Step::Write(empty) = remove_entries(&all, &[second]) else {
            panic!()
        };
        assert!(empty.segments.is_empty() && empty.seal.is_none());
        validate(&empty).unwrap();
    }

    #[test]
    fn tombstones_leave_the_directory_only_from_the_front() {
        let m = with_directory();
        let Step::Write(all) = raise_trunc(&m, RecordIndex(20)).unwrap() else {
            panic!()
        };
        let first = all.segments[0].id;
        let second = all.segments[1].id;
        // The first tombstone still has objects somewhere: removing the second
        // would stretch the first's range over the second's records.
        assert_eq!(remove_entries(&all, &[second]), Step::Done);
        let Step::Write(next) = remove_entries(&all, &[first]) else {
            panic!()
        };
        assert_eq!(next.segments, all.segments[1..]);
        validate(&next).unwrap();
    }
}
