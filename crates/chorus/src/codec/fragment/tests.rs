use proptest::prelude::*;

use super::*;
use crate::codec::testing::{
    every_bit_flip_rejected, every_truncation_rejected, patch_header, records_strategy,
    replace_payload, trailing_bytes_rejected,
};

const HEADER: usize = FRAGMENT_HEADER_BYTES;

fn data(records: &[&[u8]]) -> Fragment {
    Fragment::Data {
        epoch: Epoch(7),
        index: FragmentIndex(3),
        first: RecordIndex(100),
        records: records.iter().map(|r| Bytes::copy_from_slice(r)).collect(),
    }
}

fn fence() -> Fragment {
    Fragment::Fence {
        epoch: Epoch(8),
        index: FragmentIndex(4),
    }
}

fn patched(fragment: &Fragment, offset: usize, value: &[u8]) -> Bytes {
    patch_header(&fragment.encode(), HEADER, offset, value)
}

#[test]
fn data_fragment_layout_is_pinned() {
    let encoded = data(&[b"ab", b""]).encode();
    let payload = [2, 0, 0, 0, b'a', b'b', 0, 0, 0, 0];
    let mut expected = b"CHFR".to_vec();
    expected.extend([1, 1, 0, 0]);
    expected.extend(7u64.to_le_bytes());
    expected.extend(3u64.to_le_bytes());
    expected.extend(100u64.to_le_bytes());
    expected.extend(2u32.to_le_bytes());
    expected.extend(10u32.to_le_bytes());
    expected.extend(crc32c::crc32c(&payload).to_le_bytes());
    expected.extend(crc32c::crc32c(&expected).to_le_bytes());
    expected.extend(payload);
    assert_eq!(encoded.as_ref(), expected.as_slice());
}

#[test]
fn fence_layout_is_pinned() {
    let encoded = fence().encode();
    let mut expected = b"CHFR".to_vec();
    expected.extend([1, 2, 0, 0]);
    expected.extend(8u64.to_le_bytes());
    expected.extend(4u64.to_le_bytes());
    expected.extend([0; 8 + 4 + 4 + 4]);
    expected.extend(crc32c::crc32c(&expected).to_le_bytes());
    assert_eq!(encoded.as_ref(), expected.as_slice());
}

#[test]
fn data_and_fence_round_trip() {
    for fragment in [data(&[b"ab", b"", b"c"]), fence()] {
        assert_eq!(Fragment::decode(&fragment.encode()), Ok(fragment));
    }
}

#[test]
fn accessors_describe_the_fragment() {
    let fragment = data(&[b"x"]);
    assert_eq!(
        (fragment.epoch(), fragment.index()),
        (Epoch(7), FragmentIndex(3))
    );
    assert!(!fragment.is_fence());
    assert_eq!(fragment.records(), [Bytes::from_static(b"x")]);
    let fence = fence();
    assert_eq!((fence.epoch(), fence.index()), (Epoch(8), FragmentIndex(4)));
    assert!(fence.is_fence());
    assert!(fence.records().is_empty());
}

#[test]
#[should_panic(expected = "data fragment without records")]
fn encoding_a_data_fragment_without_records_panics() {
    data(&[]).encode();
}

#[test]
fn rejects_shorter_than_header() {
    let encoded = fence().encode().slice(..HEADER - 1);
    assert_eq!(
        Fragment::decode(&encoded),
        Err(CodecError::Truncated {
            format: Format::Fragment,
            needed: HEADER as u64,
            available: HEADER as u64 - 1
        })
    );
}

#[test]
fn rejects_bad_magic() {
    let err = Fragment::decode(&patched(&fence(), 0, b"CHSG")).unwrap_err();
    assert_eq!(
        err,
        CodecError::BadMagic {
            format: Format::Fragment,
            expected: *b"CHFR",
            actual: *b"CHSG"
        }
    );
    assert_eq!(
        err.to_string(),
        "fragment has bad magic: expected=\"CHFR\" actual=\"CHSG\""
    );
}

