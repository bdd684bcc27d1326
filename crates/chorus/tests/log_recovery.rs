//! Recovery scenarios and what readers may see (docs/protocol.md, Recovering
//! and Readers), over in-memory replicas with fault injection. After every
//! scenario, every acknowledged record must read back with identical bytes and
//! dense indices, through a reader and through a fresh recovery's replay.

#[path = "support/log.rs"]
mod log_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chorus::blob::{DynBlobStore, Fault, FaultRule, KeyMatch, ObjectStoreBlobs, Op, OpSet};
use chorus::codec::Fragment;
use chorus::ids::{Epoch, RecordIndex, SegmentId};
use chorus::log::maintenance::{Maintenance, NoProgress};
use chorus::log::{ErrorKind, LogError, LogStores, Reader, Recovery};
use chorus::register::{Manifest, Step, transform};
use log_support::{
    Cluster, append_acked, data_fragment, open_log, payload, replay_all, test_config, wait_until,
};

/// Claims an epoch with a recovery that is never started, so the register
/// names a fresh tail and pending segment of that epoch for direct writes.
async fn claim_empty_tail(cluster: &Cluster) -> Manifest {
    let recovery = Recovery::run(cluster.stores.clone(), test_config())
        .await
        .unwrap();
    let manifest = recovery.manifest().clone();
    assert_eq!(manifest.tail_base, RecordIndex(0));
    manifest
}

/// Writes `fragment` of `segment` to each replica in `replicas`.
async fn place(cluster: &Cluster, replicas: &[usize], segment: SegmentId, fragment: &Fragment) {
    for replica in replicas {
        cluster.put_fragment(*replica, segment, fragment).await;
    }
}

fn records(tag: &str, count: u64) -> Vec<Bytes> {
    (0..count).map(|sequence| payload(tag, sequence)).collect()
}

