//! Any input, as is and with its checksums made valid: decoding never panics,
//! whatever decodes re-encodes to exactly the same bytes, and it decodes against
//! its own key's checksum.
#![no_main]

use bytes::Bytes;
use chorus::codec::{SEALED_HEADER_BYTES, SealedSegment, object_crc32c};
use chorus_fuzz::with_valid_checksums;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    check(data);
    if let Some(fixed) = with_valid_checksums(data, SEALED_HEADER_BYTES) {
        check(&fixed);
    }
});

fn check(data: &[u8]) {
    let input = Bytes::copy_from_slice(data);
    if let Ok(sealed) = SealedSegment::decode(&input) {
        assert_eq!(
            sealed.encode().as_ref(),
            Ok(&input),
            "re-encoding changed the bytes"
        );
        let crc = object_crc32c(&input);
        let verified = SealedSegment::decode_verified(&input, sealed.id, sealed.base, crc);
        assert_eq!(verified.as_ref(), Ok(&sealed));
    }
}
