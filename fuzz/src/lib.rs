//! Helpers shared by the fuzz targets.

/// `data` with the payload checksum (the four bytes before the header checksum)
/// and the header checksum (the last four header bytes) set to the CRC32C of what
/// they cover, as an encoder would. Fragments and sealed objects share this
/// tail-of-header layout.
///
/// Random bytes almost never carry valid checksums, so without this the fuzzer
/// would spend its time on the checksum checks and never reach the header
/// consistency, length and frame checks behind them.
pub fn with_valid_checksums(data: &[u8], header_bytes: usize) -> Option<Vec<u8>> {
    if data.len() < header_bytes {
        return None;
    }
    let mut fixed = data.to_vec();
    let payload_crc = crc32c::crc32c(&fixed[header_bytes..]);
    fixed[header_bytes - 8..header_bytes - 4].copy_from_slice(&payload_crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&fixed[..header_bytes - 4]);
    fixed[header_bytes - 4..header_bytes].copy_from_slice(&header_crc.to_le_bytes());
    Some(fixed)
}
