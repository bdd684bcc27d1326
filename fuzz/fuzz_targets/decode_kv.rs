//! Any input: the first byte picks a key-value record (even: a command or a
//! raw payload, with or without an idempotency stamp, format 1 or 2, or an
//! etcd request) or a key-value snapshot (odd, format 1 to 4), the rest
//! is decoded as one: once
//! as it is, and once with its trailing CRC32C rewritten to fit (random
//! bytes almost never carry a valid checksum, which would hide everything
//! behind it). Decoding never panics, and whatever decodes re-encodes to
//! exactly the same bytes (both encodings are canonical), except a snapshot
//! of format 1, 2 or 3, which re-encodes in format 4 to the same state. A
//! record decodes the same whether its bytes are copied out or shared.
#![no_main]

use bytes::Bytes;
use chorus::kv::{Command, KvState, Record};
use libfuzzer_sys::fuzz_target;

fn check(command: bool, input: &[u8]) {
    if command {
        let shared = Record::decode_shared(&Bytes::copy_from_slice(input));
        assert_eq!(shared, Record::decode(input), "sharing changed the decoding");
        if let Ok(decoded) = Record::decode(input) {
            let encoded = decoded.encode().expect("a decoded record encodes");
            assert_eq!(&encoded[..], input, "re-encoding changed the bytes");
            decoded.digest().expect("a decoded record has a digest");
            // A stamped record's command alone is a different (format 1) record.
            if let Ok(command) = Command::decode(input) {
                let plain = command.encode().expect("a decoded command encodes");
                assert_eq!(plain[..] == *input, decoded.stamp.is_none());
            }
        }
    } else if let Ok(state) = KvState::decode_snapshot(input) {
        let encoded = state.encode_snapshot();
        if input[4] != 4 {
            let again = KvState::decode_snapshot(&encoded).expect("a re-encoded snapshot decodes");
            assert_eq!(again, state, "re-encoding changed the state");
        } else {
            assert_eq!(&encoded[..], input, "re-encoding changed the bytes");
        }
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
