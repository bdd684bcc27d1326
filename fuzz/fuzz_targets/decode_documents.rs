//! The JSON documents Chorus reads back from stores: `lease.json`, `HEAD.json`
//! and the object register's `manifest.json`. The first byte picks the
//! document; the rest is its bytes, decoded as is and, when they parse as a
//! JSON object, once more with a valid checksum (random bytes never carry
//! one), which reaches the field checks behind it. Decoding never panics, and
//! whatever decodes survives its own encoding unchanged.
#![no_main]

use bytes::Bytes;
use chorus::lease::{DatabaseKey, LeaseRecord, encode_document};
use chorus::codec::DOCUMENT_CHECKSUM_FIELD;
use chorus::register::{Fields, Manifest, decode_document, encode_document as encode_register};
use chorus::snapshot::Head;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    check(kind, &Bytes::copy_from_slice(rest));
    if let Some(signed) = signed(kind, rest) {
        check(kind, &signed);
    }
});

/// `rest` with a valid checksum added, if it is a JSON object of the shape the
/// document kind has.
fn signed(kind: u8, rest: &[u8]) -> Option<Bytes> {
    if kind % 3 == 2 {
        let mut fields: Fields = serde_json::from_slice(rest).ok()?;
        fields.remove(DOCUMENT_CHECKSUM_FIELD);
        let signed = encode_register(&fields);
        assert_eq!(decode_document(&signed).as_ref(), Ok(&fields), "own document");
        return Some(signed);
    }
    match serde_json::from_slice::<serde_json::Value>(rest).ok()? {
        object @ serde_json::Value::Object(_) => Some(encode_document(object)),
        _ => None,
    }
}

fn check(kind: u8, bytes: &Bytes) {
    let database = DatabaseKey::new("db").expect("a valid key");
    match kind % 3 {
        0 => {
            if let Ok(record) = LeaseRecord::decode(&database, "db/lease.json", bytes) {
                let again = LeaseRecord::decode(&database, "db/lease.json", &record.encode());
                assert_eq!(again.as_ref(), Ok(&record), "lease re-encoding changed it");
            }
        }
        1 => {
            if let Ok(head) = Head::decode(&database, "db/HEAD.json", bytes) {
                let again = Head::decode(&database, "db/HEAD.json", &head.encode());
                assert_eq!(again.as_ref(), Ok(&head), "HEAD re-encoding changed it");
            }
        }
        _ => {
            let Ok(fields) = decode_document(bytes) else {
                return;
            };
            if let Ok(manifest) = Manifest::from_fields(&fields) {
                let fields = manifest.to_fields().expect("a decoded register encodes");
                let again = decode_document(&encode_register(&fields)).expect("own document");
                assert_eq!(Manifest::from_fields(&again).as_ref(), Ok(&manifest));
            }
        }
    }
}
