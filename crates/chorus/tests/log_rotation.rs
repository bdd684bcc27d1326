//! Rotation, sealing and folding under faults (docs/protocol.md, Writing):
//! crashes between the switch to the pending segment and the fold, crashes
//! mid-seal, lost fold responses, and the two rotation backpressure errors.
//! Memory stores with fault injection; every scenario ends by reading back
//! every acknowledged record.

#[path = "support/log.rs"]
mod log_support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chorus::blob::{Fault, FaultController, FaultRule, KeyMatch, Op, OpSet, RuleId};
use chorus::ids::RecordIndex;
use chorus::log::{ErrorKind, LogConfig, LogError, MAX_DIRECTORY_ENTRY_BYTES, Writer};
use chorus::register::{FaultyRegister, Manifest, MemoryRegister};
use log_support::{Cluster, append_acked, append_acked_retrying, payload, test_config, wait_until};

/// Segments of 200 framed bytes: twelve 13-byte test records (17 bytes
/// with their length prefix) fill one.
fn small_segments() -> LogConfig {
    LogConfig {
        max_segment_bytes: 200,
        ..test_config()
    }
}

/// Records that fill one 200-byte segment.
const RECORDS_PER_SEGMENT: u64 = 12;

/// A 13-byte test record with its 4-byte length prefix: what it adds to its segment.
const FRAMED_RECORD_BYTES: u64 = 17;

/// Makes every create of a sealed object fail on the given controllers.
fn fail_sealed_creates(controllers: &[&FaultController]) -> Vec<RuleId> {
    controllers
        .iter()
        .map(|controller| {
            controller.add(
                FaultRule::new(Fault::FailBefore)
                    .ops(OpSet::of(&[Op::Create]))
                    .keys(KeyMatch::Prefix("sealed".into())),
            )
        })
        .collect()
}

/// Asserts the directory names each segment once.
fn assert_no_duplicate_entries(manifest: &Manifest) {
    let ids: BTreeSet<_> = manifest.segments.iter().map(|entry| entry.id).collect();
    assert_eq!(
        ids.len(),
        manifest.segments.len(),
        "duplicate directory entries: {:?}",
        manifest.segments
    );
}

