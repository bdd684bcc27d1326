//! The write path over in-memory replicas with fault injection.

#[path = "support/log.rs"]
mod log_support;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use chorus::blob::{Fault, FaultRule, Op, OpSet};
use chorus::ids::RecordIndex;
use chorus::log::{LogError, StopReason};
use log_support::{Cluster, assert_acked_present, payload, test_config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_arrive_in_index_order_and_read_back() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, replayed) = cluster.open(test_config()).await.unwrap();
    assert!(replayed.is_empty());
    let completions: Vec<_> = (0..200)
        .map(|i| writer.append(payload("a", i)).unwrap())
        .collect();
    let mut acked = BTreeMap::new();
    let mut last = None;
    for (i, completion) in completions.into_iter().enumerate() {
        let receipt = completion.await.unwrap();
        assert_eq!(receipt.index, RecordIndex(i as u64));
        assert!(last < Some(receipt.index));
        last = Some(receipt.index);
        acked.insert(receipt.index, payload("a", i as u64));
    }
    let read = cluster.read_from(0).await.unwrap();
    assert_eq!(read.len(), 200);
    assert_acked_present(&acked, &read);
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    let recovered = cluster.recovered_records().await;
    assert_acked_present(&acked, &recovered);
    assert_eq!(recovered.len(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_too_large_consumes_no_index() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(test_config()).await.unwrap();
    let error = writer.append(vec![0u8; 16 * 1024 + 1]).unwrap_err();
    assert!(matches!(error, LogError::RecordTooLarge { .. }), "{error}");
    assert!(!error.may_have_committed());
    assert_eq!(
        writer.append(Bytes::new()).unwrap().await.unwrap().index,
        RecordIndex(0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_returns_before_any_store_call_completes() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(test_config()).await.unwrap();
    for controller in &cluster.faults {
        controller.add(
            FaultRule::new(Fault::Delay(Duration::from_secs(3600))).ops(OpSet::of(&[Op::Create])),
        );
    }
    let creates_before: u64 = cluster.faults.iter().map(|c| c.calls(Op::Create)).sum();
    let started = std::time::Instant::now();
    let completion = writer.append(payload("x", 0)).unwrap();
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(completion.index(), RecordIndex(0));
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The fragment was issued but no create has completed.
    let creates_after: u64 = cluster.faults.iter().map(|c| c.calls(Op::Create)).sum();
    assert!(creates_after > creates_before);
    writer.abort();
    let error = completion.await.unwrap_err();
    assert!(error.may_have_committed(), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_down_keeps_committing() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(test_config()).await.unwrap();
    cluster.faults[1].set_outage(true);
    let mut acked = BTreeMap::new();
    for i in 0..50 {
        let receipt = writer.append(payload("b", i)).unwrap().await.unwrap();
        acked.insert(receipt.index, payload("b", i));
    }
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    assert_acked_present(&acked, &cluster.read_from(0).await.unwrap());
    let recovered = cluster.recovered_records().await;
    assert_acked_present(&acked, &recovered);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_three_down_poisons_the_writer() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(test_config()).await.unwrap();
    writer.append(payload("c", 0)).unwrap().await.unwrap();
    cluster.faults[0].set_outage(true);
    cluster.faults[2].set_outage(true);
    let error = writer.append(payload("c", 1)).unwrap().await.unwrap_err();
    assert!(
        matches!(
            error,
            LogError::Stopped {
                reason: StopReason::Poisoned { live: 1, quorum: 2 },
                ..
            }
        ),
        "{error}"
    );
    assert!(error.may_have_committed());
    let refused = writer.append(payload("c", 2)).unwrap_err();
    assert!(
        matches!(
            refused,
            LogError::Stopped {
                may_have_committed: false,
                ..
            }
        ),
        "{refused}"
    );
}

/// On virtual time: acks must not wait for the replica that takes 100× longer.
#[tokio::test(start_paused = true)]
async fn a_slow_replica_does_not_slow_acks() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(test_config()).await.unwrap();
    for (position, controller) in cluster.faults.iter().enumerate() {
        let delay = if position == 2 { 1000 } else { 10 };
        controller.add(
            FaultRule::new(Fault::Delay(Duration::from_millis(delay)))
                .ops(OpSet::of(&[Op::Create])),
        );
    }
    let started = tokio::time::Instant::now();
    for i in 0..20 {
        writer.append(payload("d", i)).unwrap().await.unwrap();
    }
    // Twenty sequential acks at the fast replicas' pace take 200 ms of virtual
    // time; at the slow replica's pace (behind its window) they would take 20 s.
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_millis(300),
        "acks waited for the slow replica: {elapsed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_seals_and_folds_segments() {
    let cluster = Cluster::new(3, 4).await;
    let mut config = test_config();
    config.max_segment_bytes = 2 * 1024;
    let (writer, _) = cluster.open(config.clone()).await.unwrap();
    let mut acked = BTreeMap::new();
    for i in 0..300 {
        let record = Bytes::from(format!("{:0>100}", i));
        let receipt = writer.append(record.clone()).unwrap().await.unwrap();
        acked.insert(receipt.index, record);
    }
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    let current = cluster.stores.register.read().await.unwrap().unwrap();
    let manifest = chorus::register::Manifest::from_fields(&current.fields).unwrap();
    assert!(
        manifest.segments.len() >= 2,
        "expected rotations, got {:?}",
        manifest.segments
    );
    assert_acked_present(&acked, &cluster.read_from(0).await.unwrap());
    let recovered = cluster.recovered_records().await;
    assert_eq!(recovered.len(), 300);
    assert_acked_present(&acked, &recovered);
}
