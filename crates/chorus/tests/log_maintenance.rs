//! Log maintenance (docs/protocol.md, Maintenance): truncation (floor first,
//! deletions after, tombstones until every replica let go), repair, the orphan
//! sweep, verify, and the maintenance a live writer runs in the background.
//! Memory stores with fault injection; every scenario ends by reading back
//! every acknowledged record at or above the floor.

#[path = "support/log.rs"]
mod log_support;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use chorus::blob::{DynBlobStore, Fault, FaultController, FaultRule, KeyMatch, Op, OpSet, RuleId};
use chorus::codec::{FRAGMENT_HEADER_BYTES, Fragment, SealedSegment, object_crc32c};
use chorus::ids::{FragmentIndex, OwnerId, RecordIndex, SegmentId};
use chorus::log::layout::{SEALED_PREFIX, SEGMENTS_PREFIX, fragment_key, sealed_key};
use chorus::log::maintenance::{Maintenance, NoProgress, VerifyReport};
use chorus::log::transitions::claim;
use chorus::log::{
    ErrorKind, LogConfig, LogError, MAX_DIRECTORY_ENTRY_BYTES, Reader, Recovery, Writer,
};
use chorus::register::{
    DEFAULT_MAX_ROUNDS, DirectoryEntry, FaultyRegister, Fields, Manifest, ManifestStore,
    MemoryRegister, RegisterError, RegisterVersion, VersionedManifest, transform,
};
use log_support::{Cluster, append_acked, payload, replay_all, test_config, wait_until};

type Acked = BTreeMap<RecordIndex, Bytes>;

/// Segments of 200 record bytes: sixteen 13-byte test records fill one.
fn small_segments() -> LogConfig {
    LogConfig {
        max_segment_bytes: 200,
        ..test_config()
    }
}

/// Records (13 bytes each: a 4-character tag; 17 with their length prefix)
/// that fill one 200-byte segment.
const RECORDS_PER_SEGMENT: u64 = 12;

/// How long a test waits for background work (seals, folds, repair).
const BACKGROUND_LIMIT: Duration = Duration::from_secs(5);

/// Fills and seals `count` more segments, one at a time, waiting for each fold.
async fn seal_segments(cluster: &Cluster, writer: &Writer, count: usize, acked: &mut Acked) {
    let start = cluster.manifest().await.segments.len();
    for round in 0..count {
        append_acked(writer, &format!("s{round:03}"), RECORDS_PER_SEGMENT, acked).await;
        wait_for_entries(cluster, start + round + 1).await;
    }
}

/// Waits until the directory holds at least `entries` entries.
async fn wait_for_entries(cluster: &Cluster, entries: usize) {
    wait_until("the folds", BACKGROUND_LIMIT, || async move {
        cluster.manifest().await.segments.len() >= entries
    })
    .await;
}

/// Makes every delete fail on every replica of `cluster`; returns the rules.
fn fail_deletes(cluster: &Cluster) -> Vec<RuleId> {
    cluster
        .faults
        .iter()
        .map(|controller| {
            controller.add(FaultRule::new(Fault::FailBefore).ops(OpSet::of(&[Op::Delete])))
        })
        .collect()
}

/// Removes one rule per controller.
fn remove_rules(controllers: &[FaultController], rules: Vec<RuleId>) {
    for (controller, rule) in controllers.iter().zip(rules) {
        controller.remove(rule);
    }
}

/// The sealed keys each replica holds.
async fn sealed_everywhere(cluster: &Cluster) -> Vec<Vec<String>> {
    let mut all = Vec::new();
    for replica in 0..cluster.raw.len() {
        all.push(cluster.sealed_on(replica).await);
    }
    all
}

/// The key the directory entry names.
fn key_of(entry: &DirectoryEntry) -> String {
    sealed_key(entry.id, entry.crc32c)
}

/// Whether the raw store holds `key`.
async fn holds(store: &DynBlobStore, key: &str) -> bool {
    store.head(key).await.is_ok()
}

/// Maintenance of the cluster's log (through its fault-injecting replicas).
fn maintenance(cluster: &Cluster) -> Maintenance {
    Maintenance::new(&cluster.stores)
}

/// The committed end of the cluster's log, as a process without a writer sees it.
async fn committed_end(cluster: &Cluster) -> RecordIndex {
    Reader::committed_end(&cluster.stores).await.unwrap()
}

async fn verify(cluster: &Cluster) -> VerifyReport {
    maintenance(cluster).verify(&NoProgress).await.unwrap()
}

/// Asserts `result` is a refusal to read below `floor`.
#[track_caller]
fn assert_truncated(result: Result<Vec<(RecordIndex, Bytes)>, LogError>, floor: RecordIndex) {
    match result {
        Err(LogError::Truncated {
            floor: reported, ..
        }) => assert_eq!(reported, floor),
        other => panic!("expected Truncated {{ floor: {floor} }}, got {other:?}"),
    }
}

/// Asserts a reader from `floor` returns exactly the acknowledged records from there.
async fn assert_readable_from(cluster: &Cluster, floor: RecordIndex, acked: &Acked) {
    let read = cluster
        .read_from(floor.0)
        .await
        .expect("reader from the floor");
    let expected: Vec<(RecordIndex, Bytes)> = acked
        .range(floor..)
        .map(|(index, record)| (*index, record.clone()))
        .collect();
    assert_eq!(read, expected);
}