#[test]
fn rejects_unsupported_version() {
    assert_eq!(
        Fragment::decode(&patched(&fence(), 4, &[2])),
        Err(CodecError::UnsupportedVersion {
            format: Format::Fragment,
            version: 2,
            supported: 1
        })
    );
    let newer = Fragment::decode(&patched(&fence(), 4, &[2])).unwrap_err();
    assert_eq!(
        newer.to_string(),
        "fragment written by a newer Chorus: format 2; this build reads up to 1"
    );
    // Below every format written: not a newer build, so not said to be one.
    let unknown = Fragment::decode(&patched(&fence(), 4, &[0])).unwrap_err();
    assert_eq!(
        unknown.to_string(),
        "fragment has unsupported format version: version=0 supported=1"
    );
}

#[test]
fn rejects_header_checksum_mismatch() {
    let mut corrupt = data(&[b"ab"]).encode().to_vec();
    corrupt[8] ^= 1;
    let err = Fragment::decode(&Bytes::from(corrupt)).unwrap_err();
    assert!(matches!(
        err,
        CodecError::HeaderChecksum {
            format: Format::Fragment,
            ..
        }
    ));
    assert!(
        err.to_string()
            .starts_with("fragment header checksum mismatch: stored=")
    );
}

#[test]
fn rejects_reserved_not_zero() {
    assert_eq!(
        Fragment::decode(&patched(&fence(), 6, &[0, 1])),
        Err(CodecError::ReservedNotZero {
            format: Format::Fragment,
            offset: 6,
            value: 256
        })
    );
}

#[test]
fn rejects_unknown_kind() {
    for kind in [0, 3, 255] {
        let result = Fragment::decode(&patched(&fence(), 5, &[kind]));
        assert_eq!(result, Err(CodecError::BadKind { kind }));
    }
}

#[test]
fn rejects_data_fragment_without_records() {
    let encoded = patched(&data(&[b""]), 32, &0u32.to_le_bytes());
    let err = Fragment::decode(&encoded).unwrap_err();
    assert!(matches!(
        err,
        CodecError::Inconsistent {
            format: Format::Fragment,
            ..
        }
    ));
    assert!(err.to_string().contains("data fragment holds no records"));
}

#[test]
fn rejects_fence_carrying_records() {
    let cases: [(usize, &[u8]); 3] = [(24, &[1]), (32, &[1]), (36, &[4])];
    for (offset, value) in cases {
        let err = Fragment::decode(&patched(&fence(), offset, value)).unwrap_err();
        assert!(err.to_string().contains("fence carries records"), "{err}");
    }
}

#[test]
fn rejects_payload_over_the_limit() {
    let declared = MAX_FRAGMENT_PAYLOAD_BYTES as u32 + 1;
    let encoded = patched(&data(&[b"ab"]), 36, &declared.to_le_bytes());
    assert_eq!(
        Fragment::decode(&encoded),
        Err(CodecError::PayloadTooLarge {
            format: Format::Fragment,
            declared: declared.into(),
            max: MAX_FRAGMENT_PAYLOAD_BYTES
        })
    );
}

#[test]
fn rejects_record_count_the_payload_cannot_hold() {
    let encoded = patched(&data(&[b"ab"]), 32, &3u32.to_le_bytes());
    let err = Fragment::decode(&encoded).unwrap_err();
    assert!(
        err.to_string().contains("record count exceeds payload"),
        "{err}"
    );
}

#[test]
fn rejects_record_indices_that_overflow() {
    let encoded = patched(&data(&[b"a", b"b"]), 24, &(u64::MAX - 1).to_le_bytes());
    let err = Fragment::decode(&encoded).unwrap_err();
    assert!(err.to_string().contains("record indices overflow"), "{err}");
}

