//! What an object under a replica's log prefixes is, judged against the
//! register (pure). Shared by the orphan sweep and verify.

use crate::codec::{FRAGMENT_HEADER_BYTES, parse_sealed_key_name};
use crate::ids::SegmentId;
use crate::log::layout::{SEALED_PREFIX, SEGMENTS_PREFIX};
use crate::register::Manifest;

/// The class of one stored object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectClass {
    /// A fragment of the tail or pending segment, or anything the current
    /// epoch named: in use.
    Active,
    /// A sealed object the directory names above the floor.
    Sealed,
    /// A sealed object of a tombstone (truncation deletes it).
    Tombstone,
    /// A fence: kept forever, since a superseded writer may still be running.
    Fence,
    /// Belongs to no live or sealed segment and can never become named: a
    /// losing recovery's seal, a late copy, data of a folded segment.
    Orphan,
    /// Not a log object (a key Chorus does not write); never touched.
    Foreign,
}

/// Classifies the object at `key` of `size` bytes.
pub fn classify(manifest: &Manifest, key: &str, size: u64) -> ObjectClass {
    if let Some(rest) = key
        .strip_prefix(SEGMENTS_PREFIX)
        .and_then(|r| r.strip_prefix('/'))
    {
        return classify_fragment(manifest, rest, size);
    }
    if let Some(name) = key
        .strip_prefix(SEALED_PREFIX)
        .and_then(|r| r.strip_prefix('/'))
    {
        return classify_sealed(manifest, name);
    }
    ObjectClass::Foreign
}

fn classify_fragment(manifest: &Manifest, rest: &str, size: u64) -> ObjectClass {
    let Some((id, index)) = rest.split_once('/') else {
        return ObjectClass::Foreign;
    };
    let Ok(id) = id.parse::<SegmentId>() else {
        return ObjectClass::Foreign;
    };
    if index.len() != 20 || !index.bytes().all(|b| b.is_ascii_digit()) {
        return ObjectClass::Foreign;
    }
    if is_active(manifest, id) {
        ObjectClass::Active
    } else if size == FRAGMENT_HEADER_BYTES as u64 {
        ObjectClass::Fence
    } else {
        ObjectClass::Orphan
    }
}

fn classify_sealed(manifest: &Manifest, name: &str) -> ObjectClass {
    let Ok((id, crc)) = parse_sealed_key_name(name) else {
        return ObjectClass::Foreign;
    };
    let named = manifest
        .segments
        .iter()
        .position(|entry| entry.id == id && entry.crc32c == crc);
    match named {
        Some(position) if manifest.is_tombstone(position) => ObjectClass::Tombstone,
        Some(_) => ObjectClass::Sealed,
        // A seal of the tail or pending segment may be in flight (rotation or
        // recovery), and so may one of a later segment of the current epoch
        // or of a newer epoch (the register moved on since it was read).
        None if may_be_sealing(manifest, id) => ObjectClass::Active,
        // Anything else unnamed can never become named: the directory only
        // gains the tail and pending segments. Such a copy is left by a
        // losing recovery, a late seal write, or a repair that raced a
        // truncation.
        None => ObjectClass::Orphan,
    }
}

/// Whether a seal of `id` may be in flight: ids only grow from the
/// directory through the tail to the pending segment, and only the tail
/// and pending segments (or segments after them) are sealed.
fn may_be_sealing(manifest: &Manifest, id: SegmentId) -> bool {
    id >= manifest.tail || id.epoch > manifest.epoch
}

