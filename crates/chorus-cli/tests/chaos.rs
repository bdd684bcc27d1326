//! Chaos on real processes (issue 4): three S3-compatible moto servers of
//! the test's own as replicas, a PostgreSQL register, and a `chorus log append` writer process
//! that the harness SIGKILLs and restarts over and over while it SIGSTOPs and
//! SIGCONTs one replica server at a time.
//!
//! Fault model:
//! - the writer dies by SIGKILL at a random moment (during recovery, mid-stream,
//!   mid-seal: the schedule does not aim, it only varies the writer's lifetime);
//! - at most one replica server is frozen (SIGSTOP) at any moment, for a random
//!   time, sometimes longer than `lane_stall_timeout` so the writer sheds it.
//!   Requests to a frozen server wait in its socket buffer and are answered after
//!   SIGCONT, so a killed writer's late requests still land: the "zombie write"
//!   case the fences exist for;
//! - the register (PostgreSQL) is never disturbed.
//!
//! What is checked at the end, after every server is resumed and one clean
//! writer run has appended (liveness):
//! - indices read back by `chorus log read --from 0` are dense from 0;
//! - every logged ack reads back at its index with the data the harness sent
//!   for it (the k-th ack of a run is the run's k-th line);
//! - the log is, run after run, a prefix of what each run sent (never a gap, a
//!   duplicate or a reordering), and each prefix covers that run's acks;
//! - `chorus log verify` finds nothing corrupt or unreadable; it may find
//!   sealed copies missing (a seal needs only Q replicas, so a frozen replica
//!   misses some), which `chorus log repair` must heal: after it, verify exits 0.
//!
//! The moto servers are the test's own (`support::moto::PrivateMoto`), so
//! freezing one stalls no other test. A guard sends SIGCONT to every server
//! on drop, so a panicking test leaves no server frozen.
//!
//! `CHORUS_CHAOS_SEED` replays a schedule (the OS timing still varies), and
//! `CHORUS_CHAOS_CYCLES` changes the number of kill cycles.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use chorus::log::LogConfig;
use serde_json::Value;
use support::moto::{Frozen, MotoServer, PrivateMoto, send_signal};
use support::schedule::{Rng, seed_from};
use tempfile::TempDir;

/// Kill cycles in CI (the issue asks for at least 20).
const DEFAULT_CYCLES: usize = 24;
/// Records the final, undisturbed writer run must get acknowledged.
const FINAL_RECORDS: u64 = 200;
/// Bound on any command that is expected to finish on its own.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);
/// How often waiting loops look at their flags.
const POLL: Duration = Duration::from_millis(20);
/// Segment sizes the writer runs pick from: small ones seal often.
const SEGMENT_BYTES: [u64; 3] = [16 * 1024, 64 * 1024, 256 * 1024];
/// Stderr lines kept per writer run for the report.
const STDERR_TAIL_LINES: usize = 5;
/// Input rates (lines per second) the writer runs pick from: a trickle gives
/// one record per fragment, the fastest fills fragments with many.
const FEED_LINES_PER_SECOND: [u64; 3] = [200, 1_000, 5_000];
/// The feeder writes its lines in chunks this far apart.
const FEED_TICK: Duration = Duration::from_millis(10);
/// A run waiting for its first ack is killed after this long anyway (longer
/// than the longest freeze, so a live writer always gets there).
const FIRST_ACK_TIMEOUT: Duration = Duration::from_secs(15);

// ------------------------------------------------------------------ rng ----

fn chaos_seed() -> u64 {
    seed_from("CHORUS_CHAOS_SEED")
}

fn chaos_cycles() -> usize {
    std::env::var("CHORUS_CHAOS_CYCLES")
        .map(|text| text.parse().expect("CHORUS_CHAOS_CYCLES is a count"))
        .unwrap_or(DEFAULT_CYCLES)
}

// --------------------------------------------------------- the log ----

/// The log under test and how to run `chorus` against it.
struct ChaosLog {
    dir: TempDir,
    store: Vec<String>,
}

