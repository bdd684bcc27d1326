//! `chorus bench takeover`: the takeover time of `chorus serve` against the
//! size of the state, on real processes over the embedded default.
//!
//! Per state size (`--keys`), on a fresh data directory: a primary is started
//! and loaded with that many keys (batches of [`BATCH_KEYS`] puts through
//! `POST /v1/kv:batch`, [`LOAD_CONNECTIONS`] at a time). Then each run hands
//! the primary role on with a graceful stop (SIGTERM: drain, final snapshot,
//! release), so the lease's time to live plays no part:
//!
//! - *warm*: a standby started before the stop (it restored HEAD and tailed
//!   the log until it applied a marker written just before the stop) boots
//!   once it sees the lease released, within one lease check interval
//!   (ttl/20, clamped to 100 ms–1 s);
//! - *cold*: a new process with no state, started as soon as the lease is
//!   released: it downloads and restores HEAD's snapshot (which the stop just
//!   published), then boots.
//!
//! The takeover is measured from the release (this process reads the lease
//! document every [`RELEASE_POLL`] until it shows the release, or already the
//! new holder) to the first put the new primary acknowledges (tried every
//! [`WRITE_POLL`]). The old primary's SIGTERM → release (drain, final
//! snapshot) is reported beside it as *stop*. The new primary's boot phases
//! come from its `/v1/status` (`boot_phases_ms`), its peak RSS from VmHWM in
//! `/proc/<pid>/status`. Every run checks that the marker and a sample of the
//! loaded keys survived. The process that took over is the next run's
//! primary.
//!
//! *Encode* is what every boot's claim_head cost before a boot encoded the
//! state only when no HEAD exists: a checkpoint of a state of that size,
//! encoded as that claim did, timed in this process.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus::ids::RecordIndex;
use chorus::kv::{Command, Condition, KvState, MAX_BATCH_OPERATIONS, Operation};
use chorus::lease::{LeaseRecord, LeaseStore};
use chorus::log::maintenance::Progress;
use chorus::runtime::{Checkpoint, StateMachine};
use futures::StreamExt;
use serde::Serialize;

use super::failover::{Instance, get_json, wait_for_role};
use super::kv::embedded_stores;
use super::recovery::Spread;
use crate::CommandError;
use crate::output::outln;
use crate::progress::CliProgress;

/// Keys per `POST /v1/kv:batch` while loading.
const BATCH_KEYS: usize = 1000;
const _: () = assert!(BATCH_KEYS <= MAX_BATCH_OPERATIONS);

/// Batches in flight while loading.
const LOAD_CONNECTIONS: usize = 4;

/// How often the lease document is read while waiting for the release.
const RELEASE_POLL: Duration = Duration::from_millis(2);

/// How often a put is tried while waiting for the new primary.
const WRITE_POLL: Duration = Duration::from_millis(10);

/// Bound on a stop (drain and final snapshot) and on a takeover.
const STEP_TIMEOUT: Duration = Duration::from_secs(600);

/// Timings of the checkpoint encoding per state size.
const ENCODE_REPETITIONS: usize = 3;

/// Arguments of `bench takeover`.
#[derive(Debug, Clone, clap::Args)]
pub struct TakeoverBenchArgs {
    /// State sizes, in keys, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1_000, 100_000, 1_000_000])]
    keys: Vec<usize>,
    /// Size of each value in bytes.
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
    /// Takeovers per state size and scenario.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    runs: u64,
    /// Which takeovers to measure, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Scenario::Warm, Scenario::Cold])]
    scenario: Vec<Scenario>,
    /// Lease time to live of every instance (`chorus serve --lease-ttl-secs`);
    /// a warm standby checks the lease every ttl/20.
    #[arg(long, default_value_t = 10)]
    lease_ttl_secs: u64,
    /// The chorus executable to start as `chorus serve` [default: this one],
    /// e.g. another build, side by side.
    #[arg(long)]
    serve_binary: Option<PathBuf>,
    /// Print one JSON object per row instead of a table.
    #[arg(long)]
    json: bool,
}

/// Which process takes over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Scenario {
    /// A standby that already holds the state.
    Warm,
    /// A new process that restores HEAD's snapshot.
    Cold,
}