/// Asserts `outcome` is an `InvalidFloor` whose reason contains `why`.
#[track_caller]
fn assert_invalid_floor<T: std::fmt::Debug>(outcome: Result<T, LogError>, why: &str) {
    match outcome {
        Err(error @ LogError::InvalidFloor { .. }) => {
            assert_eq!(error.kind(), ErrorKind::FixInput);
            assert!(error.to_string().contains(why), "{error}");
        }
        other => panic!("expected InvalidFloor ({why}), got {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// Truncation
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_is_committed_before_anything_is_deleted() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(small_segments()).await.unwrap();
    let mut acked = BTreeMap::new();
    seal_segments(&cluster, &writer, 4, &mut acked).await;
    append_acked(&writer, "tail", 5, &mut acked).await;
    let before = cluster.manifest().await;
    let sealed_before = sealed_everywhere(&cluster).await;
    // The floor falls inside the third segment: the first two lie wholly below.
    let floor = RecordIndex(before.segments[2].base.0 + 3);

    // Every delete fails: the pass stops right after committing the floor.
    let rules = fail_deletes(&cluster);
    let report = maintenance(&cluster)
        .truncate_before(floor, committed_end(&cluster).await, &NoProgress)
        .await
        .unwrap();
    assert_eq!(report.floor, floor);
    assert!(report.removed.is_empty(), "{report:?}");
    assert_eq!(
        report.tombstones,
        vec![before.segments[0].id, before.segments[1].id]
    );
    assert_eq!(report.deleted_objects, 0);
    let after = cluster.manifest().await;
    assert_eq!(after.trunc, floor);
    assert_eq!(
        after.segments, before.segments,
        "entries left before deletion"
    );
    assert!(after.is_tombstone(0) && after.is_tombstone(1) && !after.is_tombstone(2));
    assert_eq!(sealed_everywhere(&cluster).await, sealed_before);

    // Nothing below the floor is readable, everything above it is.
    assert_truncated(cluster.read_from(0).await, floor);
    assert_truncated(cluster.read_from(floor.0 - 1).await, floor);
    assert_readable_from(&cluster, floor, &acked).await;

    // A crash now: recovery refuses to replay from below the floor and keeps
    // everything above it.
    writer.abort();
    let recovery = Recovery::run(cluster.stores.clone(), small_segments())
        .await
        .unwrap();
    for below in [RecordIndex(0), RecordIndex(floor.0 - 1)] {
        assert!(
            matches!(
                recovery.replay(below),
                Err(LogError::InvalidCheckpoint { checkpoint, floor: f, .. })
                    if checkpoint == below && f == floor
            ),
            "replay from {below}"
        );
    }
    let replayed = replay_all(&recovery).await.unwrap();
    let expected: Vec<_> = acked.range(floor..).map(|(i, r)| (*i, r.clone())).collect();
    assert_eq!(replayed, expected);
    let writer = recovery.start().await.unwrap();
    append_acked(&writer, "more", 20, &mut acked).await;
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    remove_rules(&cluster.faults, rules);
    cluster.verify_acked(&acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncation_that_dies_after_its_cas_is_finished_by_a_later_pass_at_the_same_floor() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(small_segments()).await.unwrap();
    let mut acked = BTreeMap::new();
    seal_segments(&cluster, &writer, 3, &mut acked).await;
    let before = cluster.manifest().await;
    let floor = before.segments[2].base;
    let end = committed_end(&cluster).await;

    // Deletes hang; the process running the truncation dies while they do.
    let stalls: Vec<RuleId> = cluster
        .faults
        .iter()
        .map(|controller| {
            controller.add(
                FaultRule::new(Fault::Delay(Duration::from_secs(60))).ops(OpSet::of(&[Op::Delete])),
            )
        })
        .collect();
    let dying = maintenance(&cluster);
    let task = tokio::spawn(async move {
        dying
            .truncate_before(floor, end, &NoProgress)
            .await
            .unwrap()
    });
    wait_until("the floor is committed", BACKGROUND_LIMIT, || async {
        cluster.manifest().await.trunc == floor
    })
    .await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    remove_rules(&cluster.faults, stalls);

    let crashed = cluster.manifest().await;
    assert_eq!(crashed.segments, before.segments);
    assert_truncated(cluster.read_from(before.segments[1].base.0).await, floor);
    assert_readable_from(&cluster, floor, &acked).await;
    for replica in 0..3 {
        for entry in &before.segments {
            assert!(holds(&cluster.raw[replica], &key_of(entry)).await);
        }
    }

    // A later pass at the same floor deletes the tombstones without raising it.
    let report = maintenance(&cluster)
        .truncate_before(floor, end, &NoProgress)
        .await
        .unwrap();
    assert_eq!(report.floor, floor);
    assert_eq!(
        report.removed,
        vec![before.segments[0].id, before.segments[1].id]
    );
    assert!(report.tombstones.is_empty());
    let after = cluster.manifest().await;
    assert_eq!(after.trunc, floor);
    assert_eq!(after.segments, before.segments[2..]);
    for replica in 0..3 {
        for entry in &before.segments[..2] {
            assert!(!holds(&cluster.raw[replica], &key_of(entry)).await);
        }
    }
    append_acked(&writer, "more", 20, &mut acked).await;
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    cluster.verify_acked(&acked).await;
}

/// Seed 11 of the simulator: when a later tombstone was gone from every
/// replica but an earlier one was not, the later entry was dropped from the
/// middle of the directory, stretching the earlier tombstone's range over
/// its records. Entries now leave the directory only as a leading run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_11_tombstones_leave_the_directory_only_in_order() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(small_segments()).await.unwrap();
    let mut acked = BTreeMap::new();
    seal_segments(&cluster, &writer, 4, &mut acked).await;
    let before = cluster.manifest().await;
    let ids: Vec<SegmentId> = before.segments.iter().map(|entry| entry.id).collect();

    // Only the first tombstone's sealed copy on replica 2 resists deletion.
    let stuck = key_of(&before.segments[0]);
    cluster.faults[2].add(
        FaultRule::new(Fault::FailBefore)
            .ops(OpSet::of(&[Op::Delete]))
            .keys(KeyMatch::Exact(stuck.clone())),
    );
    let floor = before.segments[3].base;
    let report = writer.truncate_before(floor).await.unwrap();
    assert!(report.removed.is_empty(), "{report:?}");
    assert_eq!(report.tombstones.len(), 3, "{report:?}");
    for id in &ids[..3] {
        assert!(report.tombstones.contains(id), "{report:?}");
    }
    let manifest = cluster.manifest().await;
    assert_eq!(
        manifest.segments, before.segments,
        "an entry left out of order"
    );
    assert!(holds(&cluster.raw[2], &stuck).await);

    cluster.heal();
    let swept = maintenance(&cluster)
        .sweep_tombstones(&cluster.manifest().await, &NoProgress)
        .await
        .unwrap();
    assert_eq!(swept.removed, ids[..3]);
    assert_eq!(cluster.manifest().await.segments, before.segments[3..]);
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    cluster.verify_acked(&acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_down_during_truncation_leaves_tombstones_that_later_passes_sweep() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(small_segments()).await.unwrap();
    let mut acked = BTreeMap::new();
    seal_segments(&cluster, &writer, 5, &mut acked).await;
    let before = cluster.manifest().await;
    let ids: Vec<SegmentId> = before.segments.iter().map(|entry| entry.id).collect();

    // Replica 2 is down: the writer's truncation still succeeds, leaving tombstones.
    let first_floor = before.segments[2].base;
    cluster.faults[2].set_outage(true);
    let report = writer.truncate_before(first_floor).await.unwrap();
    assert_eq!(report.floor, first_floor);
    assert!(report.removed.is_empty());
    assert_eq!(report.tombstones, ids[..2]);
    let manifest = cluster.manifest().await;
    assert_eq!(manifest.trunc, first_floor);
    assert_eq!(manifest.segments, before.segments);
    assert!(manifest.is_tombstone(0) && manifest.is_tombstone(1));
    for entry in &before.segments[..2] {
        assert!(!holds(&cluster.raw[0], &key_of(entry)).await);
        assert!(!holds(&cluster.raw[1], &key_of(entry)).await);
        assert!(holds(&cluster.raw[2], &key_of(entry)).await);
    }
    // The writer keeps appending meanwhile.
    append_acked(&writer, "down", 10, &mut acked).await;

    // Healed, the leftover copies are tombstones, not damage. (What replica
    // 2 missed of the active segment while it was down is reported as
    // under-replicated; a quorum holds it.)
    cluster.heal();
    let report = verify(&cluster).await;
    assert!(report.below_quorum.is_empty(), "{report:?}");
    assert!(report.replicas.iter().all(no_damage), "{report:?}");
    assert_eq!(report.replicas[2].tombstones, 2);
    assert!(report.replicas[2].orphans.is_empty(), "{report:?}");

    // A tombstone sweep removes them without touching the floor.
    let swept = maintenance(&cluster)
        .sweep_tombstones(&cluster.manifest().await, &NoProgress)
        .await
        .unwrap();
    assert_eq!(swept.removed, ids[..2]);
    assert!(swept.tombstones.is_empty());
    assert_eq!(swept.floor, first_floor);
    let manifest = cluster.manifest().await;
    assert_eq!(manifest.trunc, first_floor);
    assert_eq!(manifest.segments[..3], before.segments[2..]);
    for entry in &before.segments[..2] {
        assert!(!holds(&cluster.raw[2], &key_of(entry)).await);
    }

    // Again with replica 1 down; this time a truncation at the same floor
    // (through the writer) is the later pass.
    let second_floor = before.segments[4].base;
    cluster.faults[1].set_outage(true);
    let report = writer.truncate_before(second_floor).await.unwrap();
    assert_eq!(report.tombstones, ids[2..4]);
    cluster.heal();
    let again = writer.truncate_before(second_floor).await.unwrap();
    assert_eq!(again.floor, second_floor);
    assert_eq!(again.removed, ids[2..4]);
    assert!(again.tombstones.is_empty());
    let manifest = cluster.manifest().await;
    assert_eq!(manifest.trunc, second_floor);
    assert_eq!(manifest.segments[0], before.segments[4]);
    for replica in 0..3 {
        for entry in &before.segments[..4] {
            assert!(!holds(&cluster.raw[replica], &key_of(entry)).await);
        }
    }
    append_acked(&writer, "more", 20, &mut acked).await;
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    cluster.verify_acked(&acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_below_the_committed_one_or_beyond_the_durable_end_is_refused() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(small_segments()).await.unwrap();
    let mut acked = BTreeMap::new();
    seal_segments(&cluster, &writer, 3, &mut acked).await;
    append_acked(&writer, "tail", 3, &mut acked).await;
    let floor = cluster.manifest().await.segments[1].base;
    writer.truncate_before(floor).await.unwrap();
    let register = || async { cluster.stores.register.read().await.unwrap().unwrap() };
    let before = register().await;
    let end = writer.status().next_index;
    assert_eq!(committed_end(&cluster).await, end);

    let lower = RecordIndex(floor.0 - 1);
    assert_invalid_floor(
        writer.truncate_before(lower).await,
        "below the committed floor",
    );
    assert_invalid_floor(
        maintenance(&cluster)
            .truncate_before(RecordIndex(0), end, &NoProgress)
            .await,
        "below the committed floor",
    );
    let beyond = RecordIndex(end.0 + 1);
    assert_invalid_floor(
        writer.truncate_before(beyond).await,
        "beyond the durable end",
    );
    assert_invalid_floor(
        maintenance(&cluster)
            .truncate_before(beyond, end, &NoProgress)
            .await,
        "beyond the durable end",
    );
    let after = register().await;
    assert_eq!(
        after.version, before.version,
        "a refused floor changed the register"
    );
    assert_eq!(after.fields, before.fields);

    // The same floor again is no error and changes nothing.
    let report = writer.truncate_before(floor).await.unwrap();
    assert_eq!(report.floor, floor);
    assert_eq!(register().await.version, before.version);
    // The durable end itself is a valid floor: nothing left below it.
    let report = writer.truncate_before(end).await.unwrap();
    assert_eq!(report.floor, end);
    assert_eq!(cluster.manifest().await.trunc, end);
    assert!(cluster.read_from(end.0).await.unwrap().is_empty());
    append_acked(&writer, "more", 20, &mut acked).await;
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    let recovered = cluster.verify_acked(&acked).await;
    assert_eq!(recovered.len(), 20);
}

/// Slows every delete so a truncation pass lasts long enough for others to queue.
fn slow_deletes(cluster: &Cluster, each: Duration) -> Vec<RuleId> {
    cluster
        .faults
        .iter()
        .map(|controller| {
            controller.add(FaultRule::new(Fault::Delay(each)).ops(OpSet::of(&[Op::Delete])))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncations_queued_while_one_runs_merge_to_the_highest_floor() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(small_segments()).await.unwrap();
    let mut acked = BTreeMap::new();
    seal_segments(&cluster, &writer, 6, &mut acked).await;
    let bases: Vec<RecordIndex> = cluster
        .manifest()
        .await
        .segments
        .iter()
        .map(|entry| entry.base)
        .collect();
    let writer = Arc::new(writer);
    let rules = slow_deletes(&cluster, Duration::from_millis(20));

    // The highest floor runs first; lower ones arrive while it deletes.
    let highest = bases[4];
    let first = tokio::spawn({
        let writer = Arc::clone(&writer);
        async move { writer.truncate_before(highest).await }
    });
    wait_until("the first floor is committed", BACKGROUND_LIMIT, || async {
        cluster.manifest().await.trunc == highest
    })
    .await;
    let queued: Vec<_> = [bases[1], bases[3], bases[2]]
        .into_iter()
        .map(|floor| {
            let writer = Arc::clone(&writer);
            tokio::spawn(async move { writer.truncate_before(floor).await })
        })
        .collect();
    for task in std::iter::once(first).chain(queued) {
        let report = task.await.unwrap().expect("a merged truncation succeeds");
        assert!(report.floor >= highest, "{report:?}");
    }
    assert_eq!(cluster.manifest().await.trunc, highest);

    // Many at once, in no particular order: all succeed, the highest wins.
    let floors = [
        bases[5],
        RecordIndex(bases[5].0 + 2),
        RecordIndex(bases[5].0 + 7),
    ];
    let tasks: Vec<_> = [floors[1], floors[0], floors[2], floors[0], floors[1]]
        .into_iter()
        .map(|floor| {
            let writer = Arc::clone(&writer);
            tokio::spawn(async move { writer.truncate_before(floor).await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().expect("a merged truncation succeeds");
    }
    let manifest = cluster.manifest().await;
    assert_eq!(manifest.trunc, floors[2]);
    assert_eq!(manifest.segments.len(), 1, "{:?}", manifest.segments);

    // Sequentially, a lower floor is still an error.
    assert_invalid_floor(
        writer.truncate_before(floors[1]).await,
        "below the committed floor",
    );
    remove_rules(&cluster.faults, rules);
    append_acked(&writer, "more", 20, &mut acked).await;
    let writer = Arc::into_inner(writer).expect("every task finished");
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    cluster.verify_acked(&acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_from_a_checkpoint_below_the_floor_fails_with_invalid_checkpoint() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(small_segments()).await.unwrap();
    let mut acked = BTreeMap::new();
    seal_segments(&cluster, &writer, 3, &mut acked).await;
    append_acked(&writer, "tail", 4, &mut acked).await;
    let floor = RecordIndex(cluster.manifest().await.segments[1].base.0 + 5);
    let report = writer.truncate_before(floor).await.unwrap();
    assert_eq!(report.removed.len(), 1);
    writer.shutdown(Duration::from_secs(5)).await.unwrap();

    let recovery = Recovery::run(cluster.stores.clone(), small_segments())
        .await
        .unwrap();
    let end = recovery.end();
    for checkpoint in [0, floor.0 - 1] {
        match recovery.replay(RecordIndex(checkpoint)) {
            Err(error @ LogError::InvalidCheckpoint { .. }) => {
                assert_eq!(error.kind(), ErrorKind::FixInput);
                assert_eq!(
                    error.to_string(),
                    format!("invalid checkpoint: checkpoint={checkpoint} floor={floor} end={end}")
                );
            }
            other => panic!("checkpoint {checkpoint}: {:?}", other.map(|_| ())),
        }
    }
    // Nothing was replayed, so the writer may not start yet; the refused
    // start consumed that recovery.
    assert!(matches!(
        recovery.start().await,
        Err(LogError::RecoveryIncomplete { .. })
    ));
    let recovery = Recovery::run(cluster.stores.clone(), small_segments())
        .await
        .unwrap();
    let mut replay = recovery.replay(floor).unwrap();
    let mut replayed = Vec::new();
    while let Some(record) = replay.next().await.unwrap() {
        replayed.push(record);
    }
    let expected: Vec<_> = acked.range(floor..).map(|(i, r)| (*i, r.clone())).collect();
    assert_eq!(replayed, expected);
    let writer = recovery.start().await.unwrap();
    append_acked(&writer, "more", 10, &mut acked).await;
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    cluster.verify_acked(&acked).await;
}

// ---------------------------------------------------------------------------
// Verify and repair
// ---------------------------------------------------------------------------

/// Flips the last byte of `key` in place (a CAS on its current version), as
/// bit rot would.
async fn corrupt_in_place(store: &DynBlobStore, key: &str) {
    let blob = store.get(key).await.unwrap();
    let mut bytes = blob.bytes.to_vec();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x5a;
    store
        .update(key, &blob.version, Bytes::from(bytes))
        .await
        .unwrap();
}

/// A log with `segments` sealed segments and a few tail records, its writer
/// shut down.
async fn sealed_log(segments: usize) -> (Cluster, Acked) {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(small_segments()).await.unwrap();
    let mut acked = BTreeMap::new();
    seal_segments(&cluster, &writer, segments, &mut acked).await;
    append_acked(&writer, "tail", 3, &mut acked).await;
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    (cluster, acked)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_finds_a_corrupt_sealed_copy_and_repair_replaces_it() {
    let (cluster, acked) = sealed_log(3).await;
    let healthy = verify(&cluster).await;
    assert!(healthy.is_healthy(), "{healthy:?}");
    assert_eq!(healthy.sealed_segments, 3);
    let entry = cluster.manifest().await.segments[1];
    let key = key_of(&entry);
    let good = cluster.raw[0].get(&key).await.unwrap().bytes;
    corrupt_in_place(&cluster.raw[1], &key).await;

    let report = verify(&cluster).await;
    assert!(!report.is_healthy());
    let damaged = &report.replicas[1];
    assert!(damaged.has_problems());
    assert_eq!(damaged.corrupt.len(), 1, "{damaged:?}");
    assert!(damaged.corrupt[0].starts_with(&key), "{damaged:?}");
    assert!(damaged.missing.is_empty());
    assert!(!report.replicas[0].has_problems() && !report.replicas[2].has_problems());
    // Readers fall back to a healthy copy meanwhile.
    assert_readable_from(&cluster, RecordIndex(0), &acked).await;

    let repaired = maintenance(&cluster).repair(&NoProgress).await.unwrap();
    assert_eq!(repaired.replaced, 1, "{repaired:?}");
    assert_eq!(repaired.restored, 0);
    assert_eq!(repaired.checked, 9);
    assert!(repaired.failures.is_empty(), "{repaired:?}");
    assert_eq!(cluster.raw[1].get(&key).await.unwrap().bytes, good);
    assert!(verify(&cluster).await.is_healthy());
    // A second pass finds nothing to do.
    let again = maintenance(&cluster).repair(&NoProgress).await.unwrap();
    assert_eq!((again.replaced, again.restored), (0, 0));
    cluster.verify_acked(&acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repair_restores_deleted_sealed_copies() {
    let (cluster, acked) = sealed_log(3).await;
    let entries = cluster.manifest().await.segments;
    let deleted = key_of(&entries[0]);
    cluster.raw[2].delete(&deleted).await.unwrap();
    // A second segment is missing on one replica and rotten on another.
    let both = key_of(&entries[2]);
    cluster.raw[0].delete(&both).await.unwrap();
    corrupt_in_place(&cluster.raw[1], &both).await;

    let report = verify(&cluster).await;
    assert!(!report.is_healthy());
    assert_eq!(report.replicas[2].missing, vec![deleted.clone()]);
    assert_eq!(report.replicas[0].missing, vec![both.clone()]);
    assert_eq!(report.replicas[1].corrupt.len(), 1);

    let repaired = maintenance(&cluster).repair(&NoProgress).await.unwrap();
    assert_eq!(
        (repaired.restored, repaired.replaced),
        (2, 1),
        "{repaired:?}"
    );
    let good = cluster.raw[2].get(&both).await.unwrap().bytes;
    for replica in 0..3 {
        let store = &cluster.raw[replica];
        assert_eq!(store.get(&both).await.unwrap().bytes, good);
        assert!(holds(store, &deleted).await);
    }
    assert!(verify(&cluster).await.is_healthy());
    cluster.verify_acked(&acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repair_reports_a_segment_with_no_healthy_copy_and_changes_nothing() {
    let (cluster, _) = sealed_log(2).await;
    let entry = cluster.manifest().await.segments[0];
    let key = key_of(&entry);
    cluster.raw[0].delete(&key).await.unwrap();
    corrupt_in_place(&cluster.raw[1], &key).await;
    corrupt_in_place(&cluster.raw[2], &key).await;
    let rotten = cluster.raw[1].get(&key).await.unwrap().bytes;

    let repaired = maintenance(&cluster).repair(&NoProgress).await.unwrap();
    assert_eq!((repaired.restored, repaired.replaced), (0, 0));
    assert_eq!(repaired.failures.len(), 3, "{repaired:?}");
    assert!(repaired.failures[0].contains("no replica has a healthy copy"));
    assert!(!holds(&cluster.raw[0], &key).await);
    assert_eq!(cluster.raw[1].get(&key).await.unwrap().bytes, rotten);
    assert!(cluster.read_from(0).await.is_err());
    assert!(!verify(&cluster).await.is_healthy());
    // That segment's records went with its last copy (three replicas lost
    // it, beyond what the log tolerates); every other segment still reads.
    let rest = cluster.manifest().await.segments[1].base;
    assert_eq!(
        cluster.read_from(rest.0).await.unwrap().first().unwrap().0,
        rest
    );
}

// ---------------------------------------------------------------------------
// The orphan sweep
// ---------------------------------------------------------------------------

/// The data fragments (not fences) replica `replica` holds of `segment`.
async fn data_fragments_on(cluster: &Cluster, replica: usize, segment: SegmentId) -> Vec<String> {
    let mut data = Vec::new();
    for key in cluster.fragments_on(replica, segment).await {
        let blob = cluster.raw[replica].get(&key).await.unwrap();
        if !Fragment::decode(&blob.bytes).unwrap().is_fence() {
            data.push(key);
        }
    }
    data
}

/// How long a test lets requests of an aborted writer land.
const ZOMBIE_SETTLE: Duration = Duration::from_millis(200);

/// How many fences replica `replica` holds, in every segment.
async fn fences_anywhere(cluster: &Cluster, replica: usize) -> usize {
    let listed = cluster.raw[replica].list(SEGMENTS_PREFIX).await.unwrap();
    listed
        .iter()
        .filter(|meta| meta.size == FRAGMENT_HEADER_BYTES as u64)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_writers_orphans_are_swept_and_live_objects_never_are() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(small_segments()).await.unwrap();
    // The writer's own clean-up of rotated segments fails: leftovers remain.
    let kept: Vec<RuleId> = cluster
        .faults
        .iter()
        .map(|controller| {
            controller.add(
                FaultRule::new(Fault::FailBefore)
                    .ops(OpSet::of(&[Op::Delete]))
                    .keys(KeyMatch::Prefix("segments".into())),
            )
        })
        .collect();
    let mut acked = BTreeMap::new();
    seal_segments(&cluster, &writer, 2, &mut acked).await;
    append_acked(&writer, "tail", 5, &mut acked).await;
    let dead = cluster.manifest().await;
    wait_until("every replica holds the tail", BACKGROUND_LIMIT, || async {
        let mut everywhere = true;
        for replica in 0..3 {
            everywhere &= data_fragments_on(&cluster, replica, dead.tail).await.len() == 5;
        }
        everywhere
    })
    .await;
    writer.abort();
    // A crashed writer's requests may still be landing (a worker thread
    // descheduled mid-request); give them time, so the listings below settle.
    tokio::time::sleep(ZOMBIE_SETTLE).await;
    remove_rules(&cluster.faults, kept);
    let (first, second) = (dead.segments[0].id, dead.segments[1].id);
    let mut leftovers = 0;
    for replica in 0..3 {
        let left = data_fragments_on(&cluster, replica, first).await.len()
            + data_fragments_on(&cluster, replica, second).await.len();
        assert!(left > 0, "replica {replica} kept nothing");
        leftovers += left;
    }

    // A recovery claims the next epoch and dies before its view: the dead
    // writer's tail is still the register's tail and must survive a sweep;
    // its sealed segments' leftover fragments are orphans.
    transform(
        cluster.stores.register.as_ref(),
        DEFAULT_MAX_ROUNDS,
        |current| claim(current, OwnerId(77)),
    )
    .await
    .unwrap();
    let swept = maintenance(&cluster)
        .sweep_orphans(&NoProgress)
        .await
        .unwrap();
    assert!(swept.failures.is_empty(), "{swept:?}");
    for replica in 0..3 {
        assert!(cluster.fragments_on(replica, first).await.is_empty());
        assert!(cluster.fragments_on(replica, second).await.is_empty());
        assert_eq!(
            data_fragments_on(&cluster, replica, dead.tail).await.len(),
            5
        );
        let sealed = cluster.sealed_on(replica).await;
        assert_eq!(
            sealed,
            vec![key_of(&dead.segments[0]), key_of(&dead.segments[1])]
        );
    }
    assert_eq!(swept.deleted, leftovers, "{swept:?}");

    // A losing recovery's seal of a directory segment under another CRC, a
    // current-epoch object nobody names yet, and objects Chorus never writes.
    let losing = SealedSegment {
        id: first,
        base: dead.segments[0].base,
        records: vec![Bytes::from_static(b"a losing recovery's view")],
    }
    .encode()
    .unwrap();
    let losing_key = sealed_key(first, object_crc32c(&losing));
    cluster.raw[0].create(&losing_key, losing).await.unwrap();
    let foreign = [
        "segments/not-a-segment/1",
        "notes/readme",
        "sealed/unparsable",
    ];
    for key in foreign {
        cluster.raw[1]
            .create(key, Bytes::from_static(b"not ours"))
            .await
            .unwrap();
    }

    // The next recovery seals the dead tail and fences it.
    let recovery = Recovery::run(cluster.stores.clone(), small_segments())
        .await
        .unwrap();
    let live = recovery.manifest().clone();
    let future = SegmentId::new(live.epoch, 9);
    let planted = Fragment::Data {
        epoch: live.epoch,
        index: FragmentIndex(0),
        first: RecordIndex(0),
        records: vec![payload("plnt", 0)],
    };
    cluster.put_fragment(2, future, &planted).await;
    let replayed = replay_all(&recovery).await.unwrap();
    assert_eq!(replayed.len(), acked.len());
    let mut fences = Vec::new();
    for replica in 0..3 {
        assert!(!cluster.fences_on(replica, dead.tail).await.is_empty());
        assert!(
            !cluster
                .fences_on(replica, dead.pending.unwrap())
                .await
                .is_empty()
        );
        fences.push(fences_anywhere(&cluster, replica).await);
    }

    // Verify lists the orphans (garbage, not damage).
    let report = verify(&cluster).await;
    assert!(report.is_healthy(), "{report:?}");
    let mut dead_data = 0;
    for (replica, fences) in fences.iter().enumerate() {
        let orphans = &report.replicas[replica].orphans;
        let mut expected = Vec::new();
        for segment in [first, second, dead.tail] {
            expected.extend(data_fragments_on(&cluster, replica, segment).await);
        }
        assert!(expected.len() >= 5, "replica {replica}: {expected:?}");
        dead_data += expected.len();
        if replica == 0 {
            expected.push(losing_key.clone());
        }
        expected.sort();
        let mut found = orphans.clone();
        found.sort();
        assert_eq!(found, expected, "replica {replica}");
        assert_eq!(report.replicas[replica].fences, *fences);
    }

    let swept = maintenance(&cluster)
        .sweep_orphans(&NoProgress)
        .await
        .unwrap();
    assert_eq!(swept.deleted, dead_data + 1, "{swept:?}");
    for (replica, fences) in fences.iter().enumerate() {
        for segment in [first, second, dead.tail] {
            let left = data_fragments_on(&cluster, replica, segment).await;
            assert!(left.is_empty(), "replica {replica}: {left:?}");
        }
        assert_eq!(
            fences_anywhere(&cluster, replica).await,
            *fences,
            "a fence was deleted on replica {replica}"
        );
        let sealed = cluster.sealed_on(replica).await;
        for entry in &live.segments {
            assert!(
                sealed.contains(&key_of(entry)),
                "replica {replica} lost {entry:?}"
            );
        }
    }
    assert!(!holds(&cluster.raw[0], &losing_key).await);
    assert!(holds(&cluster.raw[2], &fragment_key(future, FragmentIndex(0))).await);
    for key in foreign {
        assert!(holds(&cluster.raw[1], key).await, "{key} was touched");
    }
    let report = verify(&cluster).await;
    assert!(
        report.replicas.iter().all(|r| r.orphans.is_empty()),
        "{report:?}"
    );

    // The live writer's tail and pending fragments survive sweeps while it runs.
    let writer = recovery.start().await.unwrap();
    append_acked(&writer, "live", 5, &mut acked).await;
    wait_until(
        "every replica holds the live tail",
        BACKGROUND_LIMIT,
        || async {
            let mut everywhere = true;
            for replica in 0..3 {
                everywhere &= data_fragments_on(&cluster, replica, live.tail).await.len() == 5;
            }
            everywhere
        },
    )
    .await;
    let swept = maintenance(&cluster)
        .sweep_orphans(&NoProgress)
        .await
        .unwrap();
    assert_eq!(swept.deleted, 0, "{swept:?}");
    for replica in 0..3 {
        assert_eq!(
            data_fragments_on(&cluster, replica, live.tail).await.len(),
            5
        );
    }
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    cluster.verify_acked(&acked).await;
}

// ---------------------------------------------------------------------------
// A full directory
// ---------------------------------------------------------------------------

/// Appends until admission refuses with `SegmentDirectoryFull` for good: a
/// refusal while a fold is in flight (which counts as a whole entry) passes
/// once it lands, so the refusal must hold, with nothing left to fold, over a
/// few tries. Returns the directory's entries.
async fn fill_directory(cluster: &Cluster, writer: &Writer, acked: &mut Acked) -> usize {
    let mut refusals = 0;
    for sequence in 0..10_000 {
        let record = payload("fill", sequence);
        match writer.append(record.clone()) {
            Ok(completion) => {
                acked.insert(completion.await.unwrap().index, record);
                refusals = 0;
            }
            Err(LogError::SegmentDirectoryFull { entries, .. }) => {
                wait_for_entries(cluster, entries).await;
                refusals += 1;
                if refusals == 3 && cluster.manifest().await.segments.len() == entries {
                    return entries;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(other) => panic!("unexpected refusal: {other}"),
        }
    }
    panic!("the directory never filled");
}

/// Asserts the directory names none of `removed`.
#[track_caller]
fn assert_no_entry_of(manifest: &Manifest, removed: &[SegmentId]) {
    assert!(
        manifest
            .segments
            .iter()
            .all(|entry| !removed.contains(&entry.id)),
        "{:?}",
        manifest.segments
    );
}

async fn full_directory_log() -> (Cluster, Writer, Acked) {
    let register = MemoryRegister::with_capacity(4 * MAX_DIRECTORY_ENTRY_BYTES);
    let cluster = Cluster::with_register(3, 4, Arc::new(register)).await;
    let (writer, _) = cluster.open(small_segments()).await.unwrap();
    let mut acked = BTreeMap::new();
    let entries = fill_directory(&cluster, &writer, &mut acked).await;
    assert!(entries >= 2);
    (cluster, writer, acked)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_directory_clears_after_the_writer_truncates_and_appends_resume() {
    let (cluster, writer, mut acked) = full_directory_log().await;
    let manifest = cluster.manifest().await;
    let floor = manifest.tail_base;
    let report = writer.truncate_before(floor).await.unwrap();
    let removed: Vec<SegmentId> = manifest.segments.iter().map(|entry| entry.id).collect();
    assert_eq!(report.removed, removed);
    assert_no_entry_of(&cluster.manifest().await, &removed);
    // Room is back at once, and rotation into fresh entries continues.
    append_acked(&writer, "room", 2 * RECORDS_PER_SEGMENT, &mut acked).await;
    wait_for_entries(&cluster, 2).await;
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    cluster.verify_acked(&acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_directory_clears_after_another_process_truncates_and_appends_resume() {
    let (cluster, writer, mut acked) = full_directory_log().await;
    // Another process: its own stores over the same replicas and register.
    let (other, _) = cluster.private_view(1000);
    let manifest = cluster.manifest().await;
    let floor = manifest.tail_base;
    let end = Reader::committed_end(&other).await.unwrap();
    let report = Maintenance::new(&other)
        .truncate_before(floor, end, &NoProgress)
        .await
        .unwrap();
    assert!(report.tombstones.is_empty());
    let removed: Vec<SegmentId> = manifest.segments.iter().map(|entry| entry.id).collect();
    assert_eq!(report.removed, removed);
    assert_no_entry_of(&cluster.manifest().await, &removed);
    // The writer notices within its refresh period (one second).
    let started = tokio::time::Instant::now();
    let record = payload("back", 0);
    let mut completion = None;
    wait_until(
        "an append is admitted again",
        Duration::from_secs(3),
        || {
            if completion.is_none() {
                match writer.append(record.clone()) {
                    Ok(admitted) => completion = Some(admitted),
                    Err(LogError::SegmentDirectoryFull { .. }) => {}
                    Err(other) => panic!("unexpected refusal: {other}"),
                }
            }
            let admitted = completion.is_some();
            async move { admitted }
        },
    )
    .await;
    assert!(started.elapsed() < Duration::from_millis(2500));
    let receipt = completion.unwrap().await.unwrap();
    acked.insert(receipt.index, record);
    append_acked(&writer, "room", 2 * RECORDS_PER_SEGMENT, &mut acked).await;
    wait_for_entries(&cluster, 2).await;
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    cluster.verify_acked(&acked).await;
}

/// A register whose next read, once armed, answers only after a pause: the
/// read happens at once, the (by then stale) answer arrives late.
#[derive(Debug)]
struct LateAnswers {
    inner: Arc<dyn ManifestStore>,
    armed: Mutex<Option<Duration>>,
    reads: AtomicU64,
}

impl LateAnswers {
    fn new(inner: Arc<dyn ManifestStore>) -> LateAnswers {
        LateAnswers {
            inner,
            armed: Mutex::new(None),
            reads: AtomicU64::new(0),
        }
    }
}

#[async_trait::async_trait]
impl ManifestStore for LateAnswers {
    fn name(&self) -> &str {
        "late-answers"
    }

    async fn read(&self) -> Result<Option<VersionedManifest>, RegisterError> {
        let answer = self.inner.read().await;
        self.reads.fetch_add(1, Ordering::SeqCst);
        let pause = self.armed.lock().unwrap().take();
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
        answer
    }

    async fn create(&self, fields: &Fields) -> Result<RegisterVersion, RegisterError> {
        self.inner.create(fields).await
    }

    async fn update(
        &self,
        version: &RegisterVersion,
        fields: &Fields,
    ) -> Result<RegisterVersion, RegisterError> {
        self.inner.update(version, fields).await
    }

    fn max_directory_bytes(&self) -> usize {
        self.inner.max_directory_bytes()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_refresh_that_read_before_a_truncation_does_not_undo_it() {
    let register = Arc::new(LateAnswers::new(Arc::new(MemoryRegister::with_capacity(
        4 * MAX_DIRECTORY_ENTRY_BYTES,
    ))));
    let cluster = Cluster::with_register(3, 4, Arc::clone(&register) as _).await;
    let (writer, _) = cluster.open(small_segments()).await.unwrap();
    let mut acked = BTreeMap::new();
    fill_directory(&cluster, &writer, &mut acked).await;
    let full = cluster.manifest().await;

    // The writer's next refresh of its tight directory reads the register
    // before the truncation; the answer lands well after it.
    let late = Duration::from_millis(600);
    *register.armed.lock().unwrap() = Some(late);
    let reads = register.reads.load(Ordering::SeqCst);
    wait_until(
        "the writer refreshes its directory",
        BACKGROUND_LIMIT,
        || {
            let read = register.reads.load(Ordering::SeqCst) > reads;
            async move { read }
        },
    )
    .await;
    let stale_read = tokio::time::Instant::now();
    let report = writer.truncate_before(full.tail_base).await.unwrap();
    assert_eq!(report.removed.len(), full.segments.len());

    // The full segment rotates into the room.
    append_acked(&writer, "room", 1, &mut acked).await;
    wait_for_entries(&cluster, 1).await;
    // Once the stale answer has landed, a whole segment still fits and rotates.
    tokio::time::sleep_until(stale_read + late + Duration::from_millis(50)).await;
    for sequence in 0..=RECORDS_PER_SEGMENT {
        let record = payload("late", sequence);
        let completion = writer.append(record.clone()).unwrap_or_else(|refused| {
            panic!("record {sequence} refused after the truncation: {refused}")
        });
        acked.insert(completion.await.unwrap().index, record);
    }
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    cluster.verify_acked(&acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_whose_scan_races_a_fold_still_reads_every_acked_record() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(small_segments()).await.unwrap();
    let mut acked = BTreeMap::new();
    append_acked(&writer, "half", RECORDS_PER_SEGMENT / 2, &mut acked).await;
    let tail = cluster.manifest().await.tail;

    // The reader's register answers late: it scans the tail the register
    // named before the writer folded it and deleted its fragments.
    let late = Arc::new(LateAnswers::new(Arc::clone(&cluster.stores.register)));
    let (stores, _) = cluster.private_view_with_register(500, Arc::clone(&late) as _);
    *late.armed.lock().unwrap() = Some(Duration::from_millis(1500));
    let reader = tokio::spawn(async move {
        let mut reader = Reader::new(&stores, RecordIndex(0));
        let mut records = Vec::new();
        while let Some(record) = reader.try_next().await.unwrap() {
            records.push(record);
        }
        records
    });
    append_acked(&writer, "full", RECORDS_PER_SEGMENT, &mut acked).await;
    // Deleted from a quorum is enough to leave nothing committed there (a
    // lagging replica's late write may linger; the next epoch sweeps it).
    wait_until(
        "the tail is folded and its fragments deleted",
        BACKGROUND_LIMIT,
        || async {
            let mut emptied = 0;
            for replica in 0..3 {
                emptied += usize::from(cluster.fragments_on(replica, tail).await.is_empty());
            }
            cluster.manifest().await.tail != tail && emptied >= 2
        },
    )
    .await;

    let read = reader.await.unwrap();
    let expected: Vec<(RecordIndex, Bytes)> = acked.clone().into_iter().collect();
    assert_eq!(read, expected, "the reader stopped early");
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    cluster.verify_acked(&acked).await;
}

// ---------------------------------------------------------------------------
// Maintenance never fails appends; the writer's background maintenance
// ---------------------------------------------------------------------------

/// Counters recorded by this test binary, by `name{label=value,…}`.
fn counters() -> &'static Mutex<HashMap<String, Arc<Count>>> {
    static COUNTERS: OnceLock<Mutex<HashMap<String, Arc<Count>>>> = OnceLock::new();
    COUNTERS.get_or_init(Mutex::default)
}

#[derive(Debug, Default)]
struct Count(AtomicU64);

impl metrics::CounterFn for Count {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::SeqCst);
    }

    fn absolute(&self, value: u64) {
        self.0.fetch_max(value, Ordering::SeqCst);
    }
}

/// Records counters only.
struct CountingRecorder;

impl metrics::Recorder for CountingRecorder {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }

    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        let labels: Vec<String> = key
            .labels()
            .map(|label| format!("{}={}", label.key(), label.value()))
            .collect();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        let count = Arc::clone(counters().lock().unwrap().entry(name).or_default());
        metrics::Counter::from_arc(count)
    }

    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }

    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

/// The value of counter `name` so far (recording starts on first use).
fn counter(name: &str) -> u64 {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| metrics::set_global_recorder(CountingRecorder).expect("one recorder"));
    counters()
        .lock()
        .unwrap()
        .get(name)
        .map_or(0, |count| count.0.load(Ordering::SeqCst))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_errors_are_counted_and_logged_not_propagated_to_appends() {
    let repair_errors = "chorus_maintenance_errors_total{task=repair}";
    let sweep_errors = "chorus_maintenance_errors_total{task=sweep}";
    let truncate_errors = "chorus_maintenance_errors_total{task=truncate}";
    let before = [
        counter(repair_errors),
        counter(sweep_errors),
        counter(truncate_errors),
    ];
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(small_segments()).await.unwrap();
    let mut acked = BTreeMap::new();
    seal_segments(&cluster, &writer, 3, &mut acked).await;
    cluster.faults[2].set_outage(true);
    let writer = Arc::new(writer);

    // Appends run throughout the failing maintenance.
    let appender = tokio::spawn({
        let writer = Arc::clone(&writer);
        async move {
            let mut acked = BTreeMap::new();
            append_acked(&writer, "busy", 5 * RECORDS_PER_SEGMENT, &mut acked).await;
            acked
        }
    });
    let maintenance = maintenance(&cluster);
    let repaired = maintenance.repair(&NoProgress).await.unwrap();
    // One per retained segment (at least the three sealed above).
    assert!(repaired.failures.len() >= 3, "{repaired:?}");
    assert!(repaired.failures.iter().all(|f| f.starts_with("replica 2")));
    let swept = maintenance.sweep_orphans(&NoProgress).await.unwrap();
    assert!(!swept.failures.is_empty());
    assert!(swept.failures.iter().all(|f| f.starts_with("replica 2")));
    let verified = maintenance.verify(&NoProgress).await.unwrap();
    assert!(!verified.is_healthy());
    assert!(!verified.replicas[2].errors.is_empty());
    // Beside the busy writer, replica 0 may lack fragments still in flight;
    // nothing of it is damaged or unreadable.
    assert!(no_damage(&verified.replicas[0]), "{verified:?}");
    let floor = cluster.manifest().await.segments[1].base;
    let truncated = writer.truncate_before(floor).await.unwrap();
    assert_eq!(truncated.tombstones.len(), 1);

    acked.extend(appender.await.unwrap());
    assert_eq!(writer.status().stopped, None);
    assert_eq!(writer.status().next_index, RecordIndex(acked.len() as u64));
    let after = [
        counter(repair_errors),
        counter(sweep_errors),
        counter(truncate_errors),
    ];
    // Other tests of this binary only ever add to these counters.
    assert!(
        after[0] >= before[0] + repaired.failures.len() as u64,
        "{after:?}"
    );
    assert!(
        after[1] >= before[1] + swept.failures.len() as u64,
        "{after:?}"
    );
    assert!(after[2] > before[2], "{after:?}");

    cluster.heal();
    append_acked(&writer, "more", 10, &mut acked).await;
    let writer = Arc::into_inner(writer).expect("the appender finished");
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    cluster.verify_acked(&acked).await;
}

/// Settings without periodic repair: only the start and degraded seals trigger it.
fn no_periodic_repair() -> LogConfig {
    LogConfig {
        repair_interval: None,
        ..small_segments()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_repairs_at_start() {
    let (cluster, mut acked) = sealed_log(2).await;
    let entries = cluster.manifest().await.segments;
    let deleted = key_of(&entries[0]);
    cluster.raw[1].delete(&deleted).await.unwrap();
    corrupt_in_place(&cluster.raw[2], &key_of(&entries[1])).await;
    assert!(!verify(&cluster).await.is_healthy());

    let (writer, _) = cluster.open(no_periodic_repair()).await.unwrap();
    wait_until("the start repair heals", BACKGROUND_LIMIT, || async {
        verify(&cluster).await.is_healthy()
    })
    .await;
    assert!(holds(&cluster.raw[1], &deleted).await);
    append_acked(&writer, "more", 10, &mut acked).await;
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    cluster.verify_acked(&acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_degraded_seal_triggers_repair_once_the_replica_heals() {
    let register_faults = FaultController::new(5);
    let register = FaultyRegister::new(Arc::new(MemoryRegister::new()), register_faults.clone());
    let cluster = Cluster::with_register(3, 4, Arc::new(register)).await;
    let (writer, _) = cluster.open(no_periodic_repair()).await.unwrap();
    // Replica 2 refuses sealed objects; the fold waits long enough for the
    // test to heal it after the seal gave up on it.
    let refuse = cluster.faults[2].add(
        FaultRule::new(Fault::FailBefore)
            .ops(OpSet::of(&[Op::Create]))
            .keys(KeyMatch::Prefix(SEALED_PREFIX.into())),
    );
    register_faults.add(
        FaultRule::new(Fault::Delay(Duration::from_millis(400)))
            .ops(OpSet::of(&[Op::Update]))
            .times(1),
    );
    let folds = register_faults.calls(Op::Update);
    let mut acked = BTreeMap::new();
    append_acked(&writer, "full", RECORDS_PER_SEGMENT, &mut acked).await;
    append_acked(&writer, "next", 3, &mut acked).await;
    // The fold starts only once the seal has given up on replica 2.
    wait_until("the fold starts", BACKGROUND_LIMIT, || {
        let started = register_faults.calls(Op::Update) > folds;
        async move { started }
    })
    .await;
    assert!(cluster.sealed_on(2).await.is_empty());
    assert_eq!(cluster.sealed_on(0).await.len(), 1);
    assert!(
        cluster.manifest().await.segments.is_empty(),
        "folded too early"
    );
    cluster.faults[2].remove(refuse);

    wait_for_entries(&cluster, 1).await;
    let entry = cluster.manifest().await.segments[0];
    wait_until("repair re-copies the seal", BACKGROUND_LIMIT, || async {
        holds(&cluster.raw[2], &key_of(&entry)).await
    })
    .await;
    assert!(verify(&cluster).await.is_healthy());
    append_acked(&writer, "more", 10, &mut acked).await;
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    cluster.verify_acked(&acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_degraded_seal_or_a_timer_nothing_repairs() {
    // The control for the trigger test: damage after start is left alone
    // when periodic repair is off and every seal lands everywhere.
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(no_periodic_repair()).await.unwrap();
    let mut acked = BTreeMap::new();
    seal_segments(&cluster, &writer, 1, &mut acked).await;
    let entry = cluster.manifest().await.segments[0];
    cluster.raw[0].delete(&key_of(&entry)).await.unwrap();
    seal_segments(&cluster, &writer, 1, &mut acked).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!holds(&cluster.raw[0], &key_of(&entry)).await);
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    cluster.verify_acked(&acked).await;
}

/// Truncates the cluster's log below the second directory entry, as another
/// process would, while something else is in flight.
async fn truncate_below_second_entry(cluster: &Cluster) -> RecordIndex {
    let floor = cluster.manifest().await.segments[1].base;
    let end = committed_end(cluster).await;
    maintenance(cluster)
        .truncate_before(floor, end, &NoProgress)
        .await
        .unwrap();
    floor
}

/// Regression: a repair pass that read the register before a truncation
/// re-created a sealed copy the truncation had just deleted everywhere. The
/// entry then left the directory, and the copy stayed for good (an unnamed
/// seal of the current epoch looked like a seal in flight to the sweep).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repair_racing_a_truncation_takes_back_the_copy_it_restored() {
    let (cluster, acked) = sealed_log(3).await;
    let first = cluster.manifest().await.segments[0];
    let key = key_of(&first);
    cluster.raw[2].delete(&key).await.unwrap();
    // The repair's restore of that copy lands only after the truncation.
    let (view, faults) = cluster.private_view(31);
    faults[2].add(
        FaultRule::new(Fault::Delay(Duration::from_millis(500)))
            .ops(OpSet::of(&[Op::Create]))
            .keys(KeyMatch::Exact(key.clone())),
    );
    let repair = tokio::spawn(async move { Maintenance::new(&view).repair(&NoProgress).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let floor = truncate_below_second_entry(&cluster).await;
    assert!(!cluster.manifest().await.segments.contains(&first));

    let repaired = repair.await.unwrap().unwrap();
    assert_eq!(repaired.restored, 0, "{repaired:?}");
    for replica in 0..3 {
        assert!(
            !holds(&cluster.raw[replica], &key).await,
            "replica {replica} kept a copy of a truncated segment"
        );
    }
    assert!(verify(&cluster).await.is_healthy());
    assert_readable_from(&cluster, floor, &acked).await;
}

/// Regression: a reader whose sealed read raced a truncation that deleted
/// the segment reported `Corrupt` ("no replica has a valid copy") instead of
/// `Truncated`, which tells it to move up to the floor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_racing_a_truncation_is_told_truncated_not_corrupt() {
    let (cluster, _) = sealed_log(3).await;
    let key = key_of(&cluster.manifest().await.segments[0]);
    // The reader has read the register; its reads of the segment arrive
    // after the truncation deleted it.
    let (view, faults) = cluster.private_view(41);
    for controller in &faults {
        controller.add(
            FaultRule::new(Fault::Delay(Duration::from_millis(500)))
                .ops(OpSet::of(&[Op::Get]))
                .keys(KeyMatch::Exact(key.clone())),
        );
    }
    let mut reader = Reader::new(&view, RecordIndex(0));
    let read = tokio::spawn(async move { reader.try_next().await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let floor = truncate_below_second_entry(&cluster).await;
    match read.await.unwrap() {
        Err(LogError::Truncated {
            requested: RecordIndex(0),
            floor: reported,
        }) => assert_eq!(reported, floor),
        other => panic!("expected Truncated {{ floor: {floor} }}, got {other:?}"),
    }
}

/// Nothing on the replica is missing from the directory, damaged or
/// unreadable (fragments in flight or missed while down are not damage).
fn no_damage(replica: &chorus::log::maintenance::ReplicaReport) -> bool {
    replica.missing.is_empty() && replica.corrupt.is_empty() && replica.errors.is_empty()
}
