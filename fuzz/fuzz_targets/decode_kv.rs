//! Any input: the first byte picks a key-value command record (even) or a
//! key-value snapshot (odd), the rest is decoded as one. Decoding never
//! panics, and whatever decodes re-encodes to exactly the same bytes (both
//! encodings are canonical).
#![no_main]

use chorus::kv::{Command, KvState};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, input)) = data.split_first() else {
        return;
    };
    if pick % 2 == 0 {
        if let Ok(command) = Command::decode(input) {
            let encoded = command.encode().expect("a decoded command encodes");
            assert_eq!(&encoded[..], input, "re-encoding changed the bytes");
        }
    } else if let Ok(state) = KvState::decode_snapshot(input) {
        assert_eq!(&state.encode_snapshot()[..], input, "re-encoding changed the bytes");
    }
});
