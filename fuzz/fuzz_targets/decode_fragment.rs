//! Any input, as is and with its checksums made valid: decoding never panics,
//! and whatever decodes re-encodes to exactly the same bytes (one object, one
//! encoding).
#![no_main]

use bytes::Bytes;
use chorus::codec::{FRAGMENT_HEADER_BYTES, Fragment};
use chorus_fuzz::with_valid_checksums;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    check(data);
    if let Some(fixed) = with_valid_checksums(data, FRAGMENT_HEADER_BYTES) {
        check(&fixed);
    }
});

fn check(data: &[u8]) {
    let input = Bytes::copy_from_slice(data);
    if let Ok(fragment) = Fragment::decode(&input) {
        assert_eq!(fragment.encode(), input, "re-encoding changed the bytes");
    }
}
