//! Regression tests for protocol bugs the deterministic simulator
//! (`crates/chorus-sim`) found, each named after the seed that found it.
//! Replay the original run with
//! `cargo run --release -p chorus-sim -- --seed <seed> --steps 2000`
//! (on the code before the fix).

#[path = "support/log.rs"]
mod log_support;

use std::collections::BTreeMap;
use std::time::Duration;

use chorus::blob::{Fault, FaultRule, KeyMatch, Op, OpSet};
use chorus::log::{LogConfig, LogError, Recovery};
use log_support::{Cluster, append_acked, append_acked_retrying, payload, replay_all, test_config};

/// Seed 3: recovery discarded an acknowledged fragment when every observed
/// copy of it read back corrupt. A damaged copy was only counted where a
/// valid copy existed, so a position with two damaged copies (of a fragment
/// acknowledged by exactly those two replicas) looked empty and the log was
/// cut before it. Now such a position is undecidable: recovery fails with a
/// retryable `NoQuorum` and a later recovery, reading clean copies, keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_3_corrupt_reads_of_every_copy_never_discard_an_ack() {
    let cluster = Cluster::new(3, 4).await;
    let (writer, _) = cluster.open(test_config()).await.unwrap();
    cluster.faults[2].set_outage(true);
    let mut acked = BTreeMap::new();
    append_acked(&writer, "a", 1, &mut acked).await;
    writer.abort();
    cluster.faults[2].set_outage(false);
    for replica in [0, 1] {
        cluster.faults[replica].add(
            FaultRule::new(Fault::Corrupt)
                .ops(OpSet::of(&[Op::Get]))
                .keys(KeyMatch::Prefix("segments".into())),
        );
    }
    let error = Recovery::run(cluster.stores.clone(), test_config())
        .await
        .expect_err("the only copies read corrupt: recovery must not decide");
    assert!(matches!(error, LogError::NoQuorum { .. }), "{error}");
    assert!(error.to_string().contains("may hide"), "{error}");
    cluster.heal();
    let recovery = Recovery::run(cluster.stores.clone(), test_config())
        .await
        .unwrap();
    let records = replay_all(&recovery).await.unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(Some(&records[0].1), acked.get(&records[0].0));
}

/// Seed 9: with `max_replica_lag_bytes` equal to `max_fragment_bytes` (a
/// valid setting), one full fragment in flight made every lane owe more than
/// the limit (the fragment header counts too), so every healthy lane was shed
/// at once and the writer poisoned itself on its first append. Lag is now
/// measured behind the quorum, which no healthy lane exceeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_9_a_lag_limit_of_one_fragment_never_poisons_a_healthy_writer() {
    let cluster = Cluster::new(3, 4).await;
    let config = LogConfig {
        max_fragment_bytes: 395,
        max_record_bytes: 387,
        max_replica_lag_bytes: 395,
        ..test_config()
    };
    let (writer, _) = cluster.open(config).await.unwrap();
    let completions: Vec<_> = (0..16)
        .map(|i| writer.append(vec![i as u8; 387]).unwrap())
        .collect();
    for completion in completions {
        completion.await.expect("a healthy cluster acknowledges");
    }
}

/// Seed 14: once the linger deadline of a queued record had passed while the
/// window kept the fragment from being cut, the pipeline's timer branch was
/// ready on every round: a busy loop that, under the simulator's paused
/// clock, also stopped virtual time for good. The run below hangs without
/// the fix, so it runs on its own thread with a wall-clock deadline.
#[test]
fn seed_14_an_expired_linger_does_not_busy_loop() {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(async {
            let cluster = Cluster::new(3, 1).await;
            let config = LogConfig {
                linger: Duration::from_millis(10),
                ..test_config()
            };
            let (writer, _) = cluster.open(config).await.unwrap();
            for controller in &cluster.faults {
                controller.add(
                    FaultRule::new(Fault::Delay(Duration::from_millis(50)))
                        .ops(OpSet::of(&[Op::Create])),
                );
            }
            let first = writer.append(payload("l", 0)).unwrap();
            // The first fragment is cut after its linger and is in flight;
            // the window of 1 keeps the second waiting past its own linger.
            tokio::time::sleep(Duration::from_millis(15)).await;
            let second = writer.append(payload("l", 1)).unwrap();
            first.await.unwrap();
            second.await.unwrap();
        });
        let _ = done.send(());
    });
    finished
        .recv_timeout(Duration::from_secs(60))
        .expect("the writer busy-looped and virtual time stopped");
}

/// Seed 1013: with `max_active_segment_bytes` close to `max_segment_bytes`,
/// a record larger than the room left in a segment that had not reached its
/// rotation threshold was refused with `ActiveSegmentFull` — and would be
/// forever, since the segment could then never reach the threshold and
/// rotate. A segment below its threshold now always takes the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_1013_a_large_record_never_waits_forever_for_rotation() {
    let cluster = Cluster::new(3, 4).await;
    let config = LogConfig {
        max_segment_bytes: 556,
        max_active_segment_bytes: 556,
        ..test_config()
    };
    let (writer, _) = cluster.open(config).await.unwrap();
    writer.append(vec![1u8; 103]).unwrap().await.unwrap();
    let large = writer
        .append(vec![2u8; 500])
        .expect("a segment below its threshold takes the record");
    large.await.unwrap();
    // The segment crossed its threshold and rotates; until the rotation
    // lands, `ActiveSegmentFull` is the retryable backpressure it should be,
    // and then appends go on.
    append_acked_retrying(&writer, "after", 8, &mut BTreeMap::new()).await;
}
