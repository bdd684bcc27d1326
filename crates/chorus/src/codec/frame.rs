//! Record frames: `u32 LE payload length` followed by the payload. Empty payloads
//! are valid. Frames carry no checksum of their own: the enclosing object's
//! payload checksum covers them.

use bytes::{BufMut, Bytes, BytesMut};

use super::error::{CodecError, Format};

/// Bytes of the length prefix in front of every record.
pub const FRAME_HEADER_BYTES: usize = 4;

/// The largest record the codec encodes or decodes. A hard cap so that a corrupt
/// length prefix is rejected by name rather than by a truncation error, and so
/// that admission control has a ceiling to configure below.
pub const MAX_RECORD_BYTES: u64 = 64 << 20;

const _: () = assert!(MAX_RECORD_BYTES <= u32::MAX as u64);

/// Total encoded length of `records` as frames.
///
/// # Panics
/// If a record exceeds [`MAX_RECORD_BYTES`].
pub fn framed_len(records: &[Bytes]) -> u64 {
    records.iter().map(|record| frame_len(record)).sum()
}

/// Encodes `records` as consecutive frames.
///
/// # Panics
/// If a record exceeds [`MAX_RECORD_BYTES`]: admission must refuse it earlier.
pub fn encode_frames(records: &[Bytes]) -> Bytes {
    let len = usize::try_from(framed_len(records)).expect("frames fit in memory");
    let mut out = BytesMut::with_capacity(len);
    put_frames(&mut out, records);
    out.freeze()
}

/// Appends `records` as consecutive frames to `out`.
///
/// # Panics
/// If a record exceeds [`MAX_RECORD_BYTES`].
pub fn put_frames(out: &mut impl BufMut, records: &[Bytes]) {
    for record in records {
        let len = frame_len(record) - FRAME_HEADER_BYTES as u64;
        out.put_u32_le(u32::try_from(len).expect("frame_len checked the limit"));
        out.put_slice(record);
    }
}

/// Decodes exactly `count` frames that together fill all of `payload`. Records
/// are zero-copy slices of `payload` (they keep its buffer alive).
pub fn decode_frames(payload: &Bytes, count: u64) -> Result<Vec<Bytes>, CodecError> {
    // Sized from the input, never from the untrusted count alone.
    let capacity = count.min((payload.len() / FRAME_HEADER_BYTES) as u64);
    let mut records = Vec::with_capacity(capacity as usize);
    let mut offset = 0;
    while (records.len() as u64) < count {
        if offset == payload.len() {
            return Err(CodecError::RecordCountMismatch {
                declared: count,
                found: records.len() as u64,
            });
        }
        let (record, next) = decode_frame(payload, offset, records.len() as u64)?;
        records.push(record);
        offset = next;
    }
    if offset != payload.len() {
        return Err(CodecError::TrailingBytes {
            format: Format::Frames,
            extra: (payload.len() - offset) as u64,
        });
    }
    Ok(records)
}

/// Decodes the frame starting at `offset`; returns the record and the offset of
/// the next frame. `record` is the frame's position, for the error message.
fn decode_frame(payload: &Bytes, offset: usize, record: u64) -> Result<(Bytes, usize), CodecError> {
    let start = offset + FRAME_HEADER_BYTES;
    if payload.len() < start {
        return Err(truncated(start as u64, payload.len()));
    }
    let prefix = payload[offset..start].try_into().expect("four bytes");
    let length = u64::from(u32::from_le_bytes(prefix));
    if length > MAX_RECORD_BYTES {
        return Err(CodecError::RecordTooLarge {
            record,
            length,
            max: MAX_RECORD_BYTES,
        });
    }
    let end = start as u64 + length;
    if (payload.len() as u64) < end {
        return Err(truncated(end, payload.len()));
    }
    let end = end as usize;
    Ok((payload.slice(start..end), end))
}

fn truncated(needed: u64, available: usize) -> CodecError {
    CodecError::Truncated {
        format: Format::Frames,
        needed,
        available: available as u64,
    }
}

