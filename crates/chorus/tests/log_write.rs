//! The write path over in-memory replicas with fault injection. Every scenario
//! ends by reading back every acknowledged record (`Cluster::verify_acked`).

#[path = "support/log.rs"]
mod log_support;
#[path = "support/metrics.rs"]
mod metrics_support;

use std::collections::BTreeMap;
use std::future::ready;
use std::time::Duration;

use bytes::Bytes;
use chorus::blob::{Fault, FaultRule, KeyMatch, Op, OpSet};
use chorus::ids::{FragmentIndex, RecordIndex, SegmentId};
use chorus::log::layout::{SEGMENTS_PREFIX, fragment_key};
use chorus::log::{LogConfig, LogError, StopReason};
use futures::FutureExt;
use log_support::{Cluster, append_acked, assert_acked_present, payload, test_config, wait_until};
use metrics_support::Recorded;

/// The per-replica fragment window of the logs the newer tests create.
const WINDOW: u64 = 4;

/// Creates that reached the fault layer, summed over every replica.
fn creates(cluster: &Cluster) -> u64 {
    cluster.faults.iter().map(|c| c.calls(Op::Create)).sum()
}

/// A rule delaying every fragment create (not register or sealed writes) by `delay`.
fn delay_fragment_creates(delay: Duration) -> FaultRule {
    FaultRule::new(Fault::Delay(delay))
        .ops(OpSet::of(&[Op::Create]))
        .keys(KeyMatch::Prefix(SEGMENTS_PREFIX.into()))
}

/// How many replicas hold fragment `fragment` of `segment`.
async fn copies(cluster: &Cluster, segment: SegmentId, fragment: u64) -> usize {
    let key = fragment_key(segment, FragmentIndex(fragment));
    let mut copies = 0;
    for replica in 0..cluster.raw.len() {
        if cluster.fragments_on(replica, segment).await.contains(&key) {
            copies += 1;
        }
    }
    copies
}

/// Asserts that `recovered` holds nothing but admitted records, byte for byte:
/// an append that failed may reappear, but nothing that was never admitted.
#[track_caller]
fn assert_only_admitted(
    admitted: &BTreeMap<RecordIndex, Bytes>,
    recovered: &[(RecordIndex, Bytes)],
) {
    for (index, record) in recovered {
        assert_eq!(
            admitted.get(index),
            Some(record),
            "recovered record {index} was never admitted with these bytes"
        );
    }
}

/// Defends in-order acks for a burst of appends admitted at once, all of which read back.
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

/// Defends that a refused oversized record consumes no index: the next record gets index 0.
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
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    let acked = BTreeMap::from([(RecordIndex(0), Bytes::new())]);
    let recovered = cluster.verify_acked(&acked).await;
    assert_eq!(recovered, vec![(RecordIndex(0), Bytes::new())]);
}

/// Defends immediate admission: `append` returns the index while every fragment write is blocked.
#[tokio::test(start_paused = true)]
async fn admission_returns_before_any_store_call_completes() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(test_config()).await.unwrap();
    for controller in &cluster.faults {
        controller.add(delay_fragment_creates(Duration::from_secs(3600)));
    }
    let creates_before = creates(&cluster);
    let mut completion = writer.append(payload("x", 0)).unwrap();
    assert_eq!(completion.index(), RecordIndex(0));
    // The fragment is issued to every replica, and no create has completed.
    wait_until("the fragment is issued", Duration::from_secs(1), || {
        ready(creates(&cluster) == creates_before + 3)
    })
    .await;
    assert!((&mut completion).now_or_never().is_none());
    writer.abort();
    let error = completion.await.unwrap_err();
    assert!(
        matches!(
            error,
            LogError::Stopped {
                reason: StopReason::Aborted,
                may_have_committed: true,
            }
        ),
        "{error}"
    );
    let recovered = cluster.verify_acked(&BTreeMap::new()).await;
    let admitted = BTreeMap::from([(RecordIndex(0), payload("x", 0))]);
    assert_only_admitted(&admitted, &recovered);
}

/// Defends that losing one replica of three never stops acks.
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