#[test]
fn rejects_truncated_payload() {
    let encoded = data(&[b"abc"]).encode();
    let short = encoded.slice(..encoded.len() - 1);
    assert_eq!(
        Fragment::decode(&short),
        Err(CodecError::Truncated {
            format: Format::Fragment,
            needed: encoded.len() as u64,
            available: encoded.len() as u64 - 1
        })
    );
}

#[test]
fn rejects_trailing_bytes() {
    let mut longer = fence().encode().to_vec();
    longer.extend([0, 0]);
    assert_eq!(
        Fragment::decode(&Bytes::from(longer)),
        Err(CodecError::TrailingBytes {
            format: Format::Fragment,
            extra: 2
        })
    );
}

#[test]
fn rejects_payload_checksum_mismatch() {
    let mut corrupt = data(&[b"abc"]).encode().to_vec();
    corrupt[HEADER + 5] ^= 0x80;
    let err = Fragment::decode(&Bytes::from(corrupt)).unwrap_err();
    assert!(matches!(
        err,
        CodecError::PayloadChecksum {
            format: Format::Fragment,
            ..
        }
    ));
}

#[test]
fn rejects_frames_that_disagree_with_the_header() {
    let original = data(&[b"ab", b"cd"]);
    // Checksums valid, but the frames are one record short of the count.
    let payload = [4, 0, 0, 0, b'a', b'b', b'c', b'd'];
    let encoded = replace_payload(&original.encode(), HEADER, (36, 4), &payload);
    assert_eq!(
        Fragment::decode(&encoded),
        Err(CodecError::RecordCountMismatch {
            declared: 2,
            found: 1
        })
    );
}

#[test]
fn decoded_records_share_the_object_buffer() {
    let encoded = data(&[b"abc"]).encode();
    let decoded = Fragment::decode(&encoded).unwrap();
    assert_eq!(
        decoded.records()[0].as_ptr(),
        encoded[HEADER + 4..].as_ptr()
    );
}

fn data_strategy() -> impl Strategy<Value = Fragment> {
    (
        any::<u64>(),
        any::<u64>(),
        0..=u64::MAX - 8,
        records_strategy(1),
    )
        .prop_map(|(epoch, index, first, records)| Fragment::Data {
            epoch: Epoch(epoch),
            index: FragmentIndex(index),
            first: RecordIndex(first),
            records,
        })
}

fn fence_strategy() -> impl Strategy<Value = Fragment> {
    (any::<u64>(), any::<u64>()).prop_map(|(epoch, index)| Fragment::Fence {
        epoch: Epoch(epoch),
        index: FragmentIndex(index),
    })
}

fn fragment_strategy() -> impl Strategy<Value = Fragment> {
    prop_oneof![data_strategy(), fence_strategy()]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn prop_data_fragment_round_trips(fragment in data_strategy()) {
        let encoded = fragment.encode();
        prop_assert_eq!(Fragment::decode(&encoded)?, fragment);
    }

    #[test]
    fn prop_fence_round_trips(fragment in fence_strategy()) {
        let encoded = fragment.encode();
        prop_assert_eq!(encoded.len(), HEADER);
        prop_assert_eq!(Fragment::decode(&encoded)?, fragment);
    }

    #[test]
    fn prop_any_bit_flip_is_rejected(fragment in fragment_strategy()) {
        every_bit_flip_rejected(&fragment.encode(), Fragment::decode)?;
    }

    #[test]
    fn prop_any_truncation_is_rejected(fragment in fragment_strategy()) {
        every_truncation_rejected(&fragment.encode(), Fragment::decode)?;
    }

    #[test]
    fn prop_any_trailing_bytes_are_rejected(
        fragment in fragment_strategy(),
        extra in prop::collection::vec(any::<u8>(), 1..8),
    ) {
        trailing_bytes_rejected(&fragment.encode(), &extra, Fragment::decode)?;
    }
}