impl ChaosLog {
    fn on_services(moto: &PrivateMoto) -> Option<ChaosLog> {
        let replicas = moto.s3_urls("chaos").join(",");
        let register = support::postgres_register_url("chaos")?;
        Some(ChaosLog {
            dir: TempDir::new().unwrap(),
            store: vec!["--replicas".into(), replicas, "--register".into(), register],
        })
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = support::chorus_command(self.dir.path());
        command
            .args(args)
            .args(&self.store)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    }

    /// Runs a command to its end (bounded); returns status, stdout, stderr.
    fn run(&self, args: &[&str]) -> (ExitStatus, String, String) {
        let child = KillOnDrop(self.command(args).spawn().expect("chorus runs"));
        let (status, stdout, stderr) = child.wait_bounded(COMMAND_TIMEOUT);
        let status = status.unwrap_or_else(|| panic!("chorus {args:?} hung: {stderr}"));
        (status, stdout, stderr)
    }
}

/// A child process that is SIGKILLed if it is still running when dropped
/// (a panicking harness leaves no writer behind).
struct KillOnDrop(Child);

impl KillOnDrop {
    /// Waits up to `limit` for the process to end on its own, collecting its
    /// output; kills it after `limit` (status `None`).
    fn wait_bounded(mut self, limit: Duration) -> (Option<ExitStatus>, String, String) {
        let stdout = collect_text(self.0.stdout.take().unwrap());
        let stderr = collect_text(self.0.stderr.take().unwrap());
        let status = wait_until(&mut self.0, Instant::now() + limit);
        if status.is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
        (status, stdout.join().unwrap(), stderr.join().unwrap())
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Polls `child` until it exits (its status) or `deadline` passes (`None`).
fn wait_until(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

fn collect_text(mut source: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = source.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

// ------------------------------------------------------ replica chaos ----

/// Freezes one replica server at a time at random moments, on a thread of its
/// own. Dropping it (also while unwinding) stops the thread and sends SIGCONT
/// to every server.
struct ReplicaChaos {
    servers: Vec<MotoServer>,
    done: Arc<AtomicBool>,
    /// 1 + the position of the frozen server, or 0 while all run.
    frozen: Arc<AtomicUsize>,
    thread: Option<JoinHandle<FreezeStats>>,
}

/// What the replica chaos did.
#[derive(Debug, Default)]
struct FreezeStats {
    freezes: usize,
    /// Freezes longer than the writer's `lane_stall_timeout` (the lane is shed).
    long_freezes: usize,
    frozen_time: Duration,
}

impl ReplicaChaos {
    fn start(servers: Vec<MotoServer>, seed: u64) -> ReplicaChaos {
        let done = Arc::new(AtomicBool::new(false));
        let frozen = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (servers, done, frozen) = (servers.clone(), done.clone(), frozen.clone());
            std::thread::spawn(move || freeze_loop(&servers, Rng(seed), &done, &frozen))
        };
        ReplicaChaos {
            servers,
            done,
            frozen,
            thread: Some(thread),
        }
    }

    /// The position of the server frozen right now, if any.
    fn frozen_now(&self) -> Option<usize> {
        self.frozen.load(Ordering::SeqCst).checked_sub(1)
    }

    /// Stops freezing, resumes every server and returns what was done.
    fn finish(&mut self) -> FreezeStats {
        self.done.store(true, Ordering::SeqCst);
        let stats = self.thread.take().map(|thread| thread.join());
        for server in &self.servers {
            if let Err(e) = send_signal(server.pid, "CONT") {
                eprintln!("chaos: cannot resume moto pid {}: {e}", server.pid);
            }
        }
        match stats {
            Some(Ok(stats)) => stats,
            Some(Err(_)) => panic!("the replica chaos thread panicked"),
            None => FreezeStats::default(),
        }
    }
}

impl Drop for ReplicaChaos {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        for server in &self.servers {
            let _ = send_signal(server.pid, "CONT");
        }
    }
}

/// Sleeps `duration` in slices; false if `done` was raised meanwhile.
fn sleep_unless(done: &AtomicBool, duration: Duration) -> bool {
    let deadline = Instant::now() + duration;
    while Instant::now() < deadline {
        if done.load(Ordering::SeqCst) {
            return false;
        }
        std::thread::sleep(POLL.min(deadline.saturating_duration_since(Instant::now())));
    }
    !done.load(Ordering::SeqCst)
}

/// How long a server stays frozen: mostly below the writer's stall timeout
/// (the lane waits), sometimes beyond it (the lane is shed), never as long as
/// the S3 client's 10 s request timeout.
fn freeze_duration(rng: &mut Rng, stall: Duration) -> Duration {
    let stall_ms = stall.as_millis() as u64;
    assert!(
        (2_500..=7_000).contains(&stall_ms),
        "the freeze schedule assumes a lane_stall_timeout of a few seconds (below the S3 \
         client's 10 s request timeout), not {stall:?}"
    );
    match rng.below(100) {
        0..70 => rng.millis(200, 1_500),
        70..88 => rng.millis(1_500, stall_ms - 500),
        _ => rng.millis(stall_ms + 500, stall_ms + 2_500),
    }
}

fn freeze_loop(
    servers: &[MotoServer],
    mut rng: Rng,
    done: &AtomicBool,
    frozen: &AtomicUsize,
) -> FreezeStats {
    let stall = LogConfig::default().lane_stall_timeout;
    let mut stats = FreezeStats::default();
    while sleep_unless(done, rng.millis(800, 3_500)) {
        let position = rng.below(servers.len() as u64) as usize;
        let duration = freeze_duration(&mut rng, stall);
        let guard = Frozen::freeze(servers[position]);
        frozen.store(position + 1, Ordering::SeqCst);
        let started = Instant::now();
        sleep_unless(done, duration);
        frozen.store(0, Ordering::SeqCst);
        drop(guard);
        stats.freezes += 1;
        stats.long_freezes += usize::from(duration > stall);
        stats.frozen_time += started.elapsed();
    }
    stats
}

// ------------------------------------------------------- writer runs ----

/// Record `seq` of the harness's stream: the content names its sequence
/// number, with a length that varies.
fn record(seq: u64) -> String {
    format!("rec-{seq}-{}", "x".repeat((seq % 53) as usize))
}

/// The sequence number a record names, if it is one of ours.
fn sequence_of(data: &str) -> Option<u64> {
    let seq = data.strip_prefix("rec-")?.split('-').next()?.parse().ok()?;
    (record(seq) == data).then_some(seq)
}

/// One writer process from start to end.
#[derive(Debug)]
struct Run {
    /// Sequence number of the run's first line; line k is `record(base + k)`.
    base: u64,
    /// Lines written into its stdin (an upper bound on what it read).
    fed: u64,
    /// Indices it acknowledged, in the order printed.
    acks: Vec<u64>,
    /// `None` if the harness killed it, else how it ended by itself.
    exit: Option<ExitStatus>,
    /// The last lines of its stderr.
    stderr_tail: Vec<String>,
    /// Whether a replica was frozen when it was killed.
    killed_while_frozen: bool,
    /// How long after its start the first ack was seen, if any was.
    first_ack_after: Option<Duration>,
}

/// Writes `record(base..base + limit)` into `stdin` at about `rate` lines
/// per second until the pipe breaks; returns how many lines were written (an
/// upper bound on what the writer read).
fn feed(stdin: impl Write + Send + 'static, base: u64, limit: u64, rate: u64) -> JoinHandle<u64> {
    let per_tick = (rate * FEED_TICK.as_millis() as u64 / 1_000).max(1);
    std::thread::spawn(move || {
        let mut stdin = std::io::BufWriter::new(stdin);
        let started = Instant::now();
        let mut written = 0;
        while written < limit {
            let chunk = per_tick.min(limit - written);
            for k in written..written + chunk {
                if writeln!(stdin, "{}", record(base + k)).is_err() {
                    return k;
                }
            }
            written += chunk;
            if stdin.flush().is_err() {
                return written;
            }
            let due = FEED_TICK * (written / per_tick) as u32;
            std::thread::sleep(due.saturating_sub(started.elapsed()));
        }
        written
    })
}

/// Parses ack lines `{"index":N}` as they arrive, counting them in `count`.
/// Only complete lines count: a line cut off by SIGKILL was never printed.
fn read_acks(stdout: impl Read + Send + 'static, count: Arc<AtomicUsize>) -> JoinHandle<Vec<u64>> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut acks = Vec::new();
        let mut line = Vec::new();
        while reader.read_until(b'\n', &mut line).unwrap_or(0) > 0 {
            if line.ends_with(b"\n") {
                let json: Value = serde_json::from_slice(&line)
                    .unwrap_or_else(|e| panic!("{:?}: {e}", String::from_utf8_lossy(&line)));
                assert_eq!(json.as_object().map(|o| o.len()), Some(1), "{json}");
                acks.push(json["index"].as_u64().expect("an index"));
                count.store(acks.len(), Ordering::SeqCst);
            }
            line.clear();
        }
        acks
    })
}

