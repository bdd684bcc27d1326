//! `chorus bench failover`: the takeover time of `chorus serve`, measured on
//! real processes: SIGKILL of the primary → first write acknowledged by the
//! standby.
//!
//! Each run starts two `chorus serve` processes (this executable) on a fresh
//! embedded-default data directory, waits until one is primary and the other
//! a caught-up standby, writes a few keys, kills the primary, and then puts
//! to the standby in a loop until a put is acknowledged. It checks that every
//! key acknowledged before the kill is still there.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use crate::CommandError;
use crate::output::outln;

/// Arguments of `bench failover`.
#[derive(Debug, Clone, clap::Args)]
pub struct FailoverBenchArgs {
    /// Failovers to measure.
    #[arg(long, default_value_t = 10)]
    runs: usize,
    /// Lease time to live of both instances (`chorus serve --lease-ttl-secs`).
    #[arg(long, default_value_t = 10)]
    lease_ttl_secs: u64,
    /// Keys written before each kill.
    #[arg(long, default_value_t = 100)]
    keys: usize,
    /// Print one JSON object per run instead of a table.
    #[arg(long)]
    json: bool,
}

/// One run's measurements.
#[derive(Debug, Serialize)]
struct Run {
    run: usize,
    takeover_ms: u64,
    /// Lease time that was left when the primary was killed, as the
    /// primary's status reported it just before.
    lease_left_ms: u64,
}

/// Runs the benchmark.
pub async fn run(args: FailoverBenchArgs) -> Result<(), CommandError> {
    let executable = std::env::current_exe()?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    let mut takeovers = Vec::new();
    if !args.json {
        outln!("{:>4} {:>12} {:>14}", "run", "takeover ms", "lease left ms")?;
    }
    for run in 1..=args.runs {
        let dir =
            std::env::temp_dir().join(format!("chorus-failover-{}-{run}", std::process::id()));
        let measured = one_failover(&executable, &dir, &http, &args).await;
        let _ = std::fs::remove_dir_all(&dir);
        let measured = Run { run, ..measured? };
        takeovers.push(measured.takeover_ms);
        if args.json {
            outln!("{}", serde_json::to_string(&measured).expect("runs encode"))?;
        } else {
            outln!(
                "{:>4} {:>12} {:>14}",
                measured.run,
                measured.takeover_ms,
                measured.lease_left_ms
            )?;
        }
    }
    takeovers.sort_unstable();
    if let (Some(min), Some(max)) = (takeovers.first(), takeovers.last()) {
        let median = takeovers[takeovers.len() / 2];
        eprintln!(
            "takeover over {} runs: min {min} ms, median {median} ms, max {max} ms (lease ttl {} s)",
            takeovers.len(),
            args.lease_ttl_secs
        );
    }
    Ok(())
}

async fn one_failover(
    executable: &Path,
    dir: &Path,
    http: &reqwest::Client,
    args: &FailoverBenchArgs,
) -> Result<Run, CommandError> {
    let mut primary = Instance::start(executable, dir, args.lease_ttl_secs, &[])?;
    wait_for_role(http, &primary.url, "primary").await?;
    let standby = Instance::start(executable, dir, args.lease_ttl_secs, &[])?;
    wait_for_role(http, &standby.url, "standby").await?;
    for key in 0..args.keys {
        let response = http
            .put(format!("{}/v1/kv/failover/{key}", primary.url))
            .body(format!("value-{key}"))
            .send()
            .await?;
        if !response.status().is_success() {
            return Err(format!("put to the primary failed: {}", response.status()).into());
        }
    }
    let status = get_json(http, &format!("{}/v1/status", primary.url)).await?;
    let lease_left_ms = status["lease"]["expires_in_ms"].as_u64().unwrap_or(0);
    primary.kill();
    let killed = Instant::now();
    loop {
        if killed.elapsed() > Duration::from_secs(args.lease_ttl_secs + 60) {
            return Err("the standby did not take over within ttl + 60 s".into());
        }
        let put = http
            .put(format!("{}/v1/kv/failover/after", standby.url))
            .body("after")
            .send()
            .await;
        if put.is_ok_and(|response| response.status().is_success()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let takeover_ms = killed.elapsed().as_millis() as u64;
    for key in 0..args.keys {
        let value = http
            .get(format!("{}/v1/kv/failover/{key}", standby.url))
            .send()
            .await?
            .text()
            .await?;
        if value != format!("value-{key}") {
            return Err(format!("key failover/{key} lost in the takeover: found {value:?}").into());
        }
    }
    Ok(Run {
        run: 0,
        takeover_ms,
        lease_left_ms,
    })
}

/// Polls `url`'s status until it reports `role` (a standby also caught up).
pub(super) async fn wait_for_role(
    http: &reqwest::Client,
    url: &str,
    role: &str,
) -> Result<(), CommandError> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if let Ok(status) = get_json(http, &format!("{url}/v1/status")).await
            && status["role"] == role
            && (role != "standby" || status["caught_up"] == true)
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("{url} did not become {role} within 120 s").into())
}

pub(super) async fn get_json(http: &reqwest::Client, url: &str) -> Result<Value, CommandError> {
    let body = http.get(url).send().await?.bytes().await?;
    Ok(serde_json::from_slice(&body)?)
}

/// A `chorus serve` child process.
pub(super) struct Instance {
    child: Child,
    /// Where it serves HTTP.
    pub(super) url: String,
}

impl Instance {
    /// Starts `chorus serve` on a free port over `dir`, with `extra`
    /// arguments; returns once it printed where it listens.
    pub(super) fn start(
        executable: &Path,
        dir: &Path,
        ttl_secs: u64,
        extra: &[String],
    ) -> Result<Instance, CommandError> {
        let mut child = Command::new(executable)
            .args(["serve", "--listen", "127.0.0.1:0", "--lease-ttl-secs"])
            .arg(ttl_secs.to_string())
            .arg("--data-dir")
            .arg(PathBuf::from(dir))
            .args(extra)
            .env("CHORUS_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let first = lines.next().transpose()?.unwrap_or_default();
        // Keep draining stdout so the child never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        let address = first
            .strip_prefix("chorus serve: listening on ")
            .and_then(|rest| rest.split_whitespace().next())
            .ok_or_else(|| format!("unexpected first line from chorus serve: {first:?}"))?;
        Ok(Instance {
            child,
            url: format!("http://{address}"),
        })
    }

    /// The process id.
    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM (a graceful stop: drain, final snapshot, release) and
    /// returns without waiting.
    pub(super) fn terminate(&self) -> Result<(), CommandError> {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()?;
        if !status.success() {
            return Err(format!("kill -TERM {} failed: {status}", self.pid()).into());
        }
        Ok(())
    }

    /// Waits up to `timeout` for the process to exit; kills it past that.
    pub(super) async fn wait_exit(&mut self, timeout: Duration) -> Result<(), CommandError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return if status.success() {
                    Ok(())
                } else {
                    Err(format!("chorus serve exited with {status}").into())
                };
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(format!("chorus serve did not exit within {timeout:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub(super) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.kill();
    }
}