/// Defends poisoning with two of three replicas down: pending appends fail, new ones are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_three_down_poisons_the_writer() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(test_config()).await.unwrap();
    let mut acked = BTreeMap::new();
    append_acked(&writer, "c", 1, &mut acked).await;
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
    // A shutdown of a writer that already stopped reports why it stopped.
    let shutdown = writer.shutdown(Duration::from_secs(1)).await.unwrap_err();
    assert!(
        matches!(
            shutdown,
            LogError::Stopped {
                reason: StopReason::Poisoned { .. },
                may_have_committed: false,
            }
        ),
        "{shutdown}"
    );
    let recovered = cluster.verify_acked(&acked).await;
    let mut admitted = acked.clone();
    admitted.insert(RecordIndex(1), payload("c", 1));
    assert_only_admitted(&admitted, &recovered);
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
    let mut acked = BTreeMap::new();
    append_acked(&writer, "d", 20, &mut acked).await;
    // Twenty sequential acks at the fast replicas' pace take 200 ms of virtual
    // time; at the slow replica's pace (behind its window) they would take 20 s.
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_millis(300),
        "acks waited for the slow replica: {elapsed:?}"
    );
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    let recovered = cluster.verify_acked(&acked).await;
    assert_eq!(recovered.len(), 20);
}

/// Defends rotation: full segments are sealed and folded into the register, and all reads back.
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

