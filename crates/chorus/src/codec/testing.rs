//! Strategies and corruption helpers shared by the codec tests.

use std::fmt::Debug;

use bytes::Bytes;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::CodecError;

/// Between `min` and 8 records of up to 40 bytes, empty records included.
pub(crate) fn records_strategy(min: usize) -> impl Strategy<Value = Vec<Bytes>> {
    let record = prop::collection::vec(any::<u8>(), 0..40).prop_map(Bytes::from);
    prop::collection::vec(record, min..8)
}

/// `bytes` with `value` written at `offset` and the header checksum (the last
/// four header bytes) recomputed, so the decoder gets past the checksum to the
/// check under test.
pub(crate) fn patch_header(bytes: &Bytes, header: usize, offset: usize, value: &[u8]) -> Bytes {
    let mut patched = bytes.to_vec();
    patched[offset..offset + value.len()].copy_from_slice(value);
    let crc = crc32c::crc32c(&patched[..header - 4]);
    patched[header - 4..header].copy_from_slice(&crc.to_le_bytes());
    Bytes::from(patched)
}

/// `bytes` with its payload replaced by `payload` and both the payload length
/// field and the checksums rewritten to match, so only the frames are wrong.
pub(crate) fn replace_payload(
    bytes: &Bytes,
    header: usize,
    length_field: (usize, usize),
    payload: &[u8],
) -> Bytes {
    let (offset, width) = length_field;
    let mut patched = bytes[..header].to_vec();
    patched[offset..offset + width].copy_from_slice(&payload.len().to_le_bytes()[..width]);
    let payload_crc = crc32c::crc32c(payload);
    let crc_offset = header - 8;
    patched[crc_offset..crc_offset + 4].copy_from_slice(&payload_crc.to_le_bytes());
    patched.extend_from_slice(payload);
    patch_header(&Bytes::from(patched), header, 0, &[])
}

/// Every single-bit flip anywhere in `encoded` makes `decode` fail.
pub(crate) fn every_bit_flip_rejected<T: Debug>(
    encoded: &Bytes,
    decode: impl Fn(&Bytes) -> Result<T, CodecError>,
) -> Result<(), TestCaseError> {
    for bit in 0..encoded.len() * 8 {
        let mut flipped = encoded.to_vec();
        flipped[bit / 8] ^= 1 << (bit % 8);
        let result = decode(&Bytes::from(flipped));
        prop_assert!(result.is_err(), "bit {} flipped, decoded {:?}", bit, result);
    }
    Ok(())
}

/// Every strict prefix of `encoded` makes `decode` fail.
pub(crate) fn every_truncation_rejected<T: Debug>(
    encoded: &Bytes,
    decode: impl Fn(&Bytes) -> Result<T, CodecError>,
) -> Result<(), TestCaseError> {
    for len in 0..encoded.len() {
        let result = decode(&encoded.slice(..len));
        prop_assert!(
            result.is_err(),
            "prefix of {} bytes decoded {:?}",
            len,
            result
        );
    }
    Ok(())
}

/// Appending `extra` bytes to `encoded` makes `decode` fail with trailing bytes.
pub(crate) fn trailing_bytes_rejected<T: Debug>(
    encoded: &Bytes,
    extra: &[u8],
    decode: impl Fn(&Bytes) -> Result<T, CodecError>,
) -> Result<(), TestCaseError> {
    let mut longer = encoded.to_vec();
    longer.extend_from_slice(extra);
    let result = decode(&Bytes::from(longer));
    let is_trailing = matches!(result, Err(CodecError::TrailingBytes { .. }));
    prop_assert!(is_trailing, "{} extra bytes gave {:?}", extra.len(), result);
    Ok(())
}
