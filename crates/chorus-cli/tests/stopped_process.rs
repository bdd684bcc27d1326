//! A stopped process must never block another's takeover: process A runs
//! `chorus log append` over and over and is SIGSTOPped at a random moment
//! of its run (recovery, a register CAS, a fragment write, a store update);
//! while it stays stopped, process B's `chorus log append` must finish within
//! a few seconds, every time. Then A is resumed and may fail (B fenced it).
//! At the end every record B acknowledged reads back.
//!
//! Run on the embedded default (local replicas, the object register in a
//! local store) and with `--register file://…`. Before the stores were
//! lock-free, a process stopped inside a SQLite transaction or a local
//! store's `flock` section blocked B until it resumed (2 of 26 stops).
//!
//! `CHORUS_STOP_SEED` replays a schedule (OS timing still varies);
//! `CHORUS_STOP_ROUNDS` changes the number of stops (default 50).

mod support;

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long B may take while A is stopped ("a few seconds").
const B_LIMIT: Duration = Duration::from_secs(10);

/// A small deterministic generator (xorshift64*), so a schedule replays from its seed.
struct Schedule(u64);

impl Schedule {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn signal(pid: u32, name: &str) {
    // The process may have exited meanwhile; that is not a failure.
    let _ = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// Runs `chorus ARGS…` in `dir` with `input` on stdin.
fn chorus(dir: &Path, args: &[String], input: &str) -> Child {
    let mut child = support::chorus_command(dir)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chorus runs");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).unwrap();
    child
}

fn append_args(location: &[String]) -> Vec<String> {
    let mut args = vec!["log".to_owned(), "append".to_owned()];
    args.extend_from_slice(location);
    args
}

/// Waits for `child` at most `limit`, reading its output meanwhile (a full
/// pipe would stall it); past the limit kills it and returns what it printed
/// as the error.
fn wait_at_most(child: Child, limit: Duration) -> Result<Output, Output> {
    let pid = child.id();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(child.wait_with_output().unwrap()));
    match finished.recv_timeout(limit) {
        Ok(output) => Ok(output),
        Err(_) => {
            signal(pid, "KILL");
            Err(finished.recv().unwrap())
        }
    }
}

/// The index B's append acknowledged, from its `{"index":N}` line.
fn acked_index(output: &Output) -> u64 {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().next().unwrap_or_default();
    line.trim_start_matches("{\"index\":")
        .trim_end_matches('}')
        .parse()
        .unwrap_or_else(|_| panic!("not an ack: {stdout:?}"))
}

/// The command of round `round` for `role` ("a" or "b"), and its stdin.
type RoundCommand<'a> = &'a dyn Fn(&str, u64) -> (Vec<String>, String);

/// Whether A of a round holds what B contends for, read from the data dir.
type Held<'a> = &'a dyn Fn(&Path, u64) -> bool;

/// One kind of contended command: how A and B run it, and which of B's
/// failures are a legitimate wait rather than a block.
struct Contention<'a> {
    /// What A and B run.
    command: RoundCommand<'a>,
    /// Whether B may try again after failing with this stderr.
    retry: &'a dyn Fn(&str) -> bool,
    /// How long B may take in all, retries included.
    limit: Duration,
    /// The longest A runs before it is stopped: about A's own run time, so
    /// the stops land anywhere in it (some after it finished, which is fine).
    max_stop_delay_ms: u64,
    /// Whether A of round `round` holds what B contends for now; when given,
    /// A's stop delay starts once it does (a loaded machine delays a run's
    /// start by more than A holds it), or once A ended or a second passed.
    held: Option<Held<'a>>,
}