fn tail_lines(text: &str) -> Vec<String> {
    let lines: Vec<String> = text.lines().map(str::to_owned).collect();
    lines[lines.len().saturating_sub(STDERR_TAIL_LINES)..].to_vec()
}

/// Starts `chorus log append` on a stream from `base` (`limit` lines).
fn spawn_writer(log: &ChaosLog, rng: &mut Rng, base: u64, limit: u64) -> WriterProcess {
    let segment = rng.pick(&SEGMENT_BYTES).to_string();
    let linger = rng.pick(&["0", "0", "2"]);
    let rate = rng.pick(&FEED_LINES_PER_SECOND);
    let mut child = log
        .command(&[
            "log",
            "append",
            "--max-segment-bytes",
            &segment,
            "--linger-ms",
            linger,
        ])
        .stdin(Stdio::piped())
        .spawn()
        .expect("chorus log append runs");
    let acked = Arc::new(AtomicUsize::new(0));
    WriterProcess {
        feeder: feed(child.stdin.take().unwrap(), base, limit, rate),
        acks: read_acks(child.stdout.take().unwrap(), acked.clone()),
        acked,
        started: Instant::now(),
        stderr: collect_text(child.stderr.take().unwrap()),
        child: KillOnDrop(child),
        base,
    }
}