/// Records `batch` as acknowledged from index `first` on.
fn ack_all(acked: &mut BTreeMap<RecordIndex, Bytes>, first: u64, batch: &[Bytes]) {
    for (offset, record) in batch.iter().enumerate() {
        acked.insert(RecordIndex(first + offset as u64), record.clone());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_down_while_writing_and_another_during_recovery() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(test_config()).await.unwrap();
    cluster.faults[2].set_outage(true);
    let mut acked = BTreeMap::new();
    append_acked(&writer, "w", 40, &mut acked).await;
    writer.abort();

    cluster.heal();
    cluster.faults[0].set_outage(true);
    let (writer, replayed) = cluster.open(test_config()).await.unwrap();
    assert_eq!(replayed, acked.clone().into_iter().collect::<Vec<_>>());
    // The recovered writer keeps going without replica 0.
    append_acked(&writer, "after", 20, &mut acked).await;
    writer.abort();
    let recovered = cluster.verify_acked(&acked).await;
    assert_eq!(recovered.len(), 60);
}

/// Fragments 0 and 1 of the claimed tail on a quorum (acknowledged), and a lone
/// fragment 2 on replica 2 only. Returns the cluster, what was acknowledged,
/// and the lone record.
async fn lone_copy_scenario() -> (Cluster, BTreeMap<RecordIndex, Bytes>, Bytes) {
    let cluster = Cluster::new(3, 4).await;
    let manifest = claim_empty_tail(&cluster).await;
    let (epoch, tail) = (manifest.tail.epoch, manifest.tail);
    let mut acked = BTreeMap::new();
    let first = records("first", 2);
    place(
        &cluster,
        &[0, 1, 2],
        tail,
        &data_fragment(epoch, 0, 0, &first),
    )
    .await;
    ack_all(&mut acked, 0, &first);
    let second = records("second", 1);
    place(
        &cluster,
        &[0, 1],
        tail,
        &data_fragment(epoch, 1, 2, &second),
    )
    .await;
    ack_all(&mut acked, 2, &second);
    let lone = payload("lone", 0);
    let fragment = data_fragment(epoch, 2, 3, std::slice::from_ref(&lone));
    place(&cluster, &[2], tail, &fragment).await;
    (cluster, acked, lone)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_on_one_replica_only_is_not_recovered_when_all_replicas_are_observed() {
    let (cluster, acked, lone) = lone_copy_scenario().await;
    let (writer, replayed) = cluster.open(test_config()).await.unwrap();
    assert_eq!(replayed, acked.clone().into_iter().collect::<Vec<_>>());
    assert_eq!(cluster.manifest().await.tail_base, RecordIndex(3));
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    let recovered = cluster.verify_acked(&acked).await;
    assert_eq!(recovered.len(), 3);
    assert!(recovered.iter().all(|(_, record)| *record != lone));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_on_one_replica_only_is_recovered_when_one_replica_is_unobserved() {
    let (cluster, mut acked, lone) = lone_copy_scenario().await;
    // Replica 0 might hold a second copy of fragment 2: it may have been acked.
    cluster.faults[0].set_outage(true);
    let (writer, replayed) = cluster.open(test_config()).await.unwrap();
    acked.insert(RecordIndex(3), lone);
    assert_eq!(replayed, acked.clone().into_iter().collect::<Vec<_>>());
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    let recovered = cluster.verify_acked(&acked).await;
    assert_eq!(recovered.len(), 4);
}

/// Writes `count` records with every replica up and crashes the writer.
async fn written_and_crashed(cluster: &Cluster, count: u64) -> BTreeMap<RecordIndex, Bytes> {
    let (writer, _) = cluster.open(test_config()).await.unwrap();
    let mut acked = BTreeMap::new();
    append_acked(&writer, "w", count, &mut acked).await;
    writer.abort();
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_fragment_copy_is_ignored() {
    let cluster = Cluster::new(3, 4).await;
    let mut acked = written_and_crashed(&cluster, 30).await;
    // Every read from replica 0 returns a flipped bit: its fragment copies (and
    // later its sealed copies) fail their checksums.
    cluster.faults[0].add(FaultRule::new(Fault::Corrupt).ops(OpSet::of(&[Op::Get])));
    let (writer, replayed) = cluster.open(test_config()).await.unwrap();
    assert!(
        cluster.faults[0].injected() > 0,
        "no corruption was injected"
    );
    assert_eq!(replayed, acked.clone().into_iter().collect::<Vec<_>>());
    append_acked(&writer, "after", 10, &mut acked).await;
    writer.abort();
    // A reader falls back past replica 0's corrupt sealed copy as well. (In
    // the active segment it may not return the newest records while replica
    // 0 reads corrupt: with two valid copies out of reach it cannot tell they
    // are committed.)
    let read = cluster.read_from(0).await.unwrap();
    assert!(read.len() >= 30, "read only {} records", read.len());
    let expected: Vec<_> = acked.clone().into_iter().take(read.len()).collect();
    assert_eq!(read, expected);
    cluster.verify_acked(&acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_failure_during_recovery_is_retried_not_counted_as_a_lost_replica() {
    let cluster = Cluster::new(3, 4).await;
    let acked = written_and_crashed(&cluster, 20).await;
    // With replica 0 out, on both others the first listing, the first fence
    // and the first fragment read each fail once: without retries neither
    // could be observed, and recovery would find no quorum.
    for faults in &cluster.faults[1..] {
        for op in [Op::List, Op::Create, Op::Get] {
            faults.add(
                FaultRule::new(Fault::FailBefore)
                    .ops(OpSet::of(&[op]))
                    .times(1),
            );
        }
        // A fence whose answer is lost: its retry finds it already there.
        faults.add(
            FaultRule::new(Fault::FailAfter)
                .ops(OpSet::of(&[Op::Create]))
                .times(1),
        );
    }
    cluster.faults[0].set_outage(true);
    let (writer, replayed) = cluster.open(test_config()).await.unwrap();
    // At least the listing and both fence faults fired on each (the tail
    // may hold no fragment to read).
    assert!(cluster.faults[1].injected() >= 3 && cluster.faults[2].injected() >= 3);
    assert_eq!(replayed, acked.clone().into_iter().collect::<Vec<_>>());
    writer.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_fragment_copy_in_storage_is_ignored() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(test_config()).await.unwrap();
    let mut acked = BTreeMap::new();
    append_acked(&writer, "w", 12, &mut acked).await;
    let tail = cluster.manifest().await.tail;
    // Every replica holds every fragment before the crash, so that after one
    // copy is damaged two valid ones remain and a reader can prove every
    // fragment committed. (An ack needs only two copies, and under load the
    // third lane can trail by several fragments; where one of only two
    // copies is damaged a reader rightly stops before it, while recovery
    // keeps it: see a_rotted_copy_does_not_discard_a_fragment_acked_by_exactly_a_quorum.)
    wait_until(
        "every replica holds every fragment",
        Duration::from_secs(10),
        || async {
            let mut complete = true;
            for replica in 0..3 {
                complete &= cluster.fragments_on(replica, tail).await.len() == 12;
            }
            complete
        },
    )
    .await;
    writer.abort();
    // Replica 1's copies lose their last byte: truncated objects.
    for key in cluster.fragments_on(1, tail).await {
        let blob = cluster.raw[1].get(&key).await.unwrap();
        cluster.raw[1].delete(&key).await.unwrap();
        let torn = blob.bytes.slice(..blob.bytes.len() - 1);
        cluster.raw[1].create(&key, torn).await.unwrap();
    }
    // A reader returns only fragments it sees on a quorum of identical valid
    // copies: replicas 0 and 2 hold every one.
    let read = cluster.read_from(0).await.unwrap();
    assert_eq!(read, acked.clone().into_iter().collect::<Vec<_>>());
    let (writer, replayed) = cluster.open(test_config()).await.unwrap();
    assert_eq!(replayed, acked.clone().into_iter().collect::<Vec<_>>());
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    cluster.verify_acked(&acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_data_after_a_tail_gap_is_discarded() {
    let cluster = Cluster::new(3, 4).await;
    let manifest = claim_empty_tail(&cluster).await;
    let epoch = manifest.tail.epoch;
    let (tail, pending) = (manifest.tail, manifest.pending.unwrap());
    let mut acked = BTreeMap::new();
    let kept = records("kept", 2);
    place(
        &cluster,
        &[0, 1, 2],
        tail,
        &data_fragment(epoch, 0, 0, &kept),
    )
    .await;
    ack_all(&mut acked, 0, &kept);
    // Tail fragment 1 on one replica: it fails, and leaves a gap.
    let partial = records("partial", 1);
    place(&cluster, &[0], tail, &data_fragment(epoch, 1, 2, &partial)).await;
    // Pending data continuing after it, even on every replica, was never acked:
    // the writer enters the pending segment only once the tail is committed.
    let orphan = records("orphan", 3);
    place(
        &cluster,
        &[0, 1, 2],
        pending,
        &data_fragment(epoch, 0, 3, &orphan),
    )
    .await;

    let (writer, replayed) = cluster.open(test_config()).await.unwrap();
    assert_eq!(replayed, acked.clone().into_iter().collect::<Vec<_>>());
    let manifest = cluster.manifest().await;
    assert_eq!(manifest.tail_base, RecordIndex(2));
    assert!(
        manifest.segments.iter().all(|entry| entry.id != pending),
        "the pending segment was sealed: {:?}",
        manifest.segments
    );
    // Appends continue densely where the kept prefix ends.
    append_acked(&writer, "next", 5, &mut acked).await;
    assert_eq!(acked.keys().last(), Some(&RecordIndex(6)));
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    let recovered = cluster.verify_acked(&acked).await;
    assert_eq!(recovered.len(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_replicas_survive_two_down_and_block_with_three_down() {
    let cluster = Cluster::new(5, 4).await;
    let (writer, _) = cluster.open(test_config()).await.unwrap();
    cluster.faults[3].set_outage(true);
    cluster.faults[4].set_outage(true);
    let mut acked = BTreeMap::new();
    append_acked(&writer, "two-down", 30, &mut acked).await;
    writer.abort();

    // Recover with a different two down: replica 2 alone vouches for the writes.
    cluster.heal();
    cluster.faults[0].set_outage(true);
    cluster.faults[1].set_outage(true);
    let (writer, replayed) = cluster.open(test_config()).await.unwrap();
    assert_eq!(replayed, acked.clone().into_iter().collect::<Vec<_>>());
    append_acked(&writer, "other-two-down", 30, &mut acked).await;
    writer.abort();

    cluster.faults[2].set_outage(true);
    let error = Recovery::run(cluster.stores.clone(), test_config())
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            LogError::NoQuorum {
                observed: 2,
                quorum: 3,
                ..
            }
        ),
        "{error}"
    );
    assert_eq!(error.kind(), ErrorKind::Retry);
    let recovered = cluster.verify_acked(&acked).await;
    assert_eq!(recovered.len(), 60);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_works_end_to_end() {
    let cluster = Cluster::new(1, 4).await;
    let mut config = test_config();
    config.max_segment_bytes = 300;
    let (writer, replayed) = cluster.open(config.clone()).await.unwrap();
    assert!(replayed.is_empty());
    let mut acked = BTreeMap::new();
    append_acked(&writer, "one", 100, &mut acked).await;
    let read = cluster.read_from(0).await.unwrap();
    assert_eq!(read, acked.clone().into_iter().collect::<Vec<_>>());
    writer.abort();

    let (writer, replayed) = cluster.open(config).await.unwrap();
    assert_eq!(replayed, acked.clone().into_iter().collect::<Vec<_>>());
    append_acked(&writer, "again", 50, &mut acked).await;
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    assert!(cluster.manifest().await.segments.len() >= 2);
    let recovered = cluster.verify_acked(&acked).await;
    assert_eq!(recovered.len(), 150);
}

fn memory_store(name: &str) -> DynBlobStore {
    Arc::new(ObjectStoreBlobs::new(
        Arc::new(object_store::memory::InMemory::new()),
        "",
        name.to_owned(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_replica_list_is_refused() {
    let cluster = Cluster::new(3, 4).await;
    let mut acked = written_and_crashed(&cluster, 5).await;
    let before = cluster.stores.register.read().await.unwrap().unwrap();
    let original = cluster.stores.replicas.clone();
    let renamed = {
        let mut replicas = original.clone();
        replicas[1].0 = "memory://elsewhere".into();
        replicas
    };
    let reordered = vec![
        original[1].clone(),
        original[0].clone(),
        original[2].clone(),
    ];
    let fewer = vec![original[0].clone()];
    let more = {
        let mut replicas = original.clone();
        replicas.push(("memory://r3".into(), memory_store("memory://r3")));
        replicas.push(("memory://r4".into(), memory_store("memory://r4")));
        replicas
    };
    let duplicated = vec![
        original[0].clone(),
        original[0].clone(),
        original[2].clone(),
    ];
    for (case, replicas) in [
        ("renamed", renamed),
        ("reordered", reordered),
        ("fewer", fewer),
        ("more", more),
        ("duplicated", duplicated),
    ] {
        let stores = LogStores {
            replicas,
            register: Arc::clone(&cluster.stores.register),
        };
        let error = Recovery::run(stores, test_config()).await.unwrap_err();
        assert!(matches!(error, LogError::Manifest(_)), "{case}: {error}");
        assert!(
            error.to_string().contains("chorus.replicas"),
            "{case}: {error}"
        );
        let after = cluster.stores.register.read().await.unwrap().unwrap();
        assert_eq!(after, before, "{case}: the register was modified");
    }
    let (writer, _) = cluster.open(test_config()).await.unwrap();
    append_acked(&writer, "same", 5, &mut acked).await;
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    cluster.verify_acked(&acked).await;
}

/// Raises the truncation floor directly, as truncation will.
async fn raise_floor(cluster: &Cluster, floor: RecordIndex) {
    transform(cluster.stores.register.as_ref(), 4, |current| {
        let mut next = current.clone();
        next.trunc = floor;
        Ok::<_, std::convert::Infallible>(Step::Write(next))
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_below_the_floor_is_invalid() {
    let cluster = Cluster::new(3, 4).await;
    let acked = written_and_crashed(&cluster, 10).await;
    // Seal the ten records, then truncate below 5.
    let (writer, _) = cluster.open(test_config()).await.unwrap();
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    raise_floor(&cluster, RecordIndex(5)).await;

    let recovery = Recovery::run(cluster.stores.clone(), test_config())
        .await
        .unwrap();
    assert_eq!(
        (recovery.floor(), recovery.end()),
        (RecordIndex(5), RecordIndex(10))
    );
    for checkpoint in [0, 4, 11] {
        let error = recovery.replay(RecordIndex(checkpoint)).unwrap_err();
        assert!(
            matches!(
                error,
                LogError::InvalidCheckpoint {
                    floor: RecordIndex(5),
                    end: RecordIndex(10),
                    ..
                }
            ),
            "{error}"
        );
        assert_eq!(error.kind(), ErrorKind::FixInput);
    }
    let mut replay = recovery.replay(RecordIndex(7)).unwrap();
    let mut replayed = Vec::new();
    while let Some(record) = replay.next().await.unwrap() {
        replayed.push(record);
    }
    let expected: Vec<_> = acked
        .range(RecordIndex(7)..)
        .map(|(i, r)| (*i, r.clone()))
        .collect();
    assert_eq!(replayed, expected);
    let writer = recovery.start().await.unwrap();
    writer.shutdown(Duration::from_secs(5)).await.unwrap();

    let mut reader = Reader::new(&cluster.stores, RecordIndex(4));
    let error = reader.try_next().await.unwrap_err();
    assert!(
        matches!(
            error,
            LogError::Truncated {
                requested: RecordIndex(4),
                floor: RecordIndex(5)
            }
        ),
        "{error}"
    );
    let recovered = cluster.verify_acked(&acked).await;
    assert_eq!(
        recovered.first().map(|(index, _)| *index),
        Some(RecordIndex(5))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_before_the_replay_is_consumed_is_refused() {
    let cluster = Cluster::new(3, 4).await;
    let mut acked = written_and_crashed(&cluster, 10).await;

    let recovery = Recovery::run(cluster.stores.clone(), test_config())
        .await
        .unwrap();
    let error = recovery.start().await.unwrap_err();
    assert!(
        matches!(
            error,
            LogError::RecoveryIncomplete {
                end: RecordIndex(10)
            }
        ),
        "{error}"
    );
    assert_eq!(error.kind(), ErrorKind::Reopen);

    let recovery = Recovery::run(cluster.stores.clone(), test_config())
        .await
        .unwrap();
    let mut replay = recovery.replay(recovery.floor()).unwrap();
    for _ in 0..3 {
        replay.next().await.unwrap().unwrap();
    }
    let error = recovery.start().await.unwrap_err();
    assert!(
        matches!(error, LogError::RecoveryIncomplete { .. }),
        "{error}"
    );

    // A checkpoint at the end has nothing to replay: start may follow at once.
    let recovery = Recovery::run(cluster.stores.clone(), test_config())
        .await
        .unwrap();
    let mut replay = recovery.replay(recovery.end()).unwrap();
    assert!(replay.next().await.unwrap().is_none());
    let writer = recovery.start().await.unwrap();
    append_acked(&writer, "started", 5, &mut acked).await;
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    let recovered = cluster.verify_acked(&acked).await;
    assert_eq!(recovered.len(), 15);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_completion_does_not_cancel_the_append() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(test_config()).await.unwrap();
    for controller in &cluster.faults {
        controller.add(
            FaultRule::new(Fault::Delay(Duration::from_millis(30))).ops(OpSet::of(&[Op::Create])),
        );
    }
    let dropped = payload("dropped", 0);
    let completion = writer.append(dropped.clone()).unwrap();
    assert_eq!(completion.index(), RecordIndex(0));
    drop(completion);
    wait_until(
        "the dropped append is committed",
        Duration::from_secs(2),
        || async { cluster.read_from(0).await.unwrap().len() == 1 },
    )
    .await;
    let mut acked = BTreeMap::from([(RecordIndex(0), dropped)]);
    append_acked(&writer, "kept", 3, &mut acked).await;
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    let recovered = cluster.verify_acked(&acked).await;
    assert_eq!(recovered.len(), 4);
}

/// Everything `reader` returns until it catches up.
async fn read_until_caught_up(reader: &mut Reader, read: &mut Vec<(RecordIndex, Bytes)>) {
    while let Some(record) = reader.try_next().await.unwrap() {
        read.push(record);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_never_see_data_that_later_disappears() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(test_config()).await.unwrap();
    let tail = cluster.manifest().await.tail;
    // Replica 2 is down and replica 1 is slow: fragments often reach replica
    // 0 first, and a reader must not return them before replica 1 has them.
    cluster.faults[2].set_outage(true);
    cluster.faults[1].add(
        FaultRule::new(Fault::DelayUpTo(Duration::from_millis(15)))
            .ops(OpSet::of(&[Op::Create]))
            .keys(KeyMatch::Prefix("segments".into())),
    );
    let mut completions = Vec::new();
    let mut reader = Reader::new(&cluster.stores, RecordIndex(0));
    let mut read = Vec::new();
    let mut sequence = 0;
    while read.len() < 60 {
        let record = payload("w", sequence);
        sequence += 1;
        completions.push((record.clone(), writer.append(record).unwrap()));
        match reader.try_next().await.unwrap() {
            Some(record) => read.push(record),
            None => tokio::time::sleep(Duration::from_micros(500)).await,
        }
    }
    // Replica 1 goes down too: what follows reaches replica 0 only.
    cluster.faults[1].set_outage(true);
    let late: Vec<Bytes> = records("late", 5);
    for record in &late {
        completions.push((record.clone(), writer.append(record.clone()).unwrap()));
    }
    let last_late = late.last().unwrap().clone();
    wait_until(
        "replica 0 holds the late records",
        Duration::from_secs(2),
        || {
            let last_late = last_late.clone();
            let cluster = &cluster;
            async move { cluster.records_on(0, tail).await.contains(&last_late) }
        },
    )
    .await;
    read_until_caught_up(&mut reader, &mut read).await;
    // Crash.
    writer.abort();
    let mut acked = BTreeMap::new();
    for (record, completion) in completions {
        if let Ok(receipt) = completion.await {
            acked.insert(receipt.index, record);
        }
    }
    assert!(acked.values().all(|record| !late.contains(record)));

    // Recover without replica 0, the one that ran ahead.
    cluster.heal();
    cluster.faults[0].set_outage(true);
    let (writer, replayed) = cluster.open(test_config()).await.unwrap();
    let recovered: BTreeMap<RecordIndex, Bytes> = replayed.iter().cloned().collect();
    for (index, record) in &read {
        assert_eq!(
            recovered.get(index),
            Some(record),
            "record {index} was read and then disappeared"
        );
    }
    assert!(
        recovered.values().all(|record| !late.contains(record)),
        "records on one replica of three survived a recovery that did not observe it"
    );
    log_support::assert_acked_present(&acked, &replayed);
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    let mut seen = acked;
    seen.extend(read);
    cluster.verify_acked(&seen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claimed_epoch_names_the_new_segments() {
    let cluster = Cluster::new(3, 4).await;
    let acked = written_and_crashed(&cluster, 3).await;
    let recovery = Recovery::run(cluster.stores.clone(), test_config())
        .await
        .unwrap();
    let epoch = recovery.epoch();
    assert_eq!(recovery.manifest().tail, SegmentId::new(epoch, 0));
    assert_eq!(recovery.manifest().pending, Some(SegmentId::new(epoch, 1)));
    assert!(epoch > Epoch(1));
    let replayed = replay_all(&recovery).await.unwrap();
    assert_eq!(replayed, acked.clone().into_iter().collect::<Vec<_>>());
    drop(recovery);
    let (writer, _) = open_log(&cluster.stores, test_config()).await.unwrap();
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    cluster.verify_acked(&acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_that_fails_mid_seal_leaves_only_an_orphan() {
    let (cluster, acked, lone) = lone_copy_scenario().await;
    let tail = cluster.manifest().await.tail;
    // Without replica 0 the lone record may have been acked, so this recovery
    // keeps it; but its seal reaches replica 2 only, and it fails.
    cluster.faults[0].set_outage(true);
    cluster.faults[1].add(
        FaultRule::new(Fault::FailBefore)
            .ops(OpSet::of(&[Op::Create]))
            .keys(KeyMatch::Prefix("sealed".into())),
    );
    let error = Recovery::run(cluster.stores.clone(), test_config())
        .await
        .unwrap_err();
    assert!(matches!(error, LogError::NoQuorum { .. }), "{error}");
    let orphan = cluster.sealed_on(2).await;
    assert_eq!(orphan.len(), 1);
    assert_eq!(
        cluster.manifest().await.tail,
        tail,
        "the failed view was committed"
    );

    // Observing every replica, the next recovery sees one copy of three: it
    // drops the lone record and seals different content under another key.
    cluster.heal();
    let (writer, replayed) = cluster.open(test_config()).await.unwrap();
    assert_eq!(replayed, acked.clone().into_iter().collect::<Vec<_>>());
    let entry = cluster.manifest().await.segments[0];
    let named = chorus::log::layout::sealed_key(entry.id, entry.crc32c);
    assert_ne!(named, orphan[0]);
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    // The writer's start-up sweep may already have removed the orphan; an
    // explicit sweep must, and must keep the object the register names.
    Maintenance::new(&cluster.stores)
        .sweep_orphans(&NoProgress)
        .await
        .unwrap();
    let on_two = cluster.sealed_on(2).await;
    assert!(on_two.contains(&named), "the named seal was swept");
    assert!(
        !on_two.contains(&orphan[0]),
        "the orphan seal survived a sweep"
    );
    let recovered = cluster.verify_acked(&acked).await;
    assert!(recovered.iter().all(|(_, record)| *record != lone));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fragment_responses_are_resolved_by_reading_back() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(test_config()).await.unwrap();
    for controller in &cluster.faults {
        controller.add(
            FaultRule::new(Fault::FailAfter)
                .ops(OpSet::of(&[Op::Create]))
                .keys(KeyMatch::Prefix("segments".into()))
                .probability(0.3),
        );
    }
    let mut acked = BTreeMap::new();
    append_acked(&writer, "w", 50, &mut acked).await;
    assert!(cluster.faults.iter().map(|f| f.injected()).sum::<u64>() > 0);
    assert_eq!(writer.status().stopped, None);
    writer.abort();
    let recovered = cluster.verify_acked(&acked).await;
    assert_eq!(recovered.len(), 50);
}

/// Regression: recovery counted a damaged copy as observed-and-absent. A
/// fragment acknowledged by exactly two replicas of three, one of whose copies
/// then rotted, fell below the two copies needed when all three replicas were
/// observed; it was discarded, and with it (as a "tail gap") the acknowledged
/// records of the pending segment. A damaged copy now counts as an unobserved
/// replica for its position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotted_copy_does_not_discard_a_fragment_acked_by_exactly_a_quorum() {
    let cluster = Cluster::new(3, 4).await;
    let manifest = claim_empty_tail(&cluster).await;
    let epoch = manifest.tail.epoch;
    let (tail, pending) = (manifest.tail, manifest.pending.unwrap());
    let mut acked = BTreeMap::new();
    // Tail fragment 0 acked by replicas 0 and 1; replica 2 never got it.
    let first = records("quorum", 2);
    let fragment = data_fragment(epoch, 0, 0, &first);
    place(&cluster, &[0], tail, &fragment).await;
    ack_all(&mut acked, 0, &first);
    // Replica 1's copy rotted: it no longer decodes.
    let mut rotted = fragment.encode().to_vec();
    let last = rotted.len() - 1;
    rotted[last] ^= 0x40;
    cluster.raw[1]
        .create(
            &chorus::log::layout::fragment_key(tail, chorus::ids::FragmentIndex(0)),
            Bytes::from(rotted),
        )
        .await
        .unwrap();
    // The writer then moved to the pending segment and got acks there.
    let next = records("pending", 3);
    place(
        &cluster,
        &[0, 1, 2],
        pending,
        &data_fragment(epoch, 0, 2, &next),
    )
    .await;
    ack_all(&mut acked, 2, &next);

    let (writer, replayed) = cluster.open(test_config()).await.unwrap();
    assert_eq!(replayed, acked.clone().into_iter().collect::<Vec<_>>());
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    let recovered = cluster.verify_acked(&acked).await;
    assert_eq!(recovered.len(), 5);
}

/// A resuming reader (the caller knows everything below its start is
/// committed) finds its place in the active segment by binary search; it
/// must return exactly what a reader scanning from the segment's start
/// returns, from every index, while the writer is still writing and after
/// it stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resuming_reader_reads_what_a_scanning_reader_reads_from_every_index() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(test_config()).await.unwrap();
    let mut acked = BTreeMap::new();
    append_acked(&writer, "r", 40, &mut acked).await;
    let end = acked.len() as u64;
    let read_all = |mut reader: Reader| async move {
        let mut records = Vec::new();
        while let Some(record) = reader.try_next().await.unwrap() {
            records.push(record);
        }
        records
    };
    for from in 0..=end {
        let scanned = read_all(Reader::new(&cluster.stores, RecordIndex(from))).await;
        let resumed = read_all(Reader::resuming(&cluster.stores, RecordIndex(from))).await;
        let expected: Vec<_> = acked
            .range(RecordIndex(from)..)
            .map(|(index, record)| (*index, record.clone()))
            .collect();
        assert_eq!(scanned, expected, "from {from}");
        assert_eq!(resumed, expected, "from {from}");
    }
    // A resuming reader at the end picks up what is appended later.
    let mut reader = Reader::resuming(&cluster.stores, RecordIndex(end));
    append_acked(&writer, "later", 3, &mut acked).await;
    for index in end..end + 3 {
        let (read, record) = reader.next().await.unwrap();
        assert_eq!(
            (read, &record),
            (RecordIndex(index), &acked[&RecordIndex(index)])
        );
    }
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// Counts the fragment reads in flight on one replica at once.
#[derive(Debug)]
struct ReadsInFlight {
    inner: DynBlobStore,
    now: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl chorus::blob::Layer for ReadsInFlight {
    fn inner(&self) -> &DynBlobStore {
        &self.inner
    }

    async fn around<T: Send + 'static>(
        &self,
        op: Op,
        key: &str,
        call: futures::future::BoxFuture<'_, Result<T, chorus::blob::BlobError>>,
    ) -> Result<T, chorus::blob::BlobError> {
        use std::sync::atomic::Ordering::SeqCst;
        if op != Op::Get || !key.starts_with("segments") {
            return call.await;
        }
        let now = self.now.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        // Long enough for reads issued together to overlap.
        tokio::time::sleep(Duration::from_millis(2)).await;
        let result = call.await;
        self.now.fetch_sub(1, SeqCst);
        result
    }
}

/// A reader far behind reads many fragments per round trip, the same
/// records in the same order; once caught up it reads one at a time again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_behind_reads_fragments_ahead_and_one_at_a_time_once_caught_up() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(test_config()).await.unwrap();
    let mut written = Vec::new();
    for sequence in 0..64 {
        let record = payload("ahead", sequence);
        // One record per fragment: each append is acknowledged before the next.
        writer.append(record.clone()).unwrap().await.unwrap();
        written.push(record);
    }
    let counted: Vec<Arc<ReadsInFlight>> = cluster
        .stores
        .replicas
        .iter()
        .map(|(_, store)| {
            Arc::new(ReadsInFlight {
                inner: store.clone(),
                now: Default::default(),
                most: Default::default(),
            })
        })
        .collect();
    let stores = LogStores {
        replicas: cluster
            .stores
            .replicas
            .iter()
            .zip(&counted)
            .map(|((name, _), counted)| (name.clone(), counted.clone() as DynBlobStore))
            .collect(),
        register: Arc::clone(&cluster.stores.register),
    };
    let mut reader = Reader::new(&stores, RecordIndex(0));
    let mut read = Vec::new();
    while let Some((_, record)) = reader.try_next().await.unwrap() {
        read.push(record);
    }
    assert_eq!(read, written);
    let most = counted[0].most.load(std::sync::atomic::Ordering::SeqCst);
    assert!(most >= 8, "at most {most} fragment reads at once");
    // Caught up: a poll with nothing new reads one fragment.
    counted[0]
        .most
        .store(0, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(reader.try_next().await.unwrap(), None);
    assert_eq!(counted[0].most.load(std::sync::atomic::Ordering::SeqCst), 1);
}
