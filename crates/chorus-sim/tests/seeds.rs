//! The simulator in CI: 200 seeds through every phase (log, lease, runtime),
//! the first 100 of them run twice with the trace digests compared. Steps
//! are scaled down (300 instead of 2000; 75 in the runtime phase) and only
//! half the seeds replayed, to keep this debug test near 40 s on two idle
//! cores; docs/testing.md gives the release runs of 2000 steps.

use chorus_sim::{BatchSummary, replay_command, run_batch};

const SEEDS: u64 = 200;
/// Seeds 0..TWICE run a second time: a determinism check costs a whole run,
/// and more seeds find more than more replays.
const TWICE: u64 = 100;
const STEPS: u64 = 300;

#[test]
fn two_hundred_seeds_keep_every_guarantee_and_a_hundred_replay_exactly() {
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let twice = run_batch((0..TWICE).collect(), STEPS, jobs, true, |_, _| {});
    let once = run_batch((TWICE..SEEDS).collect(), STEPS, jobs, false, |_, _| {});
    let failures: Vec<String> = [&twice, &once].into_iter().flat_map(failures).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(twice.seeds + once.seeds, SEEDS);
    for summary in [&twice, &once] {
        assert!(summary.acked > 0 && summary.recoveries > 0, "{summary:?}");
        assert!(
            summary.runtime_acked > 0 && summary.runtime_takeovers > 0,
            "{summary:?}"
        );
        assert!(summary.runtime_etcd_acked > 0, "{summary:?}");
    }
}

/// Each failed seed with its replay command.
fn failures(summary: &BatchSummary) -> Vec<String> {
    summary
        .failures
        .iter()
        .map(|result| {
            let failure = result
                .failure
                .as_ref()
                .expect("failed seeds have a failure");
            format!(
                "seed {} step {}: {}\n  replay: {}",
                result.report.seed,
                failure.step,
                failure.message,
                replay_command(result.report.seed, STEPS)
            )
        })
        .collect()
}