impl Scenario {
    fn as_str(self) -> &'static str {
        match self {
            Scenario::Warm => "warm",
            Scenario::Cold => "cold",
        }
    }
}

/// One takeover's measurements.
#[derive(Debug, Clone)]
struct Sample {
    takeover_ms: f64,
    stop_ms: f64,
    /// The new primary's boot phases, by name.
    phases_ms: BTreeMap<String, f64>,
    replayed_records: f64,
    peak_rss_bytes: Option<u64>,
    head_bytes: u64,
}

/// One state size and scenario over its runs.
#[derive(Debug, Serialize)]
struct Row {
    keys: usize,
    scenario: &'static str,
    runs: usize,
    /// HEAD's payload size after the last run.
    snapshot_bytes: u64,
    takeover_ms: Spread,
    /// The sum of the boot's phases: the takeover less the wait for the
    /// release to be noticed (warm), process start (cold) and the first put.
    boot_ms: Spread,
    stop_ms: Spread,
    phases_ms: BTreeMap<String, Spread>,
    replayed_records: Spread,
    peak_rss_mib: Option<Spread>,
    /// A checkpoint and encoding of the whole state, as every boot's
    /// claim_head did before the fix.
    encode_ms: Spread,
}

/// Runs the benchmark.
pub async fn run(args: TakeoverBenchArgs) -> Result<(), CommandError> {
    if args.keys.is_empty() || args.keys.contains(&0) {
        return Err("--keys needs at least one size, each at least 1".into());
    }
    let executable = match &args.serve_binary {
        Some(path) => path.clone(),
        None => std::env::current_exe()?,
    };
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()?;
    if !args.json {
        print_header()?;
    }
    for &keys in &args.keys {
        let dir =
            std::env::temp_dir().join(format!("chorus-takeover-{}-{keys}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let rows = one_size(&executable, &dir, keys, &http, &args).await;
        let _ = std::fs::remove_dir_all(&dir);
        for row in rows? {
            print_row(&row, args.json)?;
        }
    }
    Ok(())
}

/// What every takeover of one state size works with.
struct Bench<'a> {
    executable: &'a Path,
    dir: &'a Path,
    http: &'a reqwest::Client,
    leases: LeaseStore,
    args: &'a TakeoverBenchArgs,
}

impl Bench<'_> {
    /// Starts `chorus serve` over the directory.
    fn start(&self) -> Result<Instance, CommandError> {
        Instance::start(self.executable, self.dir, self.args.lease_ttl_secs, &[])
    }

    /// Hands the primary role from `old` on (see the module docs) and returns
    /// the measurements and the new primary.
    async fn takeover(
        &self,
        mut old: Instance,
        scenario: Scenario,
        run: u64,
    ) -> Result<(Sample, Instance), CommandError> {
        let (http, leases) = (self.http, &self.leases);
        put(http, &old.url, &marker_key(scenario, run), "marker").await?;
        let standby = match scenario {
            Scenario::Warm => {
                let standby = self.start()?;
                wait_for_role(http, &standby.url, "standby").await?;
                let written = get_json(http, &format!("{}/v1/status", old.url)).await?;
                let applied = written["applied_index"].as_u64().unwrap_or(0);
                wait_until_applied(http, &standby.url, applied).await?;
                Some(standby)
            }
            Scenario::Cold => None,
        };
        let before = leases
            .read()
            .await?
            .ok_or("no lease document before the stop")?;
        let stopping = Instant::now();
        old.terminate()?;
        let released = wait_released(leases, &before).await?;
        let new = match standby {
            Some(standby) => standby,
            None => self.start()?,
        };
        let acknowledged = wait_for_write(http, &new.url).await?;
        let peak_rss_bytes = peak_rss_bytes(new.pid());
        old.wait_exit(STEP_TIMEOUT).await?;
        let status = get_json(http, &format!("{}/v1/status", new.url)).await?;
        if status["role"] != "primary" {
            return Err(format!(
                "the new process is {} after its first write",
                status["role"]
            )
            .into());
        }
        let phases_ms = status["boot_phases_ms"]
            .as_object()
            .map(|phases| {
                phases
                    .iter()
                    .map(|(name, ms)| (name.clone(), ms.as_f64().unwrap_or(0.0)))
                    .collect()
            })
            .unwrap_or_default();
        let sample = Sample {
            takeover_ms: millis(acknowledged - released),
            stop_ms: millis(released - stopping),
            phases_ms,
            replayed_records: status["replayed_records"].as_f64().unwrap_or(0.0),
            peak_rss_bytes,
            head_bytes: status["head"]["size_bytes"].as_u64().unwrap_or(0),
        };
        Ok((sample, new))
    }

    /// Checks that the marker of this run and a sample of the loaded keys are
    /// on the new primary.
    async fn verify(
        &self,
        url: &str,
        scenario: Scenario,
        run: u64,
        keys: usize,
    ) -> Result<(), CommandError> {
        let value = value_of(self.args.value_bytes);
        let mut expected = vec![(marker_key(scenario, run), "marker".to_owned())];
        for n in [0, keys / 2, keys - 1] {
            expected.push((key_name(n), value.clone()));
        }
        for (key, value) in expected {
            let found = self
                .http
                .get(format!("{url}/v1/kv/{key}"))
                .send()
                .await?
                .text()
                .await?;
            if found != value {
                return Err(format!("key {key} lost in the takeover: found {found:?}").into());
            }
        }
        Ok(())
    }
}