/// A running writer with the threads that feed and watch it.
struct WriterProcess {
    child: KillOnDrop,
    feeder: JoinHandle<u64>,
    acks: JoinHandle<Vec<u64>>,
    /// Acks parsed so far.
    acked: Arc<AtomicUsize>,
    started: Instant,
    stderr: JoinHandle<String>,
    base: u64,
}

/// When the harness SIGKILLs a writer.
#[derive(Debug, Clone, Copy)]
enum KillPlan {
    /// This long after its start: usually within its recovery.
    AfterStart(Duration),
    /// This long after its first ack: mid-stream, maybe mid-seal.
    AfterFirstAck(Duration),
}

impl KillPlan {
    fn random(rng: &mut Rng) -> KillPlan {
        match rng.below(100) {
            0..15 => KillPlan::AfterStart(rng.millis(0, 400)),
            15..85 => KillPlan::AfterFirstAck(rng.millis(0, 1_000)),
            _ => KillPlan::AfterFirstAck(rng.millis(1_000, 3_000)),
        }
    }
}

impl WriterProcess {
    /// The moment `plan` names as far as known now (before the first ack,
    /// `FIRST_ACK_TIMEOUT` after the start).
    fn kill_time(&self, plan: KillPlan, first_ack: &mut Option<Instant>) -> Instant {
        if first_ack.is_none() && self.acked.load(Ordering::SeqCst) > 0 {
            *first_ack = Some(Instant::now());
        }
        match (plan, *first_ack) {
            (KillPlan::AfterStart(delay), _) => self.started + delay,
            (KillPlan::AfterFirstAck(delay), Some(at)) => at + delay,
            (KillPlan::AfterFirstAck(_), None) => self.started + FIRST_ACK_TIMEOUT,
        }
    }

