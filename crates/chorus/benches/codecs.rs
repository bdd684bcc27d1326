//! Micro-benchmarks of the byte formats (issue 12): fragment and sealed
//! segment encode and decode, and the checksums they are built from, over
//! 4 KiB records. The write path encodes every byte once, into a fragment;
//! a writer's sealed segment is its fragments' payloads behind a new header,
//! with a whole-object CRC32C combined from theirs and an XXH3-128 digest for
//! the register. Recovery encodes sealed segments from records; recovery and
//! readers decode.
//!
//! `cargo bench -p chorus --bench codecs`; under `cargo test` each runs once.

use std::hint::black_box;

use bytes::Bytes;
use chorus::codec::{FRAME_HEADER_BYTES, Fragment, SealedSegment, object_crc32c};
use chorus::ids::{Epoch, FragmentIndex, RecordIndex, SegmentId};
use chorus::register::SealDigest;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use sha2::{Digest, Sha256};

/// The record size of the targets.
const RECORD_BYTES: usize = 4096;
const MIB: usize = 1024 * 1024;

/// Records of [`RECORD_BYTES`] whose frames fill `bytes` (at least one).
fn records_filling(bytes: usize) -> Vec<Bytes> {
    let count = (bytes / (RECORD_BYTES + FRAME_HEADER_BYTES)).max(1);
    (0..count)
        .map(|i| Bytes::from(vec![i as u8; RECORD_BYTES]))
        .collect()
}

/// A one-record fragment (light load) and a full 4 MiB one (the default
/// `max_fragment_bytes`, peak load).
fn fragments(c: &mut Criterion) {
    let mut group = c.benchmark_group("fragment");
    for (label, bytes) in [("1 record", RECORD_BYTES), ("4 MiB", 4 * MIB)] {
        let fragment = Fragment::Data {
            epoch: Epoch(7),
            index: FragmentIndex(3),
            first: RecordIndex(1_000),
            records: records_filling(bytes),
        };
        let encoded = fragment.encode();
        group.throughput(Throughput::Bytes(encoded.len() as u64));
        group.bench_with_input(BenchmarkId::new("encode", label), &fragment, |b, f| {
            b.iter(|| f.encode())
        });
        group.bench_with_input(BenchmarkId::new("decode", label), &encoded, |b, e| {
            b.iter(|| Fragment::decode(e).expect("decodes"))
        });
    }
    group.finish();
}

/// A 4 MiB sealed segment: per byte, as a 64 MiB one costs, without holding
/// hundreds of MiB per sample.
fn sealed(c: &mut Criterion) {
    let mut group = c.benchmark_group("sealed");
    let segment = SealedSegment {
        id: SegmentId::new(Epoch(7), 2),
        base: RecordIndex(1_000),
        records: records_filling(4 * MIB),
    };
    let encoded = segment.encode().expect("encodes");
    let crc = object_crc32c(&encoded);
    group.throughput(Throughput::Bytes(encoded.len() as u64));
    group.bench_function("encode/4 MiB", |b| {
        b.iter(|| segment.encode().expect("encodes"))
    });
    group.bench_function("decode/4 MiB", |b| {
        b.iter(|| SealedSegment::decode(&encoded).expect("decodes"))
    });
    // What a replay or reader runs per sealed object: decode plus the
    // whole-object checksum its key names.
    group.bench_function("decode_verified/4 MiB", |b| {
        b.iter(|| {
            SealedSegment::decode_verified(&encoded, segment.id, segment.base, crc)
                .expect("verifies")
        })
    });
    group.finish();
}

/// CRC32C (every object's payload and every sealed object whole), XXH3-128
/// (every sealed object, for the register's seal digest), and side by side
/// the seal digests of register formats 2 (BLAKE3) and 1 (SHA-256).
fn checksums(c: &mut Criterion) {
    let mut group = c.benchmark_group("checksum");
    for (label, bytes) in [("4 KiB", RECORD_BYTES), ("4 MiB", 4 * MIB)] {
        let data = vec![0x5a_u8; bytes];
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_with_input(BenchmarkId::new("crc32c", label), &data, |b, d| {
            b.iter(|| crc32c::crc32c(black_box(d)))
        });
        group.bench_with_input(BenchmarkId::new("xxh3-128", label), &data, |b, d| {
            b.iter(|| SealDigest::of_frames(black_box(d)))
        });
        group.bench_with_input(BenchmarkId::new("blake3", label), &data, |b, d| {
            b.iter(|| blake3::hash(black_box(d)))
        });
        group.bench_with_input(BenchmarkId::new("sha256", label), &data, |b, d| {
            b.iter(|| Sha256::digest(black_box(d)))
        });
    }
    group.finish();
}

criterion_group!(benches, fragments, sealed, checksums);
criterion_main!(benches);
