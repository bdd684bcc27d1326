//! Any input, decoded as the Chorus record of one SlateDB write batch: once
//! as it is, and once with its body checksum (header bytes 12..16) rewritten
//! to fit, since random bytes almost never carry a valid CRC32C. Decoding
//! never panics, and whatever decodes re-encodes to exactly the same bytes
//! (the encoding is canonical).
#![no_main]

use bytes::Bytes;
use chorus_slatedb::batch::{HEADER_BYTES, decode, encode};
use libfuzzer_sys::fuzz_target;

fn check(input: &[u8]) {
    if let Ok(rows) = decode(&Bytes::copy_from_slice(input)) {
        let encoded = encode(&rows).expect("decoded rows encode");
        assert_eq!(&encoded[..], input, "re-encoding changed the bytes");
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= HEADER_BYTES {
        let mut signed = data.to_vec();
        let crc = crc32c::crc32c(&signed[HEADER_BYTES..]);
        signed[12..16].copy_from_slice(&crc.to_le_bytes());
        check(&signed);
    }
});
