//! Any input: decoding never panics, and whatever decodes re-encodes to exactly
//! the same bytes (one object, one encoding).
#![no_main]

use bytes::Bytes;
use chorus::codec::Fragment;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let input = Bytes::copy_from_slice(data);
    if let Ok(fragment) = Fragment::decode(&input) {
        assert_eq!(fragment.encode(), input, "re-encoding changed the bytes");
    }
});