    /// Waits for the moment `plan` names (or for the writer to end by
    /// itself); the status if it ended by itself, and when the first ack came.
    fn wait_for_kill_time(&mut self, plan: KillPlan) -> (Option<ExitStatus>, Option<Instant>) {
        let mut first_ack = None;
        loop {
            if let Some(status) = self.child.0.try_wait().unwrap() {
                return (Some(status), first_ack);
            }
            if Instant::now() >= self.kill_time(plan, &mut first_ack) {
                return (None, first_ack);
            }
            std::thread::sleep(POLL);
        }
    }

    /// Lets the writer run until the moment `plan` names (or until it ends by
    /// itself), then SIGKILLs it and collects what it printed.
    fn kill_per_plan(mut self, plan: KillPlan, chaos: &ReplicaChaos) -> Run {
        let (mut exit, first_ack) = self.wait_for_kill_time(plan);
        let started = self.started;
        let mut killed_while_frozen = false;
        if exit.is_none() {
            killed_while_frozen = chaos.frozen_now().is_some();
            self.child.0.kill().unwrap(); // SIGKILL
            let status = self.child.0.wait().unwrap();
            // It may have exited on its own just before the kill.
            exit = (status.code().is_some()).then_some(status);
        }
        let mut run = self.collect(exit);
        run.killed_while_frozen = killed_while_frozen;
        run.first_ack_after = first_ack.map(|at| at - started);
        run
    }

    /// Waits for the writer to end by itself (bounded).
    fn wait(mut self) -> Run {
        let exit = wait_until(&mut self.child.0, Instant::now() + COMMAND_TIMEOUT);
        assert!(exit.is_some(), "the final writer hung");
        self.collect(exit)
    }

    fn collect(self, exit: Option<ExitStatus>) -> Run {
        let stderr = self.stderr.join().unwrap();
        assert_ne!(
            exit.and_then(|status| status.code()),
            Some(101),
            "chorus log append panicked: {stderr}"
        );
        Run {
            base: self.base,
            fed: self.feeder.join().unwrap(),
            acks: self.acks.join().expect("ack lines parse"),
            exit,
            stderr_tail: tail_lines(&stderr),
            killed_while_frozen: false,
            first_ack_after: None,
        }
    }
}

// ------------------------------------------------------------ checks ----

/// `chorus log read --from 0`: `(index, data)` per line.
fn read_log(log: &ChaosLog) -> Vec<(u64, String)> {
    let (status, stdout, stderr) = log.run(&["log", "read", "--from", "0"]);
    assert!(status.success(), "log read failed: {stderr}");
    stdout
        .lines()
        .map(|line| {
            let json: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"));
            let index = json["index"].as_u64().expect("an index");
            let data = json["data"].as_str().expect("utf-8 data").to_owned();
            (index, data)
        })
        .collect()
}

/// Every run printed acks for consecutive indices, each run after the last.
fn check_ack_order(runs: &[Run]) {
    let mut next_free = 0;
    for (number, run) in runs.iter().enumerate() {
        let Some(&first) = run.acks.first() else {
            continue;
        };
        assert!(
            first >= next_free,
            "run {number} acked {first} < {next_free}"
        );
        let expected: Vec<u64> = (first..first + run.acks.len() as u64).collect();
        assert_eq!(run.acks, expected, "run {number}: acks not consecutive");
        assert!(
            run.acks.len() as u64 <= run.fed,
            "run {number}: more acks than lines"
        );
        next_free = first + run.acks.len() as u64;
    }
}

/// Dense indices, and every logged ack reads back with the data sent for it.
fn check_acks_read_back(runs: &[Run], log: &[(u64, String)]) -> usize {
    for (position, (index, _)) in log.iter().enumerate() {
        assert_eq!(*index, position as u64, "indices are not dense");
    }
    let mut checked = 0;
    for (number, run) in runs.iter().enumerate() {
        for (k, &index) in run.acks.iter().enumerate() {
            let expected = record(run.base + k as u64);
            let found = log.get(index as usize).map(|(_, data)| data.as_str());
            assert_eq!(
                found,
                Some(expected.as_str()),
                "run {number} ack {k}: index {index} lost or wrong"
            );
            checked += 1;
        }
    }
    checked
}