/// Loads `keys` keys on a fresh directory, then measures every scenario.
async fn one_size(
    executable: &Path,
    dir: &Path,
    keys: usize,
    http: &reqwest::Client,
    args: &TakeoverBenchArgs,
) -> Result<Vec<Row>, CommandError> {
    let mut primary = Instance::start(executable, dir, args.lease_ttl_secs, &[])?;
    wait_for_role(http, &primary.url, "primary").await?;
    load(http, &primary.url, keys, args.value_bytes).await?;
    let bench = Bench {
        executable,
        dir,
        http,
        leases: embedded_stores(dir).await?.leases,
        args,
    };
    let mut measured = Vec::new();
    for &scenario in &args.scenario {
        let mut samples = Vec::new();
        for run in 1..=args.runs {
            let (sample, next) = bench.takeover(primary, scenario, run).await?;
            bench.verify(&next.url, scenario, run, keys).await?;
            eprintln!(
                "{keys} keys, {} run {run}/{}: takeover {:.0} ms (stop {:.0} ms)",
                scenario.as_str(),
                args.runs,
                sample.takeover_ms,
                sample.stop_ms
            );
            primary = next;
            samples.push(sample);
        }
        measured.push((scenario, samples));
    }
    primary.terminate()?;
    primary.wait_exit(STEP_TIMEOUT).await?;
    eprintln!("{keys} keys: timing the checkpoint encoding …");
    let value_bytes = args.value_bytes;
    let encode = tokio::task::spawn_blocking(move || encode_times(keys, value_bytes)).await??;
    let encode_ms = Spread::of(&encode);
    Ok(measured
        .into_iter()
        .map(|(scenario, samples)| summarize(keys, scenario, &samples, encode_ms))
        .collect())
}

/// The key of loaded key `n`.
fn key_name(n: usize) -> String {
    format!("takeover/key/{n}")
}

/// The value of every loaded key.
fn value_of(value_bytes: usize) -> String {
    "v".repeat(value_bytes)
}

/// The batches of the load: consecutive ranges of at most [`BATCH_KEYS`].
fn batches(keys: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    (0..keys)
        .step_by(BATCH_KEYS)
        .map(move |start| start..(start + BATCH_KEYS).min(keys))
}

#[derive(Serialize)]
struct BatchPut<'a> {
    op: &'static str,
    key: String,
    value: &'a str,
}

#[derive(Serialize)]
struct BatchBody<'a> {
    operations: Vec<BatchPut<'a>>,
}