/// Fills the active segment so the writer rotates, then appends `more` records
/// into the segment it switched to.
async fn rotate_and_continue(writer: &Writer, more: u64, acked: &mut BTreeMap<RecordIndex, Bytes>) {
    append_acked(writer, "full", RECORDS_PER_SEGMENT, acked).await;
    append_acked(writer, "next", more, acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_switching_to_pending_before_the_seal_lands() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(small_segments()).await.unwrap();
    let before = cluster.manifest().await;
    let controllers: Vec<_> = cluster.faults.iter().collect();
    fail_sealed_creates(&controllers);
    let mut acked = BTreeMap::new();
    rotate_and_continue(&writer, 10, &mut acked).await;
    let pending = before.pending.unwrap();
    // The writer is appending to the pending segment; the register has not moved.
    assert!(!cluster.fragments_on(0, pending).await.is_empty());
    assert_eq!(cluster.manifest().await, before);
    writer.abort();

    cluster.heal();
    let (writer, replayed) = cluster.open(small_segments()).await.unwrap();
    assert_eq!(replayed, acked.clone().into_iter().collect::<Vec<_>>());
    let manifest = cluster.manifest().await;
    let sealed: Vec<_> = manifest.segments.iter().map(|entry| entry.id).collect();
    assert_eq!(sealed, vec![before.tail, pending]);
    append_acked(&writer, "after", 40, &mut acked).await;
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    assert_no_duplicate_entries(&cluster.manifest().await);
    cluster.verify_acked(&acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_switching_to_pending_while_the_fold_fails() {
    let register_faults = FaultController::new(7);
    let register = FaultyRegister::new(Arc::new(MemoryRegister::new()), register_faults.clone());
    let cluster = Cluster::with_register(3, 4, Arc::new(register)).await;
    let (writer, _) = cluster.open(small_segments()).await.unwrap();
    let before = cluster.manifest().await;
    register_faults.add(FaultRule::new(Fault::FailBefore).ops(OpSet::of(&[Op::Update])));
    let mut acked = BTreeMap::new();
    rotate_and_continue(&writer, 10, &mut acked).await;
    // The seal landed on every replica; only the fold is missing.
    wait_until("the seal lands everywhere", Duration::from_secs(2), || {
        let cluster = &cluster;
        async move {
            let mut everywhere = true;
            for replica in 0..3 {
                everywhere &= cluster.sealed_on(replica).await.len() == 1;
            }
            everywhere
        }
    })
    .await;
    wait_until("the fold is attempted", Duration::from_secs(2), || {
        let injected = register_faults.injected();
        async move { injected > 0 }
    })
    .await;
    assert_eq!(cluster.manifest().await, before);
    let writer_sealed = cluster.sealed_on(0).await;
    writer.abort();

    register_faults.clear();
    let (writer, replayed) = cluster.open(small_segments()).await.unwrap();
    assert_eq!(replayed, acked.clone().into_iter().collect::<Vec<_>>());
    let manifest = cluster.manifest().await;
    assert_eq!(manifest.segments.len(), 2);
    // Recovery sealed the same content into the same content-addressed object.
    for replica in 0..3 {
        let sealed = cluster.sealed_on(replica).await;
        assert_eq!(sealed.len(), 2, "replica {replica}: {sealed:?}");
        assert!(sealed.contains(&writer_sealed[0]));
    }
    append_acked(&writer, "after", 40, &mut acked).await;
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    cluster.verify_acked(&acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_in_the_middle_of_sealing() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(small_segments()).await.unwrap();
    let before = cluster.manifest().await;
    // The seal reaches replica 0 only: short of the quorum of two.
    fail_sealed_creates(&[&cluster.faults[1], &cluster.faults[2]]);
    let mut acked = BTreeMap::new();
    rotate_and_continue(&writer, 5, &mut acked).await;
    wait_until(
        "the seal lands on replica 0",
        Duration::from_secs(2),
        || {
            let cluster = &cluster;
            async move { !cluster.sealed_on(0).await.is_empty() }
        },
    )
    .await;
    assert!(cluster.sealed_on(1).await.is_empty());
    assert_eq!(cluster.manifest().await, before);
    writer.abort();

    cluster.heal();
    let (writer, replayed) = cluster.open(small_segments()).await.unwrap();
    assert_eq!(replayed, acked.clone().into_iter().collect::<Vec<_>>());
    let manifest = cluster.manifest().await;
    let tail_entry = manifest.segments[0];
    assert_eq!(tail_entry.id, before.tail);
    let named = chorus::log::layout::sealed_key(tail_entry.id, tail_entry.crc32c);
    for replica in 0..3 {
        assert!(
            cluster.sealed_on(replica).await.contains(&named),
            "replica {replica} lacks {named}"
        );
    }
    append_acked(&writer, "after", 40, &mut acked).await;
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    cluster.verify_acked(&acked).await;
}

/// Waits until the directory holds at least `entries` entries.
async fn wait_for_folds(cluster: &Cluster, entries: usize) {
    wait_until("the folds", Duration::from_secs(2), || async move {
        cluster.manifest().await.segments.len() >= entries
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_fold_response_leaves_no_duplicate_entry() {
    let register_faults = FaultController::new(11);
    let register = FaultyRegister::new(Arc::new(MemoryRegister::new()), register_faults.clone());
    let cluster = Cluster::with_register(3, 4, Arc::new(register)).await;
    let (writer, _) = cluster.open(small_segments()).await.unwrap();
    // The first fold CAS applies, but its response is lost.
    register_faults.add(
        FaultRule::new(Fault::FailAfter)
            .ops(OpSet::of(&[Op::Update]))
            .times(1),
    );
    let mut acked = BTreeMap::new();
    append_acked(&writer, "fold", 2 * RECORDS_PER_SEGMENT, &mut acked).await;
    // While the lost response is resolved, the next segment takes every
    // record; once it is folded too, nothing is left in the active segment.
    let end = writer.status().next_index;
    wait_until("everything is folded", Duration::from_secs(2), || {
        let cluster = &cluster;
        async move { cluster.manifest().await.tail_base == end }
    })
    .await;
    assert_eq!(register_faults.injected(), 1);
    assert_eq!(cluster.manifest().await.segments.len(), 2);
    // The writer carries on, and later folds still apply once each.
    append_acked(&writer, "more", 3 * RECORDS_PER_SEGMENT, &mut acked).await;
    wait_for_folds(&cluster, 3).await;
    assert_eq!(writer.status().stopped, None);
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    assert_no_duplicate_entries(&cluster.manifest().await);
    let recovered = cluster.verify_acked(&acked).await;
    assert_eq!(recovered.len(), acked.len());
}

/// Appends `tag` records one at a time until admission refuses one; returns
/// the refusal.
async fn append_until_refused(
    writer: &Writer,
    tag: &str,
    limit: u64,
    acked: &mut BTreeMap<RecordIndex, Bytes>,
) -> LogError {
    for sequence in 0..limit {
        let record = payload(tag, sequence);
        match writer.append(record.clone()) {
            Ok(completion) => {
                let receipt = completion.await.unwrap();
                acked.insert(receipt.index, record);
            }
            Err(refused) => return refused,
        }
    }
    panic!("no refusal after {limit} appends");
}

/// Asserts `refused` is retryable backpressure that consumed no index.
#[track_caller]
fn assert_backpressure(writer: &Writer, refused: &LogError, next: RecordIndex) {
    assert_eq!(refused.kind(), ErrorKind::Retry, "{refused}");
    assert!(!refused.may_have_committed(), "{refused}");
    assert_eq!(
        writer.status().next_index,
        next,
        "a refusal consumed an index"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_segment_directory_refuses_appends() {
    let capacity = 4 * MAX_DIRECTORY_ENTRY_BYTES;
    let register = MemoryRegister::with_capacity(capacity);
    let cluster = Cluster::with_register(3, 4, Arc::new(register)).await;
    let (writer, _) = cluster.open(small_segments()).await.unwrap();
    let mut acked = BTreeMap::new();
    let refused = append_until_refused(&writer, "fill", 1000, &mut acked).await;
    assert!(
        matches!(refused, LogError::SegmentDirectoryFull { max, .. } if max == capacity),
        "{refused}"
    );
    let next = RecordIndex(acked.len() as u64);
    assert_backpressure(&writer, &refused, next);
    // Refused again, still without consuming an index.
    let again = writer.append(payload("again", 0)).unwrap_err();
    assert!(
        matches!(again, LogError::SegmentDirectoryFull { .. }),
        "{again}"
    );
    assert_backpressure(&writer, &again, next);
    // The writer rotated while the directory had room for two entries, and
    // refused once the active segment was full without that room. The last
    // seal may still be folding when the refusal comes (it already counts as
    // an entry), so wait for the register to show it.
    let used = |manifest: &chorus::register::Manifest| -> usize {
        manifest
            .segments
            .iter()
            .map(|entry| format!("{}:{}:{:08x} ", entry.id, entry.base, entry.crc32c).len())
            .sum()
    };
    wait_until("the last fold lands", Duration::from_secs(5), || async {
        used(&cluster.manifest().await) + 2 * MAX_DIRECTORY_ENTRY_BYTES > capacity
    })
    .await;
    let manifest = cluster.manifest().await;
    assert!(manifest.segments.len() >= 2, "{:?}", manifest.segments);
    // Every sealed segment reached its rotation threshold before it rotated.
    assert!(acked.len() as u64 >= manifest.segments.len() as u64 * RECORDS_PER_SEGMENT);
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    let recovered = cluster.verify_acked(&acked).await;
    assert_eq!(recovered.len(), acked.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_seal_refuses_appends_with_active_segment_full() {
    let cluster = Cluster::new(3, 4).await;
    let config = LogConfig {
        max_active_segment_bytes: 400,
        ..small_segments()
    };
    let (writer, _) = cluster.open(config).await.unwrap();
    let controllers: Vec<_> = cluster.faults.iter().collect();
    let stalls = fail_sealed_creates(&controllers);
    let mut acked = BTreeMap::new();
    append_acked(&writer, "full", RECORDS_PER_SEGMENT, &mut acked).await;
    // The old segment cannot be sealed; the new one fills up to 400 bytes.
    let refused = append_until_refused(&writer, "grow", 1000, &mut acked).await;
    assert!(
        matches!(refused, LogError::ActiveSegmentFull { max: 400, .. }),
        "{refused}"
    );
    let next = writer.status().next_index;
    assert_eq!(next, RecordIndex(acked.len() as u64));
    assert_eq!(
        acked.len() as u64,
        RECORDS_PER_SEGMENT + 400 / FRAMED_RECORD_BYTES
    );
    assert_backpressure(&writer, &refused, next);
    assert!(cluster.manifest().await.segments.is_empty());

    // The seal heals; the same append is admitted at the index it was refused.
    for (controller, stall) in cluster.faults.iter().zip(stalls) {
        controller.remove(stall);
    }
    let record = payload("retried", 0);
    let mut completion = None;
    wait_until(
        "the append is admitted again",
        Duration::from_secs(2),
        || {
            if completion.is_none() {
                completion = writer.append(record.clone()).ok();
            }
            let admitted = completion.is_some();
            async move { admitted }
        },
    )
    .await;
    let receipt = completion.unwrap().await.unwrap();
    assert_eq!(receipt.index, next);
    acked.insert(receipt.index, record);
    // The full segment rotates now; until that seal lands the new one may
    // fill up too, which is backpressure to wait out.
    append_acked_retrying(&writer, "after", 40, &mut acked).await;
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    let recovered = cluster.verify_acked(&acked).await;
    assert_eq!(recovered.len(), acked.len());
}

/// Segments are measured in frames: empty records (valid, zero payload
/// bytes) still fill and rotate their segment. Counted by payload bytes, a
/// stream of them never rotated, so the active segment (and the records the
/// writer keeps for its seal) grew without bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_empty_records_fills_and_rotates_its_segment() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(small_segments()).await.unwrap();
    let mut acked = BTreeMap::new();
    // 200 bytes of 4-byte frames: the 50th empty record fills the segment.
    for _ in 0..60 {
        let receipt = writer.append(Bytes::new()).unwrap().await.unwrap();
        acked.insert(receipt.index, Bytes::new());
    }
    wait_until(
        "the segment of empty records is folded",
        Duration::from_secs(2),
        || {
            let cluster = &cluster;
            async move { cluster.manifest().await.segments.len() == 1 }
        },
    )
    .await;
    let manifest = cluster.manifest().await;
    assert_eq!(manifest.tail_base, RecordIndex(50), "{manifest:?}");
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    assert_eq!(cluster.verify_acked(&acked).await.len(), 60);
}

/// A log whose register a build before register format 2 wrote (its newest
/// seal's digest as bare SHA-256 hex) opens and reads as before; the first
/// change writes the register back as format 3, keeping the old seal's
/// SHA-256 (named as such), and the next seal records XXH3-128.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_with_a_format_one_register_opens_and_seals_in_format_three() {
    use sha2::{Digest, Sha256};

    let sha256 = |sealed: &[u8]| hex::encode(Sha256::digest(sealed));
    opens_and_seals_from_an_older_register("1", sha256, "sha256").await;
}

/// The same from register format 2, whose seals recorded BLAKE3. Nothing
/// reads a digest back to check it (the register keeps what the sealer
/// wrote), so the stored value stands for the BLAKE3 it spelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_with_a_format_two_register_opens_and_seals_in_format_three() {
    let blake3 = |sealed: &[u8]| format!("blake3:{}", hex::encode(&sealed[..32]));
    opens_and_seals_from_an_older_register("2", blake3, "blake3").await;
}

/// Seals one segment, rewrites the register as `format` stored it (the seal's
/// digest spelled by `spell`), then opens a writer on it and seals again.
async fn opens_and_seals_from_an_older_register(
    format: &str,
    spell: impl Fn(&[u8]) -> String,
    algorithm: &str,
) {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(small_segments()).await.unwrap();
    let mut acked = BTreeMap::new();
    // Exactly one segment's records: the tail it switched to stays empty, so
    // the recovery below has nothing to seal.
    append_acked(&writer, "full", RECORDS_PER_SEGMENT, &mut acked).await;
    wait_until("the first seal folds", Duration::from_secs(10), || async {
        cluster.manifest().await.segments.len() == 1
    })
    .await;
    writer.shutdown(Duration::from_secs(5)).await.unwrap();

    // Rewrite the register as the older format spelled it.
    let sealed_key = cluster.sealed_on(0).await.pop().expect("one sealed object");
    let sealed = cluster.raw[0].get(&sealed_key).await.unwrap().bytes;
    let stored_digest = spell(&sealed);
    let register = cluster.stores.register.clone();
    let current = register.read().await.unwrap().unwrap();
    assert_eq!(current.fields["chorus.format"], "3");
    assert!(current.fields["chorus.seal_digest"].starts_with("xxh3-128:"));
    let mut older = current.fields.clone();
    older.insert("chorus.format".into(), format.into());
    older.insert("chorus.seal_digest".into(), stored_digest.clone());
    register.update(&current.version, &older).await.unwrap();
    let digest = cluster.manifest().await.seal.unwrap().digest;
    assert_eq!(digest.algorithm(), algorithm);

    // A new writer recovers from it (its claim rewrites the register) and
    // every acknowledged record reads back.
    let (writer, replayed) = cluster.open(small_segments()).await.unwrap();
    assert_eq!(replayed.len(), acked.len());
    let rewritten = register.read().await.unwrap().unwrap().fields;
    assert_eq!(rewritten["chorus.format"], "3");
    let manifest = Manifest::from_fields(&rewritten).unwrap();
    let seal = manifest.seal.unwrap();
    assert_eq!(manifest.segments.len(), 1, "nothing sealed since");
    // The old seal keeps the digest it had.
    assert_eq!(seal.digest, digest);
    assert_eq!(rewritten["chorus.seal_digest"], digest.to_string());
    // The next seal is this build's.
    let sealed_before = manifest.segments.len();
    append_acked(&writer, "after", RECORDS_PER_SEGMENT, &mut acked).await;
    wait_until("the next seal folds", Duration::from_secs(10), || async {
        cluster.manifest().await.segments.len() > sealed_before
    })
    .await;
    let newest = cluster.manifest().await.seal.unwrap();
    assert_ne!(newest.id, seal.id);
    assert_eq!(newest.digest.algorithm(), "xxh3-128");
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    assert_eq!(cluster.verify_acked(&acked).await.len(), acked.len());
}
