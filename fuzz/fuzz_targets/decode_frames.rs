//! Any input: the first byte is the record count, the rest the frames. Decoding
//! never panics, and whatever decodes re-encodes to exactly the same bytes.
#![no_main]

use bytes::Bytes;
use chorus::codec::{decode_frames, encode_frames};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&count, frames)) = data.split_first() else {
        return;
    };
    let payload = Bytes::copy_from_slice(frames);
    if let Ok(records) = decode_frames(&payload, u64::from(count)) {
        assert_eq!(records.len(), usize::from(count));
        assert_eq!(
            encode_frames(&records),
            payload,
            "re-encoding changed the bytes"
        );
    }
});
