//! Seeds that found protocol bugs or nondeterminism, run in full (2000
//! steps, twice), and the determinism self-test. Each seed is named after
//! what it found. A seed's schedule is a function of the simulator's code
//! too: once the schedule gained actions (split views, truncation,
//! maintenance, rot), these seeds no longer replay the runs that found the
//! bugs, and serve as more seeds. The log bugs themselves are pinned by
//! library-level regression tests that do not depend on the schedule, in
//! `crates/chorus/tests/sim_regressions.rs` (and `log_maintenance.rs` for
//! seed 11); the runtime phase's findings are pinned as described at their
//! seeds below.

use std::time::Duration;

use chorus_sim::{SimOptions, check_seed, replay_command, run_once};

const STEPS: u64 = 2000;

/// Runs `seed` twice on its own thread; a busy loop in the system under test
/// stops virtual time, so a wall-clock deadline turns a hang into a failure.
fn passes(seed: u64) {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let options = SimOptions {
            seed,
            steps: STEPS,
            verbose: false,
        };
        let _ = done.send(check_seed(options, true));
    });
    let result = finished
        .recv_timeout(Duration::from_secs(300))
        .unwrap_or_else(|_| panic!("seed {seed} hung: {}", replay_command(seed, STEPS)));
    if let Some(failure) = result.failure {
        panic!(
            "seed {seed} step {}: {}\n{}\n  replay: {}",
            failure.step,
            failure.message,
            failure.recent.join("\n"),
            replay_command(seed, STEPS)
        );
    }
}

/// Every observed copy of an acknowledged fragment read corrupt; recovery
/// discarded it and lost the ack (fixed: such a position is undecidable).
#[test]
fn seed_3_corrupt_reads_lost_an_ack() {
    passes(3);
}

/// One replica, corrupt reads of its only copy: the same lost ack.
#[test]
fn seed_2_corrupt_read_of_the_only_copy_lost_an_ack() {
    passes(2);
}

/// `max_replica_lag_bytes == max_fragment_bytes` shed every healthy lane and
/// poisoned the writer on its first append (fixed: lag behind the quorum).
#[test]
fn seed_9_lag_limit_poisoned_a_healthy_writer() {
    passes(9);
}

/// An expired linger with a full window busy-looped the pipeline and stopped
/// virtual time (fixed: only a future linger deadline arms the timer).
#[test]
fn seed_14_expired_linger_busy_looped() {
    passes(14);
}

/// A record larger than the room left below `max_active_segment_bytes` was
/// refused forever by a segment that had not reached its rotation threshold
/// (fixed: a segment below its threshold always takes the record). Seeds
/// 1492 and 1850 found the same bug.
#[test]
fn seed_1013_active_segment_full_forever() {
    passes(1013);
}

/// The same seed gives the same trace; different seeds give different ones.
#[test]
fn a_seed_replays_exactly() {
    let options = |seed| SimOptions {
        seed,
        steps: 300,
        verbose: false,
    };
    let first = run_once(options(7));
    let again = run_once(options(7));
    let other = run_once(options(8));
    assert!(first.failure.is_none(), "{:?}", first.failure);
    assert_eq!(first.digest, again.digest);
    assert_eq!(first.events, again.events);
    assert_ne!(first.digest, other.digest);
}

/// The runtime phase replayed differently on a loaded machine (5 % of the
/// first 200 seeds; this one in about half of its runs beside two busy
/// threads): the `chorus` runtime encodes and restores snapshots on tokio's
/// blocking pool, in real time. Fixed in the simulator's scheduler settings
/// for that phase (`executor::GatedRuntime`). The race needs load to
/// show, so this pins the seed; the mechanism is pinned by
/// `executor::tests::blocking_work_completes_only_when_nothing_else_can_run`.
#[test]
fn seed_69_runtime_blocking_pool_race() {
    passes(69);
}

/// A graceful shutdown raced a failed write in the runtime's serve loop,
/// whose `tokio::select!` was not `biased`: tokio picked the branch at
/// random (from a generator the simulator cannot seed), and one run released
/// the lease while the other exited as a failed writer. Fixed in the runtime
/// (da4746c: `biased;`, the stop branch first); the phase shuts down serving
/// primaries again, so this seed's double run covers the race.
#[test]
fn seed_44_runtime_shutdown_raced_a_failed_write() {
    passes(44);
}

/// A node cut off in the middle of its boot (state restored from HEAD at 34,
/// lease acquired, HEAD claimed, log recovery under way) lost its lease to
/// another node, which published a snapshot at 54 and truncated the log below
/// it. Healed, the first boot went on: its recovery fenced the new primary's
/// writer, and its replay from 34 failed with `InvalidCheckpoint` (floor 54),
/// which `log_error` classes as final, so the runtime stopped for good
/// although booting again, from the newer HEAD, succeeds (R8 failed at
/// step 59 of the runtime phase; seed 419 likewise). Fixed in the runtime
/// (fa9cbad): the boot checks its lease before recovering the log, and
/// `InvalidCheckpoint` in the replay is retried.
#[test]
fn seed_139_runtime_stops_when_the_log_is_truncated_past_its_boot() {
    passes(139);
}
