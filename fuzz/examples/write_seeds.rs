//! Writes a few valid objects into each target's corpus directory
//! (`fuzz/corpus/<target>/`), so fuzzing starts from inputs that pass every
//! check instead of having to discover the formats. See docs/fuzzing.md.

use std::fs;
use std::path::Path;

use bytes::Bytes;
use chorus::codec::{Fragment, SealedSegment, encode_frames};
use chorus::ids::{Epoch, FragmentIndex, RecordIndex, SegmentId};
use chorus::lease::{DatabaseKey, Generation, HolderId, Incarnation, LeaseRecord, Term};
use chorus::register::{Manifest, encode_document};
use chorus::snapshot::{Head, PayloadId, PublicationSequence, PublisherId, Sha256Digest};
use chorus_slatedb::batch::encode;
use slatedb::{RowEntry, ValueDeletable};

fn main() -> std::io::Result<()> {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let record_sets = record_sets();
    for (n, records) in record_sets.iter().enumerate() {
        write(&corpus, "decode_fragment", n, &data_fragment(records))?;
        write(&corpus, "decode_sealed", n, &sealed(records))?;
        write(&corpus, "decode_frames", n, &frames(records))?;
    }
    let fence = Fragment::Fence {
        epoch: Epoch(2),
        index: FragmentIndex(7),
    };
    write(
        &corpus,
        "decode_fragment",
        record_sets.len(),
        &fence.encode(),
    )?;
    for (n, document) in documents().iter().enumerate() {
        write(&corpus, "decode_documents", n, document)?;
    }
    for (n, batch) in write_batches().iter().enumerate() {
        write(&corpus, "decode_write_batch", n, batch)?;
    }
    println!("seeds written under {}", corpus.display());
    Ok(())
}

/// A lease, a HEAD and a register document, each behind its kind byte.
fn documents() -> Vec<Vec<u8>> {
    let database = DatabaseKey::new("db").expect("a valid key");
    let holder = HolderId::new("node-a").expect("a valid holder");
    let lease = LeaseRecord {
        database_key: database.clone(),
        holder_id: holder.clone(),
        incarnation: Some(Incarnation(0x5eed)),
        term: Term(3),
        generation: Generation(7),
        acquired_at_ms: 1_700_000_000_000,
        expires_at_ms: 1_700_000_010_000,
        released: false,
    };
    let head = Head {
        database_key: database,
        holder_id: holder,
        term: Term(3),
        lease_generation: Generation(7),
        publication_sequence: PublicationSequence(9),
        snapshot: PayloadId {
            generation: Generation(7),
            sequence: PublicationSequence(9),
        },
        wal_index: RecordIndex(120),
        payload_size_bytes: 5,
        payload_sha256: Sha256Digest::of(b"hello"),
        publisher_id: PublisherId(0x0123_4567_89ab_cdef),
        updated_at_ms: 1_700_000_000_500,
    };
    let register = Manifest::initial(vec!["a".into(), "b".into(), "c".into()], 4)
        .to_fields()
        .expect("the initial register encodes");
    [
        (0, lease.encode()),
        (1, head.encode()),
        (2, encode_document(&register)),
    ]
    .into_iter()
    .map(|(kind, bytes)| [&[kind][..], &bytes[..]].concat())
    .collect()
}

fn record_sets() -> Vec<Vec<Bytes>> {
    let record = |bytes: &[u8]| Bytes::copy_from_slice(bytes);
    vec![
        vec![record(b"")],
        vec![record(b"a")],
        vec![record(b"put k v"), record(b""), record(b"del k")],
        vec![record(&[0xff; 300]), record(b"x")],
    ]
}

/// SlateDB write batches as chorus-slatedb records them: rows of each kind,
/// an empty key, and rows with and without their optional timestamps.
fn write_batches() -> Vec<Bytes> {
    let row = |key: &[u8], value, seq, create_ts, expire_ts| RowEntry {
        key: Bytes::copy_from_slice(key),
        value,
        seq,
        create_ts,
        expire_ts,
    };
    let batches = [
        vec![row(b"", ValueDeletable::Tombstone, 0, None, None)],
        vec![row(
            b"k",
            ValueDeletable::Value(Bytes::from_static(b"v")),
            1,
            None,
            None,
        )],
        vec![
            row(
                b"a",
                ValueDeletable::Value(Bytes::from(vec![7; 300])),
                5,
                Some(1_700),
                None,
            ),
            row(b"b", ValueDeletable::Tombstone, 6, Some(1_701), Some(9_000)),
            row(
                b"c",
                ValueDeletable::Merge(Bytes::from_static(b"+1")),
                7,
                None,
                Some(-1),
            ),
        ],
    ];
    batches
        .iter()
        .map(|rows| encode(rows).expect("a valid batch"))
        .collect()
}

fn data_fragment(records: &[Bytes]) -> Bytes {
    let fragment = Fragment::Data {
        epoch: Epoch(1),
        index: FragmentIndex(3),
        first: RecordIndex(40),
        records: records.to_vec(),
    };
    fragment.encode()
}

fn sealed(records: &[Bytes]) -> Bytes {
    let segment = SealedSegment {
        id: SegmentId::new(Epoch(1), 2),
        base: RecordIndex(40),
        records: records.to_vec(),
    };
    segment.encode().expect("a valid segment")
}

/// The `decode_frames` input: the record count byte, then the frames.
fn frames(records: &[Bytes]) -> Bytes {
    let count = u8::try_from(records.len()).expect("few records");
    let mut input = vec![count];
    input.extend_from_slice(&encode_frames(records));
    Bytes::from(input)
}

fn write(corpus: &Path, target: &str, n: usize, bytes: &[u8]) -> std::io::Result<()> {
    let dir = corpus.join(target);
    fs::create_dir_all(&dir)?;
    fs::write(dir.join(format!("seed-{n}")), bytes)
}