/// Puts `keys` keys through `POST /v1/kv:batch`, with progress on stderr.
async fn load(
    http: &reqwest::Client,
    url: &str,
    keys: usize,
    value_bytes: usize,
) -> Result<(), CommandError> {
    let progress = CliProgress::stderr();
    progress.begin(&format!("loading {keys} keys"), keys as u64);
    let value = value_of(value_bytes);
    let endpoint = format!("{url}/v1/kv:batch");
    let mut posted = futures::stream::iter(batches(keys))
        .map(|range| {
            let operations = range
                .clone()
                .map(|n| BatchPut {
                    op: "put",
                    key: key_name(n),
                    value: &value,
                })
                .collect();
            let body = serde_json::to_vec(&BatchBody { operations }).expect("batches encode");
            let request = http.post(&endpoint).body(body).send();
            async move {
                let response = request.await?;
                if !response.status().is_success() {
                    let status = response.status();
                    let text = response.text().await.unwrap_or_default();
                    return Err(format!("a batch put failed: {status} {text}").into());
                }
                Ok::<_, CommandError>(range.len() as u64)
            }
        })
        .buffer_unordered(LOAD_CONNECTIONS);
    while let Some(done) = posted.next().await {
        progress.advance(done?);
    }
    progress.end();
    Ok(())
}

fn marker_key(scenario: Scenario, run: u64) -> String {
    format!("takeover/marker/{}-{run}", scenario.as_str())
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// One put that must be acknowledged.
async fn put(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    value: &str,
) -> Result<(), CommandError> {
    let response = http
        .put(format!("{url}/v1/kv/{key}"))
        .body(value.to_owned())
        .send()
        .await?;
    if !response.status().is_success() {
        return Err(format!("put {key} failed: {}", response.status()).into());
    }
    Ok(())
}

/// Polls the standby at `url` until it applied everything below `applied`.
async fn wait_until_applied(
    http: &reqwest::Client,
    url: &str,
    applied: u64,
) -> Result<(), CommandError> {
    let deadline = Instant::now() + STEP_TIMEOUT;
    while Instant::now() < deadline {
        if let Ok(status) = get_json(http, &format!("{url}/v1/status")).await
            && status["applied_index"].as_u64().unwrap_or(0) >= applied
            && status["caught_up"] == true
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(format!("the standby at {url} did not apply index {applied} in time").into())
}

/// Reads the lease every [`RELEASE_POLL`] until it is no longer `before`'s
/// holding: released, or already someone else's. Returns when it saw that.
async fn wait_released(leases: &LeaseStore, before: &LeaseRecord) -> Result<Instant, CommandError> {
    let deadline = Instant::now() + STEP_TIMEOUT;
    while Instant::now() < deadline {
        // A read can fail transiently; the next one decides.
        if let Ok(Some(lease)) = leases.read().await
            && (lease.released
                || lease.incarnation != before.incarnation
                || lease.term != before.term)
        {
            return Ok(Instant::now());
        }
        tokio::time::sleep(RELEASE_POLL).await;
    }
    Err("the primary did not release its lease in time".into())
}

/// Puts to `url` every [`WRITE_POLL`] until one is acknowledged; returns when.
async fn wait_for_write(http: &reqwest::Client, url: &str) -> Result<Instant, CommandError> {
    let deadline = Instant::now() + STEP_TIMEOUT;
    while Instant::now() < deadline {
        let put = http
            .put(format!("{url}/v1/kv/takeover/after"))
            .timeout(Duration::from_secs(2))
            .body("after")
            .send()
            .await;
        if put.is_ok_and(|response| response.status().is_success()) {
            return Ok(Instant::now());
        }
        tokio::time::sleep(WRITE_POLL).await;
    }
    Err(format!("{url} did not acknowledge a write in time").into())
}

/// The peak resident set of process `pid` (Linux: VmHWM), if known.
fn peak_rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_hwm(&status)
}

/// VmHWM of a `/proc/<pid>/status` text, in bytes.
fn parse_vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let mut fields = line["VmHWM:".len()..].split_whitespace();
    let amount: u64 = fields.next()?.parse().ok()?;
    match fields.next() {
        Some("kB") => Some(amount * 1024),
        _ => None,
    }
}

/// Builds a state of `keys` keys as the load writes them and times,
/// [`ENCODE_REPETITIONS`] times, a checkpoint and its encoding into a buffer
/// (what claim_head did on every boot before the fix), in milliseconds.
fn encode_times(keys: usize, value_bytes: usize) -> Result<Vec<f64>, CommandError> {
    let value = Bytes::from(value_of(value_bytes));
    let mut state = KvState::default();
    for (index, range) in batches(keys).enumerate() {
        let operations = range
            .map(|n| Operation::Put {
                key: Bytes::from(key_name(n)),
                value: value.clone(),
                condition: Condition::None,
            })
            .collect();
        let record = Command::Batch(operations).encode()?;
        state.apply(RecordIndex(index as u64), &record);
    }
    let mut times = Vec::with_capacity(ENCODE_REPETITIONS);
    for _ in 0..ENCODE_REPETITIONS {
        let started = Instant::now();
        let checkpoint = StateMachine::checkpoint(&state);
        let bytes = checkpoint.to_bytes()?;
        times.push(millis(started.elapsed()));
        drop((checkpoint, bytes));
    }
    Ok(times)
}

