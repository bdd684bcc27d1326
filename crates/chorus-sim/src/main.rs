//! `chorus-sim`: run the deterministic simulator over many seeds.
//!
//! ```text
//! cargo run --release -p chorus-sim -- --seeds 200 --steps 2000
//! cargo run --release -p chorus-sim -- --seed 1234 --steps 2000 --verbose
//! ```

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use chorus_sim::{BatchSummary, SeedResult, SimOptions, check_seed, replay_command, run_batch};
use clap::Parser;

/// Deterministic simulation of the Chorus log under faults.
#[derive(Debug, Parser)]
#[command(name = "chorus-sim", version)]
struct Args {
    /// How many seeds to run (from --first-seed on).
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// Safety-phase steps per seed.
    #[arg(long, default_value_t = 2000)]
    steps: u64,
    /// Run only this seed (twice, comparing traces) and report it in detail.
    #[arg(long)]
    seed: Option<u64>,
    /// The first seed of a --seeds batch.
    #[arg(long, default_value_t = 0)]
    first_seed: u64,
    /// Worker threads (default: the available parallelism).
    #[arg(long)]
    jobs: Option<usize>,
    /// Print every trace event of a --seed run to stderr.
    #[arg(long)]
    verbose: bool,
    /// Run each seed once, skipping the determinism check.
    #[arg(long)]
    once: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match args.seed {
        Some(seed) => single(&args, seed),
        None => batch(&args),
    }
}

fn single(args: &Args, seed: u64) -> ExitCode {
    let started = Instant::now();
    let options = SimOptions {
        seed,
        steps: args.steps,
        verbose: args.verbose,
    };
    let result = check_seed(options, !args.once);
    let report = &result.report;
    eprintln!("seed {seed}: {}", report.params);
    eprintln!(
        "seed {seed}: {} steps, {} events, {:.1} s virtual, digest {}, stats {:?}",
        report.steps_run,
        report.events,
        report.virtual_time.as_secs_f64(),
        hex::encode(&report.digest[..8]),
        report.stats
    );
    let violations = u64::from(result.failure.is_some());
    print_failure(&result, args.steps);
    print_summary(1, report.steps_run, violations, started.elapsed());
    exit_code(violations)
}

fn batch(args: &Args) -> ExitCode {
    let seeds: Vec<u64> = (args.first_seed..args.first_seed + args.seeds).collect();
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    eprintln!(
        "chorus-sim: seeds {}..{} × {} steps on {jobs} threads{}",
        args.first_seed,
        args.first_seed + args.seeds,
        args.steps,
        if args.once { "" } else { ", each run twice" }
    );
    let mut last_progress = Instant::now();
    let summary = run_batch(seeds, args.steps, jobs, !args.once, |result, summary| {
        if result.failure.is_some() {
            print_failure(result, args.steps);
        }
        if last_progress.elapsed() >= Duration::from_secs(5) || summary.seeds == args.seeds {
            last_progress = Instant::now();
            eprintln!(
                "progress: {}/{} seeds, {} violations, {:.0} s",
                summary.seeds,
                args.seeds,
                summary.failures.len(),
                summary.wall_time.as_secs_f64()
            );
        }
    });
    finish(&summary, args.steps)
}

fn finish(summary: &BatchSummary, steps: u64) -> ExitCode {
    for failure in &summary.failures {
        eprintln!("failed: {}", replay_command(failure.report.seed, steps));
    }
    eprintln!(
        "acked appends: {}, successful recoveries: {}, acked key-value writes: {}, lease \
         takeovers: {}, virtual time: {:.0} s",
        summary.acked,
        summary.recoveries,
        summary.runtime_acked,
        summary.runtime_takeovers,
        summary.virtual_time.as_secs_f64()
    );
    eprintln!(
        "exactly-once retries: {}, attempts answered without applying: {}, retries answered \
         from a restored snapshot: {}",
        summary.runtime_keyed_retries,
        summary.runtime_keyed_deduplicated,
        summary.runtime_keyed_restored
    );
    eprintln!(
        "etcd writes acknowledged: {} (of which refused for compacted history: {}), etcd \
         answers compared: {}, checked against the model: {}, states compared at one applied \
         end: {}",
        summary.runtime_etcd_acked + summary.runtime_etcd_compacted,
        summary.runtime_etcd_compacted,
        summary.runtime_etcd_answers_compared,
        summary.runtime_etcd_model_checked,
        summary.runtime_states_compared
    );
    eprintln!(
        "etcd leases granted: {}, keep-alives acknowledged: {} (leases kept alive across a \
         takeover: {}), expired: {}, revoked: {}, keys deleted with them: {}",
        summary.runtime_lease_grants,
        summary.runtime_lease_keep_alives,
        summary.runtime_lease_kept_across,
        summary.runtime_lease_expiries,
        summary.runtime_lease_revokes,
        summary.runtime_lease_keys_deleted
    );
    eprintln!(
        "records handed between processes: {}, applied by their receivers: {}",
        summary.runtime_records_handed_over, summary.runtime_records_applied_from_peers
    );
    let violations = summary.failures.len() as u64;
    print_summary(summary.seeds, summary.steps, violations, summary.wall_time);
    exit_code(violations)
}

fn print_failure(result: &SeedResult, steps: u64) {
    let Some(failure) = &result.failure else {
        return;
    };
    let mut err = std::io::stderr().lock();
    let seed = result.report.seed;
    let _ = writeln!(
        err,
        "VIOLATION seed {seed} step {}: {}",
        failure.step, failure.message
    );
    let _ = writeln!(err, "  params: {}", result.report.params);
    for line in &failure.recent {
        let _ = writeln!(err, "  | {line}");
    }
    let _ = writeln!(err, "  replay: {}", replay_command(seed, steps));
}

fn print_summary(seeds: u64, steps: u64, violations: u64, wall: Duration) {
    println!(
        "seeds run: {seeds}, steps: {steps}, violations: {violations}, wall time: {:.1} s",
        wall.as_secs_f64()
    );
}

fn exit_code(violations: u64) -> ExitCode {
    if violations == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
