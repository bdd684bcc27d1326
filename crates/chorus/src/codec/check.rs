//! Checks shared by the fragment and sealed-segment decoders. Each returns the
//! precise [`CodecError`] for one step of the decode order in the module docs.

use super::error::{CodecError, Format};

/// Width of the trailing header checksum field.
pub(super) const CHECKSUM_BYTES: usize = 4;

/// The object is at least as long as its fixed header.
pub(super) fn header_present(
    format: Format,
    bytes: &[u8],
    header: usize,
) -> Result<(), CodecError> {
    if bytes.len() < header {
        return Err(CodecError::Truncated {
            format,
            needed: header as u64,
            available: bytes.len() as u64,
        });
    }
    Ok(())
}

/// The object starts with `expected`.
pub(super) fn magic(format: Format, bytes: &[u8], expected: [u8; 4]) -> Result<(), CodecError> {
    let actual: [u8; 4] = bytes[..4]
        .try_into()
        .expect("caller checked the header length");
    if actual != expected {
        return Err(CodecError::BadMagic {
            format,
            expected,
            actual,
        });
    }
    Ok(())
}

/// The version is the one this build writes: there is no other yet.
pub(super) fn version(format: Format, version: u16, supported: u16) -> Result<(), CodecError> {
    if version != supported {
        return Err(CodecError::UnsupportedVersion {
            format,
            version,
            supported,
        });
    }
    Ok(())
}

/// The last four bytes of `header` are the CRC32C of the bytes before them.
pub(super) fn header_checksum(format: Format, header: &[u8]) -> Result<(), CodecError> {
    let (covered, stored) = header.split_at(header.len() - CHECKSUM_BYTES);
    let expected = u32::from_le_bytes(stored.try_into().expect("split at four bytes"));
    let actual = crc32c::crc32c(covered);
    if expected != actual {
        return Err(CodecError::HeaderChecksum {
            format,
            expected,
            actual,
        });
    }
    Ok(())
}

/// A reserved field is zero, so a future format can give it meaning.
pub(super) fn reserved(format: Format, offset: usize, value: u64) -> Result<(), CodecError> {
    if value != 0 {
        return Err(CodecError::ReservedNotZero {
            format,
            offset,
            value,
        });
    }
    Ok(())
}

/// The declared payload length is within the format's hard limit, checked before
/// anything is sized from it.
pub(super) fn payload_limit(format: Format, declared: u64, max: u64) -> Result<(), CodecError> {
    if declared > max {
        return Err(CodecError::PayloadTooLarge {
            format,
            declared,
            max,
        });
    }
    Ok(())
}

/// The object is exactly header plus declared payload: shorter is truncated,
/// longer has trailing bytes.
pub(super) fn exact_length(
    format: Format,
    total: usize,
    header: usize,
    declared: u64,
) -> Result<(), CodecError> {
    let needed = header as u64 + declared;
    let available = total as u64;
    if available < needed {
        return Err(CodecError::Truncated {
            format,
            needed,
            available,
        });
    }
    if available > needed {
        return Err(CodecError::TrailingBytes {
            format,
            extra: available - needed,
        });
    }
    Ok(())
}

/// The payload matches the checksum stored in the header.
pub(super) fn payload_checksum(
    format: Format,
    payload: &[u8],
    expected: u32,
) -> Result<(), CodecError> {
    let actual = crc32c::crc32c(payload);
    if expected != actual {
        return Err(CodecError::PayloadChecksum {
            format,
            expected,
            actual,
        });
    }
    Ok(())
}

/// Every record needs at least a length prefix, so a count above
/// `payload / FRAME_HEADER_BYTES` cannot be honest; rejecting it early also bounds
/// any allocation sized from the count.
pub(super) fn count_fits_payload(
    format: Format,
    count: u64,
    payload: u64,
) -> Result<(), CodecError> {
    let max_count = payload / super::FRAME_HEADER_BYTES as u64;
    if count > max_count {
        return Err(CodecError::Inconsistent {
            format,
            reason: format!(
                "record count exceeds payload: records={count} payload_bytes={payload}"
            ),
        });
    }
    Ok(())
}

/// `first + count` stays representable, so the end index of the records exists.
pub(super) fn end_index_fits(format: Format, first: u64, count: u64) -> Result<(), CodecError> {
    if first.checked_add(count).is_none() {
        return Err(CodecError::Inconsistent {
            format,
            reason: format!("record indices overflow: first={first} records={count}"),
        });
    }
    Ok(())
}
