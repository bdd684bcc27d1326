//! Any input: the first byte picks a key-value command record (even) or a
//! key-value snapshot (odd), the rest is decoded as one: once as it is, and
//! once with its trailing CRC32C rewritten to fit (random bytes almost never
//! carry a valid checksum, which would hide everything behind it). Decoding
//! never panics, and whatever decodes re-encodes to exactly the same bytes
//! (both encodings are canonical).
#![no_main]

use chorus::kv::{Command, KvState};
use libfuzzer_sys::fuzz_target;

fn check(command: bool, input: &[u8]) {
    if command {
        if let Ok(decoded) = Command::decode(input) {
            let encoded = decoded.encode().expect("a decoded command encodes");
            assert_eq!(&encoded[..], input, "re-encoding changed the bytes");
        }
    } else if let Ok(state) = KvState::decode_snapshot(input) {
        assert_eq!(&state.encode_snapshot()[..], input, "re-encoding changed the bytes");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, input)) = data.split_first() else {
        return;
    };
    let command = pick % 2 == 0;
    check(command, input);
    if input.len() >= 4 {
        let mut signed = input.to_vec();
        let covered = signed.len() - 4;
        let crc = crc32c::crc32c(&signed[..covered]);
        signed[covered..].copy_from_slice(&crc.to_le_bytes());
        check(command, &signed);
    }
});