/// Waits until `held` says A of `round` holds what B contends for, A ended,
/// or a second passed.
fn wait_until_held(dir: &Path, round: u64, a: &mut Child, held: Held<'_>) {
    let deadline = Instant::now() + Duration::from_secs(1);
    while !held(dir, round) && Instant::now() < deadline {
        if a.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// What B went through over every round.
struct Takeovers {
    /// B's output per round.
    outputs: Vec<Output>,
    /// Rounds in which B had to try again (A stopped inside its work).
    waited: usize,
}

/// Stops A at random moments and runs B meanwhile.
fn stop_and_take_over(dir: &Path, contention: &Contention) -> Takeovers {
    let seed = env_u64("CHORUS_STOP_SEED", 0x5eed_cafe);
    let rounds = env_u64("CHORUS_STOP_ROUNDS", 50);
    eprintln!("stop schedule: CHORUS_STOP_SEED={seed} rounds={rounds}");
    let mut schedule = Schedule(seed.max(1));
    let mut outputs = Vec::new();
    let mut waited = 0;
    let mut slowest = Duration::ZERO;
    for round in 0..rounds {
        let (args, input) = (contention.command)("a", round);
        let mut a = chorus(dir, &args, &input);
        if let Some(held) = contention.held {
            wait_until_held(dir, round, &mut a, held);
        }
        std::thread::sleep(Duration::from_millis(
            schedule.next() % contention.max_stop_delay_ms,
        ));
        signal(a.id(), "STOP");

        let started = Instant::now();
        let mut attempts = 0;
        let output = loop {
            attempts += 1;
            let (args, input) = (contention.command)("b", round);
            let b = chorus(dir, &args, &input);
            let left = contention.limit.saturating_sub(started.elapsed());
            let output = wait_at_most(b, left).unwrap_or_else(|killed| {
                signal(a.id(), "KILL");
                panic!(
                    "round {round}: B did not finish within {:?} while A was stopped: {}",
                    contention.limit,
                    String::from_utf8_lossy(&killed.stderr)
                )
            });
            if output.status.success()
                || !(contention.retry)(&String::from_utf8_lossy(&output.stderr))
            {
                break output;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let took = started.elapsed();
        slowest = slowest.max(took);
        waited += usize::from(attempts > 1);
        assert!(
            output.status.success(),
            "round {round}: B failed after {took:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        outputs.push(output);

        signal(a.id(), "CONT");
        // A may finish or fail (B fenced it); it must not hang either.
        if let Err(killed) = wait_at_most(a, Duration::from_secs(30)) {
            panic!(
                "round {round}: A did not end after it was resumed: {}",
                String::from_utf8_lossy(&killed.stderr)
            );
        }
    }
    eprintln!("{rounds} stops: B waited in {waited} rounds, its slowest run took {slowest:?}");
    Takeovers { outputs, waited }
}

fn run_to_success(dir: &Path, args: &[String]) -> String {
    let output =
        wait_at_most(chorus(dir, args, ""), Duration::from_secs(30)).unwrap_or_else(|killed| {
            panic!("{args:?} hung: {}", String::from_utf8_lossy(&killed.stderr))
        });
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn takeovers_never_wait_for_a_stopped_process(location: &[String]) {
    let dir = tempfile::TempDir::new().unwrap();
    let mut init = vec!["log".to_owned(), "init".to_owned()];
    init.extend_from_slice(location);
    run_to_success(dir.path(), &init);
    let command = |role: &str, round: u64| (append_args(location), format!("{role}-{round}\n"));
    let outputs = stop_and_take_over(
        dir.path(),
        &Contention {
            command: &command,
            // Fenced by a newer A is a legitimate race; anything else fails.
            retry: &|stderr| stderr.contains("fenced"),
            limit: B_LIMIT,
            max_stop_delay_ms: 120,
            held: None,
        },
    )
    .outputs;
    let mut read = vec![
        "log".to_owned(),
        "read".to_owned(),
        "--from".to_owned(),
        "0".to_owned(),
    ];
    read.extend_from_slice(location);
    let lines = run_to_success(dir.path(), &read);
    for (round, output) in outputs.iter().enumerate() {
        let index = acked_index(output);
        let expected = format!("{{\"index\":{index},\"data\":\"b-{round}\"}}");
        assert!(
            lines.lines().any(|line| line == expected),
            "acknowledged b-{round} at {index} is missing"
        );
    }
}

#[test]
fn a_stopped_appender_never_blocks_the_next_on_the_embedded_default() {
    takeovers_never_wait_for_a_stopped_process(&[]);
}

#[test]
fn a_stopped_appender_never_blocks_the_next_with_an_object_register_in_a_directory() {
    let register = tempfile::TempDir::new().unwrap();
    let url = format!("file://{}", register.path().join("register").display());
    takeovers_never_wait_for_a_stopped_process(&["--register".to_owned(), url]);
}

/// `chorus snapshot publish` updates `lease.json` and `HEAD.json` in the
/// snapshot store. A publisher stopped while holding the lease makes the
/// next one wait for the lease to expire (that is what a lease is for), never
/// for a lock: with a 1 s lease, B publishes within a few seconds each time.
/// Whether the newest lease document of the embedded default's snapshot
/// store names publisher A of `round` and is not released.
fn publisher_holds_lease(dir: &Path, round: u64) -> bool {
    let versions = dir.join("chorus-data/snapshots-store/default/.k.lease.json");
    let Ok(entries) = std::fs::read_dir(versions) else {
        return false;
    };
    let newest = entries.filter_map(Result::ok).map(|e| e.path()).max();
    let Some(text) = newest.and_then(|path| std::fs::read(path).ok()) else {
        return false;
    };
    let text = String::from_utf8_lossy(&text);
    text.contains(&format!("\"holder_id\": \"a-{round}\"")) && !text.contains("\"released\": true")
}

#[test]
fn a_stopped_publisher_never_blocks_the_next_beyond_its_lease() {
    let dir = tempfile::TempDir::new().unwrap();
    let payload = dir.path().join("payload.bin");
    std::fs::write(&payload, b"state").unwrap();
    let payload = payload.display().to_string();
    let command = |role: &str, round: u64| {
        let args = [
            "snapshot",
            "publish",
            "--file",
            &payload,
            "--wal-index",
            &round.to_string(),
            "--holder",
            &format!("{role}-{round}"),
            "--lease-ttl-secs",
            "1",
        ];
        (
            args.iter().map(|arg| (*arg).to_owned()).collect(),
            String::new(),
        )
    };
    let takeovers = stop_and_take_over(
        dir.path(),
        &Contention {
            command: &command,
            // A live lease of A's, or A's newer HEAD, is a wait, not a block.
            retry: &|stderr| stderr.contains("lease held") || stderr.contains("fenced"),
            limit: Duration::from_secs(1) + B_LIMIT,
            // A holds the lease for only a few milliseconds once it has it
            // (a stop up to 15 ms later landed inside in 2 rounds of 50):
            // the stops land within 4 ms of A taking it.
            max_stop_delay_ms: 4,
            held: Some(&publisher_holds_lease),
        },
    );
    assert!(
        takeovers.waited > 0,
        "no stop landed while A held the lease: the test proved nothing"
    );
    let listed = run_to_success(dir.path(), &["snapshot".to_owned(), "list".to_owned()]);
    assert!(listed.contains("HEAD"), "{listed}");
}