fn is_active(manifest: &Manifest, id: SegmentId) -> bool {
    id == manifest.tail || Some(id) == manifest.pending || id.epoch >= manifest.epoch
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::FragmentIndex;
    use crate::ids::{Epoch, OwnerId, RecordIndex};
    use crate::log::layout::{fragment_key, sealed_key};
    use crate::register::{DirectoryEntry, Seal, SealDigest};

    fn manifest() -> Manifest {
        let mut m = Manifest::initial(vec!["a".into(), "b".into(), "c".into()], 4);
        m.epoch = Epoch(5);
        m.owner = OwnerId(1);
        let entry = |epoch, base| DirectoryEntry {
            id: SegmentId::new(Epoch(epoch), 0),
            base: RecordIndex(base),
            crc32c: 7,
        };
        m.segments = vec![entry(2, 0), entry(3, 10)];
        m.seal = Some(Seal {
            id: m.segments[1].id,
            base: RecordIndex(10),
            digest: SealDigest::Blake3([0; 32]),
        });
        m.tail = SegmentId::new(Epoch(4), 0);
        m.pending = Some(SegmentId::new(Epoch(4), 1));
        m.tail_base = RecordIndex(20);
        m.trunc = RecordIndex(10);
        crate::register::validate(&m).unwrap();
        m
    }

    #[test]
    fn classifies_every_kind_of_object() {
        let m = manifest();
        let fragment =
            |epoch, counter| fragment_key(SegmentId::new(Epoch(epoch), counter), FragmentIndex(3));
        let fence = FRAGMENT_HEADER_BYTES as u64;
        assert_eq!(
            classify(&m, &fragment(4, 0), 100),
            ObjectClass::Active,
            "tail"
        );
        assert_eq!(
            classify(&m, &fragment(4, 1), fence),
            ObjectClass::Active,
            "pending"
        );
        assert_eq!(
            classify(&m, &fragment(5, 9), 100),
            ObjectClass::Active,
            "current epoch"
        );
        assert_eq!(
            classify(&m, &fragment(3, 0), 100),
            ObjectClass::Orphan,
            "sealed segment's data"
        );
        assert_eq!(classify(&m, &fragment(3, 0), fence), ObjectClass::Fence);
        assert_eq!(
            classify(&m, &sealed_key(SegmentId::new(Epoch(3), 0), 7), 0),
            ObjectClass::Sealed
        );
        assert_eq!(
            classify(&m, &sealed_key(SegmentId::new(Epoch(2), 0), 7), 0),
            ObjectClass::Tombstone
        );
        assert_eq!(
            classify(&m, &sealed_key(SegmentId::new(Epoch(3), 0), 8), 0),
            ObjectClass::Orphan,
            "other crc"
        );
        assert_eq!(
            classify(&m, &sealed_key(SegmentId::new(Epoch(4), 0), 8), 0),
            ObjectClass::Active,
            "tail seal in flight"
        );
        assert_eq!(
            classify(&m, &sealed_key(SegmentId::new(Epoch(4), 1), 8), 0),
            ObjectClass::Active,
            "pending seal in flight"
        );
        assert_eq!(
            classify(&m, &sealed_key(SegmentId::new(Epoch(5), 3), 8), 0),
            ObjectClass::Active,
            "a later segment of the current epoch"
        );
        assert_eq!(
            classify(&m, &sealed_key(SegmentId::new(Epoch(6), 0), 8), 0),
            ObjectClass::Active,
            "a newer epoch"
        );
        assert_eq!(
            classify(&m, &sealed_key(SegmentId::new(Epoch(1), 0), 7), 0),
            ObjectClass::Orphan,
            "a segment that left the directory"
        );
        let mut later = m.clone();
        later.tail = SegmentId::new(Epoch(5), 2);
        later.pending = Some(SegmentId::new(Epoch(5), 3));
        crate::register::validate(&later).unwrap();
        assert_eq!(
            classify(&later, &sealed_key(SegmentId::new(Epoch(5), 1), 8), 0),
            ObjectClass::Orphan,
            "a current-epoch segment before the tail that left the directory"
        );
        for foreign in [
            "segments/x/1",
            "sealed/nope",
            "other/file",
            "segments/0000000000000003-00000000/7",
        ] {
            assert_eq!(classify(&m, foreign, 1), ObjectClass::Foreign, "{foreign}");
        }
    }
}
