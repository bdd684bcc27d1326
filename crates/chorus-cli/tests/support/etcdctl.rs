//! etcdctl, etcd's own command-line client, run against `chorus serve` (or
//! a real etcd): one-shot commands ([`Etcdctl::run`]) and long-running ones
//! (`lease keep-alive`, `lock`, `elect`, `watch`) as [`Background`]
//! processes whose output lines are kept with the instant each was read.
//!
//! The binary is Debian's `etcd-client` (scripts/services.sh installs it
//! and exports `CHORUS_TEST_ETCDCTL_BIN`); without it a test skips, except
//! under CI, where it fails (see [`etcdctl_binary`]).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::etcd::{etcdctl_binary, free_port};
use super::server::{Launch, Server};

/// How long `chorus serve` may take to answer etcd clients.
pub const SERVE_TIMEOUT: Duration = Duration::from_secs(60);

/// What one etcdctl run printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The exit code.
    pub code: Option<i32>,
    /// Stdout, masked.
    pub stdout: String,
    /// What etcdctl itself wrote to stderr (`Error: …`, `… is healthy …`),
    /// masked; the Go client's JSON log lines (retries, with timestamps) are
    /// left out.
    pub messages: Vec<String>,
}

/// etcdctl aimed at one endpoint.
#[derive(Debug, Clone)]
pub struct Etcdctl {
    /// The etcdctl binary.
    pub binary: PathBuf,
    /// The endpoint it talks to, as `--endpoints` takes it.
    pub endpoint: String,
}

