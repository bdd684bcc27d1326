//! Where the log's objects live in each replica (docs/overview.md, Object layout).
//!
//! ```text
//! segments/<segment-id>/<fragment-index, 20 digits>   active data and fences
//! sealed/<segment-id>-<crc32c, 8 hex>                  one object per sealed segment
//! ```

use crate::codec::sealed_key_name;
use crate::ids::{FragmentIndex, SegmentId};

/// Prefix of all fragment directories.
pub const SEGMENTS_PREFIX: &str = "segments";
/// Prefix of all sealed objects.
pub const SEALED_PREFIX: &str = "sealed";

/// The directory holding one segment's fragments.
pub fn segment_prefix(segment: SegmentId) -> String {
    format!("{SEGMENTS_PREFIX}/{segment}")
}

/// The key of fragment `index` of `segment`.
pub fn fragment_key(segment: SegmentId, index: FragmentIndex) -> String {
    format!("{SEGMENTS_PREFIX}/{segment}/{}", index.key_component())
}

/// The fragment index a listed key under [`segment_prefix`] names, if it is one.
pub fn parse_fragment_key(segment: SegmentId, key: &str) -> Option<FragmentIndex> {
    let rest = key
        .strip_prefix(&segment_prefix(segment))?
        .strip_prefix('/')?;
    if rest.len() != FragmentIndex::KEY_DIGITS || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    rest.parse().ok().map(FragmentIndex)
}

/// The key of a sealed object, addressed by its content's CRC32C.
pub fn sealed_key(segment: SegmentId, object_crc32c: u32) -> String {
    format!(
        "{SEALED_PREFIX}/{}",
        sealed_key_name(segment, object_crc32c)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Epoch;

    #[test]
    fn fragment_keys_round_trip_and_sort() {
        let segment = SegmentId::new(Epoch(3), 1);
        let key = fragment_key(segment, FragmentIndex(42));
        assert_eq!(
            key,
            "segments/0000000000000003-00000001/00000000000000000042"
        );
        assert_eq!(parse_fragment_key(segment, &key), Some(FragmentIndex(42)));
        assert!(fragment_key(segment, FragmentIndex(9)) < fragment_key(segment, FragmentIndex(10)));
        let other = SegmentId::new(Epoch(3), 2);
        assert_eq!(parse_fragment_key(other, &key), None);
        assert_eq!(
            parse_fragment_key(segment, "segments/0000000000000003-00000001/42"),
            None
        );
        crate::blob::validate_key(&key).unwrap();
        crate::blob::validate_key(&sealed_key(segment, 0xdead_beef)).unwrap();
    }
}