/// Defends in-order completion: a record whose fragment lands first waits for earlier ones.
#[tokio::test(start_paused = true)]
async fn completions_resolve_in_index_order_when_later_fragments_land_first() {
    const FRAGMENTS: u64 = 4;
    let cluster = Cluster::new(3, FRAGMENTS as u32).await;
    let (writer, _) = cluster.open(test_config()).await.unwrap();
    let segment = cluster.manifest().await.tail;
    // Fragment k takes (FRAGMENTS − k) × 100 ms on every replica: the last
    // fragment reaches a quorum first, the first one last.
    for controller in &cluster.faults {
        for fragment in 0..FRAGMENTS {
            let delay = Duration::from_millis(100 * (FRAGMENTS - fragment));
            let key = fragment_key(segment, FragmentIndex(fragment));
            controller.add(
                FaultRule::new(Fault::Delay(delay))
                    .ops(OpSet::of(&[Op::Create]))
                    .keys(KeyMatch::Exact(key)),
            );
        }
    }
    // One record per fragment: each is cut (issued to all three replicas)
    // before the next is appended.
    let mut admitted = BTreeMap::new();
    let completions =
        append_one_per_fragment(&cluster, &writer, "o", FRAGMENTS, &mut admitted).await;
    for (sequence, completion) in completions.iter().enumerate() {
        assert_eq!(completion.index(), RecordIndex(sequence as u64));
    }
    let mut pending: Vec<_> = completions.into_iter().map(Some).collect();
    // The store really reorders: the last fragment is on every replica while
    // the first is on none.
    let last = FRAGMENTS - 1;
    wait_until("the last fragment lands", Duration::from_secs(1), || {
        copies(&cluster, segment, last).map(|copies| copies == 3)
    })
    .await;
    assert_eq!(
        copies(&cluster, segment, 0).await,
        0,
        "the first fragment landed early"
    );
    // Poll every completion, in index order, until all resolve. After each
    // pass the resolved ones must be a prefix of the admitted ones (a pass has
    // no await point, so the pipeline cannot run in the middle of one), and
    // each resolved record's fragment must be on a quorum.
    let mut resolved = Vec::new();
    while resolved.len() < pending.len() {
        for (position, slot) in pending.iter_mut().enumerate() {
            let Some(completion) = slot else { continue };
            if let Some(outcome) = completion.now_or_never() {
                let receipt = outcome.expect("acknowledged");
                assert_eq!(receipt.index, RecordIndex(position as u64));
                resolved.push(position as u64);
                *slot = None;
            }
        }
        assert_eq!(
            resolved,
            (0..resolved.len() as u64).collect::<Vec<_>>(),
            "a record resolved before an earlier one"
        );
        for fragment in &resolved {
            let held = copies(&cluster, segment, *fragment).await;
            assert!(held >= 2, "record {fragment} resolved on {held} copies");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    writer.shutdown(Duration::from_secs(5)).await.unwrap();
    let recovered = cluster.verify_acked(&admitted).await;
    assert_eq!(recovered.len(), FRAGMENTS as usize);
}

/// Appends one record per fragment until `count` fragments are cut: each is
/// issued to every replica (three creates) before the next record is appended.
async fn append_one_per_fragment(
    cluster: &Cluster,
    writer: &chorus::log::Writer,
    tag: &str,
    count: u64,
    admitted: &mut BTreeMap<RecordIndex, Bytes>,
) -> Vec<chorus::log::Completion> {
    let mut completions = Vec::new();
    for sequence in 0..count {
        let before = creates(cluster);
        let record = payload(tag, sequence);
        let completion = writer.append(record.clone()).unwrap();
        admitted.insert(completion.index(), record);
        completions.push(completion);
        wait_until("the fragment is issued", Duration::from_secs(1), || {
            ready(creates(cluster) == before + 3)
        })
        .await;
    }
    completions
}

/// Defends that `shutdown` gives up at its deadline when nothing commits.
#[tokio::test(start_paused = true)]
async fn shutdown_gives_up_at_its_deadline_when_nothing_commits() {
    let cluster = Cluster::new(3, WINDOW as u32).await;
    let config = LogConfig {
        lane_stall_timeout: Duration::from_secs(60),
        ..test_config()
    };
    let (writer, _) = cluster.open(config.clone()).await.unwrap();
    for controller in &cluster.faults {
        controller.add(delay_fragment_creates(Duration::from_secs(24 * 3600)));
    }
    let mut admitted = BTreeMap::new();
    // The window fills on every lane: these records are cut into fragments.
    let mut completions =
        append_one_per_fragment(&cluster, &writer, "cut", WINDOW, &mut admitted).await;
    // No lane has room: these stay queued, never cut.
    for sequence in 0..2 {
        let record = payload("queued", sequence);
        let completion = writer.append(record.clone()).unwrap();
        admitted.insert(completion.index(), record);
        completions.push(completion);
    }
    let timeout = Duration::from_secs(2);
    let started = tokio::time::Instant::now();
    let error = writer.shutdown(timeout).await.unwrap_err();
    let elapsed = started.elapsed();
    assert!(
        matches!(
            error,
            LogError::Stopped {
                reason: StopReason::Shutdown,
                may_have_committed: true,
            }
        ),
        "{error}"
    );
    assert!(
        elapsed >= timeout,
        "gave up before its deadline: {elapsed:?}"
    );
    // Paused time: the deadline is exact, not the next stall check (15 s).
    assert!(
        elapsed <= timeout + Duration::from_millis(100),
        "returned after its deadline: {elapsed:?}"
    );
    for (position, completion) in completions.into_iter().enumerate() {
        let error = completion.await.unwrap_err();
        assert!(
            matches!(
                error,
                LogError::Stopped {
                    reason: StopReason::Shutdown,
                    ..
                }
            ),
            "{error}"
        );
        let was_cut = (position as u64) < WINDOW;
        assert_eq!(
            error.may_have_committed(),
            was_cut,
            "record {position}: {error}"
        );
    }
    let recovered = cluster.verify_acked(&BTreeMap::new()).await;
    assert_only_admitted(&admitted, &recovered);
    assert!(
        recovered.len() as u64 <= WINDOW,
        "a queued record reappeared"
    );
}

/// Defends the documented bound: `shutdown(timeout)` returns at its deadline,
/// not at a later tick (it used to wait for the next stall check).
#[tokio::test(start_paused = true)]
async fn shutdown_returns_at_its_deadline_not_at_the_next_stall_check() {
    let cluster = Cluster::new(3, WINDOW as u32).await;
    let config = LogConfig {
        lane_stall_timeout: Duration::from_secs(3600),
        ..test_config()
    };
    let (writer, _) = cluster.open(config).await.unwrap();
    for controller in &cluster.faults {
        controller.add(delay_fragment_creates(Duration::from_secs(24 * 3600)));
    }
    let mut admitted = BTreeMap::new();
    let completions = append_one_per_fragment(&cluster, &writer, "s", 1, &mut admitted).await;
    let timeout = Duration::from_secs(2);
    let started = tokio::time::Instant::now();
    let error = writer.shutdown(timeout).await.unwrap_err();
    let elapsed = started.elapsed();
    assert!(error.may_have_committed(), "{error}");
    assert!(
        elapsed <= timeout + Duration::from_millis(100),
        "shutdown({timeout:?}) took {elapsed:?}"
    );
    for completion in completions {
        assert!(completion.await.unwrap_err().may_have_committed());
    }
    let recovered = cluster.verify_acked(&BTreeMap::new()).await;
    assert_only_admitted(&admitted, &recovered);
}

/// Defends that `shutdown` reports failure, not `Ok`, when the writer is
/// poisoned while draining (it used to read the dropped reply as success).
#[tokio::test(start_paused = true)]
async fn shutdown_reports_a_writer_poisoned_while_draining() {
    let cluster = Cluster::new(3, WINDOW as u32).await;
    let (writer, _) = cluster.open(test_config()).await.unwrap();
    for replica in [0, 2] {
        cluster.faults[replica].add(delay_fragment_creates(Duration::from_secs(24 * 3600)));
    }
    let mut admitted = BTreeMap::new();
    let completions = append_one_per_fragment(&cluster, &writer, "p", 1, &mut admitted).await;
    // Two lanes stall after `lane_stall_timeout` (500 ms), long before the deadline.
    let outcome = writer.shutdown(Duration::from_secs(60)).await;
    for completion in completions {
        let error = completion.await.unwrap_err();
        assert!(
            matches!(
                error,
                LogError::Stopped {
                    reason: StopReason::Poisoned { .. },
                    may_have_committed: true,
                }
            ),
            "{error}"
        );
    }
    assert!(
        outcome.is_err(),
        "shutdown reported success although an admitted record never became durable"
    );
    let recovered = cluster.verify_acked(&BTreeMap::new()).await;
    assert_only_admitted(&admitted, &recovered);
}

/// The lane sheds `(replica, reason)` the writer reported through the
/// `metrics` facade (`chorus_lane_sheds_total`).
fn sheds(recorded: &Recorded) -> Vec<(usize, String)> {
    let mut sheds = Vec::new();
    for (labels, increments) in recorded.series("chorus_lane_sheds_total") {
        let label = |name: &str| {
            labels
                .iter()
                .find_map(|label| label.strip_prefix(&format!("{name}=")))
                .expect("shed counters are labelled")
                .to_owned()
        };
        let replica: usize = label("replica").parse().expect("replica position");
        let count: f64 = increments.iter().sum();
        sheds.extend(std::iter::repeat_n(
            (replica, label("reason")),
            count as usize,
        ));
    }
    sheds
}

/// Defends lag shedding: a replica `max_replica_lag_bytes` behind is shed; acks keep flowing.
#[test]
fn a_lagging_replica_is_shed_and_acks_keep_flowing() {
    let recorded = Recorded::default();
    recorded.run(|| async {
        let cluster = Cluster::new(3, WINDOW as u32).await;
        // Small fragments and a small lag budget; a stall timeout no scenario
        // reaches, so lag is the only reason a lane can be shed.
        let config = LogConfig {
            max_fragment_bytes: 1024,
            max_record_bytes: 512,
            max_replica_lag_bytes: 4 * 1024,
            lane_stall_timeout: Duration::from_secs(24 * 3600),
            ..test_config()
        };
        let (writer, _) = cluster.open(config).await.unwrap();
        let segment = cluster.manifest().await.tail;
        let recovery_creates = cluster.faults[2].calls(Op::Create);
        cluster.faults[0].add(delay_fragment_creates(Duration::from_millis(10)));
        cluster.faults[1].add(delay_fragment_creates(Duration::from_millis(10)));
        cluster.faults[2].add(delay_fragment_creates(Duration::from_secs(10)));
        // Each ~300-byte record is its own fragment (acks are awaited one by
        // one): replica 2 owes more than 4 KiB after about fourteen of them.
        let mut acked = BTreeMap::new();
        let mut sequence = 0u64;
        while sheds(&recorded).is_empty() {
            assert!(sequence < 100, "replica 2 was never shed");
            let record = Bytes::from(format!("{:0>300}", sequence));
            let receipt = writer.append(record.clone()).unwrap().await.unwrap();
            acked.insert(receipt.index, record);
            sequence += 1;
        }
        assert_eq!(sheds(&recorded), vec![(2, "lag".to_owned())]);
        // Acks keep flowing on the two remaining replicas.
        append_acked(&writer, "after", 20, &mut acked).await;
        // Long after replica 2 would have caught up, it holds nothing: its
        // requests were cancelled and no fragment was sent to it since.
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(cluster.fragments_on(2, segment).await.is_empty());
        assert!(
            cluster.faults[2].calls(Op::Create) - recovery_creates <= WINDOW,
            "more than the window was sent"
        );
        assert_eq!(cluster.fragments_on(0, segment).await.len(), acked.len());
        assert_eq!(sheds(&recorded).len(), 1);
        writer.shutdown(Duration::from_secs(5)).await.unwrap();
        let recovered = cluster.verify_acked(&acked).await;
        assert_eq!(recovered.len(), acked.len());
    });
}

/// Defends stall shedding: a replica stuck for `lane_stall_timeout` is shed; acks keep flowing.
#[test]
fn a_stalled_replica_is_shed_and_acks_keep_flowing() {
    let recorded = Recorded::default();
    recorded.run(|| async {
        let cluster = Cluster::new(3, WINDOW as u32).await;
        // test_config: a 500 ms stall timeout and a 1 MiB lag budget that these
        // few small records never approach, so a stall is the only reason.
        let config = test_config();
        let (writer, _) = cluster.open(config.clone()).await.unwrap();
        let segment = cluster.manifest().await.tail;
        let recovery_creates = cluster.faults[2].calls(Op::Create);
        cluster.faults[0].add(delay_fragment_creates(Duration::from_millis(10)));
        cluster.faults[1].add(delay_fragment_creates(Duration::from_millis(10)));
        cluster.faults[2].add(delay_fragment_creates(Duration::from_secs(3600)));
        let started = tokio::time::Instant::now();
        let mut acked = BTreeMap::new();
        let mut sequence = 0u64;
        while sheds(&recorded).is_empty() {
            assert!(sequence < 1000, "replica 2 was never shed");
            let record = payload("before", sequence);
            let receipt = writer.append(record.clone()).unwrap().await.unwrap();
            acked.insert(receipt.index, record);
            sequence += 1;
        }
        assert_eq!(sheds(&recorded), vec![(2, "stall".to_owned())]);
        assert!(started.elapsed() > config.lane_stall_timeout);
        append_acked(&writer, "after", 20, &mut acked).await;
        // Past the hour its stuck requests would have taken, replica 2 holds
        // nothing: they were cancelled, and nothing was sent to it since.
        tokio::time::sleep(Duration::from_secs(3600 + 60)).await;
        assert!(cluster.fragments_on(2, segment).await.is_empty());
        assert!(
            cluster.faults[2].calls(Op::Create) - recovery_creates <= WINDOW,
            "more than the window was sent"
        );
        assert_eq!(sheds(&recorded).len(), 1);
        writer.shutdown(Duration::from_secs(5)).await.unwrap();
        let recovered = cluster.verify_acked(&acked).await;
        assert_eq!(recovered.len(), acked.len());
    });
}

/// Defends the write path's and recovery's metrics (docs/operations.md,
/// Metrics): what a scenario did shows in the counters, with their replica and
/// outcome labels.
#[test]
fn the_write_path_and_recovery_report_their_metrics() {
    const RECORDS: usize = 100;
    const RECORD_BYTES: usize = 100;
    let recorded = Recorded::default();
    recorded.run(|| async {
        let cluster = Cluster::new(3, WINDOW as u32).await;
        let config = LogConfig {
            max_segment_bytes: 2 * 1024,
            ..test_config()
        };
        let (writer, _) = cluster.open(config.clone()).await.unwrap();
        assert_eq!(recorded.total("chorus_recovery_runs_total"), 1.0);
        let recovery = recorded.values("chorus_recovery_seconds", &["outcome=ok"]);
        assert_eq!(recovery.len(), 1);

        let mut acked = BTreeMap::new();
        for i in 0..RECORDS {
            let record = Bytes::from(format!("{i:0>RECORD_BYTES$}"));
            let receipt = writer.append(record.clone()).unwrap().await.unwrap();
            acked.insert(receipt.index, record);
        }
        let too_large = vec![0u8; config.max_record_bytes as usize + 1];
        assert!(writer.append(too_large).is_err());
        writer.shutdown(Duration::from_secs(5)).await.unwrap();

        assert_eq!(
            recorded.total("chorus_append_records_total"),
            RECORDS as f64
        );
        assert_eq!(
            recorded.total("chorus_append_bytes_total"),
            (RECORDS * RECORD_BYTES) as f64
        );
        assert_eq!(
            recorded.values("chorus_append_failures_total", &["reason=too_large"]),
            [1.0]
        );
        let latencies = recorded.values("chorus_commit_latency_seconds", &[]);
        assert_eq!(latencies.len(), RECORDS);
        assert!(latencies.iter().all(|seconds| *seconds >= 0.0));
        // Every fragment reached a quorum, and no replica got one twice.
        let mut fragments = 0.0;
        for replica in 0..3 {
            let label = format!("replica={replica}");
            let written: f64 = recorded
                .values("chorus_fragments_total", &[&label])
                .iter()
                .sum();
            assert!(written <= RECORDS as f64, "replica {replica}: {written}");
            let bytes: f64 = recorded
                .values("chorus_fragment_bytes_total", &[&label])
                .iter()
                .sum();
            assert!(bytes >= written * RECORD_BYTES as f64, "replica {replica}");
            fragments += written;
        }
        assert!(fragments >= 2.0 * RECORDS as f64, "{fragments}");
        // 10 KB through 2 KiB segments: rotations, each one seal and one fold CAS.
        let seals: f64 = recorded
            .values("chorus_seals_total", &["outcome=ok"])
            .iter()
            .sum();
        assert!(seals >= 2.0, "{seals}");
        assert!(!recorded.values("chorus_rotation_state", &[]).is_empty());
        // The recovery's view commit and every fold are register CASes.
        assert!(recorded.total("chorus_manifest_cas_attempts_total") >= 1.0 + seals);
        assert!(recorded.values("chorus_manifest_cas_seconds", &[]).len() > seals as usize);

        let recovered = cluster.verify_acked(&acked).await;
        assert_eq!(recovered.len(), RECORDS);
    });
}

/// Hedged writes (`hedge_after_percentile`): two of three replicas stall for
/// an hour on one fragment create each, so its quorum waits on a stalled
/// request. Without hedging the append waits out the stall; with it, a
/// second create of the same fragment goes to each stalled replica after
/// the replica's own latency percentile, lands, and the append is
/// acknowledged at once. Both runs read back every record, and the hedges
/// are counted per replica.
#[test]
fn a_hedged_write_overtakes_a_stalled_request() {
    async fn acked_after(hedge_after_percentile: Option<u8>) -> Duration {
        let cluster = Cluster::new(3, WINDOW as u32).await;
        let config = LogConfig {
            hedge_after_percentile,
            lane_stall_timeout: Duration::from_secs(7200),
            ..test_config()
        };
        let (writer, _) = cluster.open(config).await.unwrap();
        let mut acked = BTreeMap::new();
        // Answered writes give each replica its latencies: one fragment
        // per record, since each is acknowledged before the next.
        for _ in 0..WARM_WRITES {
            append_acked(&writer, "warm", 1, &mut acked).await;
        }
        for controller in &cluster.faults[..2] {
            controller.add(delay_fragment_creates(Duration::from_secs(3600)).times(1));
        }
        let start = tokio::time::Instant::now();
        append_acked(&writer, "stalled", 1, &mut acked).await;
        let elapsed = start.elapsed();
        writer.shutdown(Duration::from_secs(5)).await.unwrap();
        assert_eq!(cluster.verify_acked(&acked).await.len(), WARM_WRITES + 1);
        elapsed
    }
    const WARM_WRITES: usize = 20;

    let recorded = Recorded::default();
    recorded.run(|| async {
        let unhedged = acked_after(None).await;
        assert!(unhedged >= Duration::from_secs(3600), "{unhedged:?}");
        assert_eq!(recorded.total("chorus_lane_hedges_total"), 0.0);
        let hedged = acked_after(Some(75)).await;
        assert!(hedged < Duration::from_secs(1), "{hedged:?}");
        let per_replica: Vec<f64> = (0..2)
            .map(|replica| {
                recorded
                    .values("chorus_lane_hedges_total", &[&format!("replica={replica}")])
                    .iter()
                    .sum()
            })
            .collect();
        assert!(per_replica.iter().all(|&n| n >= 1.0), "{per_replica:?}");
    });
}
