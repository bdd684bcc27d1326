//! Rebuilding a lost register from what the replicas hold.
//!
//! Sealed objects are self-describing and content-addressed (segment id,
//! base, records, and the CRC32C in their key); fragments carry their epoch
//! and record indices. From those, [`plan_register`] (pure) rebuilds the
//! directory as the chain of sealed segments, the tail as the unsealed
//! segment whose data continues that chain, and the epoch as the highest
//! any object names. The next writer's recovery then claims a newer epoch,
//! fences the tail and seals it as usual. Anything the evidence cannot
//! settle (two different sealed contents of one segment, a gap in the
//! chain, data that continues nothing) is refused: only the lost register
//! knew which one was committed.

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::blob::{BlobError, DynBlobStore};
use crate::codec::{Fragment, SealedSegment, object_crc32c, parse_sealed_key_name};
use crate::ids::{Epoch, OwnerId, RecordIndex, SegmentId};
use crate::log::layout::{SEALED_PREFIX, SEGMENTS_PREFIX};
use crate::register::{DirectoryEntry, Manifest, Seal, SealDigest};

/// A valid sealed object found on some replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedFound {
    /// Its first record index.
    pub base: RecordIndex,
    /// Its record count.
    pub records: u64,
    /// The object's seal digest.
    pub digest: SealDigest,
    /// Replicas holding a valid copy.
    pub copies: usize,
}

/// The data an unsealed segment's fragments hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActiveFound {
    /// The first record of its lowest data fragment.
    pub first: RecordIndex,
    /// The index after the last record of its highest data fragment.
    pub end: RecordIndex,
}

/// What the replicas hold, as far as a register is concerned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Evidence {
    /// Valid sealed objects: segment → object CRC32C → what it holds.
    pub sealed: BTreeMap<SegmentId, BTreeMap<u32, SealedFound>>,
    /// Segments with data fragments.
    pub active: BTreeMap<SegmentId, ActiveFound>,
    /// The highest epoch any object names (segment ids, fragments, fences).
    pub max_epoch: Epoch,
    /// Objects under the log's prefixes that failed to decode, by key.
    pub damaged: Vec<String>,
}

/// Why a register cannot be rebuilt from the evidence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RebuildError {
    /// No log objects at all: create a log instead.
    #[error("the replicas hold no log: run `chorus log init`")]
    Empty,
    /// One segment was sealed with two different contents.
    #[error(
        "segment {segment} has {contents} different sealed contents (crc32c {crcs}); only the lost register knew which was committed"
    )]
    Disagree {
        /// The segment.
        segment: SegmentId,
        /// How many contents.
        contents: usize,
        /// Their checksums.
        crcs: String,
    },
    /// The sealed segments do not form one chain.
    #[error(
        "the sealed segments do not form a chain: {segment} starts at {base} but the one before it ends at {expected}"
    )]
    Gap {
        /// The segment that does not continue the chain.
        segment: SegmentId,
        /// Its base.
        base: RecordIndex,
        /// Where the chain before it ends.
        expected: RecordIndex,
    },
    /// Unsealed data that continues nothing, or two segments that both do.
    #[error(
        "unsealed segment {segment} holds records {first}-{end} that do not continue the log at {expected}"
    )]
    Stray {
        /// The segment.
        segment: SegmentId,
        /// Its first record.
        first: RecordIndex,
        /// Its end.
        end: RecordIndex,
        /// Where the log ends without it.
        expected: RecordIndex,
    },
    /// The rebuilt register is invalid (a bug, or values out of range).
    #[error("the rebuilt register is invalid: {0}")]
    Invalid(String),
}