/// Encoded length of one record, asserting the record limit (on encode as on
/// decode, so no writer can produce what a reader refuses).
fn frame_len(record: &[u8]) -> u64 {
    let len = record.len() as u64;
    assert!(
        len <= MAX_RECORD_BYTES,
        "record too large to encode: length_bytes={len} max_bytes={MAX_RECORD_BYTES}"
    );
    FRAME_HEADER_BYTES as u64 + len
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::codec::testing::records_strategy;

    fn records(payloads: &[&[u8]]) -> Vec<Bytes> {
        payloads.iter().map(|p| Bytes::copy_from_slice(p)).collect()
    }

    #[test]
    fn frames_round_trip_including_empty_records() {
        let records = records(&[b"", b"a", b"", b"hello"]);
        let encoded = encode_frames(&records);
        assert_eq!(encoded.len() as u64, framed_len(&records));
        assert_eq!(&encoded[..4], &[0, 0, 0, 0]);
        assert_eq!(&encoded[4..9], &[1, 0, 0, 0, b'a']);
        assert_eq!(decode_frames(&encoded, 4).unwrap(), records);
    }

    #[test]
    fn no_records_is_no_bytes() {
        assert!(encode_frames(&[]).is_empty());
        assert_eq!(
            decode_frames(&Bytes::new(), 0).unwrap(),
            Vec::<Bytes>::new()
        );
    }

    #[test]
    fn decoded_records_share_the_input_buffer() {
        let encoded = encode_frames(&records(&[b"abc"]));
        let decoded = decode_frames(&encoded, 1).unwrap();
        assert_eq!(decoded[0].as_ptr(), encoded[4..].as_ptr());
    }

    #[test]
    fn rejects_truncated_length_prefix() {
        let encoded = Bytes::from_static(&[3, 0, 0]);
        assert_eq!(
            decode_frames(&encoded, 1),
            Err(CodecError::Truncated {
                format: Format::Frames,
                needed: 4,
                available: 3
            })
        );
    }

    #[test]
    fn rejects_truncated_record() {
        let encoded = Bytes::from_static(&[3, 0, 0, 0, b'a', b'b']);
        assert_eq!(
            decode_frames(&encoded, 1),
            Err(CodecError::Truncated {
                format: Format::Frames,
                needed: 7,
                available: 6
            })
        );
    }

    #[test]
    fn rejects_trailing_bytes_after_declared_records() {
        let encoded = encode_frames(&records(&[b"a", b"b"]));
        assert_eq!(
            decode_frames(&encoded, 1),
            Err(CodecError::TrailingBytes {
                format: Format::Frames,
                extra: 5
            })
        );
    }

    #[test]
    fn rejects_fewer_records_than_declared() {
        let encoded = encode_frames(&records(&[b"a"]));
        assert_eq!(
            decode_frames(&encoded, 2),
            Err(CodecError::RecordCountMismatch {
                declared: 2,
                found: 1
            })
        );
    }

    #[test]
    fn huge_declared_count_is_rejected_without_allocating_for_it() {
        assert_eq!(
            decode_frames(&Bytes::new(), u64::MAX),
            Err(CodecError::RecordCountMismatch {
                declared: u64::MAX,
                found: 0
            })
        );
    }

    #[test]
    fn rejects_record_over_the_limit() {
        let mut encoded = encode_frames(&records(&[b"", b""])).to_vec();
        let too_long = (MAX_RECORD_BYTES as u32 + 1).to_le_bytes();
        encoded[4..8].copy_from_slice(&too_long);
        assert_eq!(
            decode_frames(&Bytes::from(encoded), 2),
            Err(CodecError::RecordTooLarge {
                record: 1,
                length: MAX_RECORD_BYTES + 1,
                max: MAX_RECORD_BYTES
            })
        );
    }

    #[test]
    #[should_panic(expected = "record too large to encode")]
    fn encoding_a_record_over_the_limit_panics() {
        let record = Bytes::from(vec![0; MAX_RECORD_BYTES as usize + 1]);
        encode_frames(&[record]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn prop_frames_round_trip(records in records_strategy(0)) {
            let encoded = encode_frames(&records);
            prop_assert_eq!(encoded.len() as u64, framed_len(&records));
            prop_assert_eq!(decode_frames(&encoded, records.len() as u64)?, records);
        }

        #[test]
        fn prop_frames_reject_every_truncation(records in records_strategy(1)) {
            let encoded = encode_frames(&records);
            for len in 0..encoded.len() {
                let prefix = encoded.slice(..len);
                prop_assert!(decode_frames(&prefix, records.len() as u64).is_err());
            }
        }

        #[test]
        fn prop_frames_reject_any_trailing_byte(records in records_strategy(0), extra: u8) {
            let mut encoded = encode_frames(&records).to_vec();
            encoded.push(extra);
            let result = decode_frames(&Bytes::from(encoded), records.len() as u64);
            prop_assert!(result.is_err());
        }
    }
}
