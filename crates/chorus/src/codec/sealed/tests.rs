use proptest::prelude::*;

use super::*;
use crate::codec::testing::{
    every_bit_flip_rejected, every_truncation_rejected, patch_header, records_strategy,
    replace_payload, trailing_bytes_rejected,
};
use crate::codec::{CrcRun, FRAGMENT_HEADER_BYTES, Fragment, MAX_RECORD_BYTES};
use crate::ids::FragmentIndex;

const HEADER: usize = SEALED_HEADER_BYTES;

fn id() -> SegmentId {
    SegmentId::new(Epoch(5), 9)
}

fn segment(records: &[&[u8]]) -> SealedSegment {
    SealedSegment {
        id: id(),
        base: RecordIndex(1000),
        records: records.iter().map(|r| Bytes::copy_from_slice(r)).collect(),
    }
}

fn patched(segment: &SealedSegment, offset: usize, value: &[u8]) -> Bytes {
    patch_header(&segment.encode().unwrap(), HEADER, offset, value)
}

#[test]
fn layout_is_pinned() {
    let encoded = segment(&[b"", b"xyz"]).encode().unwrap();
    let payload = [0, 0, 0, 0, 3, 0, 0, 0, b'x', b'y', b'z'];
    let mut expected = b"CHSG".to_vec();
    expected.extend([1, 0, 0, 0]);
    expected.extend(5u64.to_le_bytes());
    expected.extend(9u32.to_le_bytes());
    expected.extend([0; 4]);
    expected.extend(1000u64.to_le_bytes());
    expected.extend(2u64.to_le_bytes());
    expected.extend(11u64.to_le_bytes());
    expected.extend(crc32c::crc32c(&payload).to_le_bytes());
    expected.extend(crc32c::crc32c(&expected).to_le_bytes());
    expected.extend(payload);
    assert_eq!(encoded.as_ref(), expected.as_slice());
}

#[test]
fn round_trips_and_reports_its_end() {
    let sealed = segment(&[b"a", b"", b"bc"]);
    assert_eq!(sealed.end(), RecordIndex(1003));
    assert_eq!(SealedSegment::decode(&sealed.encode().unwrap()), Ok(sealed));
}

#[test]
fn equal_content_gives_equal_bytes_and_key() {
    let (a, b) = (
        segment(&[b"a", b"b"]).encode().unwrap(),
        segment(&[b"a", b"b"]).encode().unwrap(),
    );
    assert_eq!(a, b);
    let key = sealed_key_name(id(), object_crc32c(&a));
    assert_eq!(key, sealed_key_name(id(), object_crc32c(&b)));
    assert_ne!(a, segment(&[b"a", b"c"]).encode().unwrap());
}

#[test]
fn encoding_an_empty_segment_is_refused() {
    let error = segment(&[]).encode().unwrap_err();
    assert!(
        matches!(
            error,
            CodecError::Inconsistent {
                format: Format::Sealed,
                ..
            }
        ),
        "{error}"
    );
}

