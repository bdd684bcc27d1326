//! The simulator in CI: 200 seeds, each run twice with the trace digests
//! compared, every phase (log, lease, runtime). Steps are scaled down (300
//! instead of 2000) to keep this debug test near a minute and a half;
//! docs/testing.md gives the release runs of 2000 steps.

use chorus_sim::{replay_command, run_batch};

const SEEDS: u64 = 200;
const STEPS: u64 = 300;

#[test]
fn two_hundred_seeds_keep_every_guarantee_and_replay_exactly() {
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let summary = run_batch((0..SEEDS).collect(), STEPS, jobs, true, |_, _| {});
    let failures: Vec<String> = summary
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
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(summary.seeds, SEEDS);
    assert!(summary.acked > 0 && summary.recoveries > 0, "{summary:?}");
    assert!(
        summary.runtime_acked > 0 && summary.runtime_takeovers > 0,
        "{summary:?}"
    );
}
