use bytes::Bytes;
use proptest::prelude::*;
use slatedb::{RowEntry, ValueDeletable};

use super::*;

fn row(key: &str, value: ValueDeletable, seq: u64) -> RowEntry {
    RowEntry {
        key: Bytes::copy_from_slice(key.as_bytes()),
        value,
        seq,
        create_ts: None,
        expire_ts: None,
    }
}

fn value(bytes: &str) -> ValueDeletable {
    ValueDeletable::Value(Bytes::copy_from_slice(bytes.as_bytes()))
}

/// A batch with one row of each kind and every timestamp combination.
fn sample() -> Vec<RowEntry> {
    vec![
        row("a", value("1"), 7),
        RowEntry {
            create_ts: Some(-5),
            ..row("b", ValueDeletable::Merge(Bytes::from_static(b"+1")), 7)
        },
        RowEntry {
            expire_ts: Some(i64::MAX),
            ..row("c", ValueDeletable::Tombstone, 7)
        },
        RowEntry {
            create_ts: Some(1),
            expire_ts: Some(2),
            ..row("", value(""), 7)
        },
    ]
}

/// `encoded` with its body checksum recomputed, so a test reaches the
/// check after the checksum.
fn reseal(mut encoded: Vec<u8>) -> Bytes {
    let crc = crc32c::crc32c(&encoded[HEADER_BYTES..]);
    encoded[12..16].copy_from_slice(&crc.to_le_bytes());
    Bytes::from(encoded)
}

#[test]
fn round_trips_every_row_kind_and_timestamp() {
    let rows = sample();
    assert_eq!(decode(&encode(&rows).unwrap()).unwrap(), rows);
}

#[test]
fn keys_and_values_are_slices_of_the_record() {
    let encoded = encode(&sample()).unwrap();
    let rows = decode(&encoded).unwrap();
    let range = encoded.as_ptr_range();
    assert!(range.contains(&rows[0].key.as_ptr()));
}

#[test]
fn an_empty_batch_is_refused_both_ways() {
    assert_eq!(encode(&[]), Err(BatchError::Empty));
    let mut encoded = encode(&sample()).unwrap().to_vec();
    encoded.truncate(HEADER_BYTES);
    encoded[8..12].copy_from_slice(&0u32.to_le_bytes());
    assert_eq!(decode(&reseal(encoded)), Err(BatchError::Empty));
}

#[test]
fn header_errors_name_the_field() {
    let encoded = encode(&sample()).unwrap().to_vec();
    assert_eq!(
        decode(&Bytes::copy_from_slice(&encoded[..10])),
        Err(BatchError::Short { len: 10 })
    );
    let mut bad = encoded.clone();
    bad[0] = b'X';
    assert_eq!(
        decode(&Bytes::from(bad)),
        Err(BatchError::Magic { found: *b"XSWB" })
    );
    let mut bad = encoded.clone();
    bad[4] = 2;
    assert_eq!(
        decode(&Bytes::from(bad)),
        Err(BatchError::Version { found: 2 })
    );
    let mut bad = encoded.clone();
    bad[6] = 1;
    assert_eq!(
        decode(&Bytes::from(bad)),
        Err(BatchError::Reserved { found: 1 })
    );
    let mut bad = encoded.clone();
    let last = bad.len() - 1;
    bad[last] ^= 0x40;
    let error = decode(&Bytes::from(bad)).unwrap_err();
    assert!(matches!(error, BatchError::Checksum { .. }), "{error}");
    assert!(error.to_string().contains("checksum mismatch"));
}

#[test]
fn body_errors_name_the_row() {
    let encoded = encode(&sample()).unwrap().to_vec();
    // Row 0's kind byte.
    let mut bad = encoded.clone();
    bad[HEADER_BYTES] = 9;
    assert_eq!(
        decode(&reseal(bad)),
        Err(BatchError::Kind { row: 0, kind: 9 })
    );
    let mut bad = encoded.clone();
    bad[HEADER_BYTES + 1] = 0x80;
    assert_eq!(
        decode(&reseal(bad)),
        Err(BatchError::Flags {
            row: 0,
            flags: 0x80
        })
    );
    // One row more than the body holds.
    let mut bad = encoded.clone();
    bad[8..12].copy_from_slice(&5u32.to_le_bytes());
    assert!(matches!(
        decode(&reseal(bad)),
        Err(BatchError::Truncated {
            row: 4,
            field: "kind",
            ..
        })
    ));
    // One row fewer: the last row is left over.
    let mut bad = encoded.clone();
    bad[8..12].copy_from_slice(&3u32.to_le_bytes());
    assert!(matches!(
        decode(&reseal(bad)),
        Err(BatchError::Trailing { rows: 3, .. })
    ));
}

fn value_strategy() -> impl Strategy<Value = ValueDeletable> {
    let bytes = || prop::collection::vec(any::<u8>(), 0..64).prop_map(Bytes::from);
    prop_oneof![
        bytes().prop_map(ValueDeletable::Value),
        bytes().prop_map(ValueDeletable::Merge),
        Just(ValueDeletable::Tombstone),
    ]
}

fn batch_strategy() -> impl Strategy<Value = Vec<RowEntry>> {
    let row = (
        prop::collection::vec(any::<u8>(), 0..32),
        value_strategy(),
        any::<u64>(),
        any::<Option<i64>>(),
        any::<Option<i64>>(),
    )
        .prop_map(|(key, value, seq, create_ts, expire_ts)| RowEntry {
            key: Bytes::from(key),
            value,
            seq,
            create_ts,
            expire_ts,
        });
    prop::collection::vec(row, 1..8)
}

proptest! {
    #[test]
    fn prop_round_trips(rows in batch_strategy()) {
        prop_assert_eq!(decode(&encode(&rows).unwrap()).unwrap(), rows);
    }

    #[test]
    fn prop_any_bit_flip_is_rejected(rows in batch_strategy(), seed: usize) {
        let encoded = encode(&rows).unwrap().to_vec();
        let bit = seed % (encoded.len() * 8);
        let mut flipped = encoded;
        flipped[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(decode(&Bytes::from(flipped)).is_err());
    }

    #[test]
    fn prop_any_truncation_is_rejected(rows in batch_strategy(), seed: usize) {
        let encoded = encode(&rows).unwrap();
        let len = seed % encoded.len();
        prop_assert!(decode(&encoded.slice(..len)).is_err());
    }

    #[test]
    fn prop_decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode(&Bytes::from(bytes));
    }
}