/// A segment past the sealed limit is refused, not panicked on: recovery
/// seals what it read from the replicas.
#[test]
fn encoding_a_segment_above_the_sealed_limit_is_refused() {
    // 65 references to one 64 MiB buffer: over 4 GiB of frames, 64 MiB of memory.
    let record = Bytes::from(vec![0u8; MAX_RECORD_BYTES as usize]);
    let sealed = SealedSegment {
        id: id(),
        base: RecordIndex(0),
        records: vec![record; 65],
    };
    let error = sealed.encode().unwrap_err();
    assert!(
        matches!(
            error,
            CodecError::PayloadTooLarge {
                format: Format::Sealed,
                max: MAX_SEALED_PAYLOAD_BYTES,
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn encoding_a_segment_whose_indices_overflow_is_refused() {
    let sealed = SealedSegment {
        id: id(),
        base: RecordIndex(u64::MAX),
        records: vec![Bytes::from_static(b"a")],
    };
    let error = sealed.encode().unwrap_err();
    assert!(error.to_string().contains("overflow"), "{error}");
}

#[test]
fn key_name_round_trips() {
    let name = sealed_key_name(id(), 0x00ab_cdef);
    assert_eq!(name, "0000000000000005-00000009-00abcdef");
    assert_eq!(parse_sealed_key_name(&name), Ok((id(), 0x00ab_cdef)));
}

#[test]
fn key_name_parser_refuses_other_spellings() {
    for bad in [
        "",
        "0000000000000005-00000009",
        "0000000000000005-00000009-00ABCDEF",
        "0000000000000005-00000009-abcdef",
        "0000000000000005-00000009-0abcdef00",
        "0000000000000005-00000009_00abcdef",
        "0000000000000005-00000009-+0abcdef",
        "5-9-00abcdef",
    ] {
        let err = parse_sealed_key_name(bad).unwrap_err();
        assert_eq!(err, CodecError::BadSealedName { name: bad.into() });
    }
}

#[test]
fn decode_verified_accepts_the_named_content() {
    let sealed = segment(&[b"a"]);
    let encoded = sealed.encode().unwrap();
    let crc = object_crc32c(&encoded);
    let decoded = SealedSegment::decode_verified(&encoded, id(), RecordIndex(1000), crc);
    assert_eq!(decoded, Ok(sealed));
}

#[test]
fn decode_verified_rejects_other_content() {
    let encoded = segment(&[b"a"]).encode().unwrap();
    let crc = object_crc32c(&encoded);
    let base = RecordIndex(1000);
    let other = SegmentId::new(Epoch(5), 10);
    assert_eq!(
        SealedSegment::decode_verified(&encoded, id(), base, crc ^ 1),
        Err(CodecError::ObjectChecksum {
            expected: crc ^ 1,
            actual: crc
        })
    );
    assert_eq!(
        SealedSegment::decode_verified(&encoded, other, base, crc),
        Err(CodecError::SegmentMismatch {
            expected: other,
            actual: id()
        })
    );
    assert_eq!(
        SealedSegment::decode_verified(&encoded, id(), RecordIndex(7), crc),
        Err(CodecError::BaseMismatch {
            expected: RecordIndex(7),
            actual: base
        })
    );
}

#[test]
fn rejects_shorter_than_header() {
    let encoded = segment(&[b"a"]).encode().unwrap();
    assert_eq!(
        SealedSegment::decode(&encoded.slice(..10)),
        Err(CodecError::Truncated {
            format: Format::Sealed,
            needed: HEADER as u64,
            available: 10
        })
    );
}

#[test]
fn rejects_bad_magic() {
    assert_eq!(
        SealedSegment::decode(&patched(&segment(&[b"a"]), 0, b"CHFR")),
        Err(CodecError::BadMagic {
            format: Format::Sealed,
            expected: *b"CHSG",
            actual: *b"CHFR"
        })
    );
}

#[test]
fn rejects_unsupported_version() {
    assert_eq!(
        SealedSegment::decode(&patched(&segment(&[b"a"]), 4, &[0, 1])),
        Err(CodecError::UnsupportedVersion {
            format: Format::Sealed,
            version: 256,
            supported: 1
        })
    );
    let newer = SealedSegment::decode(&patched(&segment(&[b"a"]), 4, &[0, 1])).unwrap_err();
    assert_eq!(
        newer.to_string(),
        "sealed segment written by a newer Chorus: format 256; this build reads up to 1"
    );
}

#[test]
fn rejects_header_checksum_mismatch() {
    let mut corrupt = segment(&[b"a"]).encode().unwrap().to_vec();
    corrupt[30] ^= 4;
    let err = SealedSegment::decode(&Bytes::from(corrupt)).unwrap_err();
    assert!(matches!(
        err,
        CodecError::HeaderChecksum {
            format: Format::Sealed,
            ..
        }
    ));
}

#[test]
fn rejects_either_reserved_field_not_zero() {
    for (offset, value) in [(6, 0x0100), (20, 0x0200_0000)] {
        let bytes = (value as u32).to_le_bytes();
        let width = if offset == 6 { 2 } else { 4 };
        let encoded = patched(&segment(&[b"a"]), offset, &bytes[..width]);
        assert_eq!(
            SealedSegment::decode(&encoded),
            Err(CodecError::ReservedNotZero {
                format: Format::Sealed,
                offset,
                value
            })
        );
    }
}

#[test]
fn rejects_segment_without_records() {
    let encoded = patched(&segment(&[b""]), 32, &0u64.to_le_bytes());
    let err = SealedSegment::decode(&encoded).unwrap_err();
    assert!(
        err.to_string().contains("sealed segment holds no records"),
        "{err}"
    );
}

#[test]
fn rejects_payload_over_the_limit() {
    let declared = MAX_SEALED_PAYLOAD_BYTES + 1;
    let encoded = patched(&segment(&[b"a"]), 40, &declared.to_le_bytes());
    assert_eq!(
        SealedSegment::decode(&encoded),
        Err(CodecError::PayloadTooLarge {
            format: Format::Sealed,
            declared,
            max: MAX_SEALED_PAYLOAD_BYTES
        })
    );
}

#[test]
fn rejects_record_count_the_payload_cannot_hold() {
    let encoded = patched(&segment(&[b"a"]), 32, &u64::MAX.to_le_bytes());
    let err = SealedSegment::decode(&encoded).unwrap_err();
    assert!(
        err.to_string().contains("record count exceeds payload"),
        "{err}"
    );
}

#[test]
fn rejects_record_indices_that_overflow() {
    let encoded = patched(&segment(&[b"a"]), 24, &u64::MAX.to_le_bytes());
    let err = SealedSegment::decode(&encoded).unwrap_err();
    assert!(err.to_string().contains("record indices overflow"), "{err}");
}

#[test]
fn rejects_truncated_payload_and_trailing_bytes() {
    let encoded = segment(&[b"abc"]).encode().unwrap();
    let len = encoded.len() as u64;
    assert_eq!(
        SealedSegment::decode(&encoded.slice(..encoded.len() - 2)),
        Err(CodecError::Truncated {
            format: Format::Sealed,
            needed: len,
            available: len - 2
        })
    );
    let mut longer = encoded.to_vec();
    longer.push(0);
    assert_eq!(
        SealedSegment::decode(&Bytes::from(longer)),
        Err(CodecError::TrailingBytes {
            format: Format::Sealed,
            extra: 1
        })
    );
}

#[test]
fn rejects_payload_checksum_mismatch() {
    let mut corrupt = segment(&[b"abc"]).encode().unwrap().to_vec();
    corrupt[HEADER] ^= 2;
    let err = SealedSegment::decode(&Bytes::from(corrupt)).unwrap_err();
    assert!(matches!(
        err,
        CodecError::PayloadChecksum {
            format: Format::Sealed,
            ..
        }
    ));
}

#[test]
fn rejects_frames_that_disagree_with_the_header() {
    let original = segment(&[b"ab"]);
    // Checksums valid, but the single frame claims more bytes than remain.
    let payload = [9, 0, 0, 0, b'a', b'b'];
    let encoded = replace_payload(&original.encode().unwrap(), HEADER, (40, 8), &payload);
    assert_eq!(
        SealedSegment::decode(&encoded),
        Err(CodecError::Truncated {
            format: Format::Frames,
            needed: 13,
            available: 6
        })
    );
}

fn segment_strategy() -> impl Strategy<Value = SealedSegment> {
    (
        any::<u64>(),
        any::<u32>(),
        0..=u64::MAX - 8,
        records_strategy(1),
    )
        .prop_map(|(epoch, counter, base, records)| SealedSegment {
            id: SegmentId::new(Epoch(epoch), counter),
            base: RecordIndex(base),
            records,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn prop_round_trips(sealed in segment_strategy()) {
        let (encoded, crc) = sealed.encode_keyed().unwrap();
        // The combined checksum is the one a reader computes from the bytes.
        prop_assert_eq!(crc, object_crc32c(&encoded));
        prop_assert_eq!(&sealed.encode().unwrap(), &encoded);
        prop_assert_eq!(&SealedSegment::decode(&encoded)?, &sealed);
        let verified = SealedSegment::decode_verified(&encoded, sealed.id, sealed.base, crc)?;
        prop_assert_eq!(verified, sealed);
    }

    /// A writer seals from the fragments it cut (their payloads and
    /// checksums): the object is the one made from the records alone.
    #[test]
    fn prop_sealing_from_the_fragments_is_the_same_object(
        sealed in segment_strategy(),
        cuts in prop::collection::vec(1usize..4, 1..32),
    ) {
        let mut checksum = CrcRun::default();
        let mut frames = Vec::new();
        let mut rest = &sealed.records[..];
        for (index, cut) in cuts.iter().cycle().enumerate() {
            if rest.is_empty() {
                break;
            }
            let (records, after) = rest.split_at((*cut).min(rest.len()));
            let fragment = Fragment::Data {
                epoch: sealed.id.epoch,
                index: FragmentIndex(index as u64),
                first: sealed.base,
                records: records.to_vec(),
            };
            let (encoded, run) = fragment.encode_with_payload();
            frames.push(encoded.slice(FRAGMENT_HEADER_BYTES..));
            checksum = checksum.then(run);
            rest = after;
        }
        let framed = FramedSegment {
            id: sealed.id,
            base: sealed.base,
            count: sealed.records.len() as u64,
            frames,
            checksum,
        };
        let (parts, crc) = framed.encode().unwrap();
        prop_assert_eq!((Bytes::from(parts.concat()), crc), sealed.encode_keyed().unwrap());
    }

    #[test]
    fn prop_key_name_round_trips(epoch: u64, counter: u32, crc: u32) {
        let id = SegmentId::new(Epoch(epoch), counter);
        prop_assert_eq!(parse_sealed_key_name(&sealed_key_name(id, crc))?, (id, crc));
    }

    #[test]
    fn prop_any_bit_flip_is_rejected(sealed in segment_strategy()) {
        every_bit_flip_rejected(&sealed.encode().unwrap(), SealedSegment::decode)?;
    }

    #[test]
    fn prop_any_truncation_is_rejected(sealed in segment_strategy()) {
        every_truncation_rejected(&sealed.encode().unwrap(), SealedSegment::decode)?;
    }

    #[test]
    fn prop_any_trailing_bytes_are_rejected(
        sealed in segment_strategy(),
        extra in prop::collection::vec(any::<u8>(), 1..8),
    ) {
        trailing_bytes_rejected(&sealed.encode().unwrap(), &extra, SealedSegment::decode)?;
    }
}
