//! Running seeds: each on its own current-thread runtime with the paused
//! clock, twice, comparing trace digests; panics anywhere in a run (driver or
//! any task of the system under test) are violations.

use std::cell::{Cell, RefCell};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

use crate::executor::{GatedRuntime, paused_runtime};
use crate::sim::{Failure, RunReport, Sim, SimOptions};

thread_local! {
    static IN_RUN: Cell<bool> = const { Cell::new(false) };
    static PANICS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Panics recorded on this thread since the last call.
pub fn take_panics() -> Vec<String> {
    PANICS.with(|panics| std::mem::take(&mut *panics.borrow_mut()))
}

/// Routes panics on threads that are running a simulation into a list (the
/// run reports them as violations); other panics print as usual.
fn install_panic_hook() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_RUN.with(Cell::get) {
                PANICS.with(|panics| panics.borrow_mut().push(info.to_string()));
            } else {
                previous(info);
            }
        }));
    });
}

/// Runs one seed once.
pub fn run_once(options: SimOptions) -> RunReport {
    install_panic_hook();
    IN_RUN.with(|flag| flag.set(true));
    take_panics();
    let runtime = paused_runtime();
    let runtime_phase = GatedRuntime::new();
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let mut sim = runtime.block_on(Sim::new(options));
        let outcome = runtime.block_on(sim.run_log_and_lease());
        let outcome = match outcome {
            Ok(()) => runtime_phase.block_on(sim.run_runtime_phase()),
            Err(violation) => Err(violation),
        };
        // The log phases' objects are dropped where they were made.
        let _entered = runtime.enter();
        sim.finish(outcome)
    }));
    drop(runtime_phase);
    drop(runtime);
    IN_RUN.with(|flag| flag.set(false));
    let panics = take_panics();
    match outcome {
        Ok(report) => report,
        Err(_) => RunReport {
            seed: options.seed,
            params: String::new(),
            steps_run: 0,
            digest: [0; 32],
            events: 0,
            virtual_time: Duration::ZERO,
            stats: Default::default(),
            failure: Some(Failure {
                step: 0,
                message: format!("the simulator panicked: {}", panics.join("; ")),
                recent: Vec::new(),
            }),
        },
    }
}

/// The result of checking one seed: two runs, digests compared.
#[derive(Debug, Clone)]
pub struct SeedResult {
    /// The first run's report.
    pub report: RunReport,
    /// What failed: a checker in the first run, or nondeterminism.
    pub failure: Option<Failure>,
}

/// Runs `options` twice (unless `twice` is false) and compares the digests.
pub fn check_seed(options: SimOptions, twice: bool) -> SeedResult {
    let first = run_once(options);
    if first.failure.is_some() || !twice {
        return SeedResult {
            failure: first.failure.clone(),
            report: first,
        };
    }
    let second = run_once(options);
    let failure = if second.digest != first.digest {
        Some(Failure {
            step: first.steps_run.min(second.steps_run),
            message: format!(
                "nondeterminism: two runs of seed {} differ (digests {} and {}, {} and {} events)",
                options.seed,
                hex::encode(&first.digest[..8]),
                hex::encode(&second.digest[..8]),
                first.events,
                second.events
            ),
            recent: second.failure.map(|f| f.recent).unwrap_or_default(),
        })
    } else {
        second.failure
    };
    SeedResult {
        report: first,
        failure,
    }
}

/// The one-line command that replays `seed`.
pub fn replay_command(seed: u64, steps: u64) -> String {
    format!("cargo run --release -p chorus-sim -- --seed {seed} --steps {steps}")
}

/// Wall time after which a seed counts as hung. A busy loop in the system
/// under test never lets virtual time advance, so the run can never end by
/// itself; all a watchdog can do is report the seed and stop the process.
pub const HANG_LIMIT: Duration = Duration::from_secs(600);

fn watchdog(running: &[Mutex<Option<(u64, Instant)>>], done: &AtomicBool, steps: u64) {
    while !done.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(500));
        for slot in running {
            let running = *slot.lock().expect("slot");
            if let Some((seed, since)) = running
                && since.elapsed() > HANG_LIMIT
            {
                eprintln!(
                    "HANG seed {seed}: no result after {} s of wall time (a busy loop \
                     stops virtual time)\n  replay: {}",
                    HANG_LIMIT.as_secs(),
                    replay_command(seed, steps)
                );
                std::process::exit(2);
            }
        }
    }
}

