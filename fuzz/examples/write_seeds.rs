//! Writes a few valid objects into each target's corpus directory
//! (`fuzz/corpus/<target>/`), so fuzzing starts from inputs that pass every
//! check instead of having to discover the formats. See docs/fuzzing.md.

use std::fs;
use std::path::Path;

use bytes::Bytes;
use chorus::codec::{Fragment, SealedSegment, encode_frames};
use chorus::ids::{Epoch, FragmentIndex, RecordIndex, SegmentId};

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
    println!("seeds written under {}", corpus.display());
    Ok(())
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
    segment.encode()
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