/// The log is, run after run, a prefix of each run's stream: no gap, no
/// duplicate, no reordering, and each prefix covers the run's acks.
fn check_runs_are_prefixes(runs: &[Run], log: &[(u64, String)]) {
    let mut position = 0;
    for (number, run) in runs.iter().enumerate() {
        let mut kept = 0;
        while let Some((index, data)) = log.get(position) {
            let seq = sequence_of(data).unwrap_or_else(|| panic!("index {index}: {data:?}"));
            if seq != run.base + kept {
                break;
            }
            assert!(
                kept < run.fed,
                "index {index}: run {number} never sent {seq}"
            );
            kept += 1;
            position += 1;
        }
        assert!(
            kept >= run.acks.len() as u64,
            "run {number}: {kept} records kept < {} acked",
            run.acks.len()
        );
    }
    if let Some((index, data)) = log.get(position) {
        panic!("index {index} holds {data:?}, which no run sent at that point");
    }
}

/// The `--json` report of `chorus log verify` and its exit status.
fn verify(log: &ChaosLog) -> (bool, Value) {
    let (status, stdout, stderr) = log.run(&["log", "verify", "--json"]);
    let report: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("verify printed no report ({e}): {stdout} {stderr}"));
    (status.success(), report)
}

/// Counts `field` (an array) over every replica of a verify report.
fn count_in_report(report: &Value, field: &str) -> usize {
    report["replicas"]
        .as_array()
        .expect("replicas")
        .iter()
        .map(|replica| replica[field].as_array().map_or(0, Vec::len))
        .sum()
}

/// Right after the chaos, verify may find sealed copies missing (a seal needs
/// only Q replicas, so a frozen one misses some, and a killed writer may not
/// have re-copied them yet) but nothing corrupt or unreadable. Returns how
/// many were missing.
fn verify_no_damage(log: &ChaosLog) -> usize {
    let (_, report) = verify(log);
    assert_eq!(count_in_report(&report, "corrupt"), 0, "corrupt: {report}");
    assert_eq!(
        count_in_report(&report, "errors"),
        0,
        "unreadable: {report}"
    );
    count_in_report(&report, "missing")
}

/// `chorus log repair` succeeds, and then verify finds nothing and exits 0.
fn repair_then_verify(log: &ChaosLog) {
    let (status, stdout, stderr) = log.run(&["log", "repair"]);
    assert!(status.success(), "repair failed: {stdout} {stderr}");
    eprintln!("chaos: {}", stdout.trim());
    let (healthy, report) = verify(log);
    assert!(healthy, "verify after repair: {report}");
}

// -------------------------------------------------------------- test ----

/// Runs `cycles` writer lifetimes, each ended by SIGKILL, under replica chaos.
fn chaos_phase(log: &ChaosLog, chaos: &ReplicaChaos, rng: &mut Rng, cycles: usize) -> Vec<Run> {
    let mut runs = Vec::new();
    let mut base = 0;
    for _ in 0..cycles {
        let writer = spawn_writer(log, rng, base, u64::MAX - base);
        let run = writer.kill_per_plan(KillPlan::random(rng), chaos);
        base += run.fed;
        runs.push(run);
    }
    runs
}

/// With every server resumed, a writer must recover and get all of its
/// records acknowledged.
fn liveness_phase(log: &ChaosLog, rng: &mut Rng, base: u64) -> Run {
    let run = spawn_writer(log, rng, base, FINAL_RECORDS).wait();
    assert!(
        run.exit.is_some_and(|status| status.success()),
        "the final writer failed: {:?}",
        run.stderr_tail
    );
    assert_eq!(run.acks.len() as u64, FINAL_RECORDS, "final writer acks");
    run
}