/// What a batch of seeds did.
#[derive(Debug, Clone, Default)]
pub struct BatchSummary {
    /// Seeds run.
    pub seeds: u64,
    /// Steps run, over all seeds (first runs only).
    pub steps: u64,
    /// Seeds that failed.
    pub failures: Vec<SeedResult>,
    /// Wall time.
    pub wall_time: Duration,
    /// Virtual time simulated (first runs only).
    pub virtual_time: Duration,
    /// Acknowledged appends, over all seeds.
    pub acked: u64,
    /// Successful recoveries, over all seeds.
    pub recoveries: u64,
    /// Key-value writes the runtime phase acknowledged, over all seeds.
    pub runtime_acked: u64,
    /// Lease takeovers in the runtime phase, over all seeds.
    pub runtime_takeovers: u64,
    /// Retries of exactly-once writes in the runtime phase, over all seeds.
    pub runtime_keyed_retries: u64,
    /// Of the runtime phase's exactly-once attempts, those answered without
    /// applying (from the table, or as an appended twin's no-op).
    pub runtime_keyed_deduplicated: u64,
    /// Of those retries, the ones answered by a process that had the
    /// original application only through a restored snapshot.
    pub runtime_keyed_restored: u64,
    /// etcd writes the runtime phase acknowledged with etcd's answer, over
    /// all seeds.
    pub runtime_etcd_acked: u64,
    /// etcd writes acknowledged as refused for compacted history, over all
    /// seeds.
    pub runtime_etcd_compacted: u64,
    /// etcd answers compared across processes and acknowledgements (R11),
    /// over all seeds.
    pub runtime_etcd_answers_compared: u64,
    /// States compared at one applied end (R12), over all seeds.
    pub runtime_states_compared: u64,
    /// etcd answers checked against the model (R13), over all seeds.
    pub runtime_etcd_model_checked: u64,
    /// etcd leases granted in the runtime phase, over all seeds.
    pub runtime_lease_grants: u64,
    /// Lease keep-alives acknowledged, over all seeds.
    pub runtime_lease_keep_alives: u64,
    /// Leases kept alive across a takeover, over all seeds.
    pub runtime_lease_kept_across: u64,
    /// Records handed between processes (the Follow action), over all seeds.
    pub runtime_records_handed_over: u64,
    /// Records applied from those, over all seeds.
    pub runtime_records_applied_from_peers: u64,
    /// Leases revoked by their expiry, over all seeds.
    pub runtime_lease_expiries: u64,
    /// Leases revoked by the client, over all seeds.
    pub runtime_lease_revokes: u64,
    /// Keys deleted by those revokes and expiries, over all seeds.
    pub runtime_lease_keys_deleted: u64,
}

/// Runs `seeds` on `jobs` threads; `progress` is called with each result.
pub fn run_batch(
    seeds: Vec<u64>,
    steps: u64,
    jobs: usize,
    twice: bool,
    mut progress: impl FnMut(&SeedResult, &BatchSummary),
) -> BatchSummary {
    let started = Instant::now();
    let next = AtomicU64::new(0);
    let (sender, receiver) = mpsc::channel();
    let mut summary = BatchSummary::default();
    let running: Vec<Mutex<Option<(u64, Instant)>>> =
        (0..jobs.max(1)).map(|_| Mutex::new(None)).collect();
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for slot in &running {
            let sender = sender.clone();
            let (seeds, next) = (&seeds, &next);
            scope.spawn(move || {
                loop {
                    let position = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some(&seed) = seeds.get(position) else {
                        break;
                    };
                    *slot.lock().expect("slot") = Some((seed, Instant::now()));
                    let options = SimOptions {
                        seed,
                        steps,
                        verbose: false,
                    };
                    let result = check_seed(options, twice);
                    *slot.lock().expect("slot") = None;
                    if sender.send(result).is_err() {
                        break;
                    }
                }
            });
        }
        drop(sender);
        scope.spawn(|| watchdog(&running, &done, steps));
        for result in receiver {
            summary.seeds += 1;
            summary.steps += result.report.steps_run;
            summary.virtual_time += result.report.virtual_time;
            summary.acked += result.report.stats.acked;
            summary.recoveries += result.report.stats.recoveries_committed;
            summary.runtime_acked += result.report.stats.runtime.acked;
            let runtime = &result.report.stats.runtime;
            summary.runtime_takeovers += runtime.takeovers;
            summary.runtime_keyed_retries += runtime.keyed_retries;
            summary.runtime_keyed_deduplicated += runtime.keyed_replayed + runtime.keyed_duplicates;
            summary.runtime_keyed_restored += runtime.keyed_restored;
            summary.runtime_etcd_acked += runtime.etcd_acked;
            summary.runtime_etcd_compacted += runtime.etcd_compacted;
            summary.runtime_etcd_answers_compared += runtime.etcd_answers_compared;
            summary.runtime_states_compared += runtime.states_compared;
            summary.runtime_etcd_model_checked += runtime.etcd_model_checked;
            summary.runtime_lease_grants += runtime.lease_grants;
            summary.runtime_lease_keep_alives += runtime.lease_keep_alives_acked;
            summary.runtime_lease_kept_across += runtime.lease_kept_across_takeovers;
            summary.runtime_records_handed_over += runtime.records_handed_over;
            summary.runtime_records_applied_from_peers += runtime.records_applied_from_peers;
            summary.runtime_lease_expiries += runtime.lease_expiries;
            summary.runtime_lease_revokes += runtime.lease_revokes;
            summary.runtime_lease_keys_deleted += runtime.lease_keys_deleted;
            if result.failure.is_some() {
                summary.failures.push(result.clone());
            }
            summary.wall_time = started.elapsed();
            progress(&result, &summary);
        }
        done.store(true, Ordering::Relaxed);
    });
    summary.wall_time = started.elapsed();
    summary.failures.sort_by_key(|result| result.report.seed);
    summary
}