fn summarize(keys: usize, scenario: Scenario, samples: &[Sample], encode_ms: Spread) -> Row {
    let spread =
        |value: &dyn Fn(&Sample) -> f64| Spread::of(&samples.iter().map(value).collect::<Vec<_>>());
    let names: std::collections::BTreeSet<&String> =
        samples.iter().flat_map(|s| s.phases_ms.keys()).collect();
    let phases_ms = names
        .into_iter()
        .map(|name| {
            let phase = spread(&|s| s.phases_ms.get(name).copied().unwrap_or(0.0));
            (name.clone(), phase)
        })
        .collect();
    let rss: Option<Vec<f64>> = samples
        .iter()
        .map(|s| s.peak_rss_bytes.map(|bytes| bytes as f64 / MIB))
        .collect();
    Row {
        keys,
        scenario: scenario.as_str(),
        runs: samples.len(),
        snapshot_bytes: samples.last().map_or(0, |s| s.head_bytes),
        takeover_ms: spread(&|s| s.takeover_ms),
        boot_ms: spread(&|s| s.phases_ms.values().sum()),
        stop_ms: spread(&|s| s.stop_ms),
        phases_ms,
        replayed_records: spread(&|s| s.replayed_records),
        peak_rss_mib: rss.map(|rss| Spread::of(&rss)),
        encode_ms,
    }
}

const MIB: f64 = 1024.0 * 1024.0;

fn print_header() -> Result<(), CommandError> {
    outln!(
        "{:>9} {:<5} {:>20} {:>6} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9}",
        "keys",
        "take",
        "takeover ms min/med/max",
        "boot",
        "restore",
        "claim",
        "recover",
        "replay",
        "RSS MiB",
        "stop ms",
        "HEAD MiB",
        "encode ms"
    )
}

fn print_row(row: &Row, json: bool) -> Result<(), CommandError> {
    if json {
        return outln!("{}", serde_json::to_string(row).expect("rows encode"));
    }
    let phase = |name: &str| {
        row.phases_ms
            .get(name)
            .map_or_else(|| "-".to_owned(), |phase| format!("{:.0}", phase.median))
    };
    let spread = &row.takeover_ms;
    outln!(
        "{:>9} {:<5} {:>20} {:>6.0} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9.0} {:>9.1} {:>9.1}",
        row.keys,
        row.scenario,
        format!("{:.0}/{:.0}/{:.0}", spread.min, spread.median, spread.max),
        row.boot_ms.median,
        phase("restore"),
        phase("claim_head"),
        phase("recover_log"),
        phase("replay"),
        row.peak_rss_mib
            .map_or_else(|| "-".to_owned(), |rss| format!("{:.0}", rss.max)),
        row.stop_ms.median,
        row.snapshot_bytes as f64 / MIB,
        row.encode_ms.median
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_hwm_is_read_in_bytes() {
        let status = "Name:\tchorus\nVmPeak:\t  900 kB\nVmHWM:\t   123456 kB\nVmRSS:\t 1000 kB\n";
        assert_eq!(parse_vm_hwm(status), Some(123_456 * 1024));
        assert_eq!(parse_vm_hwm("Name:\tchorus\n"), None);
        assert_eq!(parse_vm_hwm("VmHWM:\t12 MB\n"), None);
    }

    #[test]
    fn batches_cover_every_key_once_in_bounded_ranges() {
        let ranges: Vec<_> = batches(2_500).collect();
        assert_eq!(ranges, [0..1000, 1000..2000, 2000..2500]);
        assert_eq!(batches(1).map(|range| range.len()).collect::<Vec<_>>(), [1]);
        assert!(batches(BATCH_KEYS).all(|range| range.len() == BATCH_KEYS));
    }
}