/// Rebuilds the register record from `evidence`; see the module docs.
pub fn plan_register(
    evidence: &Evidence,
    replicas: Vec<String>,
    window: u32,
) -> Result<Manifest, RebuildError> {
    if evidence.sealed.is_empty() && evidence.active.is_empty() {
        return Err(RebuildError::Empty);
    }
    let chain = sealed_chain(evidence)?;
    let chain_start = chain.first().map(|(_, entry, _)| entry.base);
    let chain_end = chain
        .last()
        .map(|(_, entry, found)| RecordIndex(entry.base.0 + found.records));
    let mut active = evidence
        .active
        .iter()
        .filter(|(segment, _)| !evidence.sealed.contains_key(segment))
        // Leftover fragments of segments wholly below the retained chain.
        .filter(|(_, found)| chain_start.is_none_or(|start| found.end > start));
    let start = chain_end.unwrap_or_else(|| {
        evidence
            .active
            .values()
            .map(|found| found.first)
            .min()
            .unwrap_or(RecordIndex(0))
    });
    let tail = active.next();
    let pending = active.next();
    let stray = |segment: SegmentId, found: &ActiveFound, expected| RebuildError::Stray {
        segment,
        first: found.first,
        end: found.end,
        expected,
    };
    if let Some((segment, found)) = active.next() {
        return Err(stray(*segment, found, start));
    }
    if let Some((segment, found)) = tail
        && found.first != start
    {
        return Err(stray(*segment, found, start));
    }
    if let (Some((_, tail_found)), Some((segment, found))) = (tail, pending)
        && found.first != tail_found.end
    {
        return Err(stray(*segment, found, tail_found.end));
    }
    let epoch = evidence.max_epoch;
    let fresh = fresh_ids(evidence, epoch);
    let (tail_id, pending_id) = match (tail, pending) {
        (Some((tail, _)), Some((pending, _))) => (*tail, *pending),
        (Some((tail, _)), None) => (*tail, fresh[0]),
        (None, _) => (fresh[0], fresh[1]),
    };
    let manifest = Manifest {
        epoch,
        owner: OwnerId::random(),
        tail: tail_id,
        tail_base: start,
        pending: Some(pending_id),
        seal: chain.last().map(|(_, entry, found)| Seal {
            id: entry.id,
            base: entry.base,
            digest: found.digest,
        }),
        trunc: chain_start.unwrap_or(start),
        segments: chain.iter().map(|(_, entry, _)| *entry).collect(),
        replicas,
        window,
    };
    manifest
        .to_fields()
        .map_err(|e| RebuildError::Invalid(e.to_string()))?;
    Ok(manifest)
}

/// The sealed segments in base order, checked to form one chain.
fn sealed_chain(
    evidence: &Evidence,
) -> Result<Vec<(SegmentId, DirectoryEntry, SealedFound)>, RebuildError> {
    let mut chain = Vec::new();
    for (segment, contents) in &evidence.sealed {
        if contents.len() > 1 {
            let crcs: Vec<String> = contents.keys().map(|crc| format!("{crc:08x}")).collect();
            return Err(RebuildError::Disagree {
                segment: *segment,
                contents: contents.len(),
                crcs: crcs.join(", "),
            });
        }
        let (crc, found) = contents.iter().next().expect("non-empty");
        let entry = DirectoryEntry {
            id: *segment,
            base: found.base,
            crc32c: *crc,
        };
        chain.push((*segment, entry, found.clone()));
    }
    chain.sort_by_key(|(_, entry, _)| entry.base);
    for pair in chain.windows(2) {
        let (_, before, found) = &pair[0];
        let (segment, next, _) = &pair[1];
        let expected = RecordIndex(before.base.0 + found.records);
        if next.base != expected {
            return Err(RebuildError::Gap {
                segment: *segment,
                base: next.base,
                expected,
            });
        }
    }
    Ok(chain)
}

/// Two segment ids of `epoch` that no object uses.
fn fresh_ids(evidence: &Evidence, epoch: Epoch) -> [SegmentId; 2] {
    let highest = evidence
        .sealed
        .keys()
        .chain(evidence.active.keys())
        .filter(|segment| segment.epoch == epoch)
        .map(|segment| segment.counter)
        .max();
    let next = highest.map_or(0, |counter| counter + 1);
    [SegmentId::new(epoch, next), SegmentId::new(epoch, next + 1)]
}