impl Etcdctl {
    /// `etcdctl --endpoints <endpoint> <args>`, etcd's v3 API, with a
    /// command timeout generous for a loaded machine.
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.binary);
        command
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.endpoint, "--command-timeout", "20s"])
            .args(args);
        command
    }

    /// Runs `etcdctl --endpoints <endpoint> <args>` with `stdin` as input.
    pub fn run(&self, args: &[&str], stdin: &str) -> Outcome {
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("etcdctl runs");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .expect("etcdctl reads its input");
        let output = child.wait_with_output().expect("etcdctl finishes");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr);
        Outcome {
            code: output.status.code(),
            stdout: self.masked(&stdout),
            messages: stderr
                .lines()
                .filter(|line| !line.starts_with('{'))
                .map(|line| self.masked(line))
                .collect(),
        }
    }

    /// Runs `etcdctl <args>`, which must succeed, and returns its stdout.
    pub fn run_ok(&self, args: &[&str]) -> String {
        let outcome = self.run(args, "");
        assert_eq!(outcome.code, Some(0), "etcdctl {args:?}: {outcome:?}");
        outcome.stdout
    }

    /// Starts `etcdctl <args>` as a [`Background`] process; `name` labels
    /// it in failure messages.
    pub fn spawn(&self, name: &str, args: &[&str]) -> Background {
        let mut child = self
            .command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("etcdctl runs");
        let output = Arc::new(Output::default());
        drain(child.stdout.take().unwrap(), Arc::clone(&output), false);
        drain(child.stderr.take().unwrap(), Arc::clone(&output), true);
        Background {
            name: name.to_owned(),
            child,
            killed_at: None,
            output,
        }
    }

    /// `stdout` with what names the deployment replaced: the endpoint, the
    /// `fields` output's cluster id, member id and raft term, and the time
    /// a health check took.
    pub fn masked(&self, stdout: &str) -> String {
        stdout
            .replace(&self.endpoint, "<endpoint>")
            .lines()
            .map(|line| {
                for field in ["\"ClusterID\" : ", "\"MemberID\" : ", "\"RaftTerm\" : "] {
                    if line.starts_with(field) {
                        return format!("{field}<masked>");
                    }
                }
                match line.split_once("took = ") {
                    Some((before, _)) => format!("{before}took = <masked>"),
                    None => line.to_owned(),
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until the endpoint answers `endpoint health`.
    pub fn wait_healthy(&self) {
        let deadline = Instant::now() + SERVE_TIMEOUT;
        loop {
            let outcome = self.run(&["endpoint", "health"], "");
            if outcome.code == Some(0) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} not healthy within {SERVE_TIMEOUT:?}: {outcome:?}",
                self.endpoint
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Whether this etcdctl has `get --count-only` (etcd 3.5 and later).
    pub fn knows_count_only(&self) -> bool {
        let help = Command::new(&self.binary)
            .env("ETCDCTL_API", "3")
            .args(["get", "--help"])
            .output()
            .expect("etcdctl runs");
        String::from_utf8_lossy(&help.stdout).contains("--count-only")
    }
}

/// `chorus serve` started as the README says (in `dir`, an empty
/// directory, on the embedded default stores) with `--etcd-listen` on a
/// free port, and etcdctl aimed at it once it answers; `None` (the test
/// skips) when there is no etcdctl outside CI.
pub fn serve_with_etcdctl(dir: &Path) -> Option<(Server, Etcdctl)> {
    let (launch, etcdctl) = launch_with_etcdctl(dir)?;
    let chorus = launch.start("chorus");
    etcdctl.wait_healthy();
    Some((chorus, etcdctl))
}

/// How [`serve_with_etcdctl`] starts `chorus serve` (for a test that
/// restarts it on the same etcd address), and etcdctl aimed at it.
pub fn launch_with_etcdctl(dir: &Path) -> Option<(Launch, Etcdctl)> {
    let binary = etcdctl_binary()?;
    let listen = format!("127.0.0.1:{}", free_port());
    let launch = Launch::new(dir).args(["--etcd-listen", &listen]);
    let etcdctl = Etcdctl {
        binary,
        endpoint: format!("http://{listen}"),
    };
    Some((launch, etcdctl))
}

/// What a background etcdctl printed, as the drain threads read it.
#[derive(Default)]
struct Output {
    lines: Mutex<Lines>,
    changed: Condvar,
}

#[derive(Default)]
struct Lines {
    /// Each stdout line with the instant it was read.
    stdout: Vec<(Instant, String)>,
    stderr: Vec<String>,
    stdout_closed: bool,
}

/// Reads `pipe` line by line into `output` until it closes.
fn drain(pipe: impl Read + Send + 'static, output: Arc<Output>, is_stderr: bool) {
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            let mut lines = output.lines.lock().unwrap();
            match is_stderr {
                true => lines.stderr.push(line),
                false => lines.stdout.push((Instant::now(), line)),
            }
            output.changed.notify_all();
        }
        if !is_stderr {
            output.lines.lock().unwrap().stdout_closed = true;
            output.changed.notify_all();
        }
    });
}

/// A long-running etcdctl process, SIGKILLed on drop.
pub struct Background {
    name: String,
    child: Child,
    killed_at: Option<Instant>,
    output: Arc<Output>,
}

impl Background {
    /// Every stdout line so far, with the instant each was read.
    pub fn stdout(&self) -> Vec<(Instant, String)> {
        self.output.lines.lock().unwrap().stdout.clone()
    }

    /// Everything printed so far, for failure messages.
    pub fn printed(&self) -> String {
        let lines = self.output.lines.lock().unwrap();
        let stdout: Vec<&str> = lines.stdout.iter().map(|(_, line)| line.as_str()).collect();
        format!(
            "{} stdout:\n{}\n{} stderr:\n{}",
            self.name,
            stdout.join("\n"),
            self.name,
            lines.stderr.join("\n")
        )
    }

    /// Waits for a stdout line `matches` accepts (one printed earlier
    /// counts) and returns it with the instant it was read; panics at
    /// `timeout` or if stdout closes first.
    pub fn wait_for_line(
        &self,
        timeout: Duration,
        matches: impl Fn(&str) -> bool,
    ) -> (Instant, String) {
        let deadline = Instant::now() + timeout;
        let mut lines = self.output.lines.lock().unwrap();
        loop {
            if let Some(found) = lines.stdout.iter().find(|(_, line)| matches(line)) {
                return found.clone();
            }
            let now = Instant::now();
            if lines.stdout_closed || now >= deadline {
                drop(lines);
                panic!(
                    "{}: expected line not printed within {timeout:?}\n{}",
                    self.name,
                    self.printed()
                );
            }
            lines = self
                .output
                .changed
                .wait_timeout(lines, deadline - now)
                .unwrap()
                .0;
        }
    }

    /// SIGKILL (no chance to clean up: its lease is left to expire), then
    /// reaps the process; returns the instant it was killed.
    pub fn kill(&mut self) -> Instant {
        if let Some(killed_at) = self.killed_at {
            return killed_at;
        }
        let _ = self.child.kill();
        let killed_at = Instant::now();
        let _ = self.child.wait();
        self.killed_at = Some(killed_at);
        killed_at
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("---- {}", self.printed());
        }
    }
}
