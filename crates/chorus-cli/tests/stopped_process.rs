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
/// The longest A runs before it is stopped; its run is usually shorter, so
/// some stops come after A finished (then nothing is stopped, which is fine).
const MAX_STOP_DELAY_MS: u64 = 120;

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

fn append(dir: &Path, args: &[String], record: &str) -> Child {
    let mut child = support::chorus_command(dir)
        .args(["log", "append"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chorus runs");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(format!("{record}\n").as_bytes()).unwrap();
    child
}

/// Waits for `child` at most `limit`; kills it past that (`None`).
fn wait_at_most(mut child: Child, limit: Duration) -> Option<Output> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if child.try_wait().unwrap().is_some() {
            return Some(child.wait_with_output().unwrap());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
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

fn takeovers_never_wait_for_a_stopped_process(args: &[String]) {
    let dir = tempfile::TempDir::new().unwrap();
    let init = support::chorus_command(dir.path())
        .args(["log", "init"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    let seed = env_u64("CHORUS_STOP_SEED", 0x5eed_cafe);
    let rounds = env_u64("CHORUS_STOP_ROUNDS", 50);
    eprintln!("stop schedule: CHORUS_STOP_SEED={seed} rounds={rounds}");
    let mut schedule = Schedule(seed.max(1));
    let mut acked = Vec::new();
    let mut slowest = Duration::ZERO;
    for round in 0..rounds {
        let a = append(dir.path(), args, &format!("a-{round}"));
        std::thread::sleep(Duration::from_millis(schedule.next() % MAX_STOP_DELAY_MS));
        signal(a.id(), "STOP");

        let record = format!("b-{round}");
        let started = Instant::now();
        let output = loop {
            let b = append(dir.path(), args, &record);
            let output =
                wait_at_most(b, B_LIMIT.saturating_sub(started.elapsed())).unwrap_or_else(|| {
                    signal(a.id(), "KILL");
                    panic!("round {round}: B did not finish within {B_LIMIT:?} while A was stopped")
                });
            let stderr = String::from_utf8_lossy(&output.stderr);
            // Fenced by a newer A is a legitimate race; anything else fails.
            if output.status.success() || !stderr.contains("fenced") {
                break output;
            }
        };
        let took = started.elapsed();
        slowest = slowest.max(took);
        assert!(
            output.status.success(),
            "round {round}: B failed after {took:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        acked.push((acked_index(&output), record));

        signal(a.id(), "CONT");
        // A may finish or fail (B fenced it); it must not hang either.
        assert!(
            wait_at_most(a, Duration::from_secs(30)).is_some(),
            "round {round}: A did not end after it was resumed"
        );
    }
    eprintln!("{rounds} stops: B's slowest append took {slowest:?}");

    let read = support::chorus_command(dir.path())
        .args(["log", "read", "--from", "0"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    let lines = String::from_utf8_lossy(&read.stdout).into_owned();
    for (index, record) in acked {
        let expected = format!("{{\"index\":{index},\"data\":\"{record}\"}}");
        assert!(
            lines.lines().any(|line| line == expected),
            "acknowledged {record} at {index} is missing"
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