/// Reads every sealed object and fragment on every replica into
/// [`Evidence`] for [`plan_register`]. A replica that cannot be read fails
/// the call: a register rebuilt from part of the evidence could miss the
/// newest data.
pub async fn gather_evidence(replicas: &[DynBlobStore]) -> Result<Evidence, BlobError> {
    let mut evidence = Evidence::default();
    for store in replicas {
        for meta in store.list(SEALED_PREFIX).await? {
            let bytes = store.get(&meta.key).await?.bytes;
            sealed_evidence(&mut evidence, &meta.key, &bytes);
        }
        for meta in store.list(SEGMENTS_PREFIX).await? {
            let bytes = store.get(&meta.key).await?.bytes;
            fragment_evidence(&mut evidence, &meta.key, &bytes);
        }
    }
    Ok(evidence)
}

fn sealed_evidence(evidence: &mut Evidence, key: &str, bytes: &Bytes) {
    let name = key.rsplit('/').next().unwrap_or(key);
    let decoded = parse_sealed_key_name(name).ok().and_then(|(segment, crc)| {
        let sealed = SealedSegment::decode(bytes).ok()?;
        (object_crc32c(bytes) == crc && sealed.id == segment).then_some((sealed, crc))
    });
    let Some((sealed, crc)) = decoded else {
        evidence.damaged.push(key.to_owned());
        return;
    };
    evidence.max_epoch = evidence.max_epoch.max(sealed.id.epoch);
    let contents = evidence.sealed.entry(sealed.id).or_default();
    // Copies under one key count as one object (same segment, same object
    // CRC): its digest is the first copy's, computed once, not per copy.
    let found = contents.entry(crc).or_insert_with(|| SealedFound {
        base: sealed.base,
        records: sealed.records.len() as u64,
        digest: SealDigest::of_sealed_object(bytes),
        copies: 0,
    });
    found.copies += 1;
}