/// Runs `phase`, then reports how long it took.
fn timed<T>(label: &str, phase: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let outcome = phase();
    eprintln!("chaos: {label} took {:?}", started.elapsed());
    outcome
}

fn report_runs(runs: &[Run]) {
    for (number, run) in runs.iter().enumerate() {
        let ended = match run.exit {
            None => "killed".to_owned(),
            Some(status) => format!("exited {status}: {:?}", run.stderr_tail),
        };
        let frozen = if run.killed_while_frozen {
            " (a replica was frozen)"
        } else {
            ""
        };
        let acked = match (run.acks.first(), run.acks.last()) {
            (Some(first), Some(last)) => format!("indices {first}..={last}"),
            _ => "nothing".to_owned(),
        };
        eprintln!(
            "chaos: run {number}: sent rec-{}.. ({} lines), acked {acked} ({}), first ack \
             after {:?}, {ended}{frozen}",
            run.base,
            run.fed,
            run.acks.len(),
            run.first_ack_after,
        );
    }
}

/// The log after all runs: every ack read back, runs as prefixes; then a
/// repair, a clean verify, and the same log again (the sweep of the killed
/// writers' leftovers took nothing the log needs). Returns the acks checked
/// and the records read.
fn check_final_log(log: &ChaosLog, runs: &[Run]) -> (usize, usize) {
    check_ack_order(runs);
    let records = timed("read", || read_log(log));
    let checked = check_acks_read_back(runs, &records);
    check_runs_are_prefixes(runs, &records);
    timed("repair and verify", || repair_then_verify(log));
    let again = read_log(log);
    let first_difference = again.iter().zip(&records).position(|(a, b)| a != b);
    assert!(
        again.len() == records.len() && first_difference.is_none(),
        "the log changed across repair: {} records, then {}; first difference at {:?}",
        records.len(),
        again.len(),
        first_difference
    );
    (checked, records.len())
}

#[test]
fn acked_records_survive_writer_kills_and_frozen_replicas() {
    let Some(moto) = PrivateMoto::start(3) else {
        return;
    };
    let servers = moto.servers().to_vec();
    let Some(log) = ChaosLog::on_services(&moto) else {
        return;
    };
    let (seed, cycles) = (chaos_seed(), chaos_cycles());
    eprintln!("chaos: seed={seed} cycles={cycles} (replay with CHORUS_CHAOS_SEED={seed})");
    eprintln!("chaos: moto servers (port, pid): {servers:?}");
    let started = Instant::now();
    let (status, _, stderr) = log.run(&["log", "init"]);
    assert!(status.success(), "log init failed: {stderr}");

    let mut rng = Rng(seed);
    let mut chaos = ReplicaChaos::start(servers, rng.next_u64());
    let mut runs = chaos_phase(&log, &chaos, &mut rng, cycles);
    let freezes = chaos.finish();
    let chaos_time = started.elapsed();
    report_runs(&runs);
    let missing = timed("verify after the chaos", || verify_no_damage(&log));
    let base = runs.iter().map(|run| run.fed).sum();
    runs.push(timed("final writer", || {
        liveness_phase(&log, &mut rng, base)
    }));
    let (checked, records) = check_final_log(&log, &runs);

    let killed = runs.iter().filter(|run| run.exit.is_none()).count();
    assert!(killed >= cycles.min(20), "only {killed} runs were killed");
    let before_first_ack = runs
        .iter()
        .filter(|run| run.exit.is_none() && run.acks.is_empty())
        .count();
    eprintln!(
        "chaos: seed={seed}: {killed} kills ({before_first_ack} before the first ack, {} while \
         a replica was frozen), {} runs ended by themselves; {freezes:?}; {missing} sealed \
         copies missing after the chaos; {checked} acks checked, {records} records read back; \
         chaos {chaos_time:?}, total {:?}",
        runs.iter().filter(|run| run.killed_while_frozen).count(),
        runs.iter().filter(|run| run.exit.is_some()).count() - 1,
        started.elapsed()
    );
}