fn fragment_evidence(evidence: &mut Evidence, key: &str, bytes: &Bytes) {
    let segment = key
        .strip_prefix(SEGMENTS_PREFIX)
        .and_then(|rest| rest.trim_start_matches('/').split('/').next())
        .and_then(|id| id.parse::<SegmentId>().ok());
    let (Some(segment), Ok(fragment)) = (segment, Fragment::decode(bytes)) else {
        evidence.damaged.push(key.to_owned());
        return;
    };
    evidence.max_epoch = evidence.max_epoch.max(segment.epoch).max(fragment.epoch());
    if let Fragment::Data { first, records, .. } = fragment {
        let end = RecordIndex(first.0 + records.len() as u64);
        evidence
            .active
            .entry(segment)
            .and_modify(|found| {
                found.first = found.first.min(first);
                found.end = found.end.max(end);
            })
            .or_insert(ActiveFound { first, end });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(epoch: u64, counter: u32) -> SegmentId {
        SegmentId::new(Epoch(epoch), counter)
    }

    fn sealed(evidence: &mut Evidence, segment: SegmentId, crc: u32, base: u64, records: u64) {
        evidence.max_epoch = evidence.max_epoch.max(segment.epoch);
        evidence.sealed.entry(segment).or_default().insert(
            crc,
            SealedFound {
                base: RecordIndex(base),
                records,
                digest: SealDigest::Blake3([crc as u8; 32]),
                copies: 3,
            },
        );
    }

    fn active(evidence: &mut Evidence, segment: SegmentId, first: u64, end: u64) {
        evidence.max_epoch = evidence.max_epoch.max(segment.epoch);
        let found = ActiveFound {
            first: RecordIndex(first),
            end: RecordIndex(end),
        };
        evidence.active.insert(segment, found);
    }

    fn replicas() -> Vec<String> {
        (0..3).map(|i| format!("memory://r{i}")).collect()
    }

    #[test]
    fn a_chain_of_seals_and_a_tail_continuing_it_rebuild_the_register() {
        let mut evidence = Evidence::default();
        sealed(&mut evidence, id(2, 0), 0xa, 0, 1000);
        sealed(&mut evidence, id(3, 0), 0xb, 1000, 1000);
        // Fragments of sealed segments not yet deleted are ignored.
        active(&mut evidence, id(3, 0), 1000, 2000);
        active(&mut evidence, id(4, 0), 2000, 2500);
        evidence.max_epoch = Epoch(5); // a fence of a later recovery
        let manifest = plan_register(&evidence, replicas(), 4).unwrap();
        assert_eq!(manifest.epoch, Epoch(5));
        assert_eq!(manifest.tail, id(4, 0));
        assert_eq!(manifest.tail_base, RecordIndex(2000));
        assert_eq!(manifest.pending, Some(id(5, 0)));
        assert_eq!(manifest.trunc, RecordIndex(0));
        let bases: Vec<u64> = manifest.segments.iter().map(|entry| entry.base.0).collect();
        assert_eq!(bases, [0, 1000]);
        assert_eq!(manifest.seal.map(|seal| seal.id), Some(id(3, 0)));
    }

    #[test]
    fn a_tail_and_its_pending_successor_are_kept_and_fresh_ids_fill_in() {
        let mut evidence = Evidence::default();
        active(&mut evidence, id(1, 0), 0, 40);
        active(&mut evidence, id(1, 1), 40, 45);
        let manifest = plan_register(&evidence, replicas(), 4).unwrap();
        assert_eq!(
            (manifest.tail, manifest.pending),
            (id(1, 0), Some(id(1, 1)))
        );
        assert!(manifest.segments.is_empty());

        let mut sealed_only = Evidence::default();
        sealed(&mut sealed_only, id(2, 3), 0xc, 500, 10);
        let manifest = plan_register(&sealed_only, replicas(), 4).unwrap();
        assert_eq!(manifest.trunc, RecordIndex(500));
        assert_eq!(manifest.tail_base, RecordIndex(510));
        assert_eq!(
            (manifest.tail, manifest.pending),
            (id(2, 4), Some(id(2, 5)))
        );
    }

    #[test]
    fn evidence_that_cannot_be_settled_is_refused() {
        assert_eq!(
            plan_register(&Evidence::default(), replicas(), 4),
            Err(RebuildError::Empty)
        );

        let mut two_contents = Evidence::default();
        sealed(&mut two_contents, id(2, 0), 0xa, 0, 10);
        sealed(&mut two_contents, id(2, 0), 0xb, 0, 9);
        assert!(matches!(
            plan_register(&two_contents, replicas(), 4),
            Err(RebuildError::Disagree { contents: 2, .. })
        ));

        let mut gap = Evidence::default();
        sealed(&mut gap, id(2, 0), 0xa, 0, 10);
        sealed(&mut gap, id(3, 0), 0xb, 20, 10);
        assert!(matches!(
            plan_register(&gap, replicas(), 4),
            Err(RebuildError::Gap {
                expected: RecordIndex(10),
                ..
            })
        ));

        let mut stray = Evidence::default();
        sealed(&mut stray, id(2, 0), 0xa, 0, 10);
        active(&mut stray, id(3, 0), 12, 20);
        assert!(matches!(
            plan_register(&stray, replicas(), 4),
            Err(RebuildError::Stray {
                expected: RecordIndex(10),
                ..
            })
        ));

        let mut three_active = Evidence::default();
        active(&mut three_active, id(1, 0), 0, 5);
        active(&mut three_active, id(1, 1), 5, 9);
        active(&mut three_active, id(1, 2), 9, 12);
        assert!(matches!(
            plan_register(&three_active, replicas(), 4),
            Err(RebuildError::Stray { .. })
        ));
    }
}
